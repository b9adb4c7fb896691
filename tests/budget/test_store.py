"""One suite, both backends: every behaviour a worker relies on, on real Redis and in memory."""

from __future__ import annotations

import numpy as np
import pytest

from stream_dp.budget import (
    BudgetPolicy,
    BudgetStore,
    ChargeConflict,
    ChargeOutOfRange,
    HorizonLimit,
    NamespacePolicy,
    StoreOptions,
)
from stream_dp.budget.layout import StorageLayout
from stream_dp.budget.ledger import NamespaceLedger
from stream_dp.budget.policy import zcdp_to_epsilon

from .support import DAY_MS, HOUR_MS, Clock, StoreFactory, standard_policy

MINUTE_MS = 60_000


def spent(store, unit: str, now_ms: int, namespace: str = "users") -> list[float]:
    return [h.spent for h in store.spend(namespace, unit, now_ms)]


def test_ten_tenths_fill_a_limit_of_one(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store()
    assert isinstance(store, BudgetStore)
    t = clock.now_ms
    outcomes = [store.charge("users", f"q/{k}", ["alice"], 0.1, t) for k in range(11)]
    assert [bool(o.excluded[0]) for o in outcomes] == [False] * 10 + [True]
    assert [o.charged for o in outcomes] == [1] * 10 + [0]
    assert spent(store, "alice", t) == [1.0, 1.0]


def test_exclusion_is_aligned_with_the_units(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store()
    t = clock.now_ms
    store.charge("users", "warmup", ["bob"], 0.9, t)
    outcome = store.charge("users", "q/1", ["alice", "bob", "carol"], 0.2, t)
    assert outcome.excluded.dtype == bool
    assert outcome.excluded.tolist() == [False, True, False]
    assert outcome.charged == 2
    assert outcome.excluded_by_horizon == {"1h": 1, "1d": 0}
    assert not outcome.replayed
    assert spent(store, "bob", t) == [0.9, 0.9]
    assert spent(store, "carol", t) == [pytest.approx(0.2), pytest.approx(0.2)]


def test_a_late_window_is_checked_against_later_spending(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store()
    t = clock.now_ms
    assert store.charge("users", "q/late", ["alice"], 0.6, t).charged == 1
    # A window 50 minutes older closes late; a backward-only check would admit it.
    late = store.charge("users", "q/early", ["alice"], 0.6, t - 50 * MINUTE_MS)
    assert late.excluded.tolist() == [True]
    # The other way round too.
    assert store.charge("users", "r/early", ["bob"], 0.6, t - 50 * MINUTE_MS).charged == 1
    assert store.charge("users", "r/late", ["bob"], 0.6, t).excluded.tolist() == [True]


def test_hourly_budget_rolls_over(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store()
    t = clock.now_ms
    assert store.charge("users", "w/0", ["alice"], 1.0, t).charged == 1
    clock.advance(75 * MINUTE_MS)  # one horizon plus one bucket later
    assert store.charge("users", "w/75", ["alice"], 1.0, t + 75 * MINUTE_MS).charged == 1
    # A window at t + 60 min shares a run of buckets with both: refused.
    assert store.charge("users", "w/60", ["alice"], 0.1, t + 60 * MINUTE_MS).excluded.tolist() == [True]


def test_daily_backstop_binds_when_hours_do_not(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store()
    t0 = clock.now_ms
    for k in range(4):
        clock.now_ms = t0 + k * 75 * MINUTE_MS
        outcome = store.charge("users", f"d/{k}", ["alice"], 1.0, clock.now_ms)
        assert outcome.charged == 1
    clock.now_ms = t0 + 4 * 75 * MINUTE_MS
    outcome = store.charge("users", "d/4", ["alice"], 1.0, clock.now_ms)
    assert outcome.excluded.tolist() == [True]
    assert outcome.excluded_by_horizon == {"1h": 0, "1d": 1}
    report = store.spend("users", "alice", clock.now_ms)
    assert [(h.horizon_ms, h.spent, h.limit, h.fraction) for h in report] == [
        (HOUR_MS, 0.0, 1.0, 0.0),
        (DAY_MS, 4.0, 4.0, 1.0),
    ]


def test_alerts_on_crossing_and_on_refusal(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store()
    t = clock.now_ms
    first = store.charge("users", "a/1", ["alice", "bob"], 0.85, t)
    assert [(a.unit, a.horizon_ms, a.threshold, a.exhausted) for a in first.alerts] == [
        ("alice", HOUR_MS, 0.8, False),
        ("bob", HOUR_MS, 0.8, False),
    ]
    alert = first.alerts[0]
    assert (alert.namespace, alert.spent, alert.limit, alert.time_ms, alert.accounting) == (
        "users",
        0.85,
        1.0,
        t,
        "epsilon",
    )
    refused = store.charge("users", "a/2", ["alice"], 0.2, t)
    assert refused.excluded.tolist() == [True]
    assert [(a.threshold, a.exhausted, a.spent) for a in refused.alerts] == [(1.0, True, 0.85)]
    # Each threshold alerts once per horizon length...
    assert store.charge("users", "a/3", ["alice"], 0.2, t).alerts == []
    # ...and again once its entry has lapsed.
    clock.advance(2 * HOUR_MS)
    again = store.charge("users", "a/4", ["alice"], 0.85, clock.now_ms)
    assert [(a.horizon_ms, a.threshold) for a in again.alerts] == [(HOUR_MS, 0.8)]


def test_retry_replays_the_first_decision(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store()
    t = clock.now_ms
    store.charge("users", "warmup", ["bob"], 0.9, t)
    first = store.charge("users", "q/7/0", ["alice", "bob"], 0.5, t)
    retry = store.charge("users", "q/7/0", ["alice", "bob"], 0.5, t)
    assert retry.replayed and not first.replayed
    assert retry.excluded.tolist() == first.excluded.tolist() == [False, True]
    assert retry.charged == first.charged == 1
    assert retry.excluded_by_horizon == first.excluded_by_horizon
    assert spent(store, "alice", t) == [0.5, 0.5]  # charged once
    with pytest.raises(ChargeConflict, match="already charged with different units"):
        store.charge("users", "q/7/0", ["alice", "carol"], 0.5, t)
    with pytest.raises(ChargeConflict):
        store.charge("users", "q/7/0", ["alice", "bob"], 0.4, t)
    with pytest.raises(ChargeConflict):
        store.charge("users", "q/7/0", ["bob", "alice"], 0.5, t)


def test_retry_returns_the_alerts_again(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store()
    t = clock.now_ms
    first = store.charge("users", "q/1", ["alice"], 0.9, t)
    retry = store.charge("users", "q/1", ["alice"], 0.9, t)
    assert retry.alerts == first.alerts and len(first.alerts) == 1


def test_times_outside_the_store_window_are_refused(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store(options=StoreOptions(max_delay_ms=HOUR_MS, max_lead_ms=5 * MINUTE_MS))
    now = clock.now_ms
    with pytest.raises(ChargeOutOfRange, match="max_delay_ms=3600000 behind"):
        store.charge("users", "old", ["alice"], 0.1, now - HOUR_MS - 1)
    with pytest.raises(ChargeOutOfRange, match="max_lead_ms=300000 ahead"):
        store.charge("users", "future", ["alice"], 0.1, now + 5 * MINUTE_MS + 1)
    assert spent(store, "alice", now) == [0.0, 0.0]
    assert store.charge("users", "edge", ["alice"], 0.1, now - HOUR_MS).charged == 1


def test_reset_forgets_a_unit(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store()
    t = clock.now_ms
    store.charge("users", "q/1", ["alice", "bob"], 1.0, t)
    assert store.reset("users", "alice") is True
    assert store.reset("users", "alice") is False
    assert spent(store, "alice", t) == [0.0, 0.0]
    assert spent(store, "bob", t) == [1.0, 1.0]
    assert store.charge("users", "q/2", ["alice", "bob"], 1.0, t).excluded.tolist() == [False, True]


def test_top_lists_the_highest_fractions(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store(options=StoreOptions(top_min_fraction=0.5))
    t = clock.now_ms
    for unit, cost in [("u90", 0.9), ("u60", 0.6), ("u55", 0.55), ("u30", 0.3)]:
        store.charge("users", f"q/{unit}", [unit], cost, t)
    assert store.top("users", 2, t) == [("u90", pytest.approx(0.9)), ("u60", pytest.approx(0.6))]
    # u30 never reached top_min_fraction, so it is not tracked.
    assert [u for u, _ in store.top("users", 10, t)] == ["u90", "u60", "u55"]
    store.reset("users", "u90")
    assert [u for u, _ in store.top("users", 1, t)] == ["u60"]
    # Fractions are re-scored at the time asked: two hours on, the hourly spend has rolled out.
    later = store.top("users", 1, t + 2 * HOUR_MS)
    assert later == [("u60", pytest.approx(0.6 / 4.0))]


def test_top_keeps_at_most_its_capacity(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store(options=StoreOptions(top_capacity=3, top_min_fraction=0.0))
    t = clock.now_ms
    units = [f"u{k}" for k in range(10)]
    for k, unit in enumerate(units):
        store.charge("users", f"q/{k}", [unit], 0.05 * (k + 1), t)
    assert [u for u, _ in store.top("users", 10, t)] == ["u9", "u8", "u7"]


def test_rho_namespace_reports_epsilon_at_its_delta(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store()
    t = clock.now_ms
    store.charge("devices", "q/1", ["d1"], 0.25, t)
    (report,) = store.spend("devices", "d1", t)
    assert (report.spent, report.limit, report.fraction, report.delta) == (0.25, 0.5, 0.5, 1e-9)
    assert report.epsilon == pytest.approx(zcdp_to_epsilon(0.25, 1e-9))


def test_units_survive_a_generation_boundary(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store()
    policy = standard_policy()
    generation_ms = StorageLayout(NamespaceLedger(policy.namespace("users"), StoreOptions()), 64).generation_ms
    boundary = (clock.now_ms // generation_ms + 1) * generation_ms
    clock.now_ms = boundary - MINUTE_MS
    assert store.charge("users", "g/1", ["alice"], 0.6, clock.now_ms - MINUTE_MS).charged == 1
    clock.now_ms = boundary + MINUTE_MS
    assert store.charge("users", "g/2", ["alice"], 0.6, clock.now_ms - MINUTE_MS).excluded.tolist() == [True]
    assert store.charge("users", "g/3", ["alice"], 0.3, clock.now_ms - MINUTE_MS).charged == 1
    assert spent(store, "alice", clock.now_ms) == [pytest.approx(0.9), pytest.approx(0.9)]
    # Two generations on, everything the unit spent is forgotten, and nothing else is.
    clock.now_ms = boundary + 2 * generation_ms
    assert spent(store, "alice", clock.now_ms) == [0.0, 0.0]
    assert store.charge("users", "g/4", ["alice"], 1.0, clock.now_ms).charged == 1


def test_bad_calls_are_rejected_with_a_reason(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store()
    t = clock.now_ms
    with pytest.raises(KeyError, match="known namespaces: devices, users"):
        store.charge("visitors", "q", ["a"], 0.1, t)
    with pytest.raises(ValueError, match="distinct"):
        store.charge("users", "q", ["a", "a"], 0.1, t)
    with pytest.raises(ValueError, match="non-empty"):
        store.charge("users", "q", ["a", ""], 0.1, t)
    with pytest.raises(TypeError, match="must be str"):
        store.charge("users", "q", ["a", 7], 0.1, t)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="charge_id"):
        store.charge("users", "", ["a"], 0.1, t)
    with pytest.raises(ValueError, match="integer Unix milliseconds"):
        store.charge("users", "q", ["a"], 0.1, float(t))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exceeds the 1h limit"):
        store.charge("users", "q", ["a"], 1.5, t)
    with pytest.raises(ValueError, match="n must be a positive integer"):
        store.top("users", 0, t)
    assert spent(store, "a", t) == [0.0, 0.0]


def test_an_empty_batch_charges_nobody(make_store: StoreFactory, clock: Clock) -> None:
    outcome = make_store().charge("users", "q/empty", [], 0.1, clock.now_ms)
    assert outcome.excluded.shape == (0,) and outcome.charged == 0 and outcome.alerts == []


def test_numpy_inputs_are_accepted(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store()
    units = np.array(["x1", "x2", "x3"])
    outcome = store.charge("users", "q/np", units, 0.1, np.int64(clock.now_ms))
    assert outcome.charged == 3


def test_unusual_unit_ids_are_kept_apart(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store()
    t = clock.now_ms
    units = ["a\x00b", "a", "b", "ü-ñ", "\udcff", "x" * 300, ":", "c:d"]
    assert store.charge("users", "q/odd", units, 0.5, t).charged == len(units)
    store.charge("users", "q/odd2", ["a"], 0.5, t)
    assert spent(store, "a", t) == [1.0, 1.0]
    assert spent(store, "a\x00b", t) == [0.5, 0.5]
    assert spent(store, "\udcff", t) == [0.5, 0.5]


def test_many_units_in_one_batch(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store()
    t = clock.now_ms
    rng = np.random.default_rng(7)  # synthetic test data only
    units = [f"user-{k}" for k in rng.permutation(5000)]
    store.charge("users", "pre", units[:1000], 0.95, t)
    outcome = store.charge("users", "big", units, 0.1, t)
    assert outcome.excluded[:1000].all() and not outcome.excluded[1000:].any()
    assert outcome.charged == 4000


def test_an_independent_namespace_has_its_own_budget(make_store: StoreFactory, clock: Clock) -> None:
    policy = BudgetPolicy(
        [
            NamespacePolicy("users", "epsilon", [HorizonLimit(HOUR_MS, 1.0)]),
            NamespacePolicy("sessions", "epsilon", [HorizonLimit(HOUR_MS, 1.0)]),
        ]
    )
    store = make_store(policy=policy)
    t = clock.now_ms
    store.charge("users", "q/1", ["same-id"], 1.0, t)
    assert store.charge("sessions", "q/1", ["same-id"], 1.0, t).charged == 1


def test_a_backlog_within_input_retention_is_charged(make_store: StoreFactory, clock: Clock) -> None:
    """Windows of a backlog replayed hours or days late still count against every horizon holding them."""
    store = make_store()
    now = clock.now_ms
    two_hours_ago = now - 2 * HOUR_MS
    assert store.charge("users", "backlog/2h", ["alice"], 0.6, two_hours_ago).charged == 1
    assert spent(store, "alice", two_hours_ago) == [pytest.approx(0.6), pytest.approx(0.6)]
    # The hour holding it is full for a second 0.6; the day still counts it at the store clock.
    assert store.charge("users", "backlog/2h+30m", ["alice"], 0.6, two_hours_ago + 30 * MINUTE_MS).excluded.tolist() == [
        True
    ]
    assert spent(store, "alice", now) == [0.0, pytest.approx(0.6)]

    six_days_ago = now - 6 * DAY_MS
    assert store.charge("users", "backlog/6d", ["bob"], 0.9, six_days_ago).charged == 1
    assert store.charge("users", "backlog/6d+20m", ["bob"], 0.2, six_days_ago + 20 * MINUTE_MS).excluded.tolist() == [
        True
    ]
    # The day holding it counts it too: three more full hours fit, a fourth does not.
    assert store.charge("users", "day/6d+2h", ["bob"], 1.0, six_days_ago + 2 * HOUR_MS).charged == 1
    assert store.charge("users", "day/6d+4h", ["bob"], 1.0, six_days_ago + 4 * HOUR_MS).charged == 1
    assert store.charge("users", "day/6d+6h", ["bob"], 1.0, six_days_ago + 6 * HOUR_MS).charged == 1
    assert store.charge("users", "day/6d+8h", ["bob"], 0.2, six_days_ago + 8 * HOUR_MS).excluded.tolist() == [True]
    assert spent(store, "bob", six_days_ago + 8 * HOUR_MS)[1] == pytest.approx(3.9)
    assert spent(store, "bob", now) == [0.0, 0.0]


def test_a_backlog_older_than_the_accepted_delay_is_refused(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store()
    delay = StoreOptions().max_delay_ms
    now = clock.now_ms
    with pytest.raises(ChargeOutOfRange, match=f"more than max_delay_ms={delay} behind the store clock"):
        store.charge("users", "too-old", ["alice"], 0.1, now - delay - 1)
    assert spent(store, "alice", now - delay) == [0.0, 0.0]
    assert store.charge("users", "oldest", ["alice"], 0.1, now - delay).charged == 1


def delta_policy() -> BudgetPolicy:
    """epsilon <= 10 and delta <= 1e-5 per hour; epsilon <= 40 per day."""
    return BudgetPolicy([
        NamespacePolicy(
            "users",
            "epsilon",
            [
                HorizonLimit(HOUR_MS, 10.0, buckets=4),
                HorizonLimit(HOUR_MS, 1e-5, buckets=4, delta=True),
                HorizonLimit(DAY_MS, 40.0, buckets=24),
            ],
            alert_at=(0.8, 1.0),
        )
    ])


def test_delta_is_charged_beside_epsilon_and_refuses_on_its_own(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store(delta_policy())
    t = clock.now_ms
    # delta 3e-6 per window: three windows fit 1e-5, the fourth does not, though epsilon (0.4 of 10) would.
    outcomes = [store.charge("users", f"q/{k}", ["alice"], 0.1, t, delta=3e-6) for k in range(4)]
    assert [bool(o.excluded[0]) for o in outcomes] == [False, False, False, True]
    assert outcomes[3].excluded_by_horizon == {"1h": 0, "1h-delta": 1, "1d": 0}
    report = store.spend("users", "alice", t)
    assert [(h.currency, h.label) for h in report] == [("epsilon", "1h"), ("delta", "1h-delta"), ("epsilon", "1d")]
    assert report[0].spent == pytest.approx(0.3)
    assert report[1].spent == pytest.approx(9e-6) and report[1].limit == pytest.approx(1e-5)
    assert report[1].remaining == pytest.approx(1e-6)
    assert report[1].epsilon is None and report[1].delta is None
    # The delta alert says what it is about.
    assert {a.accounting for a in outcomes[3].alerts} == {"delta"}


def test_a_pure_epsilon_charge_leaves_delta_untouched(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store(delta_policy())
    t = clock.now_ms
    for k in range(50):
        assert store.charge("users", f"q/{k}", ["alice"], 0.1, t).charged == 1
    report = store.spend("users", "alice", t)
    assert report[1].spent == 0.0 and report[0].spent == pytest.approx(5.0)


def test_delta_without_a_delta_limit_is_refused_up_front(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store()
    with pytest.raises(ValueError, match="no delta limit"):
        store.charge("users", "q/1", ["alice"], 0.1, clock.now_ms, delta=1e-6)
    assert spent(store, "alice", clock.now_ms) == [0.0, 0.0]  # nothing was charged


def test_delta_is_rounded_up_to_a_pico_unit(make_store: StoreFactory, clock: Clock) -> None:
    store = make_store(delta_policy())
    t = clock.now_ms
    store.charge("users", "q/1", ["alice"], 0.1, t, delta=1e-15)  # under one pico-unit: charged as one
    assert store.spend("users", "alice", t)[1].spent == pytest.approx(1e-12)
