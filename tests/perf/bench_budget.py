"""Benchmark of the Redis budget store: units charged per second, Redis bytes per active unit.

    .venv/bin/python tests/perf/bench_budget.py [--units 100000] [--batch 10000] [--redis-url URL]

Scenarios (all on the real Redis at --redis-url / $REDIS_URL, keys under a
fresh prefix that is deleted afterwards):

* fresh   -- every unit charged for the first time;
* repeat  -- the same units charged again in the same buckets (2-entry states);
* day     -- a simulated day: each hour a random half of the units is charged
             (store clock moved by hand), so states hold up to ~30 buckets;
             throughput of the last hours and memory at the end of the day.

Baselines measured in the same run: a Lua script doing one unchecked HINCRBY
per unit key (the cheapest possible per-unit write, without any check), and
the in-process MemoryBudgetStore. "server" is Redis' own time in EVALSHA
(INFO commandstats), "client" the rest (Python packing, network, parsing).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import redis
from prometheus_client import CollectorRegistry

from stream_dp.budget import BudgetPolicy, HorizonLimit, MemoryBudgetStore, NamespacePolicy, RedisBudgetStore
from stream_dp.metrics.budget import BudgetMetrics

HOUR_MS = 3_600_000

NAIVE_SCRIPT = """
for i = 1, #KEYS do redis.call('HINCRBY', KEYS[i], ARGV[1], ARGV[2]) end
return #KEYS
"""


def policy(day_buckets: int) -> BudgetPolicy:
    return BudgetPolicy(
        [
            NamespacePolicy(
                "users",
                "epsilon",
                [HorizonLimit(HOUR_MS, 1.0, buckets=4), HorizonLimit(24 * HOUR_MS, 4.0, buckets=day_buckets)],
                alert_at=(0.8, 1.0),
            )
        ]
    )


class Clock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def evalsha_stats(client: redis.Redis) -> tuple[int, int]:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def delete_prefix(client: redis.Redis, prefix: str) -> None:
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"{prefix}*", count=5000):
        batch.append(key)
        if len(batch) >= 5000:
            client.delete(*batch)
            batch.clear()
    if batch:
        client.delete(*batch)


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def run_batches(client: redis.Redis, store, batches: list[list[str]], cost: float, time_ms: int, tag: str) -> dict:
    calls0, usec0 = evalsha_stats(client)
    started = time.perf_counter()
    for k, units in enumerate(batches):
        store.charge("users", f"{tag}/{k}", units, cost, time_ms)
    elapsed = time.perf_counter() - started
    calls1, usec1 = evalsha_stats(client)
    n = sum(len(b) for b in batches)
    server_s = (usec1 - usec0) / 1e6
    return {
        "units": n,
        "seconds": elapsed,
        "rate": n / elapsed,
        "server_us": server_s / n * 1e6,
        "client_us": (elapsed - server_s) / n * 1e6,
    }


def report(name: str, result: dict, baseline_rate: float | None = None) -> None:
    line = (
        f"{name:<28} {result['rate']:>11,.0f} units/s   server {result['server_us']:5.2f} us/unit"
        f"   client {result['client_us']:5.2f} us/unit"
    )
    if baseline_rate:
        line += f"   x{result['rate'] / baseline_rate:.2f} of naive HINCRBY"
    print(line)


def measure(redis_url: str, *, units_n: int = 100_000, batch_size: int = 10_000, hours: int = 24, shards: int = 64,
            day_buckets: int = 24, with_metrics: bool = True) -> dict:
    """Every scenario once; prints as it goes and returns the numbers."""
    client = redis.Redis.from_url(redis_url)
    prefix = f"bench-budget-{os.getpid()}-{time.time_ns() % 10**9}:"
    rng = np.random.default_rng(1)  # synthetic ids and activity only
    units = [f"user-{k:09d}" for k in rng.permutation(units_n * 10)[:units_n]]
    batches = [units[i : i + batch_size] for i in range(0, len(units), batch_size)]
    start_ms = (int(time.time() * 1000) // HOUR_MS) * HOUR_MS
    clock = Clock(start_ms)
    metrics = BudgetMetrics(CollectorRegistry()) if with_metrics else None
    out: dict = {"redis_version": client.info("server")["redis_version"], "units": units_n, "batch": batch_size,
                 "shards": shards}
    print(
        f"redis {out['redis_version']}, {units_n:,} units in batches of {batch_size:,}, "
        f"{shards} shards, metrics {'off' if metrics is None else 'on'}"
    )
    try:
        # Baseline: one unchecked HINCRBY per unit key, same batches, same transport.
        naive = client.register_script(NAIVE_SCRIPT)
        calls0, usec0 = evalsha_stats(client)
        started = time.perf_counter()
        for batch in batches:
            naive(keys=[f"{prefix}naive:{u}" for u in batch], args=[1, 1])
        elapsed = time.perf_counter() - started
        calls1, usec1 = evalsha_stats(client)
        naive_result = {
            "units": len(units),
            "seconds": elapsed,
            "rate": len(units) / elapsed,
            "server_us": (usec1 - usec0) / len(units),
            "client_us": (elapsed - (usec1 - usec0) / 1e6) / len(units) * 1e6,
        }
        report("baseline naive HINCRBY", naive_result)
        out["naive"] = naive_result
        delete_prefix(client, f"{prefix}naive:")

        store = RedisBudgetStore(
            client, policy(day_buckets), key_prefix=prefix, shards=shards, metrics=metrics, clock_ms=clock
        )
        memory_before = used_memory(client)
        fresh = run_batches(client, store, batches, 0.01, start_ms, "fresh")
        memory_after = used_memory(client)
        report("fresh units", fresh, naive_result["rate"])
        out["fresh"] = fresh
        repeat = run_batches(client, store, batches, 0.01, start_ms, "repeat")
        report("repeat (2-entry states)", repeat, naive_result["rate"])
        out["repeat"] = repeat
        out["fresh_bytes_per_unit"] = (memory_after - memory_before) / len(units)
        print(
            f"{'memory, fresh':<28} {(memory_after - memory_before) / len(units):>11.1f} bytes/unit "
            "(INFO used_memory delta, incl. charge records)"
        )

        # A day: each hour, half of the units (at random) are charged twice, 20 minutes apart.
        day_results = []
        for hour in range(1, hours + 1):
            clock.now_ms = start_ms + hour * HOUR_MS
            chosen = [units[k] for k in np.flatnonzero(rng.random(len(units)) < 0.5)]
            day_batches = [chosen[i : i + batch_size] for i in range(0, len(chosen), batch_size)]
            day_results.append(run_batches(client, store, day_batches, 0.05, clock.now_ms - 20 * 60_000, f"h{hour}a"))
            day_results.append(run_batches(client, store, day_batches, 0.05, clock.now_ms, f"h{hour}b"))
        last = day_results[-8:]
        n, seconds = sum(r["units"] for r in last), sum(r["seconds"] for r in last)
        server_us = sum(r["server_us"] * r["units"] for r in last) / n
        out["day"] = {
            "units": n,
            "seconds": seconds,
            "rate": n / seconds,
            "server_us": server_us,
            "client_us": seconds / n * 1e6 - server_us,
        }
        report(f"day, last {len(last) // 2}h (busy states)", out["day"], naive_result["rate"])
        shard_keys = [k for k in client.scan_iter(match=f"{prefix}s:*", count=5000)]
        state_bytes = sum(client.memory_usage(k, samples=0) or 0 for k in shard_keys)
        largest = max(shard_keys, key=client.hlen) if shard_keys else None
        sample = [u for u in client.hkeys(largest)[:200] if u] if largest else []
        lengths = [client.hstrlen(largest, u) for u in sample]
        mean_state = f"{np.mean(lengths):.0f}" if lengths else "n/a"
        out["day_state_bytes_per_unit"] = state_bytes / len(units)
        print(
            f"{'memory, end of day':<28} {state_bytes / len(units):>11.1f} bytes/unit "
            f"(MEMORY USAGE of shard hashes; mean state {mean_state} bytes)"
        )
        delete_prefix(client, prefix)

        # The in-process store on the same batches, for comparison.
        mem_store = MemoryBudgetStore(policy(day_buckets), clock_ms=Clock(start_ms))
        started = time.perf_counter()
        for k, batch in enumerate(batches):
            mem_store.charge("users", f"m/{k}", batch, 0.01, start_ms)
        elapsed = time.perf_counter() - started
        out["memory_store_rate"] = len(units) / elapsed
        print(
            f"{'MemoryBudgetStore, fresh':<28} {len(units) / elapsed:>11,.0f} units/s   "
            f"(Redis store x{fresh['rate'] / (len(units) / elapsed):.2f})"
        )
    finally:
        delete_prefix(client, prefix)
        client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=100_000, help="active units (default 100000)")
    parser.add_argument("--batch", type=int, default=10_000, help="units per charge call (default 10000)")
    parser.add_argument("--hours", type=int, default=24, help="hours in the day scenario (default 24)")
    parser.add_argument("--shards", type=int, default=64, help="shard hashes per namespace (default 64)")
    parser.add_argument("--day-buckets", type=int, default=24, help="buckets of the 24h horizon (default 24)")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--no-metrics", action="store_true", help="charge without a BudgetMetrics")
    args = parser.parse_args()
    measure(args.redis_url, units_n=args.units, batch_size=args.batch, hours=args.hours, shards=args.shards,
            day_buckets=args.day_buckets, with_metrics=not args.no_metrics)


if __name__ == "__main__":
    main()
