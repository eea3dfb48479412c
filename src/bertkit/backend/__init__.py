"""How the encoder runs on this machine: the measured precision, dynamic int8 and its
ahead-of-time kernels, and the allocator settings of a long-running process."""
