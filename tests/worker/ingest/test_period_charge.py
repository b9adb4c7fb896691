"""Charging continual windows: the period's loss once per unit, at most W windows per period, through crashes.

Run on the in-memory backends and on the real Redis ones (RedisReleaseLedger,
RedisBudgetStore, RedisPeriodRegister): the budget is read back from the
store, never inferred from the worker's results.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from stream_dp.budget import BudgetUnavailable
from stream_dp.worker.ingest.charge import Charged, WindowCharge, charge_in_order, excluded_units
from stream_dp.worker.ingest.closed_windows import window_charge
from stream_dp.worker.ingest.period_charge import admit
from stream_dp.worker.query.runtime import ContinualCharging
from stream_dp.worker.store.ledger import LedgerUnavailable
from stream_dp.worker.store.period_register import Participation

from tests.worker._periods import HOUR_MS, Backend, backends_fixture

WINDOW_MS = 60_000
PERIOD_MS = 10 * WINDOW_MS
COST = 1.0  # epsilon of a whole period
W = 2

backends = backends_fixture(["memory", "redis", "redis-cluster"])
two_backends = backends_fixture(["memory", "redis"])


def continual_query(name: str = "q", w: int = W, *, cost: float = COST, window_ms: int = WINDOW_MS) -> SimpleNamespace:
    """What ``window_charge`` reads of a QueryRuntime."""
    return SimpleNamespace(name=name, namespace="users", cost=cost, delta=0.0,
                           continual=ContinualCharging(PERIOD_MS, 0, window_ms, w))


def window(query: SimpleNamespace, start_ms: int, units: list[str], partition: int = 0) -> WindowCharge:
    size = query.continual.window_size_ms
    partial = SimpleNamespace(window_start_ms=start_ms, window_end_ms=start_ms + size, partition=partition,
                              units=units)
    return window_charge(query, partial)


def admitted(result: Charged) -> frozenset[str] | str:
    if result.error is not None:
        return type(result.error).__name__
    assert result.charged_units is not None and result.excluded is not None
    return frozenset(u for u, out in zip(result.charged_units, result.excluded.tolist(), strict=True) if not out)


def spent(backend: Backend, unit: str, now_ms: int) -> float:
    (day,) = backend.budget.spend("users", unit, now_ms)
    return round(day.spent, 6)


def period_start(now_ms: int, periods_back: int) -> int:
    return now_ms // PERIOD_MS * PERIOD_MS - periods_back * PERIOD_MS


def test_a_unit_in_w_plus_3_windows_is_charged_once_and_admitted_to_its_first_w(backends):
    b, now = backends.make(), backends.clock.now_ms
    query, first, second = continual_query(), period_start(now, 3), period_start(now, 2)
    windows = [window(query, first + i * WINDOW_MS, ["target", f"other-{i}"]) for i in range(W + 3)]
    results = charge_in_order(b.journal, b.budget, windows, b.periods)
    assert [admitted(r) for r in results] == [
        frozenset({"target", f"other-{i}"}) if i < W else frozenset({f"other-{i}"}) for i in range(W + 3)]
    assert [r.over_cap for r in results] == [0] * W + [1] * 3
    assert spent(b, "target", now) == COST  # once for the whole period
    assert all(spent(b, f"other-{i}", now) == COST for i in range(W + 3))
    # The next period charges it again, and admits it again.
    later = [window(query, second + i * WINDOW_MS, ["target"]) for i in range(W + 1)]
    results = charge_in_order(b.journal, b.budget, later, b.periods)
    assert [admitted(r) for r in results] == [frozenset({"target"})] * W + [frozenset()]
    assert spent(b, "target", now) == 2 * COST


def test_units_the_store_refuses_are_left_out_and_charged_afresh_at_their_next_window(backends):
    b, now = backends.make(), backends.clock.now_ms
    b.budget.charge("users", "earlier", ["poor"], 9.5, now - 2 * HOUR_MS)  # 0.5 left of 10 per day
    query, start = continual_query(), period_start(now, 3)
    results = charge_in_order(b.journal, b.budget, [window(query, start + i * WINDOW_MS, ["poor", "rich"])
                                                    for i in range(3)], b.periods)
    assert [admitted(r) for r in results] == [frozenset({"rich"})] * 2 + [frozenset()]
    assert [r.over_cap for r in results] == [0, 0, 1]  # rich; poor is out for want of budget, not of windows
    assert (spent(b, "poor", now), spent(b, "rich", now)) == (9.5, COST)
    assert classes(b.periods.classify(window(query, start, []).continual, ["poor", "rich"])) == [
        Participation.FIRST, Participation.REPLAY]


def classes(values: np.ndarray) -> list[Participation]:
    return [Participation(int(v)) for v in values]


# -- settings changed within a period ---------------------------------------------------------
# A period's charge paid for the settings it was made under: other settings (here W, the cost and the
# window size; tests/worker/release/test_continual_settings.py covers every setting) make a new period.


def test_a_unit_charged_under_other_settings_is_charged_again_at_its_next_window(backends):
    b, now = backends.make(), backends.clock.now_ms
    start = period_start(now, 3)
    before, after = continual_query(w=1, cost=1.0), continual_query(w=4, cost=4.0)
    (first,) = charge_in_order(b.journal, b.budget, [window(before, start, ["u"])], b.periods)
    assert admitted(first) == frozenset({"u"}) and spent(b, "u", now) == 1.0
    # Restarted with epsilon 4 and W = 4 in the same period: paid for W = 1 at epsilon 1, "u" pays again, and
    # its 4 windows count from here.
    results = charge_in_order(b.journal, b.budget, [window(after, start + i * WINDOW_MS, ["u"]) for i in range(1, 6)],
                              b.periods)
    assert [admitted(r) for r in results] == [frozenset({"u"})] * 4 + [frozenset()]
    assert [r.over_cap for r in results] == [0] * 4 + [1]
    assert spent(b, "u", now) == 1.0 + 4.0


def test_a_window_charged_under_other_settings_is_a_new_charge_not_a_replay(backends):
    b, now = backends.make(), backends.clock.now_ms
    start = period_start(now, 3)
    before, after = continual_query(w=1, cost=1.0), continual_query(w=4, cost=4.0)
    charge_in_order(b.journal, b.budget, [window(before, start, ["u"])], b.periods)
    # The same window again (its input replayed after the restart): the store must neither refuse the new
    # charge as a conflicting replay of the old one nor answer it with the old one's outcome.
    (again,) = charge_in_order(b.journal, b.budget, [window(after, start, ["u"])], b.periods)
    assert window(after, start, []).charge_id != window(before, start, []).charge_id
    assert admitted(again) == frozenset({"u"})
    assert spent(b, "u", now) == 1.0 + 4.0


def test_another_window_size_is_another_grid_not_a_replay(backends):
    b, now = backends.make(), backends.clock.now_ms
    start = period_start(now, 3)
    minutes, two_minutes = continual_query(w=1), continual_query(w=1, window_ms=2 * WINDOW_MS)
    charge_in_order(b.journal, b.budget, [window(minutes, start + 2 * WINDOW_MS, ["u"])], b.periods)  # window 3
    later = window(two_minutes, start + 4 * WINDOW_MS, ["u"])
    assert later.continual.index == 3  # the same number, another stretch of time
    assert classes(b.periods.classify(later.continual, ["u"])) == [Participation.FIRST]
    (charged, full) = charge_in_order(b.journal, b.budget, [later, window(two_minutes, start + 6 * WINDOW_MS, ["u"])],
                                      b.periods)
    assert admitted(charged) == frozenset({"u"}) and admitted(full) == frozenset() and full.over_cap == 1
    assert spent(b, "u", now) == 2 * COST


def test_the_same_settings_after_a_restart_charge_nothing_again(backends):
    b, now = backends.make(), backends.clock.now_ms
    start = period_start(now, 3)
    charge_in_order(b.journal, b.budget, [window(continual_query(), start, ["u", "v"])], b.periods)
    restarted = continual_query()  # built afresh from the same settings
    results = charge_in_order(b.journal, b.budget, [window(restarted, start, ["u", "v"]),  # a replay
                                                    window(restarted, start + WINDOW_MS, ["u"]),
                                                    window(restarted, start + 2 * WINDOW_MS, ["u"])], b.periods)
    assert [admitted(r) for r in results] == [frozenset({"u", "v"}), frozenset({"u"}), frozenset()]
    assert (spent(b, "u", now), spent(b, "v", now)) == (COST, COST)


# -- crashes ---------------------------------------------------------------------------------

STEPS = ("journal", "classify", "first-journal", "charge", "register")


class Faults:
    """Fails one step of one window once, before the step or after it ran (its reply lost); logs every step."""

    def __init__(self, step: str | None = None, phase: str = "before", charge_id: str | None = None) -> None:
        self.target = (step, phase, charge_id)
        self.fired = False
        self.log: list[tuple[str, str]] = []

    def at(self, step: str, phase: str, charge_id: str, error: Exception) -> None:
        if phase == "before":
            self.log.append((step, charge_id))
        if not self.fired and (step, phase, charge_id) == self.target:
            self.fired = True
            raise error


class FlakyJournal:
    def __init__(self, inner, faults: Faults) -> None:
        self.inner, self.faults = inner, faults

    def remember_units(self, charge_id: str, units: list[str]) -> list[str]:
        base = charge_id.removesuffix("/first")
        step = "first-journal" if base != charge_id else "journal"
        self.faults.at(step, "before", base, LedgerUnavailable("journal down (test)"))
        stored = self.inner.remember_units(charge_id, units)
        self.faults.at(step, "after", base, LedgerUnavailable("journal reply lost (test)"))
        return stored


class FlakyStore:
    def __init__(self, inner, faults: Faults) -> None:
        self.inner, self.faults = inner, faults

    def charge(self, namespace, charge_id, units, cost, event_time_ms, *, delta=0.0):
        self.faults.at("charge", "before", charge_id, BudgetUnavailable("store down (test)"))
        outcome = self.inner.charge(namespace, charge_id, units, cost, event_time_ms, delta=delta)
        self.faults.at("charge", "after", charge_id, BudgetUnavailable("store reply lost (test)"))
        return outcome


class FlakyRegister:
    def __init__(self, inner, faults: Faults) -> None:
        self.inner, self.faults = inner, faults
        self.charge_ids: dict[tuple, str] = {}

    def _call(self, step, window, units, run):
        start = window.period_start_ms + (window.index - 1) * WINDOW_MS
        cid = f"{window.query}/{start}/{window.partition}/{window.settings}"
        self.faults.at(step, "before", cid, LedgerUnavailable(f"{step} down (test)"))
        out = run(window, units)
        self.faults.at(step, "after", cid, LedgerUnavailable(f"{step} reply lost (test)"))
        return out

    def classify(self, window, units):
        return self._call("classify", window, units, self.inner.classify)

    def register(self, window, units):
        return self._call("register", window, units, self.inner.register)


def scenario(now_ms: int) -> list[WindowCharge]:
    """Two periods on partition 0 and one window on partition 1, in the order the emitter charges them."""
    query, p0, p1 = continual_query(), period_start(now_ms, 4), period_start(now_ms, 3)
    plan = [
        (p0, 0, ["steady", "poor", "once-0"]),
        (p0, 1, ["steady"]),  # the same unit on another partition: charged there too
        (p0 + WINDOW_MS, 0, ["steady", "sparse", "once-1"]),
        (p0 + 2 * WINDOW_MS, 0, ["steady", "tail", "poor"]),
        (p0 + 3 * WINDOW_MS, 0, ["steady", "tail"]),
        (p0 + 4 * WINDOW_MS, 0, ["steady", "sparse", "tail", "once-4"]),
        (p0 + 5 * WINDOW_MS, 0, ["tail", "steady"]),
        (p1, 0, ["steady", "sparse", "poor"]),
        (p1 + WINDOW_MS, 0, ["steady", "once-9"]),
    ]
    return [window(query, start, units, partition) for start, partition, units in plan]


UNITS = ["steady", "sparse", "tail", "poor", "once-0", "once-1", "once-4", "once-9"]


def run(backend: Backend, windows: list[WindowCharge], faults: Faults) -> dict[str, list]:
    """Charge as the emitter does; an outage is a crash: everything is replayed from the first window."""
    journal, budget = FlakyJournal(backend.journal, faults), FlakyStore(backend.budget, faults)
    periods = FlakyRegister(backend.periods, faults)
    seen: dict[str, list] = {w.charge_id: [] for w in windows}
    for _ in range(3):
        results = charge_in_order(journal, budget, windows, periods)
        for w, result in zip(windows, results, strict=False):
            if isinstance(result.error, (BudgetUnavailable, LedgerUnavailable)):
                break
            seen[w.charge_id].append(admitted(result))
        else:
            return seen
    raise AssertionError("still failing after two replays")


def fresh(backends) -> Backend:
    backend = backends.make()
    backend.budget.charge("users", "earlier", ["poor"], 9.5, backends.clock.now_ms - 2 * HOUR_MS)
    return backend


def test_every_crash_point_replays_to_the_same_admissions_and_charges_once(two_backends):
    backends, now = two_backends, two_backends.clock.now_ms
    windows = scenario(now)
    baseline = Faults()
    plain = run(fresh(backends), windows, baseline)
    expected = {cid: outcomes[0] for cid, outcomes in plain.items()}
    first_backend = fresh(backends)
    run(first_backend, windows, Faults())
    spend = {u: spent(first_backend, u, now) for u in UNITS}
    # The rule, spelled out: W=2 windows per period and partition, one charge each.
    starts = [w.charge_id for w in windows]
    assert [("steady" in expected[c]) for c in starts] == [True, True, True, False, False, False, False, True, True]
    with_tail = [w.charge_id for w in windows if "tail" in w.partial_units]
    assert [("tail" in expected[c]) for c in with_tail] == [True, True, False, False]
    assert not any("poor" in expected[c] for c in starts)
    assert spend == {"steady": 3.0, "sparse": 2.0, "tail": 1.0, "poor": 9.5, "once-0": 1.0, "once-1": 1.0,
                     "once-4": 1.0, "once-9": 1.0}
    points = sorted({(step, cid) for step, cid in baseline.log})
    assert {step for step, _ in points} == set(STEPS)
    for step, cid in points:
        for phase in ("before", "after"):
            backend = fresh(backends)
            faults = Faults(step, phase, cid)
            seen = run(backend, windows, faults)
            assert faults.fired, (step, phase, cid)
            for charge, outcomes in seen.items():
                assert outcomes and all(o == expected[charge] for o in outcomes), (step, phase, cid, charge, outcomes)
            assert {u: spent(backend, u, now) for u in UNITS} == spend, (step, phase, cid)


def test_a_window_rebuilt_after_a_crash_charges_and_admits_by_its_journaled_lists(two_backends):
    backends, now = two_backends, two_backends.clock.now_ms
    query, start = continual_query(), period_start(now, 3)
    b = backends.make()
    first = window(query, start, ["a", "b"])
    faults = Faults("register", "before", first.charge_id)
    (failed,) = charge_in_order(b.journal, FlakyStore(b.budget, faults), [first], FlakyRegister(b.periods, faults))
    assert isinstance(failed.error, LedgerUnavailable)
    # The replay rebuilt the window from another batch: a late event of "c" now lands inside, "b"'s is gone.
    (replayed,) = charge_in_order(b.journal, b.budget, [window(query, start, ["a", "c"])], b.periods)
    assert replayed.charged_units == ["a", "b"] and admitted(replayed) == frozenset({"a", "b"})
    mask, rebuilt = excluded_units(["a", "c"], replayed.charged_units, replayed.excluded)
    assert rebuilt and mask.tolist() == [False, True]  # "c" was never charged: out
    assert (spent(b, "a", now), spent(b, "b", now), spent(b, "c", now)) == (COST, COST, 0.0)


def test_a_continual_window_without_a_register_is_refused():
    query = continual_query()
    with pytest.raises(ValueError, match="period register"):
        charge_in_order(None, None, [window(query, 0, ["a"])])


def test_admission_rule():
    units = ["f1", "f2", "m", "r", "x", "stray"]
    c = Participation
    cls = np.array([c.FIRST, c.FIRST, c.MORE, c.REPLAY, c.FULL, c.FIRST], dtype=np.uint8)
    # Journaled first list from the first run: f1, f2 (the store refused f2); "stray" looks first only now.
    decision = admit(units, cls, ["f1", "f2"], np.array([False, True]))
    assert decision.excluded.tolist() == [False, True, False, False, True, True]
    assert decision.over_cap.tolist() == [False, False, False, False, True, False]
    # A journaled first unit is decided by the store even if the register has it by now.
    decision = admit(["f1"], np.array([c.REPLAY], dtype=np.uint8), ["f1"], np.array([False]))
    assert decision.excluded.tolist() == [False]


def test_periods_follow_the_window_grid():
    continual = ContinualCharging(period_ms=PERIOD_MS, offset_ms=15_000, window_size_ms=WINDOW_MS,
                                  max_windows_per_unit=3)
    start = 7 * PERIOD_MS + 15_000
    assert continual.period_start(start) == start and continual.window_index(start) == 1
    last = start + PERIOD_MS - WINDOW_MS
    assert continual.period_start(last) == start and continual.window_index(last) == 10
    assert continual.period_end(last) == start + PERIOD_MS and continual.window_index(last + WINDOW_MS) == 1
    with pytest.raises(ValueError, match="not the start of a window"):
        continual.period_start(start + 1)
    with pytest.raises(ValueError, match="multiple of the window size"):
        ContinualCharging(PERIOD_MS + 1, 0, WINDOW_MS, 1)
    with pytest.raises(ValueError, match="between 1 and the 10 windows"):
        ContinualCharging(PERIOD_MS, 0, WINDOW_MS, 11)
