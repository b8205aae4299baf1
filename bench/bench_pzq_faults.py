"""Fault injection on replicated pzq queues, the long form: many seeds, long runs. Needs root.

    python bench/bench_pzq_faults.py                       # seeds 1..20, 120 s of faults each
    python bench/bench_pzq_faults.py --seeds 5 --duration 60
    python bench/bench_pzq_faults.py --seed 7              # replay one seed
    python bench/bench_pzq_faults.py --seed 7 --keep runs  # and keep its logs in runs/seed-7

Each seed is one run of tests/pzq_faults.py: three brokers in network namespaces, one
cluster, a queue ``jobs`` with ``replicas: 1`` on each, a producer (200 messages a second)
and a consumer on each host, and a fault every 3-8 s drawn from the seed (SIGKILL and
restart, a host cut off, SIGSTOP and SIGCONT, two at once, a SIGKILL right after a
takeover); then everything is healed, the producers stop and the queues drain until no
delivery for ``--drain`` s. What each run does is told on standard error as it happens; one
row per seed, then a summary (markdown), go to standard output. A run that lost messages,
delivered unexpected ones or had a broker crash tells what the brokers logged around them
(standard error) and keeps its logs (``--keep``, else a temporary folder that is left).

Targets: lost 0, unexpected 0, duplicates <= 2 % of the ACKed ids, throughput during the
faults >= 80 % of the offered rate. Exit status 1 when a run lost messages or delivered
unexpected ones (the promises), else 0.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import netns  # noqa: E402
import pzq_faults  # noqa: E402

HEADER = ("| seed | faults | sent | ACKed | lost | duplicates | why | unexpected | "
          "throughput | drain | problems |")


def row(r: pzq_faults.Result) -> str:
    rep = r.report
    whys = ", ".join(f"{n} {why}" for why, n in rep.whys().most_common()) or "-"
    ratio = rep.throughput / rep.offered if rep.offered else 0.0
    drain = "-" if rep.drain_s is None else f"{rep.drain_s:.1f} s"
    return (f"| {r.seed} | {len(r.faults)} | {rep.sent} | {rep.acked} | {len(rep.lost)} | "
            f"{len(rep.duplicates)} ({rep.duplicate_percent:.2f} %) | {whys} | "
            f"{len(rep.unexpected)} | {100 * ratio:.0f} % | {drain} | {len(r.problems)} |")


def summary(results: list[pzq_faults.Result], failed: dict[int, str]) -> str:
    lines = ["", "## Summary", "", "| target | runs that met it |", "|---|---|"]
    if results:
        names = [t[0] for t in results[0].report.targets()]
        for i, name in enumerate(names):
            met = sum(1 for r in results if r.report.targets()[i][3])
            target = results[0].report.targets()[i][2]
            lines.append(f"| {name} {target} | {met} of {len(results)} |")
        acked = sum(r.report.acked for r in results)
        dups = sum(len(r.report.duplicates) for r in results)
        lines += ["", f"Over all runs: {acked} ids ACKed, "
                      f"{sum(len(r.report.lost) for r in results)} lost, {dups} duplicated "
                      f"({100 * dups / max(acked, 1):.2f} %), "
                      f"{sum(len(r.report.unexpected) for r in results)} unexpected."]
        bad = [r for r in results if r.report.lost or r.report.unexpected or r.problems]
        for r in bad:
            lines.append(f"- seed {r.seed}: {len(r.report.lost)} lost, "
                         f"{len(r.report.unexpected)} unexpected, {len(r.problems)} problems; "
                         f"replay: {pzq_faults.replay_command(r.seed, r.duration)}")
    for seed, why in failed.items():
        lines.append(f"- seed {seed}: the run failed: {why}")
    return "\n".join(lines)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20, help="how many seeds (default 20)")
    ap.add_argument("--first", type=int, default=1, help="the first seed (default 1)")
    ap.add_argument("--seed", type=int, help="replay this one seed only")
    ap.add_argument("--duration", type=float, default=120.0,
                    help="seconds of faults per run (default 120)")
    ap.add_argument("--drain", type=float, default=30.0,
                    help="the drain ends after this many seconds without a delivery")
    ap.add_argument("--keep", type=Path, help="keep every run's logs in KEEP/seed-N")
    args = ap.parse_args()
    why = netns.available()
    if why:
        raise SystemExit(why)
    seeds = [args.seed] if args.seed is not None else range(args.first,
                                                             args.first + args.seeds)
    results: list[pzq_faults.Result] = []
    failed: dict[int, str] = {}
    interrupted = False
    print(HEADER)
    print("|" + "---|" * HEADER.count(" | ") + "---|")
    try:
        for seed in seeds:
            base = (args.keep / f"seed-{seed}" if args.keep
                    else Path(tempfile.mkdtemp(prefix=f"pzq-faults-{seed}-")))
            try:
                r = pzq_faults.run(seed, args.duration, base / "run", drain_quiet=args.drain,
                                   drain_max=max(300.0, 3 * args.drain), say=say)
            except Exception as exc:  # noqa: BLE001 - one run's failure, said; the next runs
                failed[seed] = repr(exc)[:2000]
                say(f"seed {seed}: the run failed: {exc!r}; its logs are in {base}")
                print(f"| {seed} | run failed: {str(exc).splitlines()[0][:200]} |", flush=True)
                continue
            results.append(r)
            say(r.report.text())
            for p in r.problems:
                say(f"problem: {p}")
            print(row(r), flush=True)
            bad = r.report.lost or r.report.unexpected or r.problems
            if bad:
                pzq_faults.dump(r, base / "events.jsonl")
                say(pzq_faults.story(r, (r.report.lost + r.report.unexpected)[:10]))
                say(f"seed {seed}: logs kept in {base}")
            elif not args.keep:
                shutil.rmtree(base, ignore_errors=True)
    except KeyboardInterrupt:
        say("interrupted: the summary of the runs done")
        interrupted = True
    print(summary(results, failed))
    if any(r.report.lost or r.report.unexpected for r in results):
        return 1
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
