"""Every period-register backend: which windows of a period each unit took part in, at most W of them.

One suite, run against the in-memory register, one Redis and a Redis Cluster
(waiting for a replica, as a clustered worker does).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import redis

from stream_dp.budget import StoreOptions
from stream_dp.worker.store.ledger import LedgerUnavailable
from stream_dp.worker.store.period_register import (
    Participation,
    PeriodWindow,
    RedisPeriodRegister,
    classify_stored,
    standing,
)

from tests.worker._periods import HOUR_MS, backends_fixture

FIRST, MORE, REPLAY, FULL = Participation.FIRST, Participation.MORE, Participation.REPLAY, Participation.FULL
WINDOW_MS = 60_000

backends = backends_fixture(["memory", "redis", "redis-cluster"])


def window(start_ms: int, index: int, *, cap: int = 2, partition: int = 0, query: str = "q",
           settings: str = "5e771265") -> PeriodWindow:
    return PeriodWindow(query, partition, start_ms, start_ms + HOUR_MS, index, cap, settings)


def classes(values) -> list[Participation]:
    return [Participation(int(v)) for v in values]


@pytest.fixture
def register(backends):
    return backends.register(f"{backends.name}:r", StoreOptions())


def test_units_take_part_in_at_most_w_windows_of_a_period(register, backends):
    start = backends.clock.now_ms
    w1, w2, w3 = (window(start, i) for i in (1, 2, 3))
    assert classes(register.classify(w1, ["a", "b", "c"])) == [FIRST, FIRST, FIRST]
    assert classes(register.register(w1, ["a", "b"])) == [FIRST, FIRST]
    assert classes(register.classify(w1, ["a", "b", "c"])) == [REPLAY, REPLAY, FIRST]
    assert classes(register.classify(w2, ["a", "c"])) == [MORE, FIRST]
    assert classes(register.register(w2, ["a"])) == [MORE]
    assert classes(register.classify(w3, ["a", "b"])) == [FULL, MORE]
    # A FULL unit is not registered: it still holds exactly windows 1 and 2.
    assert classes(register.register(w3, ["a", "b"])) == [FULL, MORE]
    assert classes(register.classify(w3, ["a", "b"])) == [FULL, REPLAY]
    assert classes(register.classify(w1, ["a"])) == [REPLAY]
    assert classes(register.classify(w2, ["a"])) == [REPLAY]


def test_registering_a_window_again_changes_nothing(register, backends):
    w1 = window(backends.clock.now_ms, 1, cap=1)
    assert classes(register.register(w1, ["a"])) == [FIRST]
    assert classes(register.register(w1, ["a"])) == [REPLAY]
    assert classes(register.classify(window(backends.clock.now_ms, 2, cap=1), ["a"])) == [FULL]
    assert register.register(w1, []).size == 0 and register.classify(w1, []).size == 0


def test_queries_periods_and_partitions_are_apart(register, backends):
    start = backends.clock.now_ms
    register.register(window(start, 1, cap=1), ["a"])
    assert classes(register.classify(window(start, 2, cap=1), ["a"])) == [FULL]
    for other in (window(start, 2, cap=1, partition=1), window(start, 2, cap=1, query="q2"),
                  window(start + HOUR_MS, 2, cap=1), window(start, 2, cap=1, settings="0the7")):
        assert classes(register.classify(other, ["a"])) == [FIRST]
    # A period charged under other settings is another period: its registrations are its own.
    assert classes(register.register(window(start, 1, cap=1, settings="0the7"), ["a"])) == [FIRST]
    assert classes(register.classify(window(start, 2, cap=1), ["a"])) == [FULL]


def test_a_unit_that_filled_up_meanwhile_is_not_registered(register, backends):
    """Two windows of one partition charged at once (a worker that lost the partition and the one that took it):
    both saw the unit with room for one more window; only the first to register gets it."""
    start = backends.clock.now_ms
    register.register(window(start, 1), ["a"])
    w2, w3 = window(start, 2), window(start, 3)
    assert classes(register.classify(w2, ["a"])) == [MORE] == classes(register.classify(w3, ["a"]))
    assert classes(register.register(w3, ["a"])) == [MORE]
    assert classes(register.register(w2, ["a"])) == [FULL]
    assert classes(register.classify(w2, ["a"])) == [FULL]


def test_concurrent_registrations_never_exceed_w(register, backends):
    start = backends.clock.now_ms
    units = [f"u{i}" for i in range(200)]
    barrier = threading.Barrier(6)

    def run(index: int) -> np.ndarray:
        barrier.wait()
        return register.register(window(start, index, cap=3), units)

    threads, results = [], {}
    for index in range(1, 7):
        threads.append(threading.Thread(target=lambda i=index: results.__setitem__(i, run(i))))
        threads[-1].start()
    for thread in threads:
        thread.join()
    admitted = sum((results[i] != FULL).astype(int) for i in range(1, 7))
    assert (admitted == 3).all()
    # What each call says it admitted is what the register holds.
    for index in range(1, 7):
        held = register.classify(window(start, index, cap=3), units) == REPLAY
        assert (held == (results[index] != FULL)).all()


def test_unit_ids_are_kept_exactly(register, backends):
    units = ["ünï ★", "a b", "x" * 300, "\ud800surrogate", "{tag}", "1"]
    w1 = window(backends.clock.now_ms, 1, cap=1)
    assert classes(register.register(w1, units)) == [FIRST] * len(units)
    assert classes(register.classify(w1, units)) == [REPLAY] * len(units)


def test_a_period_is_forgotten_after_its_end_plus_the_stores_delays(backends):
    options = StoreOptions(max_delay_ms=HOUR_MS, max_lead_ms=60_000)
    register = backends.register(f"{backends.name}:e", options)
    now = backends.clock.now_ms
    current = window(now - HOUR_MS // 2, 1)  # ends in half an hour
    register.register(current, ["a"])
    expired = window(now - 3 * HOUR_MS, 1)  # ended two hours ago: its charges are out of range
    assert classes(register.register(expired, ["a"])) == [FIRST]
    assert classes(register.classify(expired, ["a"])) == [FIRST]  # nothing was kept
    keep_until = current.period_end_ms + options.record_ttl_ms
    if backends.client is None:
        backends.clock.now_ms = keep_until - 1
        assert classes(register.classify(current, ["a"])) == [REPLAY]
        backends.clock.now_ms = keep_until
        assert classes(register.classify(current, ["a"])) == [FIRST]
    else:
        # Redis expires on its own clock, which the test clock only approximates.
        expires_at = backends.client.pexpiretime(register.key(current))
        assert expires_at == keep_until


def test_large_windows_are_registered_in_several_calls(backends):
    split = {} if backends.client is None else {"units_per_call": 7}  # the memory register has no calls to split
    register = backends.register(f"{backends.name}:s", StoreOptions(), **split)
    start = backends.clock.now_ms
    units = [f"u{i}" for i in range(50)]
    register.register(window(start, 1, cap=1), units[:20])
    got = classes(register.register(window(start, 2, cap=1), units))
    assert got == [FULL] * 20 + [FIRST] * 30
    assert classes(register.classify(window(start, 2, cap=1), units)) == [FULL] * 20 + [REPLAY] * 30


def test_classification_rule():
    w = (7).to_bytes(4, "big")
    assert standing(None, w, 2) == FIRST and standing(b"", w, 2) == FIRST
    assert standing((3).to_bytes(4, "big"), w, 2) == MORE
    assert standing((3).to_bytes(4, "big") + w, w, 2) == REPLAY
    assert standing((3).to_bytes(4, "big") + (5).to_bytes(4, "big"), w, 2) == FULL
    # A window index is matched on whole 4-byte entries, never across two.
    assert standing(b"\x00\x00\x00\x00\x07\x00\x00\x00", w, 3) == MORE
    pw = window(0, 7)
    assert classes(classify_stored([None, w], pw)) == [FIRST, REPLAY]


def test_windows_must_be_in_range():
    with pytest.raises(ValueError, match="count from 1"):
        window(0, 0)
    with pytest.raises(ValueError, match="empty"):
        PeriodWindow("q", 0, 10, 10, 1, 1, "5e771265")
    with pytest.raises(ValueError, match="settings"):
        window(0, 1, settings="")
    with pytest.raises(ValueError, match="settings"):
        window(0, 1, settings="a}b")


def test_redis_down_raises_ledger_unavailable():
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    register = RedisPeriodRegister(client, options=StoreOptions())
    try:
        with pytest.raises(LedgerUnavailable, match="period register unavailable"):
            register.classify(window(0, 1), ["a"])
        with pytest.raises(LedgerUnavailable, match="period register unavailable"):
            register.register(window(0, 1), ["a"])
    finally:
        client.close()
