"""``python -m specdec demo``: see specdec.cli."""

import sys

from .cli import main

sys.exit(main())
