"""`python -m bertkit.cli ...` (and `torchrun -m bertkit.cli ...`) runs the command line."""

import sys

from bertkit.cli import main

sys.exit(main())
