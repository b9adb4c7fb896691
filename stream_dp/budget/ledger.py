"""Pure per-unit ledger logic: the check-and-charge rule on one unit's counters.

A unit's state is a small mapping of integer fields to integer values (the
Redis backend stores the same content packed, see :mod:`stream_dp.budget.layout`,
and ``charge.lua`` implements the same rule on it):

* bucket counter of limit ``i`` (0-based) and bucket ``b``:
  field ``b * 8 + i`` -> fixed-point units (micro-epsilon, micro-rho or
  pico-delta, as the limit says) charged at event times in bucket ``b``;
* alert level of horizon ``i``: field ``-(i + 1)`` -> ``lapse_ms * 8 + level``,
  the highest alert threshold index (1-based) the unit reached, valid until
  ``lapse_ms`` (one horizon after the unit first reached it, rounded up to a
  whole second).

Every field has a deadline after which no admissible charge can read it
(bucket ``b``: its end + horizon + ``max_delay_ms``; level: its lapse time);
fields past their deadline are pruned, and a unit whose fields are all past
their deadline is forgotten.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal

from stream_dp.budget.policy import MICRO, PICO, NamespacePolicy
from stream_dp.budget.store import StoreOptions

FIELD_STRIDE = 8
"""Bucket fields are ``bucket * FIELD_STRIDE + horizon_index`` (at most 8 horizons, 8 levels)."""


def ceil_to_second(ms: int) -> int:
    """Level lapse times are whole seconds (they are stored in seconds)."""
    return -(-ms // 1000) * 1000


@dataclass(frozen=True)
class HorizonPlan:
    """One horizon of a namespace in ledger terms (integers only)."""

    index: int
    horizon_ms: int
    buckets: int
    bucket_ms: int
    limit_units: int
    threshold_units: tuple[int, ...]
    label: str
    limit: float
    delta: bool = False
    """True: this limit bounds delta (pico-units)."""

    @property
    def scale(self) -> int:
        return PICO if self.delta else MICRO

    def bucket_of(self, time_ms: int) -> int:
        return time_ms // self.bucket_ms

    def field_of(self, bucket: int) -> int:
        return bucket * FIELD_STRIDE + self.index

    @property
    def level_field(self) -> int:
        return -(self.index + 1)


@dataclass
class UnitCharge:
    """What charging one unit did."""

    admitted: bool
    spent_units: list[int]
    """Per horizon: spend (run maximum) after the charge, or before it if refused."""
    refused: list[bool]
    """Per horizon: True if this horizon's limit refused the charge."""
    transitions: list[tuple[int, int, int, int]]
    """Alert levels entered: (horizon index, old level, new level, lapse_ms)."""


class NamespaceLedger:
    """The check-and-charge rule of one namespace, on plain integer mappings."""

    def __init__(self, policy: NamespacePolicy, options: StoreOptions) -> None:
        self.policy = policy
        self.options = options
        self.horizons: tuple[HorizonPlan, ...] = tuple(
            HorizonPlan(
                index=i,
                horizon_ms=h.horizon_ms,
                buckets=h.buckets,
                bucket_ms=h.bucket_ms,
                limit_units=h.limit_units,
                threshold_units=policy.threshold_units(h),
                label=h.label,
                limit=h.limit,
                delta=h.delta,
            )
            for i, h in enumerate(policy.horizons)
        )
        self.levels = len(policy.alert_at)

    def field_deadline(self, field: int, value: int) -> int:
        """Time (ms) after which no admissible charge reads ``field``."""
        if field < 0:
            return value // FIELD_STRIDE
        plan = self.horizons[field % FIELD_STRIDE]
        bucket = field // FIELD_STRIDE
        return (bucket + 1) * plan.bucket_ms + plan.horizon_ms + self.options.max_delay_ms

    def key_deadline(self, state: Mapping[int, int]) -> int:
        """When the whole unit can be forgotten: the largest field deadline (0 if empty)."""
        return max((self.field_deadline(f, v) for f, v in state.items()), default=0)

    def prune(self, state: MutableMapping[int, int], now_ms: int) -> list[int]:
        """Drop fields past their deadline; returns the dropped fields."""
        stale = [f for f, v in state.items() if self.field_deadline(f, v) <= now_ms]
        for f in stale:
            del state[f]
        return stale

    def run_max(self, state: Mapping[int, int], plan: HorizonPlan, time_ms: int) -> int:
        """Largest sum over runs of ``buckets + 1`` consecutive buckets containing ``time_ms``."""
        b = plan.bucket_of(time_ms)
        width = plan.buckets
        values = [state.get(plan.field_of(j), 0) for j in range(b - width, b + width + 1)]
        run = sum(values[: width + 1])
        best = run
        for k in range(1, width + 1):
            run += values[width + k] - values[k - 1]
            best = max(best, run)
        return best

    def spent_units(self, state: Mapping[int, int], time_ms: int) -> list[int]:
        return [self.run_max(state, plan, time_ms) for plan in self.horizons]

    def level_of(self, plan: HorizonPlan, spent: int, refused: bool) -> int:
        if refused:
            return self.levels
        return sum(1 for t in plan.threshold_units if spent >= t)

    def charge_unit(
        self, state: MutableMapping[int, int], cost_units: Sequence[int] | int, time_ms: int, now_ms: int
    ) -> UnitCharge:
        """Check and charge one unit in place (the caller holds any lock).

        ``cost_units``: the charge per limit (``NamespacePolicy.cost_units``), or
        one number for every limit; a limit whose cost is 0 (the delta limit of
        a pure-epsilon query) is checked, never written.
        """
        if isinstance(cost_units, int):
            cost_units = (cost_units,) * len(self.horizons)
        self.prune(state, now_ms)
        spent = self.spent_units(state, time_ms)
        refused = [
            s + c > plan.limit_units for s, c, plan in zip(spent, cost_units, self.horizons, strict=True)
        ]
        admitted = not any(refused)
        if admitted:
            for i, plan in enumerate(self.horizons):
                if cost_units[i] == 0:
                    continue
                field = plan.field_of(plan.bucket_of(time_ms))
                state[field] = state.get(field, 0) + cost_units[i]
                spent[i] += cost_units[i]
        transitions: list[tuple[int, int, int, int]] = []
        for i, plan in enumerate(self.horizons):
            level = self.level_of(plan, spent[i], refused[i])
            if level == 0:
                continue
            record = state.get(plan.level_field)
            if record is None:
                old_level, lapse_ms = 0, ceil_to_second(now_ms + plan.horizon_ms)
            else:
                old_level, lapse_ms = record % FIELD_STRIDE, record // FIELD_STRIDE
            if level > old_level:
                state[plan.level_field] = lapse_ms * FIELD_STRIDE + level
                transitions.append((i, old_level, level, lapse_ms))
        return UnitCharge(admitted=admitted, spent_units=spent, refused=refused, transitions=transitions)

    def edge_units(self, plan: HorizonPlan, fractions: Sequence[float]) -> tuple[int, ...]:
        """Histogram edges in micro-units: spend/limit <= f  iff  spend <= floor(f * limit)."""
        limit = Decimal(plan.limit_units)
        return tuple(int((Decimal(repr(float(f))) * limit).to_integral_value(ROUND_FLOOR)) for f in fractions)

    def top_score(self, spent: list[int]) -> float:
        """A unit's spend fraction: the largest over horizons."""
        return max(s / plan.limit_units for s, plan in zip(spent, self.horizons, strict=True))
