"""The full reliability suite: seeded fault runs on a private Kafka broker, then a table of what survived.

    .venv/bin/python tests/reliability/run_faults.py                 # all 120 runs (two to three hours)
    .venv/bin/python tests/reliability/run_faults.py --start 61      # resume a campaign at run 61
    .venv/bin/python tests/reliability/run_faults.py --only 3 --only 11   # runs by number
    .venv/bin/python tests/reliability/run_faults.py --fuzz 100000   # also the worker fuzz run, 1e5 messages

Each run uses a private Redis and fresh topics; all runs share one private
Kafka broker (started here, so broker faults never touch the shared one).
Exits 1 if any run broke an invariant or its fault was never injected. Logs and data stay under --work-dir.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", type=int, action="append", help="run only these run numbers (1-based, repeatable)")
    parser.add_argument("--start", type=int, default=1, help="skip the runs numbered below this (resume a campaign)")
    parser.add_argument("--seed-offset", type=int, default=0, help="added to every run's seed (new schedules)")
    parser.add_argument("--work-dir", type=Path, default=None, help="where logs and data go (default: a temp dir)")
    parser.add_argument("--fuzz", type=int, default=0, metavar="N", help="also run the worker fuzz with N messages")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python 3.x import-time warnings
    from tests.reliability.catalogue import full_catalogue
    from tests.reliability.harness import FaultRun, RunResult
    from tests.reliability.report import describe, format_kinds, format_table
    from tests.reliability.services import PrivateKafka, PrivateKafkaCluster, SmallDiskKafka

    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="stream-dp-faults-"))
    runs = list(enumerate(full_catalogue(), 1))
    if args.only:
        runs = [(i, run) for i, run in runs if i in set(args.only)]
    runs = [(i, run) for i, run in runs if i >= args.start]
    print(f"{len(runs)} fault runs; work dir {work_dir}", flush=True)
    kafka = PrivateKafka(work_dir / "kafka", worker_proxy=True)
    cluster: PrivateKafkaCluster | None = None  # started for the first run that needs three brokers
    small_disk: SmallDiskKafka | None = None  # and a broker on a small filesystem for the first that fills it
    started = time.monotonic()
    kafka.start()
    print(f"private broker on {kafka.bootstrap} ready after {time.monotonic() - started:.1f}s", flush=True)
    results: list[RunResult] = []
    kinds: list[str] = []
    try:
        for number, planned in runs:
            if planned.needs_cluster:
                if cluster is None:
                    cluster = PrivateKafkaCluster(work_dir / "kafka-cluster")
                target = cluster
            elif planned.needs_small_disk:
                if small_disk is None:
                    small_disk = SmallDiskKafka(work_dir / "kafka-small-disk", worker_proxy=True)
                target = small_disk
            else:
                target = kafka
            target.start()  # a broker fault leaves it running, but a failed restart must not sink later runs
            run = FaultRun(planned.fault, planned.seed + args.seed_offset, work_dir / f"run{number:02d}",
                           bootstrap=target.bootstrap, kafka=target, **planned.options())
            result = run.run()
            results.append(result)
            kinds.append(planned.kind)
            print(describe(result), flush=True)
        fuzz_ok = True
        if args.fuzz:
            from tests.reliability.fuzz_run import run_worker_fuzz

            outcome = run_worker_fuzz(kafka.bootstrap, work_dir / "fuzz", messages=args.fuzz, seed=1)
            print(outcome.describe(), flush=True)
            fuzz_ok = outcome.passed
    finally:
        kafka.stop()
        if cluster is not None:
            cluster.stop()
        if small_disk is not None:
            small_disk.remove()
    print()
    print(format_table(results))
    print()
    print(format_kinds(kinds, results))
    survived = sum(r.passed for r in results)
    print(f"\n{survived}/{len(results)} fault runs survived; total {time.monotonic() - started:.0f}s")
    return 0 if survived == len(results) and fuzz_ok else 1


if __name__ == "__main__":
    sys.exit(main())
