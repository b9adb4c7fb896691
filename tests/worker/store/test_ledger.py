"""Every ledger backend: a window's release is stored once and read back unchanged.

On a Redis Cluster the ledger waits for one replica before a stored release is used, as a clustered worker does.
"""

import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from stream_dp.budget.redis_nodes import ReplicaWait
from stream_dp.budget.redis_url import client_from_url
from stream_dp.worker.release.entry import decode_entry, pack_records
from stream_dp.worker.store.ledger import LedgerUnavailable, MemoryReleaseLedger, RedisReleaseLedger

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
    for key in client.scan_iter(f"{unique_name}:*", count=10_000):
        client.delete(key)
    client.close()


def test_first_claim_wins_and_later_claims_get_the_stored_values(ledger):
    payload = b"\x00SDP release of window 0 \t\n" + bytes(range(256))
    first = ledger.claim("q", 0, payload)
    assert first.newly_written and not first.published and first.payload == payload
    second = ledger.claim("q", 0, b"another draw")
    assert not second.newly_written and second.payload == payload
    ledger.mark_published("q", 0)
    assert ledger.get("q", 0).published and ledger.get("q", 0).payload == payload
    assert ledger.get("q", 60_000) is None
    assert ledger.claim("q", 60_000, b"").payload == b""


def test_released_through_only_moves_forward(ledger):
    assert ledger.released_through("q", 0) is None
    ledger.raise_released_through("q", 0, 120_000)
    ledger.raise_released_through("q", 0, 60_000)
    ledger.raise_released_through("q", 1, 60_000)
    assert ledger.released_through("q", 0) == 120_000
    assert ledger.released_through("q", 1) == 60_000


def test_the_first_publication_start_is_kept(ledger):
    before = int(time.time() * 1000)
    first = ledger.publication_start("q", 5_000)
    assert before - 5_000 <= first <= int(time.time() * 1000) - 5_000  # the store's clock, less the lateness
    time.sleep(0.01)
    assert ledger.publication_start("q", 0) == first  # a later worker, or a restart: the first start stays
    assert ledger.publication_start("other", 0) > first


@pytest.mark.parametrize("backend", ["redis", "redis-cluster"])
def test_publication_start_never_expires_and_continues_an_earlier_versions_start(request, backend, unique_name):
    """A query an earlier version released keeps the first window it released (its expiring ``start`` key)."""
    client, wait = _client_and_wait(request, backend)
    prefix = f"{unique_name}:ledger"
    ledger = RedisReleaseLedger(client, prefix=prefix, ttl_s=3_600, wait=wait)
    try:
        client.set(f"{prefix}:{{old}}:start", 120_000, ex=3_600)
        assert ledger.publication_start("old", 1_000) == 120_000
        client.delete(f"{prefix}:{{old}}:start")  # expired
        assert ledger.publication_start("old", 1_000) == 120_000
        assert ledger.publication_start("new", 1_000) > 120_000
        for query in ("old", "new"):
            assert client.ttl(f"{prefix}:{{{query}}}:publication-start") == -1
    finally:
        for key in client.scan_iter(f"{unique_name}:*"):
            client.delete(key)
        client.close()


def test_redis_down_raises_ledger_unavailable():
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    ledger = RedisReleaseLedger(client)
    try:
        with pytest.raises(LedgerUnavailable, match="not publishing"):
            ledger.claim("q", 0, b"")
        with pytest.raises(LedgerUnavailable, match="publication start"):
            ledger.publication_start("q", 0)
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
        ledger.claim("q", 0, b"")
        ledger.raise_released_through("q", 0, 60_000)
        assert 0 < client.ttl(f"{prefix}:{{q}}:0") <= 3_600  # the window entry does expire
        assert client.ttl(mark) == -1
        # A mark written by an earlier version carries a TTL: the next raise, even one
        # that does not move it, makes it durable.
        client.expire(mark, 100)
        ledger.raise_released_through("q", 0, 30_000)
        assert client.ttl(mark) == -1 and ledger.released_through("q", 0) == 60_000
    finally:
        for key in client.scan_iter(f"{unique_name}:*", count=10_000):
            client.delete(key)
        client.close()


