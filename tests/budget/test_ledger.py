"""The admission rule on one unit (pure logic): soundness, tightness, forgetting."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.budget import HorizonLimit, NamespacePolicy, StoreOptions
from stream_dp.budget.ledger import NamespaceLedger

HOUR_MS = 3_600_000
MINUTE_MS = 60_000
OPTIONS = StoreOptions(max_delay_ms=2 * HOUR_MS, max_lead_ms=15 * MINUTE_MS)


def ledger(limit: float = 1.0, buckets: int = 4, alert_at: tuple[float, ...] = (0.8, 1.0)) -> NamespaceLedger:
    policy = NamespacePolicy("users", "epsilon", [HorizonLimit(HOUR_MS, limit, buckets)], alert_at=alert_at)
    return NamespaceLedger(policy, OPTIONS)


def brute_force_admits(
    admitted: list[tuple[int, int]], time_ms: int, cost: int, plan_limit: int, bucket_ms: int, buckets: int
) -> bool:
    """The rule written out directly: every run of buckets+1 buckets containing the charge stays within the limit."""
    counters: dict[int, int] = {}
    for t, c in admitted:
        counters[t // bucket_ms] = counters.get(t // bucket_ms, 0) + c
    b = time_ms // bucket_ms
    for start in range(b - buckets, b + 1):
        run = sum(counters.get(j, 0) for j in range(start, start + buckets + 1))
        if run + cost > plan_limit:
            return False
    return True


charges = st.lists(
    st.tuples(st.integers(0, 6 * HOUR_MS), st.integers(1, 600_000)),  # (event time ms, cost in micro-units)
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(charges, st.sampled_from([1, 2, 4, 12]))
def test_no_interval_of_one_horizon_exceeds_the_limit(sequence: list[tuple[int, int]], buckets: int) -> None:
    """Soundness, checked on the admitted charges themselves, for charges in any time order."""
    book = ledger(buckets=buckets)
    plan = book.horizons[0]
    state: dict[int, int] = {}
    admitted: list[tuple[int, int]] = []
    for time_ms, cost in sequence:
        expected = brute_force_admits(admitted, time_ms, cost, plan.limit_units, plan.bucket_ms, buckets)
        result = book.charge_unit(state, cost, time_ms, now_ms=0)
        assert result.admitted == expected
        if result.admitted:
            admitted.append((time_ms, cost))
    # The largest spend over [a, a + H] is reached with a at a charge time.
    for start, _ in admitted:
        window = sum(c for t, c in admitted if start <= t <= start + HOUR_MS)
        assert window <= plan.limit_units


@settings(max_examples=200, deadline=None)
@given(charges, st.lists(st.integers(-15 * MINUTE_MS, 2 * HOUR_MS), min_size=40, max_size=40))
def test_forgetting_old_buckets_never_changes_a_decision(sequence: list[tuple[int, int]], delays: list[int]) -> None:
    """With the store clock running (charges up to max_delay_ms late), pruning keeps every bucket the rule reads."""
    book = ledger()
    pruned_state: dict[int, int] = {}
    full_state: dict[int, int] = {}
    clock = 0
    for (time_ms, cost), delay in zip(sorted(sequence), delays, strict=False):
        clock = max(clock, time_ms + delay)  # a store clock never runs backwards
        if not time_ms - OPTIONS.max_lead_ms <= clock <= time_ms + OPTIONS.max_delay_ms:
            continue  # the store refuses this charge as out of range
        with_pruning = book.charge_unit(pruned_state, cost, time_ms, now_ms=clock)
        without = book.charge_unit(full_state, cost, time_ms, now_ms=0)
        assert with_pruning.admitted == without.admitted
        assert with_pruning.spent_units == without.spent_units


def test_charges_in_one_bucket_fill_the_limit_exactly() -> None:
    book = ledger()
    state: dict[int, int] = {}
    results = [book.charge_unit(state, 100_000, 10 * HOUR_MS, now_ms=10 * HOUR_MS) for _ in range(11)]
    assert [r.admitted for r in results] == [True] * 10 + [False]
    assert results[9].spent_units == [1_000_000]
    assert results[10].refused == [True]


def test_a_late_charge_is_checked_against_later_spending() -> None:
    """A check looking only backwards from the charge time would admit this late charge."""
    book = ledger()
    state: dict[int, int] = {}
    t = 10 * HOUR_MS
    assert book.charge_unit(state, 600_000, t, now_ms=t).admitted
    late = book.charge_unit(state, 600_000, t - 50 * MINUTE_MS, now_ms=t)
    assert not late.admitted
    assert late.spent_units == [600_000]


def test_budget_returns_after_one_horizon_and_one_bucket() -> None:
    book = ledger()
    state: dict[int, int] = {}
    t = 10 * HOUR_MS
    assert book.charge_unit(state, 1_000_000, t, now_ms=t).admitted
    # Within H + w (one bucket of slack) the spend still counts...
    assert not book.charge_unit(state, 1, t + HOUR_MS, now_ms=t + HOUR_MS).admitted
    # ...after it, it does not.
    assert book.charge_unit(
        state, 1_000_000, t + HOUR_MS + 15 * MINUTE_MS, now_ms=t + HOUR_MS + 15 * MINUTE_MS
    ).admitted


def test_levels_enter_once_and_lapse_after_a_horizon() -> None:
    book = ledger()
    state: dict[int, int] = {}
    t = 10 * HOUR_MS
    first = book.charge_unit(state, 850_000, t, now_ms=t)
    assert first.transitions == [(0, 0, 1, t + HOUR_MS)]
    assert book.charge_unit(state, 10_000, t, now_ms=t).transitions == []
    refused = book.charge_unit(state, 500_000, t, now_ms=t)
    assert refused.transitions == [(0, 1, 2, t + HOUR_MS)]  # keeps the first entry's lapse
    later = t + 2 * HOUR_MS
    again = book.charge_unit(state, 850_000, later, now_ms=later)
    assert again.transitions == [(0, 0, 1, later + HOUR_MS)]


def test_old_fields_are_pruned() -> None:
    book = ledger()
    state: dict[int, int] = {}
    t = 10 * HOUR_MS
    book.charge_unit(state, 100_000, t, now_ms=t)
    assert book.key_deadline(state) == t + 15 * MINUTE_MS + HOUR_MS + OPTIONS.max_delay_ms
    book.charge_unit(state, 100_000, t + 4 * HOUR_MS, now_ms=t + 4 * HOUR_MS)
    assert len(state) == 1  # the first bucket could no longer be read, so it is gone
