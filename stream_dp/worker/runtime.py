"""Everything one query needs at run time, built once from the configuration."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from stream_dp.config import QueryConfig
from stream_dp.windows.histogram import HistogramSpec
from stream_dp.worker.combiner import WindowCombiner
from stream_dp.worker.records import GroupKey


@dataclass(frozen=True)
class ContinualCharging:
    """How a continual query's windows fall into periods, and in how many of a period a unit may take part.

    Periods are cut on the windows' grid: period ``k`` covers event times
    ``[offset_ms + k * period_ms, offset_ms + (k + 1) * period_ms)``, so each
    window lies in exactly one period. A unit is charged the period's loss at
    the first window of a period it contributes to, and is left out of every
    window of the period after its ``max_windows_per_unit``-th.
    """

    period_ms: int
    offset_ms: int  # the windows' offset
    window_size_ms: int
    max_windows_per_unit: int

    def __post_init__(self) -> None:
        for name in ("period_ms", "offset_ms", "window_size_ms", "max_windows_per_unit"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"continual {name} must be an int, got {value!r}")
        size, period = self.window_size_ms, self.period_ms
        if size < 1 or period < size or period % size:
            raise ValueError(
                f"continual period of {period} ms is not a whole number of windows of {size} ms; "
                "use a period that is a multiple of the window size (e.g. 1d with 1m windows)"
            )
        if not 0 <= self.offset_ms < size:
            raise ValueError(f"window offset {self.offset_ms} ms must lie in [0, {size}) ms, the window size")
        if not 1 <= self.max_windows_per_unit <= period // size:
            raise ValueError(
                f"max_windows_per_unit {self.max_windows_per_unit} must be between 1 and the {period // size} "
                "windows of a period"
            )

    @classmethod
    def of(cls, query: QueryConfig) -> ContinualCharging | None:
        """The continual charging of ``query``, or None if it is not continual."""
        if query.continual is None:
            return None
        return cls(
            period_ms=query.continual.period_ms,
            offset_ms=query.window.offset_ms,
            window_size_ms=query.window.size_ms,
            max_windows_per_unit=query.continual.max_windows_per_unit,
        )

    def _check_window(self, window_start_ms: int) -> None:
        if (window_start_ms - self.offset_ms) % self.window_size_ms:
            raise ValueError(
                f"{window_start_ms} is not the start of a window of {self.window_size_ms} ms at offset "
                f"{self.offset_ms} ms; pass a window's start"
            )

    def period_start(self, window_start_ms: int) -> int:
        """Start of the period holding the window that starts at ``window_start_ms``."""
        self._check_window(window_start_ms)
        return (window_start_ms - self.offset_ms) // self.period_ms * self.period_ms + self.offset_ms

    def period_end(self, window_start_ms: int) -> int:
        return self.period_start(window_start_ms) + self.period_ms

    def window_index(self, window_start_ms: int) -> int:
        """The window's place in its period: 1 for the period's first window."""
        return (window_start_ms - self.period_start(window_start_ms)) // self.window_size_ms + 1


@dataclass
class QueryRuntime:
    """A query's engine (ingest side), combiner and release plan (release side)."""

    config: QueryConfig
    engine: Any  # stream_dp.windows.WindowEngine
    plan: Any  # stream_dp.dp.ReleasePlan
    combiner: WindowCombiner
    namespace: str
    # Per-unit charge of one window, in the namespace's unit (epsilon or rho); of a continual query,
    # of one period (charged once per unit and period, see ``continual``).
    cost: float
    delta: float  # charged beside ``cost`` to the namespace's delta limits, per window or (continual) per period
    privacy: dict[str, Any]  # the `privacy` block of every release record of this query
    continual: ContinualCharging | None = None  # set for continual queries: charged per period, not per window
    sandbox: Any = None  # sample_aggregate queries: the user function's process (``worker.sandbox``)

    @property
    def name(self) -> str:
        return self.config.name

    @cached_property
    def public_groups(self) -> list[GroupKey] | None:
        # Built once: a query may list a million public groups, and the release stage asks often.
        return self.config.public_group_keys()

    @cached_property
    def histogram(self) -> HistogramSpec | None:
        """The value bins of a quantiles query (None for other queries): its partials carry histograms."""
        quantiles = self.config.aggregations.quantiles
        if quantiles is None:
            return None
        lo, hi = quantiles.bounds
        return HistogramSpec(bins=quantiles.bins, lo=float(lo), hi=float(hi))

    @property
    def blocks(self) -> int | None:
        """A sample-and-aggregate query's block count (its partials carry block values), else None."""
        plan = getattr(self.plan, "sample_aggregate", None)
        return None if plan is None else plan.blocks

    @property
    def features(self) -> Any:
        """What each unit adds to a vector query's groups (``stream_dp.dp.vectors.FeatureSpec``), or to a unary
        local-DP query's (``stream_dp.dp.local.UnaryReports``), else None."""
        vector = getattr(self.plan, "vector", None)
        if vector is not None:
            return vector.features
        local = getattr(self.plan, "local", None)
        if local is not None and local.mechanism == "oue":  # unary reports: support counts per value
            from stream_dp.dp.local import UnaryReports

            return UnaryReports(local.domain_size)
        return None
