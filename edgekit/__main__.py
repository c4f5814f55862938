"""`python -m edgekit ...`, the same as the `edgekit` command."""
import sys

from edgekit.cli import main

sys.exit(main())
