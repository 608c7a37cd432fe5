"""`python -m luminar ...` runs the `luminar` command (cli.py)."""
import sys

from .cli import main

sys.exit(main())
