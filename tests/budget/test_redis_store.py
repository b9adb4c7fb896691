"""What only the Redis backend does: fail closed, survive restarts, stay atomic under concurrency."""

from __future__ import annotations

import multiprocessing
import uuid

import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from stream_dp.budget import (
    BudgetPolicy,
    BudgetUnavailable,
    ChargeOutOfRange,
    HorizonLimit,
    MemoryBudgetStore,
    NamespacePolicy,
    RedisBudgetStore,
    StoreLayoutMismatch,
    StoreOptions,
)
from stream_dp.budget.layout import StorageLayout
from stream_dp.budget.ledger import NamespaceLedger
from stream_dp.budget.policy import to_units_up
from stream_dp.budget.store import LEGACY_MAX_DELAY_MS
from stream_dp.metrics.budget import BudgetMetrics

from .conftest import RedisServer, _delete_prefix
from .support import HOUR_MS, Clock, concurrent_worker, standard_policy

MINUTE_MS = 60_000


def shard_key(prefix: str, unit: str, now_ms: int, shards: int = 64) -> str:
    layout = StorageLayout(NamespaceLedger(standard_policy().namespace("users"), StoreOptions()), shards)
    generation = layout.generation_of(now_ms)
    return f"{prefix}s:users:{generation}:{int(layout.shard_of([unit])[0])}"


def test_unreachable_redis_fails_closed_after_retries(unique_name: str) -> None:
    registry = CollectorRegistry()
    metrics = BudgetMetrics(registry)
    sleeps: list[float] = []
    store = RedisBudgetStore.from_url(
        "redis://127.0.0.1:1/0",
        standard_policy(),
        socket_timeout_s=0.2,
        retries=2,
        backoff_s=0.01,
        sleep=sleeps.append,
        metrics=metrics,
    )
    with pytest.raises(BudgetUnavailable, match="nothing may be released"):
        store.charge("users", "q/1", ["alice"], 0.1, 1_700_000_000_000)
    assert sleeps == [0.01, 0.02]
    errors = registry.get_sample_value(
        "stream_dp_budget_store_errors_total", {"namespace": "users", "operation": "charge", "kind": "connection"}
    )
    assert errors == 3
    with pytest.raises(BudgetUnavailable):
        store.spend("users", "alice", 1_700_000_000_000)


def test_a_script_error_charges_nobody(redis_client: redis.Redis, unique_name: str, clock: Clock) -> None:
    prefix = f"{unique_name}:"
    store = RedisBudgetStore(redis_client, standard_policy(), key_prefix=prefix, clock_ms=clock)
    units = [f"user-{k}" for k in range(200)]
    foreign = shard_key(prefix, units[150], clock.now_ms)
    redis_client.set(foreign, "not a hash")  # another application's key in our key space
    with pytest.raises(BudgetUnavailable, match="WRONGTYPE"):
        store.charge("users", "q/1", units, 0.5, clock.now_ms)
    redis_client.delete(foreign)
    # Reads and decisions precede all writes: no unit was charged, no record was kept.
    assert all(store.spend("users", u, clock.now_ms)[0].spent == 0.0 for u in units)
    retry = store.charge("users", "q/1", units, 0.5, clock.now_ms)
    assert not retry.replayed and retry.charged == 200


def test_lost_script_cache_is_reloaded(redis_client: redis.Redis, unique_name: str, clock: Clock) -> None:
    store = RedisBudgetStore(redis_client, standard_policy(), key_prefix=f"{unique_name}:", clock_ms=clock)
    store.charge("users", "q/1", ["alice"], 0.1, clock.now_ms)
    redis_client.script_flush()
    assert store.charge("users", "q/2", ["alice"], 0.1, clock.now_ms).charged == 1
    assert store.reset("users", "alice")


def test_client_must_return_bytes(redis_url: str) -> None:
    with pytest.raises(ValueError, match="decode_responses=False"):
        RedisBudgetStore(redis.Redis.from_url(redis_url, decode_responses=True), standard_policy())


