"""The services a broker can host, by the name of their config section (``services.<name>``).

Adding a service: implement zbroker.service.Service, add its config section to
zbroker/config.py (with an ``enabled`` setting) and register its class here.
"""

from __future__ import annotations

from zbroker.pzq.service import PzqService
from zbroker.service import Service

from .zpipes import ZpipesService

SERVICES: dict[str, type[Service]] = {
    "zpipes": ZpipesService,
    "pzq": PzqService,
}
