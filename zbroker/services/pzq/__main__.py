"""``python -m zbroker.services.pzq``: the standalone pzq queue."""

import sys

from .cli import main

sys.exit(main())
