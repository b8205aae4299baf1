"""No import cycle among the modules of ``zbroker`` and ``zpipes``: every import counts, at the
top of a module, in a function (where a cycle hides: it works until someone moves the import)
or under ``TYPE_CHECKING`` (two modules that need each other's types lean on each other).
Importing ``a.b.c`` imports the package ``a.b`` too, so that counts as well.

The modules are read, not imported: the graph is what the source says."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGES = ("zbroker", "zpipes")
#: cycles still to take apart, each as the set of its modules; a cycle not here fails the
#: test, and so does one here that is gone (take it out of the list)
KNOWN: list[set[str]] = []


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports, anywhere in it, with the
    packages they are in (but not its own packages: they are imported before it anyway)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1]) if node.level else ""
            module = ".".join(filter(None, [base, node.module or ""]))
            targets.add(module)
            targets.update(f"{module}.{a.name}" for a in node.names)
    own = {".".join(name.split(".")[:k]) for k in range(1, name.count(".") + 1)}
    found = set()
    for target in targets:
        parts = target.split(".")
        for k in range(1, len(parts) + 1):
            module = ".".join(parts[:k])
            if module in known and module != name and module not in own:
                found.add(module)
    return found


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_reading_finds_a_cycle_hidden_in_a_function(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from p import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    known = {"p": pkg / "__init__.py", "p.a": pkg / "a.py", "p.b": pkg / "b.py"}
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert cycles(graph) == [{"p.a", "p.b"}]


def test_no_import_cycle_but_those_being_taken_apart():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    found = cycles(graph)
    new = [sorted(c) for c in found if c not in KNOWN]
    gone = [sorted(c) for c in KNOWN if c not in found]
    assert not new, f"import cycles: {new}"
    assert not gone, f"these cycles are gone: take them out of KNOWN: {gone}"