def test_large_batches_are_split_into_idempotent_chunks(
    redis_client: redis.Redis, unique_name: str, clock: Clock
) -> None:
    store = RedisBudgetStore(
        redis_client, standard_policy(), key_prefix=f"{unique_name}:", clock_ms=clock, max_units_per_call=7
    )
    units = [f"user-{k}" for k in range(20)]
    store.charge("users", "pre", units[5:9], 0.95, clock.now_ms)
    first = store.charge("users", "q/1", units, 0.1, clock.now_ms)
    assert first.excluded.tolist() == [5 <= k < 9 for k in range(20)]
    assert (
        redis_client.exists(
            f"{unique_name}:c:users:q/1", f"{unique_name}:c:users:q/1#1", f"{unique_name}:c:users:q/1#2"
        )
        == 3
    )
    retry = store.charge("users", "q/1", units, 0.1, clock.now_ms)
    assert retry.replayed and retry.excluded.tolist() == first.excluded.tolist() and retry.charged == 16


def test_memory_per_unit_is_small_and_keys_expire(redis_client: redis.Redis, unique_name: str, clock: Clock) -> None:
    prefix = f"{unique_name}:"
    store = RedisBudgetStore(redis_client, standard_policy(), key_prefix=prefix, clock_ms=clock)
    units = [f"user-{k:07d}" for k in range(3000)]
    store.charge("users", "q/1", units, 0.1, clock.now_ms)
    store.charge("users", "q/2", units, 0.1, clock.now_ms - 20 * MINUTE_MS)  # a second bucket per horizon
    shard_keys = list(redis_client.scan_iter(match=f"{prefix}s:*", count=1000))
    assert 0 < len(shard_keys) <= 64
    total = sum(redis_client.memory_usage(k, samples=0) for k in shard_keys)
    # Two buckets on each of two horizons: 32 bytes of state plus the hash's per-field cost.
    assert total / len(units) < 200
    generation_ms = StorageLayout(
        NamespaceLedger(standard_policy().namespace("users"), StoreOptions()), 64
    ).generation_ms
    ttl_ms = redis_client.pttl(shard_keys[0])
    assert generation_ms < ttl_ms <= 2 * generation_ms


def test_durability_warnings(redis_server: RedisServer) -> None:
    store = RedisBudgetStore.from_url(redis_server.url, standard_policy())
    assert store.durability_warnings() == []
    client = redis.Redis.from_url(redis_server.url)
    client.config_set("appendfsync", "everysec")
    client.config_set("maxmemory-policy", "allkeys-lru")
    warnings = store.durability_warnings()
    assert any("appendfsync is everysec" in w for w in warnings)
    assert any("maxmemory-policy is allkeys-lru" in w for w in warnings)
    client.close()
    store.close()


def test_durability_settings_a_user_may_not_read_are_said_unchecked(redis_server: RedisServer) -> None:
    """A worker's Redis user with only the commands it needs (``stream-dp acls``) may not run CONFIG GET: the
    fsync and lazyfree settings then go unchecked, and the warnings say so instead of passing in silence."""
    admin = redis.Redis.from_url(redis_server.url)
    user = f"worker-{uuid.uuid4().hex[:8]}"
    admin.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-config"])
    try:
        url = redis_server.url.replace("redis://", f"redis://{user}:pw@")
        store = RedisBudgetStore.from_url(url, standard_policy())
        warnings = store.durability_warnings()
        store.close()
        assert any("appendfsync could not be read" in w and "always" in w for w in warnings), warnings
        assert any("lazyfree-lazy-expire could not be read" in w for w in warnings), warnings
    finally:
        admin.acl_deluser(user)
        admin.close()


def test_redis_restart_fails_closed_then_recovers_without_double_charges(redis_server: RedisServer) -> None:
    store = RedisBudgetStore.from_url(
        redis_server.url, standard_policy(), socket_timeout_s=0.5, retries=1, backoff_s=0.01
    )
    units = [f"user-{k}" for k in range(100)]
    import time

    t = int(time.time() * 1000)
    assert store.charge("users", "A", units, 0.3, t).charged == 100
    redis_server.stop()
    with pytest.raises(BudgetUnavailable):
        store.charge("users", "B", units, 0.3, t)
    with pytest.raises(BudgetUnavailable):
        store.spend("users", units[0], t)
    redis_server.start()  # the same directory: the append-only file is replayed
    replay = store.charge("users", "A", units, 0.3, t)
    assert replay.replayed and replay.charged == 100
    after = store.charge("users", "B", units, 0.3, t)
    assert not after.replayed and after.charged == 100
    assert {store.spend("users", u, t)[0].spent for u in units} == {0.6}
    store.close()


