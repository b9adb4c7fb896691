"""A master of the Redis Cluster dies with a charge in flight and its replica takes over.

Modelled on the worker: a window is released (its noisy values claimed in the
release ledger, then published) only after its charge returned, and a charge
that failed is retried with the same charge id until it goes through. What
must hold afterwards:

* every charge a recorded release depended on is still there, and so is every
  recorded release: each returned only once a replica held it (WAIT);
* the charge in flight failed closed, and retried it charged every unit
  exactly once (groups on the surviving masters replay, the dead master's
  groups are charged anew on the promoted replica);
* while the promoted replica has no replica of its own, charges of its slots
  fail closed (WAIT cannot be met) instead of returning unreplicated;
* no unit goes over its limit.

The victim's replica is paused (SIGSTOP) and the victim drops its link to it
before the charge in flight, so the master's last writes cannot reach it:
without WAIT that charge would return, be released, and vanish with the master.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis

from stream_dp.budget import BudgetUnavailable, ChargeOutcome, RedisBudgetStore
from stream_dp.budget.keys import key_slot_of
from stream_dp.budget.redis_nodes import ReplicaWait, ReplicationShortfall, ping
from stream_dp.budget.redis_url import client_from_url
from stream_dp.worker.store.ledger import LedgerUnavailable, RedisReleaseLedger

from .cluster_support import PrivateCluster
from .support import standard_policy

WAIT = ReplicaWait(replicas=1, timeout_ms=500)
COST = 0.2  # the 1 h limit is 1.0: five charges fit, the sixth is refused


def retry_until_charged(store: RedisBudgetStore, charge_id: str, units: list[str], t: int) -> ChargeOutcome:
    """What the worker does with a window whose charge failed: the same call again, until it goes through."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return store.charge("users", charge_id, units, COST, t)
        except BudgetUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def query_on(cluster: PrivateCluster, port: int, on: bool) -> str:
    """A query name whose ledger keys live on the master at ``port`` (``on``) or on another one."""
    return next(
        q for q in (f"query-{n}" for n in range(10_000))
        if (cluster.master_of_slot(key_slot_of(f"{{{q}}}")) == port) == on
    )


