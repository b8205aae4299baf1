"""The ZPIPES core (codec, state machine, pipe table, server core, peering, the client's protocol
logic) does no I/O and must import without pyzmq: other runtimes and tools build on it. The
package's public names stay where they were, imported on first use."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import zpipes

CORE_MODULES = [
    "zpipes.protocol",
    "zbroker.services.zpipes.machine",
    "zbroker.services.zpipes.pipes",
    "zbroker.services.zpipes.server",
    "zbroker.services.zpipes.peering",
    "zbroker.services.zpipes.directory",
    "zbroker.services.zpipes.engine",
    "zbroker.services.zpipes.links",
    "zbroker.services.zpipes.actions",
    "zpipes.errors",
    "zpipes.client_protocol",
]


def run_without_zmq(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where ``import zmq`` fails."""
    guard = "import sys\nsys.modules['zmq'] = None  # any import of zmq raises ImportError\n"
    return subprocess.run([sys.executable, "-c", guard + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_module_imports_without_pyzmq(module):
    done = run_without_zmq(f"""
        import importlib
        importlib.import_module({module!r})
        assert sys.modules.get('zmq') is None, 'zmq was imported'
        assert 'asyncio' not in sys.modules, 'the event loop was imported'
        print('ok')
    """)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


def test_package_errors_need_no_pyzmq_and_the_client_names_load_on_use():
    """The sync client speaks ZMTP itself: it loads (on use) without pyzmq, and so does the
    command; the asyncio client is the one that needs it."""
    done = run_without_zmq("""
        import zpipes
        assert issubclass(zpipes.PipeFailed, zpipes.ZpipesError)
        assert 'zpipes.client' not in sys.modules
        assert callable(zpipes.open) and 'zpipes.client' in sys.modules
        import zpipes.cli
        try:
            import zpipes.aio
        except ImportError:
            print('asyncio client needs zmq')
    """)
    assert done.returncode == 0 and done.stdout == "asyncio client needs zmq\n", done.stderr


def test_the_command_starts_without_what_it_does_not_use():
    """What the ``zpipes`` command imports is its start-up, paid by every use in a shell
    pipeline: neither pyzmq nor asyncio, nor typing or dataclasses (annotations are never
    evaluated; typing was about 3 ms of a 40 ms start, dataclasses much more)."""
    done = run_without_zmq("""
        import zpipes.cli, zpipes.client
        zpipes.cli.build_parser().parse_args(['write', 'p'])
        print(sorted(m for m in ('zmq', 'asyncio', 'typing', 'dataclasses')
                     if sys.modules.get(m) is not None))
    """)
    assert done.returncode == 0 and done.stdout == "[]\n", done.stderr or done.stdout


def test_the_development_install_adds_no_import_hook_to_every_start():
    """scripts/setup's editable install finds the packages through a path entry, as an
    installed wheel does, not through setuptools' import hook: the hook's .pth made every
    Python start of the venv import pathlib, re and importlib.util (about 13 ms of a zpipes
    command's 40). Nothing to check where the packages were not installed editable."""
    site = [p for p in sys.path if p.endswith("site-packages")]
    hooks = [pth for p in site for pth in Path(p).glob("__editable__.zbroker-*.pth")]
    if not hooks:
        pytest.skip("zbroker is not installed editable in this interpreter's site-packages")
    for pth in hooks:
        assert not any(line.startswith("import") for line in pth.read_text().splitlines()), (
            f"{pth} runs code at every start: run scripts/setup")
    done = subprocess.run([sys.executable, "-c", "import sys; print('pathlib' in sys.modules)"],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert done.stdout == "False\n", done.stderr or done.stdout


def test_public_names_still_resolve():
    from zpipes import client, errors

    for name in zpipes.__all__:
        value = getattr(zpipes, name)
        assert value is getattr(client, name, None) or value is getattr(errors, name, None)
    assert set(zpipes.__all__) <= set(dir(zpipes))
    assert zpipes.client is client  # the submodule, as before, even if nothing imported it
    with pytest.raises(AttributeError):
        zpipes.no_such_name  # noqa: B018


def test_both_clients_share_one_protocol_module():
    from zpipes import aio, client, client_protocol

    for name in ("ReaderProtocol", "WriterProtocol", "Phase", "EOF", "check_pipe_name"):
        assert getattr(client, name) is getattr(client_protocol, name)  # the old path works
    assert aio.ReaderProtocol is client_protocol.ReaderProtocol


def test_pzq_client_is_a_package_of_its_own_with_nothing_of_the_broker():
    """pzq's client imports nothing of the broker (its wire format, which the broker's queue
    cores take from it, not even pyzmq); its names load on use, and the old import path
    still gives the same classes."""
    done = run_without_zmq("""
        import pzq.wire
        assert not [m for m in sys.modules if m.split('.')[0] == 'zbroker'], 'the broker'
        print('wire ok')
    """)
    assert done.returncode == 0 and done.stdout == "wire ok\n", done.stderr
    done = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys
        import pzq
        assert 'pzq.client' not in sys.modules
        producer = pzq.Producer
        assert 'pzq.client' in sys.modules
        assert not [m for m in sys.modules if m.split('.')[0] == 'zbroker'], 'the broker'
        from pzq.client import Producer
        assert Producer is producer
        print('client ok')
    """)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "client ok\n", done.stderr
    # the standalone queue by its old module name, as scripts may run it
    old = subprocess.run([sys.executable, "-m", "zbroker.pzq", "--help"], capture_output=True,
                         text=True, timeout=60)
    new = subprocess.run([sys.executable, "-m", "zbroker.services.pzq", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert old.returncode == 0 and old.stdout == new.stdout and "--receive-dsn" in old.stdout
