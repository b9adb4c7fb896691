"""Faults replayed step by step with one worker: each test pins one failure mode at an exact step.

Each test drives a real worker process (real Kafka, a private Redis behind
the fault proxy) through a fault at an exact step and then checks one
invariant from the topics: a late event first seen after a restart is
dead-lettered; a window held during a Redis outage survives a stop or a
crash; a crash between charge and publish with a different replay batch
keeps the window; windows held by an outage are charged in window order and
none is lost when released out of order; empty windows are released on
every home partition.
"""

from __future__ import annotations

import time

import pytest

from tests.reliability.redis_proxy import Trigger, is_budget_charge
from tests.reliability.scenario import Scenario
from tests.reliability.topics import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.services]


def _units(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i:03d}" for i in range(n)]


def test_a_late_event_first_seen_after_a_restart_is_dead_lettered(scenario):
    s = scenario()
    s.produce([s.event(u, 0) for u in _units("a", 20)] + s.closers(1))
    s.start_worker()
    assert s.wait_released(0, 60), "window 0 was not released"
    assert s.worker.stop() == 0  # a clean stop commits offsets with closed_through past window 1
    (late_offset,) = s.produce([s.event("late-unit", 0, page="search")])
    s.start_worker()

    def dead_lettered() -> bool:
        return any(d.headers.get("source") == f"{s.input_topic}/0/{late_offset}".encode() for d in s.dead_letters())

    assert wait_until(dead_lettered, 20, 1.0), (
        f"the late event at offset {late_offset} never reached the dead-letter topic; worker metrics say "
        f"replayed={s.metric('stream_dp_events_total', outcome='replayed')}, "
        f"late={s.metric('stream_dp_events_total', outcome='late')}"
    )


@pytest.mark.parametrize("stop", ["sigterm", "kill -9"])
def test_a_window_held_during_a_redis_outage_survives_a_restart(scenario, stop):
    s = scenario()
    units = _units("h", 30)
    s.redis.stop()
    s.start_worker()
    s.produce([s.event(u, 0) for u in units] + s.closers(0))
    assert wait_until(lambda: s.metric("stream_dp_pending_charges") >= 1, 30, 0.3), "window 0 was never held"
    time.sleep(2.5)  # at least one offset commit (every second) while the window is held
    if stop == "sigterm":
        s.worker.stop()
    else:
        s.worker.kill()
    s.redis.start()
    s.start_worker()
    assert s.wait_released(0, 40), "window 0 was never released after the restart"
    counts = [p.count.sum() for p in s.partials()[s.window_start(0)]]
    assert counts and all(c == len(units) for c in counts), counts


def test_a_crash_after_the_charge_with_a_different_replay_batch_keeps_the_window(scenario):
    s = scenario()
    units = _units("c", 25)
    trigger = s.proxy.arm(Trigger(is_budget_charge, occurrence=1, forward=True))
    s.start_worker()
    s.produce([s.event(u, 0) for u in units] + s.closers(0))
    assert trigger.fired.wait(30), "the worker never charged window 0"
    s.worker.kill()  # the charge is in Redis, the partial was never published
    s.proxy.drop_frozen()
    s.produce([s.event("late-unit", 0, page="search")])  # late: window 0 had closed before it was sent
    s.start_worker()
    conflict = "already charged with other units"
    assert s.wait_released(0, 40), (
        f"window 0 was never released; the worker log {'reports' if conflict in s.worker.log_text() else 'lacks'} "
        f"'{conflict}'"
    )
    partials = s.partials()[s.window_start(0)]
    assert partials and partials[0].count.sum() == len(units), [p.count.tolist() for p in partials]


@pytest.fixture(scope="module", params=["down_from_the_start", "down_after_the_first_check"])
def reordered(request, tmp_path_factory, kafka_bootstrap):
    """Redis is down: window 0 closes and is held, window 1 closes and is held too; Redis returns.

    Down from the start, the worker cannot even verify its store (``guard.store``); down after it
    did, window 0's charge fails and the worker waits to verify the store again. Either way both
    windows wait uncharged, whatever backoff a charge would be at, and once Redis answers they are
    charged in window order. The budget covers one window, every unit is in both. Returns the
    partials and releases of windows 0 and 1.
    """
    s = Scenario(tmp_path_factory.mktemp("reordered"), kafka_bootstrap, budget_windows=1)
    try:
        units = _units("r", 20)
        if request.param == "down_from_the_start":
            s.redis.stop()
            s.start_worker()
        else:
            s.start_worker()
            assert wait_until(lambda: s.metric("stream_dp_store_checks_total", outcome="verified") >= 1, 40, 0.2)
            s.redis.stop()
        s.produce([s.event(u, 0) for u in units] + s.closers(0))

        def held() -> float:
            return s.metric("stream_dp_pending_charges")

        assert wait_until(lambda: held() >= 1, 40, 0.2), "window 0 was not held while Redis was down"
        s.produce([s.event(u, 1) for u in units] + s.closers(1))
        assert wait_until(lambda: held() >= 2, 40, 0.2), "window 1 was not held while Redis was down"
        # Held for the outage: a charge that failed, or one not sent because the store was not verified.
        assert wait_until(lambda: sum(s.metric("stream_dp_budget_failures_total", kind=kind)
                                      for kind in ("unavailable", "store_unverified")) >= 1, 20, 0.2)
        s.redis.start()
        released = wait_until(lambda: {s.window_start(0), s.window_start(1)} <= s.releases().keys(), 40, 1.0)
        yield s, released, s.partials()
    finally:
        s.close()


