"""The budget-store interface: what a worker calls, what it gets back, what can go wrong."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from stream_dp.budget.policy import BudgetPolicy, format_duration_ms


class BudgetError(Exception):
    """Base of every budget-store failure. On any of them the caller must not release."""


class BudgetUnavailable(BudgetError):
    """The store could not be reached or failed while charging; nothing may be released.

    A retry with the same charge id is safe: a charge that did reach the store
    is replayed, not charged twice.
    """


class StoreLayoutMismatch(BudgetError):
    """Budgets in the store were written by workers with another layout.

    Every worker of a namespace must use the same ``StoreOptions``, shard count
    and horizons/buckets; otherwise each would see only part of a unit's spending.
    """


class ChargeRejected(BudgetError, ValueError):
    """The store refused the charge as a whole (no unit was charged)."""


class ChargeOutOfRange(ChargeRejected):
    """The charge's event time is too far behind (or ahead of) the store's clock.

    Old buckets are forgotten after ``max_delay_ms``; admitting a charge older
    than that could exceed a limit unseen, so it is refused. Raise
    ``StoreOptions.max_delay_ms`` (keys then live longer) if windows legitimately
    close that late, e.g. during a backfill. The worker sets it from the input
    topics' retention (``STREAM_DP_INPUT_RETENTION_MS``).
    """


class ChargeConflict(ChargeRejected):
    """The charge id was already used with different units, cost or event time.

    Retries must repeat the original call exactly (same units in the same order);
    a new window needs a new charge id.
    """


DEFAULT_INPUT_RETENTION_MS = 7 * 86_400_000
"""Kafka's default ``retention.ms`` (7 days): how old a backlog the worker may have to charge."""

CLOSE_SLACK_MS = 3_600_000
"""How much later than its newest record a window may be charged (allowed lateness, watermark lag,
processing): the whole accepted delay before it was derived from the input retention."""

LEGACY_MAX_DELAY_MS = 3_600_000
"""The accepted delay of stores laid out before it followed the input retention (see RedisBudgetStore)."""


@dataclass(frozen=True)
class StoreOptions:
    """Tuning shared by every backend.

    ``max_delay_ms``: how far a charge's event time may lag the store clock
    (allowed lateness + watermark lag + processing delay, and, for a backlog
    replayed after an outage, the age of its oldest record). Buckets are kept
    ``horizon + max_delay_ms`` past their end, so this also sets key lifetime.
    The default accepts any backlog the input topics still hold at Kafka's
    default retention: see :meth:`for_input_retention`.
    ``max_lead_ms``: how far a charge's event time may run ahead of the clock
    (producer clock skew). ``top_capacity`` / ``top_min_fraction``: ``top``
    tracks at most this many units per period, and only units whose spend
    fraction reached ``top_min_fraction``.
    """

    max_delay_ms: int = DEFAULT_INPUT_RETENTION_MS + CLOSE_SLACK_MS
    max_lead_ms: int = 900_000
    top_capacity: int = 1000
    top_min_fraction: float = 0.5

    @classmethod
    def for_input_retention(cls, input_retention_ms: int) -> StoreOptions:
        """Options under which every window the input topics can still replay is charged.

        A record stays in its topic for ``input_retention_ms``; the window it
        falls in is charged at the window's end, at most ``CLOSE_SLACK_MS``
        after the record's event time in normal running. A backlog is thus
        charged at most retention + slack behind the store clock. (Kafka
        deletes whole segments, so a record can outlive its retention by up to
        a segment's age; windows older than the accepted delay are refused,
        never charged unsoundly.) Every writer of a key prefix must use the
        same value: the worker and ``stream-dp budget`` both call this.
        """
        if isinstance(input_retention_ms, bool) or not isinstance(input_retention_ms, int) or input_retention_ms < 0:
            raise ValueError(
                f"input_retention_ms must be a non-negative integer number of ms, got {input_retention_ms!r}; "
                "use the input topics' retention.ms"
            )
        return cls(max_delay_ms=input_retention_ms + CLOSE_SLACK_MS)

    def __post_init__(self) -> None:
        for name in ("max_delay_ms", "max_lead_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer number of ms, got {value!r}")
        if isinstance(self.top_capacity, bool) or not isinstance(self.top_capacity, int) or self.top_capacity < 1:
            raise ValueError(f"top_capacity must be a positive integer, got {self.top_capacity!r}")
        if not 0.0 <= self.top_min_fraction <= 1.0:
            raise ValueError(f"top_min_fraction must be in [0, 1], got {self.top_min_fraction!r}")

    @property
    def record_ttl_ms(self) -> int:
        """Lifetime of a charge record (the idempotency key).

        A retry arriving after the record expired has an event time older than
        ``now - max_delay_ms`` and is refused as out of range, so no retry can
        ever be charged twice.
        """
        return self.max_delay_ms + self.max_lead_ms + 1000


