"""Budget policies: rolling horizons with limits, per namespace of privacy units.

Amounts are kept in fixed point: one *micro-unit* is 10**-6 of epsilon (or of
rho in a zCDP namespace), one *pico-unit* 10**-12 of delta. Limits are rounded
**down** and charges **up** to a whole unit, so the integer ledger never admits
more than the real-valued policy and never drifts the way repeated float
additions do.

An epsilon namespace may also limit delta per horizon: queries that spend
delta (Gaussian noise, partition selection) charge it beside epsilon, and a
unit is admitted only if every limit holds. Basic composition holds for
privacy filters, (epsilon, delta) included (Rogers, Roth, Ullman & Vadhan
2016; Whitehouse et al. 2023), so the losses charged to a unit in a horizon
sum to at most (L_epsilon, L_delta).

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
from typing import Any, Literal

Accounting = Literal["epsilon", "rho"]

MICRO = 1_000_000
"""Fixed-point scale: micro-units per unit of epsilon (or rho)."""

PICO = 1_000_000_000_000
"""Fixed-point scale of delta: pico-units per unit (a delta of 1e-6 is 10**6 pico-units)."""

MAX_HORIZONS = 7
"""Limits per namespace, epsilon (or rho) and delta ones together (the stored state flags each
limit's alert level in one byte)."""

MAX_THRESHOLDS = 7
"""Alert thresholds per namespace; a unit's level (0..7) is packed into 3 bits."""

MAX_LIMIT_UNITS = 2**32 - 1
"""Largest limit in fixed-point units (about 4295 epsilon, or a delta of 0.0043): bucket
counters are stored as unsigned 32-bit integers."""

_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def to_units_up(amount: float, scale: int = MICRO) -> int:
    """``amount`` in fixed-point units (micro-units by default), rounded up (used for charges)."""
    return int((Decimal(repr(float(amount))) * scale).to_integral_value(ROUND_CEILING))


def to_units_down(amount: float, scale: int = MICRO) -> int:
    """``amount`` in fixed-point units (micro-units by default), rounded down (used for limits)."""
    return int((Decimal(repr(float(amount))) * scale).to_integral_value(ROUND_FLOOR))


def from_units(units: int, scale: int = MICRO) -> float:
    """Fixed-point units back to a float amount (for reports)."""
    return units / scale


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
    delta: bool = False
    """True: ``limit`` bounds delta, charged in pico-units; False: the namespace's epsilon (or rho)."""

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
        if not isinstance(self.delta, bool):
            raise ValueError(f"delta must be True (a delta limit) or False, got {self.delta!r}")
        units = to_units_down(self.limit, self.scale)
        what = "delta limit" if self.delta else "limit"
        if units < 1:
            raise ValueError(f"{what} must be at least {'1e-12' if self.delta else '1e-6'} (one fixed-point unit), got {self.limit!r}")
        if units > MAX_LIMIT_UNITS:
            raise ValueError(
                f"{what} {self.limit!r} is too large; the ledger supports {what}s up to "
                f"{MAX_LIMIT_UNITS / self.scale:g}"
            )

    @property
    def scale(self) -> int:
        """Fixed-point units per unit of what this limit bounds."""
        return PICO if self.delta else MICRO

    @property
    def bucket_ms(self) -> int:
        """Width ``w`` of one bucket in ms."""
        return self.horizon_ms // self.buckets

    @property
    def limit_units(self) -> int:
        """The limit in fixed-point units, rounded down."""
        return to_units_down(self.limit, self.scale)

    @property
    def label(self) -> str:
        """Metric label of this limit: ``'1h'`` (epsilon or rho), ``'1h-delta'`` (delta)."""
        return format_duration_ms(self.horizon_ms) + ("-delta" if self.delta else "")


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
        if all(h.delta for h in self.horizons):
            raise ValueError(
                f"namespace {self.name}: every limit bounds delta; give at least one {self.accounting} limit"
            )
        if self.accounting == "rho" and any(h.delta for h in self.horizons):
            raise ValueError(
                f"namespace {self.name}: a rho (zCDP) namespace holds no delta limit: zCDP queries spend no "
                "delta. Account the namespace in epsilon to limit delta (Gaussian and partition selection)"
            )
        lengths = [(h.horizon_ms, h.delta) for h in self.horizons]
        if len(set(lengths)) != len(lengths):
            raise ValueError(
                f"namespace {self.name}: two limits of one kind share a horizon "
                f"({[h.label for h in self.horizons]}); keep the smaller one"
            )
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

    @property
    def limits_delta(self) -> bool:
        """True when some limit bounds delta (queries spending delta may charge this namespace)."""
        return any(h.delta for h in self.horizons)

    def currency(self, horizon: HorizonLimit) -> str:
        """What ``horizon`` limits: ``'delta'``, or the namespace's accounting (``'epsilon'``/``'rho'``)."""
        return "delta" if horizon.delta else self.accounting

    def threshold_units(self, horizon: HorizonLimit) -> tuple[int, ...]:
        """Spend (micro-units) at which each alert threshold is reached: ceil(a * limit)."""
        limit = Decimal(horizon.limit_units)
        return tuple(int((Decimal(repr(a)) * limit).to_integral_value(ROUND_CEILING)) for a in self.alert_at)

    def cost_units(self, cost: float, delta: float = 0.0) -> tuple[int, ...]:
        """A query's per-window loss in fixed-point units (rounded up), one entry per limit.

        ``cost`` is in the namespace's accounting (epsilon or rho); ``delta``
        is charged to delta limits. A query that spends delta needs a delta
        limit: charging it only epsilon would leave its delta unbounded.
        """
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost <= 0:
            raise ValueError(f"cost must be a finite positive {self.accounting}, got {cost!r}")
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0.0 <= delta < 1.0:
            raise ValueError(f"delta must be a number in [0, 1), got {delta!r}")
        if delta > 0 and not self.limits_delta:
            raise ValueError(
                f"a charge of delta={delta:g} to namespace {self.name}, which has no delta limit: its delta would "
                "be unbounded. Add a delta limit to a horizon of the namespace, e.g. "
                "{horizon: 1h, epsilon: 1.0, delta: 1e-6}"
            )
        units = []
        for h in self.horizons:
            amount = delta if h.delta else cost
            u = to_units_up(amount, h.scale)
            if u > h.limit_units:
                raise ValueError(
                    f"a charge of {amount!r} {self.currency(h)} exceeds the {h.label} limit {h.limit!r} of namespace "
                    f"{self.name}: no unit could ever be charged; lower the query's {self.currency(h)} or raise "
                    "the limit"
                )
            units.append(u)
        return tuple(units)

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


def policy_from_config(pipeline_config: Any) -> BudgetPolicy:
    """The budget policy of a loaded query file (``stream_dp.config.PipelineConfig``)."""
    namespaces = []
    for name, namespace in pipeline_config.namespaces.items():
        horizons = []
        for b in namespace.budgets:
            horizons.append(HorizonLimit(b.horizon_ms, b.limit, b.buckets))
            if b.delta is not None:
                horizons.append(HorizonLimit(b.horizon_ms, b.delta, b.buckets, delta=True))
        namespaces.append(NamespacePolicy(name, namespace.accounting, horizons, alert_at=namespace.alert_at))
    return BudgetPolicy(namespaces)
