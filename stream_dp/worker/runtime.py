"""Everything one query needs at run time, built once from the configuration."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from stream_dp.config import QueryConfig
from stream_dp.windows.histogram import HistogramSpec
from stream_dp.worker.combiner import WindowCombiner
from stream_dp.worker.records import GroupKey


@dataclass
class QueryRuntime:
    """A query's engine (ingest side), combiner and release plan (release side)."""

    config: QueryConfig
    engine: Any  # stream_dp.windows.WindowEngine
    plan: Any  # stream_dp.dp.ReleasePlan
    combiner: WindowCombiner
    namespace: str
    cost: float  # per-unit charge of one window, in the namespace's unit (epsilon or rho)
    delta: float  # per-unit delta of one window, charged beside ``cost`` to the namespace's delta limits
    privacy: dict[str, Any]  # the `privacy` block of every release record of this query

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
