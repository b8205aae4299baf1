"""``python -m zpipes``: the zpipes command."""

import sys

from zpipes.cli import main

sys.exit(main())
