"""Memory: process RSS per open (unit, group) pair in the window engine, and Redis bytes per active unit.

    .venv/bin/python tests/perf/bench_memory.py [--pairs 1000000] [--units 100000]

* Engine (in a fresh process, no Kafka): one window stays open (the clock
  never lets it close) while ``--pairs`` events arrive, each a new (unit,
  group) pair -- every unit touches two groups once, within the bounds, so
  no event is dropped. RSS is read from /proc before the first and after the
  last batch (pending rows compacted); ``peak`` is VmHWM, which includes the
  transient copies of compaction. The child fixes glibc's mmap threshold as
  the worker process does (``process.tuning.tune_allocator``; without it much
  of the RSS is heap glibc keeps after the batches are freed:
  ``--default-allocator`` measures that). The RSS after ``malloc_trim(0)`` is
  printed too, and the engine's own count of its numpy state
  (``state_nbytes``). ``--pairs 10000000`` is the 10M-pair case (about 2
  minutes and 1.5 GB).
* Redis (``REDIS_URL``): ``--units`` units each charged once by a
  ``RedisBudgetStore`` with the policy of ``bench_budget.py`` (1 h and 24 h
  horizons); INFO ``used_memory`` before and after, and MEMORY USAGE of the
  namespace's state hashes, per unit. Keys are deleted afterwards.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import perfkit  # noqa: E402
from bench_windows import START_MS, make_engine  # noqa: E402

from stream_dp.windows import RawBatch  # noqa: E402

PARTITIONS = 4
GROUPS = 1_000


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _pair_batch(first_pair: int, count: int, rng: np.random.Generator) -> RawBatch:
    """Pairs ``first_pair`` .. : pair ``2u`` and ``2u + 1`` are unit ``u`` in two different groups."""
    pair = np.arange(first_pair, first_pair + count)
    unit = pair // 2
    # the second group of a unit is 1 .. GROUPS - 1 after its first, so the two always differ
    group = (unit + (pair % 2) * (1 + (unit // GROUPS) % (GROUPS - 1))) % GROUPS
    ts = START_MS + rng.integers(0, perfkit.WINDOW_MS - 10_000, count)  # well inside the one open window
    partition = ((unit * 2_654_435_761) % 2**32) % PARTITIONS
    values = [
        b'{"user_id":"u%d","ts":%d,"page":"/g%d","value":%.2f}' % row
        for row in zip(unit.tolist(), ts.tolist(), group.tolist(), np.round(rng.gamma(2.0, 20.0, count), 2).tolist())
    ]
    # offsets only need to grow; records stamped with their event times
    return RawBatch(values, partition.astype(np.int32), pair.astype(np.int64), ts)


def _rss_after_malloc_trim() -> int | None:
    """RSS once glibc has handed its free heap pages back (None where there is no glibc)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return None
    return _status_bytes("VmRSS")


def engine_child(pairs: int, batch: int, default_allocator: bool = False) -> dict[str, Any]:
    if not default_allocator:
        from stream_dp.worker.process.tuning import tune_allocator

        tune_allocator()  # as the worker process runs
    rng = np.random.default_rng(3)  # synthetic data only
    clock = [START_MS + 1_000]  # no partition goes idle and the watermark stays inside the window
    warm = make_engine(PARTITIONS, clock, 3, 2, placement=False)
    warm.process(_pair_batch(0, 2_000, rng))  # first-call allocations (numpy, msgspec) are not per-pair state
    del warm
    engine = make_engine(PARTITIONS, clock, 3, 2, placement=False)
    gc.collect()
    rss0 = _status_bytes("VmRSS")
    started = time.perf_counter()
    for first in range(0, pairs, batch):
        result = engine.process(_pair_batch(first, min(batch, pairs - first), rng))
        if result.partials:
            raise RuntimeError("a window closed during the memory benchmark; the clock must hold it open")
    open_pairs = engine.open_pairs  # compacts pending rows
    gc.collect()
    rss1 = _status_bytes("VmRSS")
    peak = _status_bytes("VmHWM")
    state = engine.state_nbytes()
    rss_trimmed = _rss_after_malloc_trim()
    return {
        "pairs": open_pairs,
        "seconds": time.perf_counter() - started,
        "rss_bytes_per_pair": (rss1 - rss0) / open_pairs,
        "peak_bytes_per_pair": (peak - rss0) / open_pairs,
        "trimmed_bytes_per_pair": None if rss_trimmed is None else (rss_trimmed - rss0) / open_pairs,
        "state_bytes_per_pair": (state["rows"] + state["unit_ids"]) / open_pairs,
        "group_table_bytes": state["group_table"],
        "rss_mb": rss1 / 2**20,
    }


