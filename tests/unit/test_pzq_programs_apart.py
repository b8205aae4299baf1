"""pzq's service package holds what runs inside a broker; its programs (the standalone ``pzq``
command, ``zbroker queue``) are the sub-package ``commands``, which uses the service's modules.
The service's modules import nothing of it, in a function or under ``TYPE_CHECKING``
included, but for the hand-over: service.py gives the broker's CLI ``zbroker queue`` (the
package's ``QUEUE``), which imports the command's modules only when it is used.
``__main__.py`` is the standalone program's ``python -m`` entry, not the service's.

The modules are read, not imported (but for the last test, which imports the service)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).parents[2]
SERVICE = "zbroker.services.pzq"
COMMANDS = f"{SERVICE}.commands"
#: the one import of the programs' package a module of the service may make, and the names it
#: takes from it
HAND_OVER = {f"{SERVICE}.service": {COMMANDS: {"QUEUE"}}}
#: the module of the service's package that is a program's: ``python -m zbroker.services.pzq``
PROGRAMS_ENTRY = f"{SERVICE}.__main__"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def in_programs(module: str) -> bool:
    return module == COMMANDS or module.startswith(COMMANDS + ".")


def programs_imported(name: str, path: Path) -> dict[str, set[str]]:
    """The modules of the programs' package that module ``name`` (its source at ``path``)
    imports anywhere in it, each with the names it takes from it (none for ``import a.b``, nor
    for ``from PACKAGE import module``, which counts as that module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if in_programs(a.name):
                    found.setdefault(a.name, set())
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1]) if node.level else ""
            module = ".".join(filter(None, [base, node.module or ""]))
            if in_programs(module):
                found.setdefault(module, set()).update(a.name for a in node.names)
                continue
            for a in node.names:
                if in_programs(f"{module}.{a.name}"):
                    found.setdefault(f"{module}.{a.name}", set())
    return found


def service_modules() -> dict[str, Path]:
    """Every module of the service's package (its cores included) but the programs'."""
    package = ROOT.joinpath(*SERVICE.split("."))
    found = {module_name(p, ROOT): p for p in sorted(package.rglob("*.py"))}
    return {name: path for name, path in found.items()
            if not in_programs(name) and name != PROGRAMS_ENTRY}


def test_the_reading_finds_every_way_of_importing_the_programs(tmp_path):
    pzq = tmp_path.joinpath(*SERVICE.split("."))
    (pzq / "core").mkdir(parents=True)
    (pzq / "server.py").write_text("def f():\n    from .commands.queue import parser\n")
    (pzq / "store.py").write_text("from . import commands, config\n")
    (pzq / "top.py").write_text("import zbroker.services.pzq.commands.put as put\n")
    (pzq / "core" / "queue.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from ..commands.location import QueueInfo\n")
    (pzq / "metrics.py").write_text("from .config import X\nimport zbroker.command\n")
    found = {module_name(p, tmp_path): programs_imported(module_name(p, tmp_path), p)
             for p in sorted(pzq.rglob("*.py"))}
    assert found == {f"{SERVICE}.server": {f"{COMMANDS}.queue": {"parser"}},
                     f"{SERVICE}.store": {COMMANDS: set()},
                     f"{SERVICE}.top": {f"{COMMANDS}.put": set()},
                     f"{SERVICE}.core.queue": {f"{COMMANDS}.location": {"QueueInfo"}},
                     f"{SERVICE}.metrics": {}}


def test_the_service_imports_nothing_of_its_programs_but_the_hand_over():
    modules = service_modules()
    assert f"{SERVICE}.service" in modules and f"{SERVICE}.core.queue" in modules
    found = {name: programs_imported(name, path) for name, path in modules.items()}
    found = {name: what for name, what in found.items() if what}
    assert found == HAND_OVER, (
        f"the service's modules import its programs' ({COMMANDS}): {found}; a program may "
        f"import the service, not the other way round (but for {HAND_OVER})")


def test_the_service_brings_in_no_program_until_one_is_used():
    """Importing the service (as the broker's CLI does, to list its commands) loads no module
    of the programs but their package, nor pzq's client; asking for ``zbroker queue``'s parser
    does."""
    code = f"""
        import sys
        from {SERVICE}.service import PzqService
        (command,) = PzqService.commands()
        def loaded():
            return sorted(m for m in sys.modules
                          if m.startswith('{COMMANDS}.') or m == 'pzq.client')
        print(command.name, loaded())
        command.parser()
        print(loaded())
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    first, then = done.stdout.splitlines()
    assert first == "queue []"
    assert f"'{COMMANDS}.queue'" in then and "'pzq.client'" in then