@dataclass(frozen=True)
class AlertRecord:
    """A unit reached ``threshold`` of a horizon's limit (or a charge was refused).

    ``exhausted`` is True when the alert comes from a refused charge: the unit
    could not afford the charge, whatever its current fraction.
    """

    namespace: str
    unit: str
    horizon_ms: int
    spent: float
    limit: float
    threshold: float
    time_ms: int
    accounting: str
    exhausted: bool = False


@dataclass(frozen=True)
class ChargeOutcome:
    """Result of charging a batch of units for one released window.

    ``excluded[i]`` is True when ``units[i]`` could not afford the charge and was
    not charged: the caller drops all of that unit's events from the window.
    ``charged`` counts the units charged. ``replayed`` is True when the charge id
    had already been charged: the stored decision is returned, nobody is charged.
    ``excluded_by_horizon``: units refused by each limit, by its label (``'1h'``,
    ``'1h-delta'``); a unit refused by two limits counts in both.
    """

    excluded: np.ndarray
    charged: int
    alerts: list[AlertRecord] = field(default_factory=list)
    replayed: bool = False
    excluded_by_horizon: dict[str, int] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> ChargeOutcome:
        return cls(excluded=np.zeros(0, dtype=bool), charged=0)


@dataclass(frozen=True)
class HorizonSpend:
    """A unit's spend on one horizon at a point in time.

    ``spent`` is the largest spend of any run of ``buckets + 1`` buckets that
    contains the time: exactly what stands between the unit and exclusion, so
    ``remaining = limit - spent`` can still be charged at that time.
    ``currency`` is what the limit bounds: ``'epsilon'``, ``'rho'`` or
    ``'delta'``. For epsilon and rho limits ``epsilon``/``delta`` give the
    spend as (epsilon, delta)-DP: for rho namespaces converted at the
    namespace's ``report_delta``; for epsilon namespaces delta is None. For a
    delta limit they are None and ``spent`` is the delta spent.
    """

    horizon_ms: int
    spent: float
    limit: float
    fraction: float
    epsilon: float | None
    delta: float | None
    currency: str = "epsilon"

    @property
    def remaining(self) -> float:
        """What can still be charged at this time (never negative)."""
        return max(0.0, self.limit - self.spent)

    @property
    def label(self) -> str:
        """``'1h'``, or ``'1h-delta'`` for a delta limit (as in metric labels)."""
        return format_duration_ms(self.horizon_ms) + ("-delta" if self.currency == "delta" else "")


@runtime_checkable
class BudgetStore(Protocol):
    """Per-unit privacy budgets with atomic, idempotent batch check-and-charge."""

    @property
    def policy(self) -> BudgetPolicy: ...

    def charge(
        self, namespace: str, charge_id: str, units: Sequence[str], cost: float, event_time_ms: int,
        *, delta: float = 0.0,
    ) -> ChargeOutcome:
        """Charge ``cost`` (and ``delta``, to delta limits) at ``event_time_ms`` to every unit that can afford both.

        Raises ``BudgetError`` (never returns) when nothing could be charged.
        """
        ...

    def spend(self, namespace: str, unit: str, now_ms: int) -> list[HorizonSpend]:
        """The unit's spend on each horizon of the namespace at ``now_ms``."""
        ...

    def top(self, namespace: str, n: int, now_ms: int) -> list[tuple[str, float]]:
        """Up to ``n`` units with the highest spend fraction (max over horizons) at ``now_ms``."""
        ...

    def reset(self, namespace: str, unit: str) -> bool:
        """Forget the unit's spend (an administrative override); True if it had any."""
        ...

    def close(self) -> None: ...
