"""``python -m zbroker.services.pzq``: the standalone pzq queue."""

import sys

from .commands.standalone import main

sys.exit(main())
