"""The embedded budget store: same rule and results as Redis, in one process.

For a single worker without Redis, and for tests. Thread-safe (one lock);
state is lost when the process exits, so a restarted worker starts every unit
with a full budget -- use it only where that is acceptable.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from stream_dp.budget import batch
from stream_dp.budget.ledger import NamespaceLedger
from stream_dp.budget.policy import BudgetPolicy
from stream_dp.budget.store import (
    ChargeConflict,
    ChargeOutcome,
    ChargeOutOfRange,
    HorizonSpend,
    StoreOptions,
)
from stream_dp.metrics.budget import BudgetMetrics


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class MemoryBudgetStore:
    """Budget store kept in process memory; ``clock_ms`` is the store clock."""

    def __init__(
        self,
        policy: BudgetPolicy,
        options: StoreOptions | None = None,
        *,
        metrics: BudgetMetrics | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self._policy = policy
        self._options = options or StoreOptions()
        self._metrics = metrics
        self._clock_ms = clock_ms
        self._ledgers = {name: NamespaceLedger(ns, self._options) for name, ns in policy.namespaces.items()}
        self._lock = threading.Lock()
        self._units: dict[tuple[str, str], dict[int, int]] = {}
        self._unit_deadlines: dict[tuple[str, str], int] = {}
        self._unit_expiry: list[tuple[int, tuple[str, str]]] = []
        self._records: dict[tuple[str, str], tuple[int, str, ChargeOutcome]] = {}
        self._record_expiry: list[tuple[int, tuple[str, str]]] = []
        self._top: dict[tuple[str, int], dict[str, float]] = {}

    @property
    def policy(self) -> BudgetPolicy:
        return self._policy

    def close(self) -> None:
        pass

    def _ledger(self, namespace: str) -> NamespaceLedger:
        try:
            return self._ledgers[namespace]
        except KeyError:
            self._policy.namespace(namespace)
            raise

    def _expire(self, now_ms: int) -> None:
        """Forget units, records and top periods whose deadline passed (lock held)."""
        while self._unit_expiry and self._unit_expiry[0][0] <= now_ms:
            _, key = heapq.heappop(self._unit_expiry)
            deadline = self._unit_deadlines.get(key)
            if deadline is not None and deadline <= now_ms:
                del self._unit_deadlines[key]
                self._units.pop(key, None)
        while self._record_expiry and self._record_expiry[0][0] <= now_ms:
            _, record_key = heapq.heappop(self._record_expiry)
            record = self._records.get(record_key)
            if record is not None and record[0] <= now_ms:
                del self._records[record_key]
        stale = [k for k in self._top if (k[1] + 2) * self._ledgers[k[0]].policy.longest_horizon_ms <= now_ms]
        for period_key in stale:
            del self._top[period_key]

    def charge(
        self, namespace: str, charge_id: str, units: Sequence[str], cost: float, event_time_ms: int,
        *, delta: float = 0.0,
    ) -> ChargeOutcome:
        ledger = self._ledger(namespace)
        if not isinstance(charge_id, str) or not charge_id:
            raise ValueError(
                f"charge_id must be a non-empty str such as 'query/window_start/partition', got {charge_id!r}"
            )
        time_ms = batch.event_time(event_time_ms)
        cost_units = ledger.policy.cost_units(cost, delta)
        unit_list = batch.as_unit_list(units)
        if not unit_list:
            return ChargeOutcome.empty()
        started = time.perf_counter()
        digest = batch.charge_digest(cost_units, time_ms, *batch.pack_units(unit_list))
        opts = self._options
        with self._lock:
            now_ms = int(self._clock_ms())
            self._expire(now_ms)
            record = self._records.get((namespace, charge_id))
            if record is not None:
                if record[1] != digest:
                    raise ChargeConflict(
                        f"charge id {charge_id!r} was already charged with different units, cost or event time; "
                        "a retry must repeat the original call, a new window needs a new charge id"
                    )
                stored = record[2]
                outcome = ChargeOutcome(
                    excluded=stored.excluded.copy(),
                    charged=stored.charged,
                    alerts=list(stored.alerts),
                    replayed=True,
                    excluded_by_horizon=dict(stored.excluded_by_horizon),
                )
                if self._metrics is not None:
                    self._metrics.record_replay(namespace, time.perf_counter() - started)
                    self._metrics.expire_levels(now_ms)
                return outcome
            if time_ms < now_ms - opts.max_delay_ms:
                raise ChargeOutOfRange(
                    f"charge {charge_id!r}: event time {time_ms} is more than max_delay_ms={opts.max_delay_ms} "
                    f"behind the store clock ({now_ms}); raise StoreOptions.max_delay_ms if windows close this late"
                )
            if time_ms > now_ms + opts.max_lead_ms:
                raise ChargeOutOfRange(
                    f"charge {charge_id!r}: event time {time_ms} is more than max_lead_ms={opts.max_lead_ms} ahead "
                    f"of the store clock ({now_ms}); check producer clocks or raise StoreOptions.max_lead_ms"
                )
            outcome, spent, transitions = self._charge_locked(ledger, unit_list, cost_units, time_ms, now_ms)
            self._records[(namespace, charge_id)] = (now_ms + opts.record_ttl_ms, digest, outcome)
            heapq.heappush(self._record_expiry, (now_ms + opts.record_ttl_ms, (namespace, charge_id)))
        if self._metrics is not None:
            self._observe(ledger, outcome, spent, transitions, now_ms, time.perf_counter() - started)
        return outcome

    def _charge_locked(
        self, ledger: NamespaceLedger, units: list[str], cost_units: tuple[int, ...], time_ms: int, now_ms: int
    ) -> tuple[ChargeOutcome, np.ndarray, np.ndarray]:
        namespace = ledger.policy.name
        n, m = len(units), len(ledger.horizons)
        excluded = np.zeros(n, dtype=bool)
        spent = np.zeros((n, m), dtype=np.int64)
        refusals = [0] * m
        transitions: list[tuple[int, int, int, int, int, int, int]] = []
        for position, unit in enumerate(units):
            key = (namespace, unit)
            state = self._units.get(key)
            if state is None:
                state = {}
            result = ledger.charge_unit(state, cost_units, time_ms, now_ms)
            excluded[position] = not result.admitted
            spent[position] = result.spent_units
            for i, refused in enumerate(result.refused):
                refusals[i] += refused
            for i, old, new, lapse in result.transitions:
                transitions.append((position, i, old, new, int(result.refused[i]), result.spent_units[i], lapse))
            if state:
                self._units[key] = state
                deadline = ledger.key_deadline(state)
                if deadline > self._unit_deadlines.get(key, 0):
                    self._unit_deadlines[key] = deadline
                    heapq.heappush(self._unit_expiry, (deadline, key))
            else:
                self._units.pop(key, None)
        self._update_top(ledger, units, spent, time_ms)
        packed = np.array(transitions, dtype=batch.ALERT_DTYPE) if transitions else np.zeros(0, batch.ALERT_DTYPE)
        outcome = ChargeOutcome(
            excluded=excluded,
            charged=int(n - excluded.sum()),
            alerts=batch.alert_records(ledger, units, packed, time_ms),
            replayed=False,
            excluded_by_horizon={p.label: c for p, c in zip(ledger.horizons, refusals, strict=True)},
        )
        return outcome, spent, packed

    def _update_top(self, ledger: NamespaceLedger, units: list[str], spent: np.ndarray, time_ms: int) -> None:
        """Same candidate rule as charge.lua: score >= top_min_fraction, above the minimum once full."""
        opts = self._options
        limits = np.array([p.limit_units for p in ledger.horizons], dtype=np.float64)
        scores = (spent / limits).max(axis=1)
        period = time_ms // ledger.policy.longest_horizon_ms
        top = self._top.setdefault((ledger.policy.name, period), {})
        floor_score = min(top.values()) if len(top) >= opts.top_capacity else -1.0
        added = False
        for position in np.flatnonzero((scores >= opts.top_min_fraction) & (scores > floor_score)):
            unit, score = units[position], float(scores[position])
            if score > top.get(unit, -1.0):
                top[unit] = score
            added = True
        if added and len(top) > opts.top_capacity:
            ranked = sorted(top.items(), key=lambda item: (item[1], batch.encode_unit(item[0])))
            for unit, _ in ranked[: len(top) - opts.top_capacity]:
                del top[unit]
        if not top:
            del self._top[(ledger.policy.name, period)]

    def _observe(
        self,
        ledger: NamespaceLedger,
        outcome: ChargeOutcome,
        spent: np.ndarray,
        transitions: np.ndarray,
        now_ms: int,
        latency_s: float,
    ) -> None:
        metrics = self._metrics
        assert metrics is not None
        namespace = ledger.policy.name
        metrics.record_charge(
            namespace,
            charged=outcome.charged,
            excluded=int(outcome.excluded.sum()),
            refusals=dict(outcome.excluded_by_horizon),
            latency_s=latency_s,
        )
        metrics.enter_levels(namespace, batch.level_entries(ledger, transitions))
        for i, plan in enumerate(ledger.horizons):
            edges = np.array(ledger.edge_units(plan, metrics.fraction_buckets), dtype=np.int64)
            counts = np.bincount(np.searchsorted(edges, spent[:, i], side="left"), minlength=len(edges) + 1)
            metrics.spend_fraction.observe_counts(
                (namespace, plan.label), counts, float(spent[:, i].sum()) / plan.limit_units
            )
        metrics.expire_levels(now_ms)

    def spend(self, namespace: str, unit: str, now_ms: int) -> list[HorizonSpend]:
        ledger = self._ledger(namespace)
        with self._lock:
            self._expire(int(self._clock_ms()))
            state = dict(self._units.get((namespace, unit), {}))
        return batch.spend_report(ledger, state, batch.event_time(now_ms))

    def top(self, namespace: str, n: int, now_ms: int) -> list[tuple[str, float]]:
        ledger = self._ledger(namespace)
        if n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        now_ms = batch.event_time(now_ms)
        current = now_ms // ledger.policy.longest_horizon_ms
        fetch = min(self._options.top_capacity, 4 * n + 16)
        with self._lock:
            self._expire(int(self._clock_ms()))
            candidates: dict[str, None] = {}
            for period in (current - 1, current, current + 1):
                members = self._top.get((namespace, period), {})
                ranked = sorted(members.items(), key=lambda item: (-item[1], batch.encode_unit(item[0])))
                candidates.update((unit, None) for unit, _ in ranked[:fetch])
            states = {unit: dict(self._units.get((namespace, unit), {})) for unit in candidates}
        scored = []
        for unit, state in states.items():
            score = ledger.top_score(ledger.spent_units(state, now_ms))
            if score > 0:
                scored.append((unit, score))
        scored.sort(key=lambda item: (-item[1], item[0]))
        return scored[:n]

    def reset(self, namespace: str, unit: str) -> bool:
        self._ledger(namespace)
        with self._lock:
            self._unit_deadlines.pop((namespace, unit), None)
            existed = self._units.pop((namespace, unit), None) is not None
            for (ns, _), members in self._top.items():
                if ns == namespace:
                    members.pop(unit, None)
        return existed
