"""`python -m gpuvm` is the `gpuvm` command."""
import sys

from .cli import main

sys.exit(main())
