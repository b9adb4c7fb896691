"""Every ledger backend: a window's release is stored once and read back unchanged.

On a Redis Cluster the ledger waits for one replica before a stored release is used, as a clustered worker does.
"""

import pytest
import redis

from stream_dp.budget.redis_nodes import ReplicaWait
from stream_dp.budget.redis_url import client_from_url
from stream_dp.worker.ledger import LedgerUnavailable, MemoryReleaseLedger, RedisReleaseLedger

URL_FIXTURES = {"redis": "redis_url", "redis-cluster": "redis_cluster_url"}


def _client_and_wait(request, backend):
    client = client_from_url(request.getfixturevalue(URL_FIXTURES[backend]), timeout_s=5.0)
    return client, (ReplicaWait(1, 2000) if backend == "redis-cluster" else None)


@pytest.fixture(params=["memory", "redis", "redis-cluster"])
def ledger(request, unique_name):
    if request.param == "memory":
        yield MemoryReleaseLedger()
        return
    client, wait = _client_and_wait(request, request.param)
    yield RedisReleaseLedger(client, prefix=f"{unique_name}:ledger", wait=wait)
    for key in client.scan_iter(f"{unique_name}:*"):
        client.delete(key)
    client.close()


def test_first_claim_wins_and_later_claims_get_the_stored_values(ledger):
    records = [(b'["/a"]', b'{"count":5}'), (b'["/b"]', b'{"count":7,"note":"tab\\tnewline\\n"}')]
    first = ledger.claim("q", 0, records)
    assert first.newly_written and not first.published and first.records == records
    second = ledger.claim("q", 0, [(b'["/a"]', b'{"count":999}')])
    assert not second.newly_written and second.records == records
    ledger.mark_published("q", 0)
    assert ledger.get("q", 0).published
    assert ledger.get("q", 60_000) is None
    assert ledger.claim("q", 60_000, []).records == []


def test_released_through_only_moves_forward(ledger):
    assert ledger.released_through("q", 0) is None
    ledger.raise_released_through("q", 0, 120_000)
    ledger.raise_released_through("q", 0, 60_000)
    ledger.raise_released_through("q", 1, 60_000)
    assert ledger.released_through("q", 0) == 120_000
    assert ledger.released_through("q", 1) == 60_000


def test_redis_down_raises_ledger_unavailable():
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    ledger = RedisReleaseLedger(client)
    try:
        with pytest.raises(LedgerUnavailable, match="not publishing"):
            ledger.claim("q", 0, [])
    finally:
        client.close()


def test_charge_journal_keeps_the_first_unit_list(ledger):
    assert ledger.remember_units("q/0/1", ["u1", "u2"]) == ["u1", "u2"]
    assert ledger.remember_units("q/0/1", ["u1", "u3", "u4"]) == ["u1", "u2"]
    assert ledger.remember_units("q/0/2", []) == []
    assert ledger.remember_units("q/0/2", ["u9"]) == []


@pytest.mark.parametrize("backend", ["redis", "redis-cluster"])
def test_released_through_mark_never_expires(request, backend, unique_name):
    """Window entries expire with the ledger TTL; the mark that says "released through" must not."""
    client, wait = _client_and_wait(request, backend)
    prefix = f"{unique_name}:ledger"
    ledger = RedisReleaseLedger(client, prefix=prefix, ttl_s=3_600, wait=wait)
    mark = f"{prefix}:{{q}}:released-through:0"
    try:
        ledger.claim("q", 0, [])
        ledger.raise_released_through("q", 0, 60_000)
        assert 0 < client.ttl(f"{prefix}:{{q}}:0") <= 3_600  # the window entry does expire
        assert client.ttl(mark) == -1
        # A mark written by an earlier version carries a TTL: the next raise, even one
        # that does not move it, makes it durable.
        client.expire(mark, 100)
        ledger.raise_released_through("q", 0, 30_000)
        assert client.ttl(mark) == -1 and ledger.released_through("q", 0) == 60_000
    finally:
        for key in client.scan_iter(f"{unique_name}:*"):
            client.delete(key)
        client.close()
