"""``python -m zbroker.pzq``, the old name of ``python -m zbroker.services.pzq``: the standalone
pzq queue."""

import sys

from zbroker.services.pzq.commands.standalone import main

sys.exit(main())
