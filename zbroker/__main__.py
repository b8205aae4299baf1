"""``python -m zbroker``: the same as the ``zbroker`` command."""

import sys

from zbroker.cli import main

sys.exit(main())
