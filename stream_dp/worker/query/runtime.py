"""Everything one query needs at run time, built once from the configuration."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import orjson

from stream_dp.config import QueryConfig
from stream_dp.dp.histogram import HistogramSpec
from stream_dp.worker.combine.combiner import WindowCombiner
from stream_dp.worker.partials.wire import GroupKey


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


# What a window's charge and noise depend on, besides the charge itself (cost, delta, namespace) and a
# continual query's period grid: these fields of the query's configuration. Others -- topics, timeouts,
# the timestamp's format, the partitioner -- change neither what a unit pays nor the noise it is released with.
_CONFIG_FIELDS: dict[str, Any] = {
    "epsilon": True, "delta": True, "mechanism": True, "privacy_unit": True, "bounds": True,
    "window": {"size_ms", "offset_ms"}, "continual": True, "group_by": True, "groups": True, "aggregations": True,
}
_FINGERPRINT = "_settings_fingerprint"  # where a runtime keeps its fingerprint once computed


def charged_settings(query: Any) -> dict[str, Any]:
    """Every setting a query's charge and noise depend on, as plain JSON values.

    ``query`` is a ``QueryRuntime``; a stand-in that carries only what a charge reads (no ``config``)
    is described by its charge alone.
    """
    settings: dict[str, Any] = {"namespace": query.namespace, "cost": query.cost, "delta": query.delta}
    continual = getattr(query, "continual", None)
    if continual is not None:
        settings.update(period_ms=continual.period_ms, offset_ms=continual.offset_ms,
                        window_size_ms=continual.window_size_ms, max_windows_per_unit=continual.max_windows_per_unit)
    config = getattr(query, "config", None)
    if config is not None:
        # Hierarchies and local DP are described only when a query has them: a continual query (which cannot
        # have them) is then described exactly as the keys of its stored periods and trees were made.
        include = {**_CONFIG_FIELDS, **({"local_dp": True} if config.local_dp is not None else {})}
        # Lists keep their order (the public groups' order labels the releases); no sets in here.
        settings["config"] = config.model_dump(mode="json", include=include)
        if config.hierarchy_split is not None:
            # Each level's share of the budget, which is what the noise depends on (``true`` and equal weights
            # are the same split).
            settings["hierarchy_split"] = config.hierarchy_split
    return settings


def settings_fingerprint(query: Any) -> str:
    """A digest of ``charged_settings(query)``: equal for equal settings, in every process and run.

    Partials carry it (the release withholds a window charged under other settings than its own), and
    continual queries key their periods, charges and trees by it. Computed once per runtime: the public
    groups may number a million.
    """
    cached = vars(query).get(_FINGERPRINT)
    if cached is None:
        canonical = orjson.dumps(charged_settings(query), option=orjson.OPT_SORT_KEYS)
        cached = vars(query)[_FINGERPRINT] = hashlib.blake2b(canonical, digest_size=8).hexdigest()
    return cached


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
    sandbox: Any = None  # sample_aggregate queries: the user function's process (``worker.sandbox.runner``)

    def __post_init__(self) -> None:
        # The release stage adds up only partials charged under the settings it noises for: its own.
        if self.combiner is not None:
            self.combiner.settings = settings_fingerprint(self)

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
