"""Budget policies: rolling horizons with limits, per namespace of privacy units.

Amounts are kept in fixed point: one *micro-unit* is 10**-6 of epsilon (or of
rho in a zCDP namespace). Limits are rounded **down** and charges **up** to a
whole micro-unit, so the integer ledger never admits more than the real-valued
policy and never drifts the way repeated float additions do.

A float is read as the shortest decimal that round-trips to it (``repr``), so
``0.1`` is exactly 100_000 micro-units and ten charges of 0.1 fit a limit of
1.0. The float's own binary representation error (at most half an ulp, about
1e-17 relative) is not charged.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Literal

Accounting = Literal["epsilon", "rho"]

MICRO = 1_000_000
"""Fixed-point scale: micro-units per unit of epsilon (or rho)."""

MAX_HORIZONS = 7
"""Horizons per namespace (the stored state flags each horizon's alert level in one byte)."""

MAX_THRESHOLDS = 7
"""Alert thresholds per namespace; a unit's level (0..7) is packed into 3 bits."""

MAX_LIMIT_UNITS = 2**32 - 1
"""Largest limit in micro-units (about 4295 epsilon): bucket counters are
stored as unsigned 32-bit integers."""

_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def to_units_up(amount: float) -> int:
    """``amount`` in micro-units, rounded up (used for charges)."""
    return int((Decimal(repr(float(amount))) * MICRO).to_integral_value(ROUND_CEILING))


def to_units_down(amount: float) -> int:
    """``amount`` in micro-units, rounded down (used for limits)."""
    return int((Decimal(repr(float(amount))) * MICRO).to_integral_value(ROUND_FLOOR))


def from_units(units: int) -> float:
    """Micro-units back to a float amount (for reports)."""
    return units / MICRO


def zcdp_to_epsilon(rho: float, delta: float) -> float:
    """Epsilon of (epsilon, delta)-DP implied by ``rho``-zCDP.

    epsilon = rho + 2 * sqrt(rho * ln(1/delta))  (Bun & Steinke 2016, Prop. 1.3).
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if rho < 0.0 or not math.isfinite(rho):
        raise ValueError(f"rho must be a finite non-negative number, got {rho!r}")
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def format_duration_ms(ms: int) -> str:
    """Short label for a duration: ``3600000 -> '1h'``, ``90000 -> '90s'``."""
    for size, suffix in ((86_400_000, "d"), (3_600_000, "h"), (60_000, "m"), (1_000, "s")):
        if ms % size == 0:
            return f"{ms // size}{suffix}"
    return f"{ms}ms"


@dataclass(frozen=True)
class HorizonLimit:
    """At most ``limit`` may be spent per unit in any ``horizon_ms`` of event time.

    The horizon is split into ``buckets`` buckets of ``horizon_ms / buckets`` ms;
    a charge is admitted only if every run of ``buckets + 1`` consecutive buckets
    containing it stays within the limit (see :mod:`stream_dp.budget`). More
    buckets waste less budget (the admitted spend per real horizon can reach the
    limit more closely) and cost a few more bytes per active unit.
    """

    horizon_ms: int
    limit: float
    buckets: int = 4

    def __post_init__(self) -> None:
        if isinstance(self.horizon_ms, bool) or not isinstance(self.horizon_ms, int) or self.horizon_ms <= 0:
            raise ValueError(
                f"horizon_ms must be a positive integer number of milliseconds, got {self.horizon_ms!r} "
                "(e.g. 3_600_000 for one hour)"
            )
        if isinstance(self.buckets, bool) or not isinstance(self.buckets, int) or not 1 <= self.buckets <= 255:
            raise ValueError(f"buckets must be an integer in [1, 255], got {self.buckets!r}")
        if self.horizon_ms % self.buckets:
            raise ValueError(
                f"horizon_ms={self.horizon_ms} is not divisible by buckets={self.buckets}: "
                "choose a bucket count that divides the horizon (e.g. 4, 12 or 24 for an hour or a day)"
            )
        if isinstance(self.limit, bool) or not isinstance(self.limit, (int, float)) or not math.isfinite(self.limit):
            raise ValueError(f"limit must be a finite number, got {self.limit!r}")
        units = to_units_down(self.limit)
        if units < 1:
            raise ValueError(f"limit must be at least 1e-6 (one micro-unit), got {self.limit!r}")
        if units > MAX_LIMIT_UNITS:
            raise ValueError(
                f"limit {self.limit!r} is too large; the ledger supports limits up to {MAX_LIMIT_UNITS / MICRO:g}"
            )

    @property
    def bucket_ms(self) -> int:
        """Width ``w`` of one bucket in ms."""
        return self.horizon_ms // self.buckets

    @property
    def limit_units(self) -> int:
        """The limit in micro-units, rounded down."""
        return to_units_down(self.limit)

    @property
    def label(self) -> str:
        """Metric label of this horizon, e.g. ``'1h'``."""
        return format_duration_ms(self.horizon_ms)


@dataclass(frozen=True)
class NamespacePolicy:
    """Budget policy of one kind of privacy unit (e.g. ``users`` keyed by ``user_id``).

    ``accounting`` is ``"epsilon"`` (pure DP, losses add up) or ``"rho"`` (zCDP,
    rho adds up); callers convert each query's loss into this unit before
    charging. ``alert_at`` lists fractions of each limit (increasing, in (0, 1])
    at which a unit raises an alert. ``report_delta`` is the delta at which
    rho spend is reported as (epsilon, delta).
    """

    name: str
    accounting: Accounting
    horizons: tuple[HorizonLimit, ...]
    alert_at: tuple[float, ...] = (0.8, 1.0)
    report_delta: float = 1e-9

    def __init__(
        self,
        name: str,
        accounting: Accounting,
        horizons: Iterable[HorizonLimit],
        alert_at: Iterable[float] = (0.8, 1.0),
        report_delta: float = 1e-9,
    ) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "accounting", accounting)
        object.__setattr__(self, "horizons", tuple(horizons))
        object.__setattr__(self, "alert_at", tuple(float(a) for a in alert_at))
        object.__setattr__(self, "report_delta", float(report_delta))
        self._validate()

    def _validate(self) -> None:
        if not isinstance(self.name, str) or not _NAMESPACE_RE.match(self.name):
            raise ValueError(
                f"namespace name {self.name!r} is invalid: use 1-64 letters, digits, '_', '.' or '-' (no ':')"
            )
        if self.accounting not in ("epsilon", "rho"):
            raise ValueError(f"namespace {self.name}: accounting must be 'epsilon' or 'rho', got {self.accounting!r}")
        if not self.horizons:
            raise ValueError(
                f"namespace {self.name}: give at least one HorizonLimit, e.g. HorizonLimit(3_600_000, 1.0)"
            )
        if len(self.horizons) > MAX_HORIZONS:
            raise ValueError(f"namespace {self.name}: at most {MAX_HORIZONS} horizons, got {len(self.horizons)}")
        for h in self.horizons:
            if not isinstance(h, HorizonLimit):
                raise TypeError(f"namespace {self.name}: horizons must be HorizonLimit objects, got {type(h).__name__}")
        lengths = [h.horizon_ms for h in self.horizons]
        if len(set(lengths)) != len(lengths):
            raise ValueError(f"namespace {self.name}: two limits share a horizon ({lengths}); keep the smaller one")
        if len(self.alert_at) > MAX_THRESHOLDS:
            raise ValueError(
                f"namespace {self.name}: at most {MAX_THRESHOLDS} alert thresholds, got {len(self.alert_at)}"
            )
        previous = 0.0
        for a in self.alert_at:
            if not (previous < a <= 1.0):
                raise ValueError(
                    f"namespace {self.name}: alert_at must be strictly increasing fractions in (0, 1], "
                    f"got {list(self.alert_at)} (e.g. [0.8, 1.0])"
                )
            previous = a
        if not 0.0 < self.report_delta < 1.0:
            raise ValueError(f"namespace {self.name}: report_delta must be in (0, 1), got {self.report_delta!r}")

    @property
    def longest_horizon_ms(self) -> int:
        return max(h.horizon_ms for h in self.horizons)

    def threshold_units(self, horizon: HorizonLimit) -> tuple[int, ...]:
        """Spend (micro-units) at which each alert threshold is reached: ceil(a * limit)."""
        limit = Decimal(horizon.limit_units)
        return tuple(int((Decimal(repr(a)) * limit).to_integral_value(ROUND_CEILING)) for a in self.alert_at)

    def cost_units(self, cost: float) -> int:
        """A query's loss in micro-units (rounded up), validated against the limits."""
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost <= 0:
            raise ValueError(f"cost must be a finite positive {self.accounting}, got {cost!r}")
        units = to_units_up(cost)
        for h in self.horizons:
            if units > h.limit_units:
                raise ValueError(
                    f"cost {cost!r} {self.accounting} exceeds the {h.label} limit {h.limit!r} of namespace "
                    f"{self.name}: no unit could ever be charged; "
                    f"lower the query's {self.accounting} or raise the limit"
                )
        return units

    def to_epsilon_delta(self, spent: float) -> tuple[float, float | None]:
        """``spent`` as (epsilon, delta): delta is None for epsilon namespaces (not tracked)."""
        if self.accounting == "epsilon":
            return spent, None
        return zcdp_to_epsilon(spent, self.report_delta), self.report_delta


@dataclass(frozen=True)
class BudgetPolicy:
    """The policies of all namespaces a worker charges."""

    namespaces: Mapping[str, NamespacePolicy]

    def __init__(self, namespaces: Iterable[NamespacePolicy] | Mapping[str, NamespacePolicy]) -> None:
        items: Sequence[NamespacePolicy] = (
            list(namespaces.values()) if isinstance(namespaces, Mapping) else list(namespaces)
        )
        by_name: dict[str, NamespacePolicy] = {}
        for ns in items:
            if not isinstance(ns, NamespacePolicy):
                raise TypeError(f"namespaces must be NamespacePolicy objects, got {type(ns).__name__}")
            if ns.name in by_name:
                raise ValueError(f"namespace {ns.name!r} is defined twice; merge its horizons into one NamespacePolicy")
            by_name[ns.name] = ns
        if not by_name:
            raise ValueError(
                "a BudgetPolicy needs at least one namespace, e.g. NamespacePolicy('users', 'epsilon', [...])"
            )
        object.__setattr__(self, "namespaces", dict(by_name))

    def namespace(self, name: str) -> NamespacePolicy:
        """The policy of ``name``; raises ``KeyError`` naming the known namespaces."""
        try:
            return self.namespaces[name]
        except KeyError:
            known = ", ".join(sorted(self.namespaces)) or "none"
            raise KeyError(f"unknown budget namespace {name!r}; known namespaces: {known}") from None