def test_windows_held_by_an_outage_are_charged_in_window_order(reordered):
    s, _, partials = reordered
    first = partials[s.window_start(0)]
    second = partials[s.window_start(1)]
    assert first and second, "both windows' partials must be published"
    assert (first[0].units_excluded, second[0].units_excluded) == (0, 20), (
        f"window 0 excluded {first[0].units_excluded} units, window 1 excluded {second[0].units_excluded}"
    )


def test_a_window_released_out_of_order_is_not_lost(reordered):
    s, released, _ = reordered
    assert released, f"window 0 was never released (windows released: {sorted(s.releases())})"


def test_empty_windows_are_released_on_every_home(scenario):
    from stream_dp.worker.partials.homes import window_home

    s = scenario(partials_partitions=2)
    # Homes are hashed from the (random) query name: take data windows on window 0's home up to the
    # first one that follows a window homed elsewhere, so there are empty windows on the other home.
    homes = [window_home(s.query, s.window_start(k), 2) for k in range(64)]
    data_home = homes[0]
    other = next(k for k in range(64) if homes[k] != data_home)  # all 64 on one home: p = 2^-63
    last = next(k for k in range(other, 64) if homes[k] == data_home)
    with_data = [k for k in range(last + 1) if homes[k] == data_home]
    empty = [k for k in range(last) if homes[k] != data_home]
    s.produce([s.event(f"e-{k}-{i}", k) for k in with_data for i in range(5)] + s.closers(max(with_data) + 1))
    s.start_worker()
    assert s.wait_released(max(with_data), 60), "the last window with data was never released"
    released = wait_until(lambda: all(s.window_start(k) in s.releases() for k in empty), 20, 1.0)
    assert released, (
        f"windows with data {with_data} (home {data_home}) were released, empty windows {empty} (other home) "
        f"were not: {sorted(k for k in empty if s.window_start(k) not in s.releases())} missing"
    )


@pytest.mark.parametrize("outage_s", [2.0, 24.0], ids=["within_the_output_wait", "longer_than_the_output_wait"])
def test_a_broker_killed_as_a_window_is_published_holds_it_until_the_broker_returns(tmp_path, outage_s):
    """The broker dies between the ledger claim and the publish: the worker waits for it (or, past
    ``STREAM_DP_OUTPUT_WAIT_S``, here 20 s, holds the window and tries again), keeps running, and publishes
    the window once the broker is back: its records, once per group."""
    from tests.reliability.redis_proxy import is_ledger_claim
    from tests.reliability.services import PrivateKafka

    kafka = PrivateKafka(tmp_path / "kafka")
    kafka.start()
    s = Scenario(tmp_path, kafka.bootstrap, worker_env={"STREAM_DP_OUTPUT_WAIT_S": "20"})
    try:
        units = _units("b", 20)
        s.start_worker()
        entry = f"stream-dp:ledger:{{{s.query}}}:{s.window_start(0)}".encode()  # window 0's ledger entry
        s.proxy.hold(lambda command: is_ledger_claim(command) and command[3] == entry)
        s.produce([s.event(u, 0, page=("home", "search")[i % 2]) for i, u in enumerate(units)] + s.closers(0))
        assert wait_until(lambda: s.proxy.holding >= 1, 40, 0.1), "the worker never claimed window 0"
        s.close_producer()
        kafka.stop(crash=True)
        s.proxy.release_holds()  # the claim reaches Redis; the publish finds no broker
        time.sleep(outage_s)
        assert s.worker.alive, f"the worker exited ({s.worker.reap()}) while the broker was down; see {s.worker.log_path}"
        kafka.start()
        wait_until(lambda: s.window_start(0) in s.releases() or not s.worker.alive, 90, 1.0)
        assert s.worker.alive, f"the worker exited ({s.worker.reap()}) after the outage; see {s.worker.log_path}"
        assert s.wait_released(0, 1), f"window 0 was never released after the broker returned; see {s.worker.log_path}"
        time.sleep(3)  # a second publish of the window would follow at once
        records = s.releases()[s.window_start(0)]
        assert sorted(r["group"]["page"] for r in records) == ["home", "search"], records
        assert s.worker.alive, f"the worker exited ({s.worker.reap()}); see {s.worker.log_path}"
    finally:
        s.close()
        kafka.stop(crash=True)
