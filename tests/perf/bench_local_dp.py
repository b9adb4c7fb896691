"""Memory and speed of local-DP reports in the window engine: bytes per unary (oue) report, events per second.

    .venv/bin/python tests/perf/bench_local_dp.py                       # 40,000 reports over 4,096 values, ~1 min
    .venv/bin/python tests/perf/bench_local_dp.py --reports 100000 --domain 1024 --epsilon 4

In a fresh process (no Kafka), ``--reports`` oue reports, one per unit, over
``--domain`` values arrive in one window, which then closes and is added up
into its support counts, as the worker does (decode, window, bound, close,
``aggregate``). Each report lists every value with probability
``q = 1 / (e^eps + 1)`` and its own with 1/2, as the randomizer's would.
Printed: the engine's numpy state per report while the window is open,
the process's peak (VmHWM) growth over the run per report (the transient
copies of compaction, closing and adding up included), and events per CPU
second; then the same for as many k-ary randomized response reports, the
other mechanism, whose reports are one group value. The allocator is set
as the worker sets it (``process.tuning.tune_allocator``).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_memory import _status_bytes  # noqa: E402
from bench_windows import START_MS  # noqa: E402

from stream_dp.dp.local import REPORT_TAG_FIELD, LocalRandomizer, UnaryReports, report_tag  # noqa: E402
from stream_dp.windows import BoundingSpec, EventSchema, RawBatch, WindowEngine, WindowSpec  # noqa: E402

WINDOW_MS = 60_000
BATCH = 2_000


def _schema(mechanism: str, domain: tuple[str, ...], epsilon: float) -> EventSchema:
    tag = report_tag(LocalRandomizer.build(mechanism, epsilon, len(domain)), domain)
    if mechanism == "oue":
        return EventSchema(unit_field="user_id", timestamp_field="ts", report_field="browser", report_domain=domain,
                           report_tag_field=REPORT_TAG_FIELD, report_tag=tag)
    return EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("browser",), group_domain=domain,
                       report_tag_field=REPORT_TAG_FIELD, report_tag=tag)


def _batches(mechanism: str, domain: tuple[str, ...], epsilon: float, reports: int, seed: int):
    """Batches of reports, made as they are read so that the messages do not count as the engine's memory."""
    rng = np.random.default_rng(seed)  # synthetic reports only: their law, not a private randomizer
    tag = report_tag(LocalRandomizer.build(mechanism, epsilon, len(domain)), domain).encode()
    names = [b'"%s"' % v.encode() for v in domain]
    q = 1.0 / (math.exp(epsilon) + 1.0)
    for first in range(0, reports, BATCH):
        n = min(BATCH, reports - first)
        ts = START_MS + 1_000 + rng.integers(0, WINDOW_MS - 2_000, n)
        values = []
        for i, t in zip(range(first, first + n), ts.tolist()):
            if mechanism == "oue":
                ones = np.flatnonzero(rng.random(len(domain)) < q)
                listed = b"[" + b",".join(names[v] for v in ones.tolist()) + b"]"
            else:
                listed = names[int(rng.integers(0, len(domain)))]
            values.append(b'{"user_id":"u%d","ts":%d,"browser":%s,"%s":"%s"}'
                          % (i, t, listed, REPORT_TAG_FIELD.encode(), tag))
        yield RawBatch(values, np.zeros(n, dtype=np.int32), np.arange(first, first + n, dtype=np.int64), ts)


def child(mechanism: str, reports: int, domain_size: int, epsilon: float) -> dict[str, Any]:
    from stream_dp.worker.process.tuning import tune_allocator

    tune_allocator()  # as the worker process runs
    domain = tuple(f"v{i}" for i in range(domain_size))
    clock = [START_MS + 1_000]

    def engine() -> WindowEngine:
        made = WindowEngine(_schema(mechanism, domain, epsilon),
                            WindowSpec(size_ms=WINDOW_MS, allowed_lateness_ms=1_000, idle_timeout_ms=2_000),
                            BoundingSpec(max_groups_per_unit=1, max_events_per_group=1, clip_lo=0.0, clip_hi=0.0,
                                         secret=b"bench-secret-0123456789abcdef"),
                            clock_ms=lambda: clock[0])
        made.assign([0])
        return made

    warm = engine()  # first-call allocations (numpy, msgspec) are not per-report state
    for batch in _batches(mechanism, domain, epsilon, 200, seed=1):
        warm.process(batch)
    del warm
    batches = list(_batches(mechanism, domain, epsilon, reports, seed=2)) if mechanism == "krr" else None
    gc.collect()
    rss0 = _status_bytes("VmRSS")
    eng = engine()
    cpu = 0.0
    for batch in batches or _batches(mechanism, domain, epsilon, reports, seed=2):
        started = time.process_time()
        eng.process(batch)
        cpu += time.process_time() - started
    state = eng.state_nbytes()
    started = time.process_time()
    clock[0] += 10 * WINDOW_MS
    (partial,) = eng.tick()
    totals = partial.aggregate(features=UnaryReports(domain_size) if mechanism == "oue" else None)
    cpu += time.process_time() - started
    counted = int(totals.distinct_units.sum())
    if counted != reports:
        raise RuntimeError(f"{counted} reports counted of {reports}: reports were dropped")
    return {
        "mechanism": mechanism, "reports": reports, "domain": domain_size, "epsilon": epsilon,
        "state_bytes_per_report": (state["rows"] + state["unit_ids"]) / reports,
        "peak_bytes_per_report": (_status_bytes("VmHWM") - rss0) / reports,
        "peak_mb": _status_bytes("VmHWM") / 2**20,
        "events_per_cpu_s": reports / cpu,
    }


def measure(
    reports: int = 40_000, domain: int = 4_096, epsilon: float = 2.0, timeout_s: float = 900
) -> dict[str, Any]:
    """Both mechanisms, each in a fresh process."""
    out = {}
    for mechanism in ("oue", "krr"):
        completed = subprocess.run(
            [sys.executable, __file__, "--child", mechanism, "--reports", str(reports), "--domain", str(domain),
             "--epsilon", str(epsilon)], capture_output=True, text=True, timeout=timeout_s,
        )
        lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
        if completed.returncode != 0 or not lines:
            raise RuntimeError(
                f"local-DP {mechanism} run failed (exit {completed.returncode}): {completed.stderr[-2000:]}")
        out[mechanism] = json.loads(lines[-1])
    return out


def describe(result: dict[str, Any]) -> list[str]:
    return [f"local DP, {r['reports']:,} {r['mechanism']} reports over {r['domain']:,} values "
            f"(epsilon {r['epsilon']:g}) in one window: state {r['state_bytes_per_report']:,.0f} bytes/report, peak "
            f"{r['peak_bytes_per_report']:,.0f} bytes/report (process VmHWM {r['peak_mb']:,.0f} MB), "
            f"{r['events_per_cpu_s']:,.0f} events/CPU-s" for r in result.values()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reports", type=int, default=40_000)
    parser.add_argument("--domain", type=int, default=4_096)
    parser.add_argument("--epsilon", type=float, default=2.0)
    parser.add_argument("--child", choices=("oue", "krr"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.reports, args.domain, args.epsilon)))
        return
    print("\n".join(describe(measure(args.reports, args.domain, args.epsilon))))


if __name__ == "__main__":
    main()
