"""The encoder room: the model's settings, its layers and kernels, the heads, the head table and
Hugging Face checkpoints in and out. Everything that knows a model family by name lives here."""