def test_concurrent_workers_never_overspend(redis_url: str, unique_name: str, clock: Clock) -> None:
    prefix = f"{unique_name}:"
    workers, rounds = 4, 12
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers) as pool:
        results = pool.starmap(
            concurrent_worker, [(redis_url, prefix, w, rounds, clock.now_ms) for w in range(workers)]
        )
    expected: dict[str, int] = {}
    for done in results:
        for charged_units, cost_units in done:
            for unit in charged_units:
                expected[unit] = expected.get(unit, 0) + cost_units
    client = redis.Redis.from_url(redis_url)
    store = RedisBudgetStore(client, standard_policy(), key_prefix=prefix, clock_ms=clock)
    hour_limit = to_units_up(1.0)
    exhausted = 0
    for unit in (f"unit-{k}" for k in range(300)):
        spent_units = round(store.spend("users", unit, clock.now_ms)[0].spent * 1_000_000)
        assert spent_units == expected.get(unit, 0)
        assert spent_units <= hour_limit
        exhausted += spent_units > hour_limit - to_units_up(0.15)
    assert exhausted > 0  # the workers really competed for the same budgets
    _delete_prefix(client, prefix)
    client.close()


operations = st.lists(
    st.tuples(
        st.sets(st.sampled_from([f"u{k}" for k in range(8)]), min_size=1, max_size=8),
        st.sampled_from([0.05, 0.2, 0.35, 0.8]),
        st.integers(-55, 10),  # event time in minutes relative to the clock
        st.integers(0, 40),  # clock advance in minutes before the charge
        st.booleans(),  # retry the previous charge instead
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations)
def test_both_backends_decide_identically(redis_client: redis.Redis, unique_name: str, ops: list) -> None:
    clock = Clock((1_800_000_000_000 // HOUR_MS) * HOUR_MS)
    prefix = f"{unique_name}:{uuid.uuid4().hex[:8]}:"
    registries = (CollectorRegistry(), CollectorRegistry())
    memory = MemoryBudgetStore(standard_policy(), metrics=BudgetMetrics(registries[0]), clock_ms=clock)
    real = RedisBudgetStore(
        redis_client, standard_policy(), key_prefix=prefix, metrics=BudgetMetrics(registries[1]), clock_ms=clock
    )
    previous = None
    for k, (units, cost, offset_min, advance_min, retry) in enumerate(ops):
        clock.advance(advance_min * MINUTE_MS)
        if retry and previous is not None:
            call = previous
        else:
            call = (f"q/{k}", sorted(units), cost, clock.now_ms + offset_min * MINUTE_MS)
        try:
            a = memory.charge("users", *call)
        except ChargeOutOfRange:
            with pytest.raises(ChargeOutOfRange):
                real.charge("users", *call)
            continue
        b = real.charge("users", *call)
        assert a.excluded.tolist() == b.excluded.tolist()
        assert (a.charged, a.replayed, a.excluded_by_horizon) == (b.charged, b.replayed, b.excluded_by_horizon)
        assert a.alerts == b.alerts
        previous = call
    for unit in (f"u{k}" for k in range(8)):
        assert memory.spend("users", unit, clock.now_ms) == real.spend("users", unit, clock.now_ms)
    assert memory.top("users", 8, clock.now_ms) == real.top("users", 8, clock.now_ms)
    names = ["stream_dp_budget_spend_fraction_bucket", "stream_dp_budget_units_at_threshold"]
    for name in names:
        samples = [
            sorted((tuple(sorted(s.labels.items())), s.value) for m in r.collect() for s in m.samples if s.name == name)
            for r in registries
        ]
        assert samples[0] == samples[1]
    # No per-example clean-up: the example's keys are under its own prefix, and ``redis_client`` deletes every
    # key under ``unique_name:`` once, after the last example. A SCAN per example walks the whole shared
    # keyspace (millions of keys when other suites ran): 60 of them took longer than the test timeout, which
    # interrupted one example mid-SCAN, and Hypothesis then reported a failure its replay did not repeat.


def test_memory_store_is_thread_safe(clock: Clock) -> None:
    import threading

    store = MemoryBudgetStore(standard_policy(), clock_ms=clock)
    pool = [f"unit-{k}" for k in range(100)]
    charged: list[tuple[list[str], int]] = []
    lock = threading.Lock()

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)  # synthetic test data only
        for r in range(30):
            units = [pool[k] for k in rng.choice(100, size=40, replace=False)]
            outcome = store.charge("users", f"t{seed}/{r}", units, 0.1, clock.now_ms)
            with lock:
                charged.append(([u for u, x in zip(units, outcome.excluded, strict=True) if not x], 100_000))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    totals: dict[str, int] = {}
    for units, cost in charged:
        for u in units:
            totals[u] = totals.get(u, 0) + cost
    for unit in pool:
        spent = round(store.spend("users", unit, clock.now_ms)[0].spent * 1_000_000)
        assert spent == totals.get(unit, 0) <= 1_000_000


def test_workers_must_share_one_layout(redis_client: redis.Redis, unique_name: str, clock: Clock) -> None:
    prefix = f"{unique_name}:"
    first = RedisBudgetStore(redis_client, standard_policy(), key_prefix=prefix, clock_ms=clock, shards=64)
    first.charge("users", "q/1", ["alice"], 0.4, clock.now_ms)
    other_shards = RedisBudgetStore(redis_client, standard_policy(), key_prefix=prefix, clock_ms=clock, shards=16)
    with pytest.raises(StoreLayoutMismatch, match="same StoreOptions, shards and horizons"):
        other_shards.charge("users", "q/2", ["alice"], 0.4, clock.now_ms)
    other_delay = RedisBudgetStore(
        redis_client, standard_policy(), StoreOptions(max_delay_ms=2 * HOUR_MS), key_prefix=prefix, clock_ms=clock
    )
    with pytest.raises(StoreLayoutMismatch):
        other_delay.charge("users", "q/2", ["alice"], 0.4, clock.now_ms)
    # Readers (the admin CLI) adopt the stored generation length and shard count.
    assert other_shards.spend("users", "alice", clock.now_ms)[0].spent == 0.4
    assert other_delay.spend("users", "alice", clock.now_ms)[0].spent == 0.4
    # A reader with other horizons or buckets cannot interpret the states.
    rebucketed = BudgetPolicy(
        [
            NamespacePolicy(
                "users", "epsilon", [HorizonLimit(HOUR_MS, 1.0, buckets=12), HorizonLimit(24 * HOUR_MS, 4.0, 24)]
            )
        ]
    )
    reader = RedisBudgetStore(redis_client, rebucketed, key_prefix=prefix, clock_ms=clock)
    with pytest.raises(StoreLayoutMismatch, match="horizon_ms:buckets differ"):
        reader.spend("users", "alice", clock.now_ms)


def test_a_unit_moves_to_the_new_generation(redis_client: redis.Redis, unique_name: str, clock: Clock) -> None:
    prefix = f"{unique_name}:"
    store = RedisBudgetStore(redis_client, standard_policy(), key_prefix=prefix, clock_ms=clock)
    generation_ms = StorageLayout(
        NamespaceLedger(standard_policy().namespace("users"), StoreOptions()), 64
    ).generation_ms
    boundary = (clock.now_ms // generation_ms + 1) * generation_ms
    clock.now_ms = boundary - MINUTE_MS
    store.charge("users", "g/1", ["alice"], 0.5, clock.now_ms)
    old_key = shard_key(prefix, "alice", clock.now_ms)
    assert redis_client.hexists(old_key, "alice")
    clock.now_ms = boundary + MINUTE_MS
    store.charge("users", "g/2", ["alice"], 0.25, clock.now_ms)
    new_key = shard_key(prefix, "alice", clock.now_ms)
    assert new_key != old_key
    assert not redis_client.hexists(old_key, "alice") and redis_client.hexists(new_key, "alice")
    assert store.spend("users", "alice", clock.now_ms)[0].spent == 0.75
    # Shard hashes stay real hash tables (a listpack would scan every field on each lookup).
    assert redis_client.object("encoding", new_key) == b"hashtable"


def test_budgets_laid_out_for_an_hour_keep_their_delay(
    redis_client: redis.Redis, unique_name: str, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Upgrading a deployment keeps charging the budgets it has, at the delay they were stored for."""
    prefix = f"{unique_name}:"
    legacy = StoreOptions(max_delay_ms=LEGACY_MAX_DELAY_MS)
    old = RedisBudgetStore(redis_client, standard_policy(), legacy, key_prefix=prefix, clock_ms=clock)
    assert old.charge("users", "old/1", ["alice"], 0.6, clock.now_ms).charged == 1
    upgraded = RedisBudgetStore(redis_client, standard_policy(), key_prefix=prefix, clock_ms=clock)
    with caplog.at_level("WARNING", logger="stream_dp.budget.redis_store"):
        assert upgraded.charge("users", "new/1", ["alice", "bob"], 0.6, clock.now_ms).excluded.tolist() == [True, False]
    assert "laid out for charges at most 3600000 ms late" in caplog.text
    # Old and upgraded workers can run side by side during a rolling upgrade.
    assert old.charge("users", "old/2", ["bob"], 0.6, clock.now_ms).excluded.tolist() == [True]
    with pytest.raises(ChargeOutOfRange, match="laid out for that delay by an earlier version"):
        upgraded.charge("users", "new/2", ["carol"], 0.1, clock.now_ms - 2 * HOUR_MS)
    # Another namespace with nothing stored yet gets the full delay.
    assert upgraded.charge("devices", "new/3", ["d1"], 0.1, clock.now_ms - 2 * HOUR_MS).charged == 1
    # Any other difference still refuses to write.
    other = RedisBudgetStore(redis_client, standard_policy(), key_prefix=prefix, clock_ms=clock, shards=16)
    with pytest.raises(StoreLayoutMismatch, match="same StoreOptions, shards and horizons"):
        other.charge("users", "other/1", ["dave"], 0.1, clock.now_ms)


def test_a_unit_holding_thousands_of_buckets_is_still_charged(
    redis_client: redis.Redis, unique_name: str, clock: Clock
) -> None:
    """A unit charged in every 5-minute bucket of a week-long backlog, on an epsilon and a delta limit.

    Its state holds over 4,000 counters, which the charge script unpacks in
    one call: it must neither fail nor lose a counter.
    """
    five_min = 300_000
    policy = BudgetPolicy([NamespacePolicy("users", "epsilon", [
        HorizonLimit(HOUR_MS, 1.0, buckets=12),
        HorizonLimit(HOUR_MS, 1e-5, buckets=12, delta=True),
        HorizonLimit(24 * HOUR_MS, 100.0, buckets=12),
    ])])
    options = StoreOptions.for_input_retention(7 * 24 * HOUR_MS)
    store = RedisBudgetStore(redis_client, policy, options, key_prefix=f"{unique_name}:", clock_ms=clock)
    first = clock.now_ms - 7 * 24 * HOUR_MS
    times = range(first, clock.now_ms, five_min)
    for k, t in enumerate(times):
        assert store.charge("users", f"q/{k}", ["alice"], 0.01, t, delta=1e-7).charged == 1
    assert len(times) == 2016  # 2 x 2016 counters on the hour limits, ~85 on the day limit
    spend = store.spend("users", "alice", clock.now_ms - five_min)
    # the last hour (and its neighbour bucket) holds 13 charges of 0.01 and 1e-7
    assert spend[0].spent == pytest.approx(0.13) and spend[1].spent == pytest.approx(1.3e-6)
    assert store.charge("users", "q/last", ["alice"], 0.01, clock.now_ms, delta=1e-7).charged == 1
