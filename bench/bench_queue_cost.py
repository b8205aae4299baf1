"""What a pzq queue costs a broker when it is idle: start time, memory, threads, descriptors
and CPU, at several numbers of queues, each against a broker with one queue started in the
same run (the baseline).

    python bench/bench_queue_cost.py                    # 100, 1000 and 5000 queues
    python bench/bench_queue_cost.py --queues 100 2000

Each broker gets a config with N push queues on abstract ipc endpoints (no ports to find), in
a temporary directory, and is started as a real process. Printed for each N: the seconds until
its status answers, its resident memory, threads and descriptors once up (and after 5 s of
idling, the CPU it spent idling, from /proc/PID/stat), and per queue: (figure at N - figure of
the baseline) / (N - 1). A queue holds 5 descriptors (3 listeners, its log's lock and
segment): 5 000 queues need an open-file limit over 25 000. The bench raises its own (and
so the brokers') to what the largest N needs: as root it may pass the hard limit; otherwise
what does not fit the hard limit is said, not measured.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
IDLE_S = 5.0


def config(n: int, tmp: Path, tag: str) -> Path:
    queues = {f"q{i}": {"receive_endpoint": f"ipc://@/qc-{tag}/{i}/in",
                        "send_endpoint": f"ipc://@/qc-{tag}/{i}/out",
                        "data_dir": str(tmp / "data" / f"q{i}")} for i in range(n)}
    path = tmp / "zbroker.cfg"
    path.write_text(yaml.safe_dump({
        "clients": {"max_clients": 100},
        "services": {"zpipes": {"enabled": False},
                     "pzq": {"enabled": True, "queues": queues}}}))
    return path


def status(name: str, env: dict[str, str]) -> dict | None:
    r = subprocess.run([sys.executable, "-m", "zbroker", "status", name, "--json"], env=env,
                       capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout) if r.returncode == 0 else None


def proc_figures(pid: int) -> dict[str, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    rss = threads = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return {"rss_mb": rss / 2**20, "threads": threads,
            "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "cpu_s": (int(fields[11]) + int(fields[12])) / ticks}


def measure(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="zb-queue-cost-") as d:
        tmp = Path(d)
        tag = uuid.uuid4().hex[:8]
        name = f"qc{tag}"
        env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp), XDG_CONFIG_HOME=str(tmp / "config"),
                   XDG_STATE_HOME=str(tmp / "state"),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                            os.environ.get("PYTHONPATH")])))
        cfg = config(n, tmp, tag)
        started = time.monotonic()
        with open(tmp / "broker.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "zbroker", name, "--config",
                                     str(cfg)], env=env, stdout=log, stderr=log,
                                    stdin=subprocess.DEVNULL)
        try:
            # up: every queue started ("broker started" follows the services' start), and
            # the status answers
            while "broker started" not in (tmp / "broker.log").read_text() \
                    or status(name, env) is None:
                if proc.poll() is not None:
                    raise SystemExit(f"the broker with {n} queues exited: "
                                     + (tmp / "broker.log").read_text()[-2000:])
                time.sleep(0.1)
            up = time.monotonic() - started
            figures = proc_figures(proc.pid)
            time.sleep(IDLE_S)
            idle = proc_figures(proc.pid)["cpu_s"] - figures["cpu_s"]
            return {"start_s": up, **figures, "idle_cpu_ms_per_s": idle / IDLE_S * 1000}
        finally:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, nargs="+", default=[100, 1000, 5000],
                        help="the numbers of queues to measure (default 100 1000 5000)")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(hard, 5 * max(args.queues) + 1000)
    try:  # (past the hard limit only with the privilege to raise it: root)
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
        hard = want
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    base = measure(1)
    keys = ("start_s", "rss_mb", "threads", "fds", "idle_cpu_ms_per_s")
    print("| queues | " + " | ".join(keys) + " | per queue: start ms, RSS KiB, threads, fds |")
    print("|---" * (len(keys) + 2) + "|")
    print("| 1 (baseline) | " + " | ".join(f"{base[k]:.2f}" for k in keys) + " | |")
    for n in args.queues:
        if 5 * n + 500 > hard:
            print(f"| {n} | needs an open-file limit of about {5 * n + 500} (hard limit here: "
                  f"{hard}) |")
            continue
        m = measure(n)
        per = [(m[k] - base[k]) / (n - 1) for k in ("start_s", "rss_mb", "threads", "fds")]
        print(f"| {n} | " + " | ".join(f"{m[k]:.2f}" for k in keys)
              + f" | {per[0] * 1000:.2f} ms, {per[1] * 1024:.0f} KiB, {per[2]:.3f}, "
                f"{per[3]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
