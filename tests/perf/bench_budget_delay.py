"""What the budget store's accepted delay costs: Redis bytes and charge rate per unit, 1 h vs 7 days.

    REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/python tests/perf/bench_budget_delay.py [--once 50000] [--busy 10000]

For each accepted delay -- the legacy 1 h, and the default of a 7-day input
retention (7 d + 1 h) -- on the policy of ``bench_budget.py`` (1 h / 4 buckets
and 24 h / 24 buckets), store clock moved by hand:

* once: ``--once`` fresh units charged one time, batches of 10,000;
* busy: ``--busy`` units charged in every 15-minute window of a day (96
  windows, each charged 15 s after it ends), memory read after the last one.

Bytes per unit are INFO ``used_memory`` deltas and the MEMORY USAGE of the
namespace's shard hashes (both divided by the units); the rate is units
charged per second of wall time (client included). The hash lifetime is
printed too: a shard hash lives 2-3 generations after its last write, and
the generation grows with the delay. Keys go under a fresh prefix and are
deleted afterwards. Numbers only: nothing here asserts on speed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_budget import Clock, delete_prefix, policy, used_memory

from stream_dp.budget import RedisBudgetStore, StoreOptions
from stream_dp.budget.layout import StorageLayout
from stream_dp.budget.ledger import NamespaceLedger
from stream_dp.budget.store import LEGACY_MAX_DELAY_MS

HOUR_MS = 3_600_000
WINDOW_MS = 15 * 60_000
BATCH = 10_000


def hash_bytes(client: redis.Redis, prefix: str) -> int:
    return sum(int(client.memory_usage(k) or 0) for k in client.scan_iter(match=f"{prefix}s:*", count=5000))


def measure(client: redis.Redis, options: StoreOptions, units: int, windows: int, start_ms: int) -> dict[str, float]:
    prefix = f"bench-delay-{uuid.uuid4().hex[:8]}:"
    clock = Clock(start_ms)
    store = RedisBudgetStore(client, policy(24), options, key_prefix=prefix, clock_ms=clock)
    names = [f"unit-{k:08d}" for k in range(units)]
    batches = [names[i : i + BATCH] for i in range(0, units, BATCH)]
    try:
        before = used_memory(client)
        started = time.perf_counter()
        for w in range(windows):
            end_ms = start_ms + (w + 1) * WINDOW_MS
            clock.now_ms = end_ms + 15_000
            for k, batch in enumerate(batches):
                store.charge("users", f"w{w}/{k}", batch, 0.04, end_ms)
        elapsed = time.perf_counter() - started
        records = sum(1 for _ in client.scan_iter(match=f"{prefix}c:*", count=5000))
        state = hash_bytes(client, prefix)
        delete_prefix(client, f"{prefix}c:")  # charge records: their own cost, not the unit's
        used = used_memory(client) - before
    finally:
        delete_prefix(client, prefix)
        store.close()
    layout = StorageLayout(NamespaceLedger(policy(24).namespace("users"), options), 64)
    return {
        "units": units,
        "windows": windows,
        "rate": units * windows / elapsed,
        "used_per_unit": used / units,
        "hash_per_unit": state / units,
        "records": records,
        "generation_h": layout.generation_ms / HOUR_MS,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--once", type=int, default=50_000, help="units charged once (default 50000)")
    parser.add_argument("--busy", type=int, default=10_000, help="units charged in every window of a day (default 10000)")
    args = parser.parse_args()
    client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    start_ms = (int(time.time() * 1000) // (24 * HOUR_MS)) * 24 * HOUR_MS
    delays = {"1 h": StoreOptions(max_delay_ms=LEGACY_MAX_DELAY_MS), "7 d + 1 h": StoreOptions()}
    print(f"{'delay':>10} {'case':>5} {'units':>7} {'windows':>7} {'units/s':>9} {'B/unit used':>12} "
          f"{'B/unit hashes':>14} {'generation':>11}")
    for label, options in delays.items():
        for case, units, windows in (("once", args.once, 1), ("busy", args.busy, 96)):
            r = measure(client, options, units, windows, start_ms)
            print(f"{label:>10} {case:>5} {units:>7} {windows:>7} {r['rate']:>9.0f} {r['used_per_unit']:>12.1f} "
                  f"{r['hash_per_unit']:>14.1f} {r['generation_h']:>10.1f}h")
    client.close()


if __name__ == "__main__":
    main()
