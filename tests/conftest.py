"""Shared fixtures. Broker processes: see helpers.py. The tests are in unit/, processes/ and
namespaces/, by what they need.

    def test_x(broker):                     # a running broker with the default config
        broker.name, broker.endpoint, broker.proc, broker.stop()

    def test_y(start_broker):               # a factory
        b = start_broker(config={"log": {"level": "debug"}}, args=["--animate"])
        c = start_broker(name=b.name, wait=False)   # not waiting: it is expected to fail
        assert c.wait() == 1
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import zmq

# the shared helpers live here; the tests, by what they need, in unit/ (one process: cores,
# codecs, real sockets and disks), processes/ (real brokers and clients as processes) and
# namespaces/ (several hosts in network namespaces, as root); tests import shared pieces of
# one another across them
_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), *(str(_HERE / d) for d in ("unit", "processes", "namespaces"))]

from helpers import REPO_ROOT, BrokerProcess, spawn_broker  # noqa: E402

StartBroker = Callable[..., BrokerProcess]

# what a clustered broker remembers of its cluster (its state directory) goes under the
# tests' own temporary directory, for every process they start, never in the home directory
if "ZBROKER_TESTS_STATE" not in os.environ:
    import tempfile

    os.environ["ZBROKER_TESTS_STATE"] = os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(
        prefix="zbroker-tests-state-")


def pytest_configure(config: pytest.Config) -> None:
    """Compile zbroker and zpipes to bytecode once, before any test runs.

    The tests start hundreds of Python processes (brokers, pzq, the command-line
    tools, Spark's Python workers) that import these packages from this tree. Where
    PYTHONDONTWRITEBYTECODE is set, none of them writes the bytecode cache, so each would
    compile the packages again: about 0.3 s of CPU per process. Only what changed since the
    last run is compiled; a file edited later is still read from its source (the cache is
    checked against it). Done by the controlling process, not by each xdist worker."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import compileall

    for package in ("zbroker", "zpipes"):
        compileall.compile_dir(REPO_ROOT / package, quiet=2)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Any:
    """Keep the bytecode of the test modules that collection imports (pytest's assertion
    rewriting of them, above all) in tests/__pycache__, PYTHONDONTWRITEBYTECODE or not.

    Without the cache every process that collects (each xdist worker) rewrites and
    compiles all the test modules again: ~7 s of CPU each at every start, before any test
    runs. Only while collecting; a module edited later is rewritten from its source (the
    cache is checked against it)."""
    saved = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = saved


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` (scripts/test), with one change: the Spark test files
    (test_spark_*.py) are one unit, run by one worker, so that one JVM and SparkSession (the
    session-scoped ``spark`` fixture) serve them all. Split over two workers, each worker
    started a JVM of its own (~10-25 s) and paid its warm-up in its first jobs again, and
    the two JVMs took both cores at once. Every other file is still a unit of its own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SparkFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "spark" if Path(scope).name.startswith("test_spark_") else scope

    return SparkFilesTogether(config, log)


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    """A ZeroMQ context for the test's own sockets, destroyed (linger 0) at teardown."""
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[StartBroker]:
    """``start_broker(name=None, config=None, args=(), wait=True) -> BrokerProcess``.

    Starts a broker process (a unique name unless given; ``config`` a dict written as YAML)
    and, with ``wait``, waits until its endpoint accepts connections. Every broker still
    running at teardown is killed (SIGKILL).
    """
    started: list[BrokerProcess] = []

    def start(name: str | None = None, config: dict[str, Any] | str | None = None,
              args: Sequence[str] = (), wait: bool = True) -> BrokerProcess:
        b = spawn_broker(tmp_path, name=name, config=config, args=args)
        started.append(b)
        if wait:
            b.wait_until_up()
        return b

    yield start
    for b in started:
        b.kill()


@pytest.fixture
def broker(start_broker: StartBroker) -> BrokerProcess:
    """A running broker with a unique name and the default config."""
    return start_broker()


@pytest.fixture
def start_pzq(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``start_pzq(*args, database=None) -> PzqProcess``: a standalone pzq process on free
    loopback ports, data in the test's temporary directory; killed at teardown."""
    from pzq_helpers import spawn_pzq

    started: list[Any] = []

    def start(*args: str, database: Path | None = None, **kw: Any) -> Any:
        db = database or tmp_path / f"pzq{len(started)}"
        q = spawn_pzq(db, *args, registry=started, **kw)
        q.wait_up()
        return q

    yield start
    for q in started:
        q.kill()


# --- Spark (tests marked spark) ---------------------------------------------------------


def _java_problem() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    java = shutil.which("java", path=os.pathsep.join(
        filter(None, [java_home and os.path.join(java_home, "bin"), os.environ.get("PATH")])))
    if java is None:
        return "no java on PATH or in JAVA_HOME (Spark needs Java 17 or newer)"
    try:
        subprocess.run([java, "-version"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"java does not run: {exc}"
    return None


ENV_KEYS = ("SPARK_LOCAL_IP", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")
LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One local SparkSession for the whole test run (``local[2]``, UI off, loopback only,
    Python workers on this interpreter), with the zbroker formats registered. Skipped, with
    the reason, when pyspark, pyarrow or Java is missing."""
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'zbroker[spark]')")
    pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'zbroker[spark]')")
    problem = _java_problem()
    if problem is not None:
        pytest.skip(problem)
    from pyspark.sql import SparkSession

    from zbroker.spark import register

    base = tmp_path_factory.mktemp("spark")
    log4j = base / "log4j2.properties"
    log4j.write_text(LOG4J2, encoding="utf-8")
    # The JVM and the Python workers it starts inherit this environment (restored after).
    saved = {key: os.environ.get(key) for key in ENV_KEYS}
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    # The JVM's quick compiler only: these small jobs end before the optimising one pays
    # back its own work, which on two busy cores made the session start and the first jobs
    # take a third longer.
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j} -XX:TieredStopAtLevel=1"
    session = (
        SparkSession.builder.master("local[2]")
        .appName("zbroker-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.sql.warehouse.dir", str(base / "warehouse"))
        .config("spark.local.dir", str(base / "local"))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