def engine_memory(pairs: int, batch: int = 200_000, timeout_s: float = 1_800, default_allocator: bool = False) -> dict[str, Any]:
    """``default_allocator``: without the worker's C-heap setting (``process.tuning.tune_allocator``)."""
    completed = subprocess.run(
        [sys.executable, __file__, "--engine-child", "--pairs", str(pairs), "--batch", str(batch)]
        + (["--default-allocator"] if default_allocator else []),
        capture_output=True, text=True, timeout=timeout_s,
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not lines:
        raise RuntimeError(f"engine memory run failed (exit {completed.returncode}): {completed.stderr[-2000:]}")
    result = json.loads(lines[-1])
    if result["pairs"] != pairs:
        raise RuntimeError(f"engine holds {result['pairs']} pairs, expected {pairs}: events were dropped")
    return result


def redis_memory(redis_url: str, units: int, batch: int = 10_000) -> dict[str, Any]:
    import redis
    from bench_budget import HOUR_MS, Clock, delete_prefix, policy, used_memory

    from stream_dp.budget import RedisBudgetStore

    client = redis.Redis.from_url(redis_url)
    prefix = f"{perfkit.unique_name('mem')}:"
    start_ms = (int(time.time() * 1000) // HOUR_MS) * HOUR_MS
    store = RedisBudgetStore(client, policy(24), key_prefix=prefix, clock_ms=Clock(start_ms))
    ids = [f"user-{k:09d}" for k in range(units)]
    try:
        before = used_memory(client)
        for k in range(0, units, batch):
            store.charge("users", f"mem/{k}", ids[k : k + batch], 0.01, start_ms)
        after = used_memory(client)
        states = list(client.scan_iter(match=f"{prefix}s:*", count=5_000))
        state_bytes = sum(client.memory_usage(key, samples=0) or 0 for key in states)
        return {"units": units, "used_memory_per_unit": (after - before) / units, "state_bytes_per_unit": state_bytes / units}
    finally:
        delete_prefix(client, prefix)
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=200_000)
    parser.add_argument("--units", type=int, default=100_000, help="units charged for the Redis measurement (0: skip)")
    parser.add_argument("--engine-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--default-allocator", action="store_true",
                        help="leave glibc's mmap threshold as it is (the worker fixes it, see process_tuning)")
    args = parser.parse_args()
    if args.engine_child:
        print(json.dumps(engine_child(args.pairs, args.batch, args.default_allocator)))
        return
    engine = engine_memory(args.pairs, args.batch, default_allocator=args.default_allocator)
    trimmed = engine["trimmed_bytes_per_pair"]
    print(f"engine: {engine['pairs']:,} open pairs in {engine['seconds']:.1f} s: RSS {engine['rss_bytes_per_pair']:.1f} bytes/pair, "
          f"after malloc_trim {'n/a' if trimmed is None else f'{trimmed:.1f}'}, peak {engine['peak_bytes_per_pair']:.1f}, "
          f"numpy state {engine['state_bytes_per_pair']:.1f} (process RSS {engine['rss_mb']:.0f} MB)")
    if args.units:
        redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
        r = redis_memory(redis_url, args.units)
        print(f"redis: {r['units']:,} units charged once: {r['used_memory_per_unit']:.1f} bytes/unit (used_memory), "
              f"{r['state_bytes_per_unit']:.1f} bytes/unit (state hashes)")


if __name__ == "__main__":
    main()