def test_a_master_killed_mid_charge_loses_no_released_charge_and_charges_none_twice(private_cluster: PrivateCluster) -> None:
    cluster = private_cluster
    client = client_from_url(cluster.url, timeout_s=2.0, own_retries=False)
    store = RedisBudgetStore(client, standard_policy(), key_prefix="failover:", wait=WAIT, retries=2, backoff_s=0.05)
    ledger = RedisReleaseLedger(client_from_url(cluster.url, timeout_s=2.0), prefix="failover:ledger", wait=WAIT)
    t = int(time.time() * 1000)
    units = [f"user-{k}" for k in range(3000)]

    # The victim: the master of slot group 0 (every batch of 3000 units has units there).
    victim = cluster.master_of_slot(key_slot_of(store.keys.shard_prefix("users", 0)))
    on_victim, elsewhere = query_on(cluster, victim, True), query_on(cluster, victim, False)

    # Releases the worker recorded: (query, window) -> the charge ids they depended on.
    releases: dict[tuple[str, int], str] = {}

    def release(query: str, window: int, charge_id: str) -> bool:
        try:
            ledger.claim(query, window, f"noise of {charge_id}".encode())
        except LedgerUnavailable:
            return False
        releases[(query, window)] = charge_id
        return True

    for k in range(2):
        store.charge("users", f"q/{k}", units, COST, t)
        assert release(on_victim, k, f"q/{k}")

    replica = cluster.cut_off_replica(victim)  # from now on the victim's writes reach no replica
    # A release stored on the victim now must not be published: it could vanish with the master.
    released_unreplicated = release(on_victim, 2, "q/0")

    result: dict[str, object] = {}

    def in_flight() -> None:
        try:
            result["outcome"] = store.charge("users", "q/in-flight", units, COST, t)
        except BudgetUnavailable as exc:
            result["error"] = exc

    thread = threading.Thread(target=in_flight)
    thread.start()
    # Mid-charge: the victim ran the batch's group calls and blocks in WAIT (or, without WAIT, has answered).
    deadline = time.monotonic() + 30
    while thread.is_alive() and cluster.blocked_clients(victim) == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    waiting = cluster.blocked_clients(victim)
    cluster.kill(victim)
    cluster.resume(replica)
    thread.join(timeout=60)
    assert not thread.is_alive()
    in_flight_returned = "outcome" in result
    print(f"killed {victim} with {waiting} clients blocked in WAIT; the charge in flight "
          f"{'returned' if in_flight_returned else 'failed: ' + str(result.get('error'))[:160]}")
    if in_flight_returned:  # a worker would release the window now
        release(elsewhere, 0, "q/in-flight")

    cluster.wait_promoted(replica)
    # The promoted replica has no replica yet: its charges fail closed rather than return unreplicated.
    shortfall: BaseException | None = None
    if not in_flight_returned:
        deadline = time.monotonic() + 30
        while shortfall is None and time.monotonic() < deadline:
            try:
                store.charge("users", "q/in-flight", units, COST, t)
                break
            except BudgetUnavailable as exc:
                if isinstance(exc.__cause__, ReplicationShortfall):
                    shortfall = exc.__cause__
        assert shortfall is not None, "a charge on a master without replicas returned although WAIT could not be met"

    cluster.restart(victim)  # the old master rejoins as the new master's replica
    cluster.wait_replicated(replica)
    if not in_flight_returned:
        retry_until_charged(store, "q/in-flight", units, t)
        assert release(elsewhere, 0, "q/in-flight")

    # Every recorded release is still in the ledger (a replay would get it back, not draw new noise) ...
    problems = []
    lost_releases = [key for key in releases if ledger.get(*key) is None]
    if lost_releases:
        problems.append(f"released windows lost in the failover: {lost_releases}")
    if released_unreplicated:
        problems.append("a release no replica held was stored and so could be published")
    # ... and so is every charge they depended on, each exactly once.
    reader = RedisBudgetStore(client_from_url(cluster.url, timeout_s=2.0), standard_policy(), key_prefix="failover:")
    charges = set(releases.values())
    expected = COST * len(charges)
    spent = {u: reader.spend("users", u, t)[0].spent for u in units}
    lost = sorted(u for u, s in spent.items() if s < expected - 1e-9)
    doubled = sorted(u for u, s in spent.items() if s > expected + 1e-9)
    if lost:
        problems.append(f"{len(lost)} units lost a charge a release depended on ({sorted(charges)}), e.g. {lost[:3]}")
    if doubled:
        problems.append(f"{len(doubled)} units were charged more than once, e.g. {doubled[:3]}")
    assert not problems, "; ".join(problems)

    # And no unit goes over its limit, however often it is charged now.
    outcomes = [retry_until_charged(store, f"fill/{k}", units, t) for k in range(4)]
    assert outcomes[-1].excluded.all(), "the sixth charge of 0.2 against a limit of 1.0 was admitted"
    over = [u for u in units if reader.spend("users", u, t)[0].spent > 1.0 + 1e-9]
    assert not over, f"{len(over)} units over the 1h limit, e.g. {over[:3]}"
    store.close()
    reader.close()


def test_readiness_ping_sees_a_dead_master_and_a_master_without_replicas(private_cluster: PrivateCluster) -> None:
    """The worker's /readyz check (``redis_nodes.ping``) on a cluster: every master answers, with its replicas."""
    cluster = private_cluster
    client = client_from_url(cluster.url, timeout_s=1.0)
    assert ping(client, replicas=1)
    victim = cluster.masters()[1]
    replica = cluster.replica_of(victim)
    cluster.kill(victim)
    with pytest.raises(redis.ConnectionError, match=f"Redis Cluster master 127.0.0.1:{victim} does not answer"):
        ping(client, replicas=1)
    cluster.wait_promoted(replica)
    assert ping(client)  # the slot map is refreshed: every master answers ...
    with pytest.raises(ReplicationShortfall, match=f"127.0.0.1:{replica} has 0 replicas connected"):
        ping(client, replicas=1)  # ... but charges on the promoted one cannot be acknowledged by a replica
    cluster.restart(victim)
    cluster.wait_replicated(replica)
    assert ping(client, replicas=1)
    client.close()
