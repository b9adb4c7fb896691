"""The store guard: which Redis states it accepts, completes or refuses, on every marker backend.

The verdicts are checked against a table written from the rules in
``stream_dp.worker.guard.store``'s docstring; the Redis backends are checked on
the real servers, the cluster one also for where its markers land.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import pytest

from stream_dp.budget.redis_nodes import ReplicaWait
from stream_dp.budget.redis_url import client_from_url
from stream_dp.worker.guard.store import (
    MARKERS,
    MemoryStoreMarkers,
    RedisStoreMarkers,
    StoreGuard,
    StoreReplaced,
    check,
    judge,
)
from stream_dp.worker.kafka.commit_metadata import encode_commit_metadata

T, U = "a" * 32, "b" * 32
ALL_T = [T] * MARKERS
HALF_T = [T if i % 2 else None for i in range(MARKERS)]
NONE = [None] * MARKERS


@pytest.mark.parametrize(
    ("markers", "committed", "expect"),
    [
        (ALL_T, [], "ok"),  # verified, nothing committed yet
        (ALL_T, [T], "ok"),  # the store the progress was made with
        (NONE, [], "new"),  # a new deployment
        (HALF_T, [], "complete"),  # a first start cut short
        (NONE, [T], "refuse"),  # emptied: flushed, restarted without its AOF, another server
        (ALL_T, [U], "refuse"),  # another store altogether
        (ALL_T, [T, U], "refuse"),  # partitions committed with two stores
        (HALF_T, [T], "refuse"),  # a node lost its data after progress was committed
        ([T, U] + [T] * (MARKERS - 2), [], "refuse"),  # markers of two stores
    ],
)
def test_verdicts(markers, committed, expect):
    verdict = judge(markers, committed)
    outcome = ("refuse" if verdict.problem else "new" if not any(markers) and verdict.fill
               else "complete" if verdict.fill else "ok")
    assert outcome == expect, verdict
    if expect in ("ok", "complete"):
        assert verdict.token == T
    if expect == "new":
        assert verdict.token is not None and len(verdict.token) == 32


def test_refusal_says_what_happened_and_how_to_fix_it():
    markers = MemoryStoreMarkers()
    with pytest.raises(StoreReplaced) as raised:
        check(markers, [T])
    message = str(raised.value)
    assert T in message and "holds no store token" in message
    assert "restore" in message and "STREAM_DP_GROUP_ID" in message
    assert markers.read() == NONE  # refusing writes nothing


def _metadata(token: str | None) -> str:
    return encode_commit_metadata({}, {}, 0, None, store=token)


def test_guard_waits_for_redis_then_refuses_a_store_that_lost_what_it_acknowledged():
    class Flaky(MemoryStoreMarkers):
        down = True

        def read(self):
            if self.down:
                raise ConnectionError("redis down")
            return super().read()

    markers = Flaky()
    group: list[str] = []  # the commit metadata of every partition of the group
    guard = StoreGuard(markers, lambda: list(group), retry_s=0.0)
    assert not guard.verify() and not guard.ready()  # no answer: nothing charged, no failure either
    markers.down = False
    assert guard.verify() and guard.ready()
    token = guard.token
    assert markers.read() == [token] * MARKERS

    group[:] = [_metadata(token), _metadata(None), "not json"]
    guard.note_assignment()  # the same store named again: verified again
    assert not guard.ready() and guard.verify() and guard.token == token
    group.append(_metadata(U))  # a partition committed with another store
    guard.note_assignment()
    assert not guard.ready()
    with pytest.raises(StoreReplaced, match=U):
        guard.verify()
    with pytest.raises(StoreReplaced):
        guard.verify()  # and stays refused
    assert not guard.ready()


def test_a_group_whose_commits_cannot_be_read_is_not_taken_for_a_new_deployment():
    """Unreadable commits are no evidence that none names a store: nothing is verified (and no marker
    written) until they are read."""
    markers = MemoryStoreMarkers()
    broker_up = False

    def read_group():
        if not broker_up:
            raise TimeoutError("group coordinator not available")
        return [_metadata(T)]

    guard = StoreGuard(markers, read_group, retry_s=0.0)
    assert not guard.verify() and not guard.ready()
    assert markers.read() == NONE
    broker_up = True
    with pytest.raises(StoreReplaced, match=T):  # the group's commits name a store this empty Redis is not
        guard.verify()
    assert markers.read() == NONE


URL_FIXTURES = {"redis": "redis_url", "redis-cluster": "redis_cluster_url"}


@pytest.fixture(params=["memory", "redis", "redis-cluster"])
def markers(request, unique_name):
    if request.param == "memory":
        yield MemoryStoreMarkers()
        return
    client = client_from_url(request.getfixturevalue(URL_FIXTURES[request.param]), timeout_s=5.0)
    wait = ReplicaWait(1, 2000) if request.param == "redis-cluster" else None
    made = RedisStoreMarkers(client, prefix=f"{unique_name}:ledger", wait=wait)
    made.client = client
    yield made
    for key in made.keys:
        client.delete(key)
    client.close()


def test_first_fill_wins_and_every_marker_ends_with_its_token(markers):
    assert markers.read() == NONE
    with ThreadPoolExecutor(4) as pool:  # workers starting together
        results = list(pool.map(markers.fill, [f"{i:032x}" for i in range(8)]))
    (token,) = {t for result in results for t in result}
    assert markers.read() == [token] * MARKERS
    assert check(markers, [token]) == token


def test_a_lost_node_is_caught_once_progress_names_the_store(markers):
    token = check(markers, [])
    if isinstance(markers, MemoryStoreMarkers):
        markers._held[3] = None
    else:
        markers.client.delete(markers.keys[3])
    with pytest.raises(StoreReplaced, match=f"1 of {MARKERS} store markers are gone"):
        check(markers, [token])


def test_cluster_markers_reach_every_master(redis_cluster_url, unique_name):
    client = client_from_url(redis_cluster_url, timeout_s=5.0)
    try:
        made = RedisStoreMarkers(client, prefix=f"{unique_name}:ledger")
        masters = {(n.host, n.port) for n in client.get_primaries()}
        holding = {(n.host, n.port) for n in (client.get_node_from_key(key) for key in made.keys)}
        assert holding == masters and len(masters) >= 3
    finally:
        client.close()


def test_a_store_emptied_under_a_running_worker_is_caught_by_the_next_check():
    markers = MemoryStoreMarkers()
    guard = StoreGuard(markers, recheck_s=3600.0)
    assert guard.verify() and not guard.due()
    markers._held = list(NONE)  # Redis restarted without its data
    assert guard.verify()  # not due yet: the last check stands
    guard._next_recheck_s = -math.inf  # the recheck interval has passed
    assert guard.due()
    with pytest.raises(StoreReplaced, match="holds no store token"):
        guard.verify()
    assert not guard.ready() and markers.read() == NONE  # nothing written into the empty store


def test_after_a_failed_call_nothing_is_charged_until_the_markers_are_read_again():
    markers = MemoryStoreMarkers()
    guard = StoreGuard(markers, recheck_s=3600.0)
    assert guard.verify()
    token = guard.token
    guard.suspect()  # a charge found Redis unavailable
    assert not guard.ready() and guard.due()
    assert guard.verify() and guard.token == token  # the same store came back
    guard.suspect()
    markers._held = list(NONE)  # ... or it came back empty
    with pytest.raises(StoreReplaced):
        guard.verify()


def test_every_64_slot_band_holds_a_marker():
    """So any master serving 128 contiguous slots holds at least one whole band, and a marker (slots
    computed here with redis-py's own CRC16, not the project's helper)."""
    from redis.crc import key_slot

    keys = RedisStoreMarkers(None, prefix="stream-dp:ledger").keys
    bands = sorted(key_slot(key.encode()) // 64 for key in keys)
    assert bands == list(range(16384 // 64)) and len(keys) == MARKERS