@pytest.fixture(params=["redis", "redis-cluster"])
def small_chunks(request, unique_name):
    client, wait = _client_and_wait(request, request.param)
    yield client, RedisReleaseLedger(client, prefix=f"{unique_name}:ledger", chunk_bytes=1_000, wait=wait)
    for key in client.scan_iter(f"{unique_name}:*", count=10_000):
        client.delete(key)
    client.close()


def test_large_entries_are_stored_in_values_no_larger_than_a_chunk(small_chunks, unique_name):
    client, ledger = small_chunks
    payload = bytes(range(256)) * 41  # 10,496 bytes: 11 chunks
    assert ledger.claim("q", 0, payload).newly_written
    key = f"{unique_name}:ledger:{{q}}:0"
    fields = client.hgetall(key)
    pieces = {k: v for k, v in fields.items() if k.startswith(b"c") and k != b"chunks"}
    assert len(pieces) == 11 and max(map(len, pieces.values())) == 1_000 and fields[b"chunks"] == b"11"
    assert 0 < client.ttl(key) <= 7 * 86_400
    assert ledger.claim("q", 0, b"other draw" * 500).payload == payload
    ledger.mark_published("q", 0)
    assert ledger.get("q", 0).payload == payload and ledger.get("q", 0).published
    assert not list(client.scan_iter(f"{unique_name}:*staging*", count=10_000))  # the loser's staged chunks are gone
    units = [f"unit-{i}" for i in range(3_000)]
    assert ledger.remember_units("q/0/1", units) == units  # journals are chunked the same way
    assert ledger.remember_units("q/0/1", ["other"]) == units


def test_concurrent_claims_of_one_window_store_exactly_one_draw(small_chunks):
    _, ledger = small_chunks
    draws = [bytes([i]) * 5_000 for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda d: ledger.claim("q", 60_000, d), draws))
    assert sum(r.newly_written for r in results) == 1
    (winner,) = [r.payload for r in results if r.newly_written]
    assert all(r.payload == winner for r in results) and ledger.get("q", 60_000).payload == winner


def test_entries_and_journals_of_earlier_versions_are_still_read(small_chunks, unique_name):
    client, ledger = small_chunks
    old = pack_records([(b'["/a"]', b'{"count":5}')])
    client.hset(f"{unique_name}:ledger:{{q}}:0", mapping={"payload": old, "state": "published"})
    assert ledger.claim("q", 0, b"new draw").payload == old
    stored = ledger.get("q", 0)
    assert stored.published and decode_entry(stored.payload).render() == [(b'["/a"]', b'{"count":5}')]
    client.set(f"{unique_name}:ledger:units:{{q/0/1}}", zlib.compress("u1\0u2".encode(), 1))
    assert ledger.remember_units("q/0/1", ["u3"]) == ["u1", "u2"]


class _FillsUpAfterOneStagedChunk:
    """A client whose Redis fills up (``maxmemory`` 1 byte) right after the first staged chunk is written,
    as if other writers had taken the rest of its memory."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def __getattr__(self, name: str):
        return getattr(self._client, name)

    def hset(self, key, *args, **kwargs):
        written = self._client.hset(key, *args, **kwargs)
        if b":staging:" in (key if isinstance(key, bytes) else key.encode()):
            self._client.config_set("maxmemory", "1")
        return written


@pytest.mark.services
def test_a_full_redis_refuses_the_claim_with_the_fix_and_leaves_no_staging_key_without_a_ttl(tmp_path):
    """A private Redis (noeviction) that fills up while a large entry is being staged: the claim fails
    naming the fix, nothing is stored, and the staging key it began leaves with its TTL."""
    import os

    from tests.reliability.services import PrivateRedis

    server = PrivateRedis(tmp_path / "redis")
    server.start()
    try:
        client = server.client()
        ledger = RedisReleaseLedger(_FillsUpAfterOneStagedChunk(client), prefix="full:ledger", chunk_bytes=64 * 1024)
        with pytest.raises(LedgerUnavailable, match=r"out of memory .*Raise its maxmemory"):
            ledger.claim("q", 0, os.urandom(4 * 64 * 1024))
        staging = list(client.scan_iter("full:ledger:*:staging:*"))
        assert len(staging) == 1, staging
        assert all(client.ttl(key) > 0 for key in staging), [(key, client.ttl(key)) for key in staging]
        client.config_set("maxmemory", "0")
        assert ledger.get("q", 0) is None  # nothing claimed: the window is drawn and stored when Redis has room
    finally:
        server.stop()
