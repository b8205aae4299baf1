"""The registry of the services a broker can host: plug-ins, found by their entry points.

A service is a class implementing zbroker.service.Service, registered in the entry-point group
``zbroker.services`` of its distribution (the name is the key of its config section under
``services:``)::

    [project.entry-points."zbroker.services"]
    zpipes = "zbroker.services.zpipes:ZpipesService"

Nothing else of the broker names it: its config section, metrics, status and the features
it tells peer brokers are the class's own (see zbroker.service.Service). ZPIPES and pzq are
registered so, by this package's own metadata.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re

from zbroker.service import Service

GROUP = "zbroker.services"
_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")


class PluginError(Exception):
    """A service plug-in cannot be used; the message names it and is for the operator."""


@functools.cache
def installed() -> dict[str, type[Service]]:
    """Every service of the entry-point group, by name, in their ``start_order`` (then by
    name). Loaded once per process. Raises PluginError when one fails to import or is not a
    Service."""
    found: dict[str, type[Service]] = {}
    origin: dict[str, str] = {}
    for ep in importlib.metadata.entry_points(group=GROUP):
        where = f"{ep.value} of {_dist(ep)}"
        if not _NAME_RE.fullmatch(ep.name):
            raise PluginError(f"service plug-in {ep.name!r} ({where}): a service's name must be "
                              "1 to 32 lower-case letters, digits or '_', starting with a "
                              "letter")
        if ep.name in found:
            raise PluginError(f"service plug-in {ep.name!r} is registered twice: by "
                              f"{origin[ep.name]} and by {where}")
        try:
            cls = ep.load()
        except Exception as exc:
            raise PluginError(f"service plug-in {ep.name!r} ({where}) cannot be loaded: "
                              f"{type(exc).__name__}: {exc}") from exc
        if not (isinstance(cls, type) and issubclass(cls, Service)):
            raise PluginError(f"service plug-in {ep.name!r} ({where}) is not a "
                              "zbroker.service.Service class")
        if getattr(cls, "name", None) != ep.name:
            raise PluginError(f"service plug-in {ep.name!r} ({where}) names itself "
                              f"{getattr(cls, 'name', None)!r}: the entry point's name and the "
                              "class's `name` must agree")
        found[ep.name] = cls
        origin[ep.name] = where
    return {name: found[name] for name in sorted(found, key=lambda n: (found[n].start_order, n))}


def _dist(ep: importlib.metadata.EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else "an unnamed distribution"
