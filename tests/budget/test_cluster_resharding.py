"""A slot of the budget store moves to another master while charges go on (``redis-cli --cluster reshard``).

While the slot migrates, a charge of it is answered TRYAGAIN or ASK: a new
charge is refused (fail closed, retried later) rather than run on a node
holding only part of the slot's budgets; a replayed charge follows ASK to
wherever its record is. Once the slot has moved, the store's stale slot map
gets MOVED, refreshes and charges on the new master. Every unit ends charged
exactly once per charge id.
"""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry
from redis.exceptions import TryAgainError

from stream_dp.budget import BudgetUnavailable, RedisBudgetStore, StoreOptions
from stream_dp.budget.keys import key_slot_of
from stream_dp.budget.redis_nodes import ReplicaWait
from stream_dp.budget.redis_url import client_from_url
from stream_dp.metrics.budget import BudgetMetrics

from .cluster_support import PrivateCluster
from .support import standard_policy

COST = 0.25


def cluster_errors(registry: CollectorRegistry) -> float:
    value = registry.get_sample_value(
        "stream_dp_budget_store_errors_total", {"namespace": "users", "operation": "charge", "kind": "cluster"}
    )
    return value or 0.0


def test_charges_follow_a_slot_migration_without_double_charges(private_cluster: PrivateCluster) -> None:
    cluster = private_cluster
    registry = CollectorRegistry()
    client = client_from_url(cluster.url, timeout_s=2.0, own_retries=False)
    # Every charge enters the top set (top_min_fraction=0), so a recorded charge has all of its keys: a call
    # missing one of them during a migration is refused with TRYAGAIN, replays too (tried again later).
    store = RedisBudgetStore(
        client, standard_policy(), StoreOptions(top_min_fraction=0.0), key_prefix="reshard:", wait=ReplicaWait(1, 1000), retries=2, backoff_s=0.02,
        metrics=BudgetMetrics(registry=registry),
    )
    t = int(time.time() * 1000)
    units = [f"user-{k}" for k in range(2000)]
    first = store.charge("users", "c/1", units, COST, t)
    assert not first.excluded.any()

    slot = key_slot_of(store.keys.shard_prefix("users", 0))
    source = cluster.master_of_slot(slot)
    target = next(p for p in cluster.masters() if p != source)
    cluster.begin_migration(slot, source, target)

    # Migrating, keys still on the source: a replay runs there (its record is there) ...
    assert store.charge("users", "c/1", units, COST, t).replayed
    # ... a new charge's record exists nowhere yet, so Redis refuses it rather than split the slot's keys.
    with pytest.raises(BudgetUnavailable) as refused:
        store.charge("users", "c/2", units, COST, t)
    assert isinstance(refused.value.__cause__, TryAgainError)

    # The keys move; the slot is still migrating, so the source answers ASK for them.
    assert cluster.migrate_keys(slot, source, target) > 0
    assert cluster.keys_in_slot(source, slot) == 0
    before = cluster_errors(registry)
    replay = store.charge("users", "c/1", units, COST, t)  # only the target holds c/1's keys now
    assert replay.replayed and not replay.excluded.any()
    assert cluster_errors(registry) > before, "the replay did not go through an ASK redirection"
    with pytest.raises(BudgetUnavailable):
        store.charge("users", "c/2", units, COST, t)

    # The slot is the target's now: the store's map is stale, MOVED sends it there.
    cluster.end_migration(slot, target)
    assert cluster.master_of_slot(slot) == target
    second = store.charge("users", "c/2", units, COST, t)
    assert not second.excluded.any()
    assert store.charge("users", "c/1", units, COST, t).replayed

    spent = {u: store.spend("users", u, t)[0].spent for u in units}
    wrong = {u: s for u, s in spent.items() if abs(s - 2 * COST) > 1e-9}
    assert not wrong, f"{len(wrong)} units not charged exactly twice (c/1 and c/2), e.g. {list(wrong.items())[:3]}"
    # Two more charges reach the limit of 1.0; a fifth is refused for every unit.
    for k in range(2):
        assert not store.charge("users", f"c/fill{k}", units, COST, t).excluded.any()
    assert store.charge("users", "c/over", units, COST, t).excluded.all()
    store.close()
