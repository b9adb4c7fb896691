"""One query's whole release: per-window counts and sums, and the options beside them.

A query's ``epsilon`` (and ``delta``) is what one window's release costs one
unit, all parts together. Parts and their mechanisms:

* counts, sums, means (``ReleasePlan``): Laplace or Gaussian noise, with
  partition selection when the groups are not public;
* ``hierarchy``: the counts and sums at every prefix level of ``group_by``
  (coarsest first), each level a ``ReleasePlan`` with its share of the budget,
  made consistent afterwards (children sum to their parent) by post-processing;
* ``top_k``: the k groups with the most events, permute-and-flip (``TopKPlan``);
* ``quantiles``: per group, the exponential mechanism over bin edges
  (``QuantilesPlan``);
* ``continual``: running totals over a period with the binary tree mechanism
  (``ContinualPlan``); its loss is per *period*, charged once per unit per period.
* ``local``: reports randomized by their producers (``LocalRandomizer``); the
  worker adds no noise and debiases the counts; the loss is the report's.
* ``mean_vector`` / ``covariance``: per group, Gaussian noise on the sums of
  the units' l2-clipped vectors (``VectorPlan``, :mod:`stream_dp.dp.vectors`).
* ``sample_aggregate``: per group, a noisy mean of a user function's clipped
  outputs on disjoint blocks of units (:mod:`stream_dp.dp.sample_aggregate`).

Budget split: every component -- selection, count, sum, top_k, quantiles --
gets an equal share of ``epsilon``; the count-and-sum share of a hierarchy is
split across levels by the configured weights. Sequential composition adds
the parts' losses (Dwork & Roth Theorem 3.16; Bun & Steinke 2016 Lemma 2.3).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stream_dp.dp.bounds import ClipRange, ContributionBounds
from stream_dp.dp.loss import PrivacyLoss
from stream_dp.dp.plan import ReleasePlan
from stream_dp.dp.topk import TopKPlan

_BASE = ("count", "sum", "mean")


@dataclass(frozen=True)
class QuantileRequest:
    q: tuple[float, ...]
    lo: float
    hi: float
    bins: int
    value_interval: bool = False  # half the share to a noisy histogram for value intervals


@dataclass(frozen=True)
class VectorRequest:
    kind: str  # "mean_vector" or "covariance"
    fields: tuple[str, ...]
    clip_norm: float


@dataclass(frozen=True)
class SampleAggregateRequest:
    function: str
    blocks: int
    lo: float
    hi: float
    aggregate: str = "mean"
    bins: int = 64


@dataclass(frozen=True)
class ContinualRequest:
    windows_per_period: int
    max_windows_per_unit: int


def _coarse_bounds(bounds: ContributionBounds) -> ContributionBounds:
    """Bounds that hold at a coarser level: a unit's L0 groups may all share one parent, which then
    gets up to L0 * Linf of its events (same l1, larger l2 than at the finest level)."""
    return ContributionBounds(1, bounds.max_groups_per_unit * bounds.max_events_per_group)


@dataclass(frozen=True)
class QueryPlan:
    """Every part of one query's release, calibrated up front. Use :meth:`build`."""

    levels: tuple[ReleasePlan, ...]  # coarsest first; the last is the finest (the group_by groups)
    top_k: TopKPlan | None
    quantiles: Any | None  # stream_dp.dp.quantiles.QuantilesPlan
    continual: Any | None  # stream_dp.dp.continual.ContinualPlan
    loss: PrivacyLoss
    shares: dict[str, float] = field(default_factory=dict)
    local: Any | None = None  # stream_dp.dp.local.LocalRandomizer
    vector: Any | None = None  # stream_dp.dp.vectors.VectorPlan
    sample_aggregate: Any | None = None  # stream_dp.dp.sample_aggregate.SampleAggregatePlan

    @property
    def base(self) -> ReleasePlan | None:
        """The plan of the per-group counts and sums (finest level), if the query has them."""
        return self.levels[-1] if self.levels else None

    @property
    def hierarchy(self) -> bool:
        return len(self.levels) > 1

    @classmethod
    def build(
        cls,
        *,
        mechanism: str,
        epsilon: float,
        delta: float = 0.0,
        bounds: ContributionBounds,
        clip: ClipRange | None,
        aggregations: Iterable[str],
        selection_delta: float | None = None,
        hierarchy_split: Sequence[float] | None = None,
        top_k: int | None = None,
        quantiles: QuantileRequest | None = None,
        continual: ContinualRequest | None = None,
        local: tuple[str, float, int] | None = None,
        vector: VectorRequest | None = None,
        sample_aggregate: SampleAggregateRequest | None = None,
    ) -> QueryPlan:
        """Split ``epsilon`` (and ``delta``) over the parts and calibrate each (module docstring)."""
        chosen = frozenset(aggregations)
        base_names = frozenset(chosen & set(_BASE))
        if "mean" in base_names:
            base_names |= {"count", "sum"}
        if local is not None:
            from stream_dp.dp.local import LocalRandomizer

            randomizer = LocalRandomizer.build(*local)  # (mechanism, epsilon per report, domain size)
            return cls((), None, None, None, PrivacyLoss.pure(randomizer.epsilon), {"local_dp": 1.0}, randomizer)
        if continual is not None:
            from stream_dp.dp.continual import ContinualPlan

            if top_k is not None or quantiles is not None or hierarchy_split is not None:
                raise ValueError("a continual release holds running counts, sums and means only")
            plan = ContinualPlan.build(
                epsilon=epsilon, bounds=bounds, clip=clip, aggregations=base_names,
                windows_per_period=continual.windows_per_period,
                max_windows_per_unit=continual.max_windows_per_unit,
            )
            return cls((), None, None, plan, plan.loss, {"continual": 1.0})
        base_components = len(base_names - {"mean"}) + (1 if selection_delta is not None and base_names else 0)
        components = (base_components + (top_k is not None) + (quantiles is not None) + (vector is not None)
                      + (sample_aggregate is not None))
        if components == 0:
            raise ValueError("nothing to release: ask for count, sum, mean, top_k, quantiles or a vector")
        share = 1.0 / components
        shares: dict[str, float] = {}
        levels: list[ReleasePlan] = []
        loss: PrivacyLoss | None = None
        if base_names:
            base_share = share * base_components
            shares["counts_and_sums"] = base_share
            weights = list(hierarchy_split) if hierarchy_split is not None else [1.0]
            total_weight = sum(weights)
            if not (math.isfinite(total_weight) and total_weight > 0 and all(w > 0 for w in weights)):
                raise ValueError(f"hierarchy_split {weights} must be positive weights with a finite sum, e.g. [1, 1, 2]")
            for depth, weight in enumerate(weights):
                fraction = base_share * weight / total_weight
                finest = depth == len(weights) - 1
                level = ReleasePlan.build(
                    mechanism=mechanism, epsilon=epsilon * fraction,
                    delta=delta * fraction if mechanism == "gaussian" else 0.0,
                    bounds=bounds if finest else _coarse_bounds(bounds), clip=clip, aggregations=base_names,
                    selection_delta=selection_delta if finest else None,
                )
                levels.append(level)
                loss = level.loss if loss is None else loss + level.loss
        topk_plan = None
        if top_k is not None:
            shares["top_k"] = share
            topk_plan = TopKPlan.build(epsilon=epsilon * share * (1 - 1e-9), k=top_k, bounds=bounds)
            loss = topk_plan.loss if loss is None else loss + topk_plan.loss
        quantiles_plan = None
        if quantiles is not None:
            from stream_dp.dp.quantiles import QuantilesPlan

            shares["quantiles"] = share
            quantiles_plan = QuantilesPlan.build(
                epsilon=epsilon * share * (1 - 1e-9), q=list(quantiles.q), lo=quantiles.lo, hi=quantiles.hi,
                bins=quantiles.bins, bounds=bounds, value_interval=quantiles.value_interval,
            )
            loss = quantiles_plan.loss if loss is None else loss + quantiles_plan.loss
        vector_plan = None
        if vector is not None:
            from stream_dp.dp.loss import zcdp_rho
            from stream_dp.dp.vectors import VectorPlan

            if mechanism != "gaussian":
                raise ValueError(f"{vector.kind} adds Gaussian noise scaled to an l2 norm: use mechanism='gaussian'")
            shares[vector.kind] = share
            vector_plan = VectorPlan.build(
                kind=vector.kind, fields=vector.fields, clip_norm=vector.clip_norm,
                rho=zcdp_rho(epsilon * share, delta * share) * (1 - 1e-9), delta=delta * share, bounds=bounds,
            )
            loss = vector_plan.loss if loss is None else loss + vector_plan.loss
        sa_plan = None
        if sample_aggregate is not None:
            from stream_dp.dp.loss import zcdp_rho
            from stream_dp.dp.sample_aggregate import SampleAggregatePlan

            shares["sample_aggregate"] = share
            gaussian = mechanism == "gaussian"
            sa_plan = SampleAggregatePlan.build(
                function=sample_aggregate.function, blocks=sample_aggregate.blocks, lo=sample_aggregate.lo,
                hi=sample_aggregate.hi, kind="gaussian" if gaussian else "laplace",
                budget=(zcdp_rho(epsilon * share, delta * share) if gaussian else epsilon * share) * (1 - 1e-9),
                delta=delta * share if gaussian else 0.0, bounds=bounds, aggregate=sample_aggregate.aggregate,
                bins=sample_aggregate.bins,
            )
            loss = sa_plan.loss if loss is None else loss + sa_plan.loss
        assert loss is not None
        if loss.epsilon > epsilon * (1 + 1e-9) or loss.delta > delta + (selection_delta or 0.0) + 1e-15:
            raise RuntimeError(f"the certified loss {loss} exceeds the requested budget epsilon={epsilon}, "
                               f"delta={delta}; nothing is released")
        return cls(tuple(levels), topk_plan, quantiles_plan, None, loss, shares, vector=vector_plan,
                   sample_aggregate=sa_plan)

    def release(self, counts: Any, sums: Any, distinct_units: Any, noise: Any) -> Any:
        """The per-group counts, sums and means of one window (``ReleasePlan.release`` of the finest level)."""
        if self.base is None:
            raise ValueError("this query releases no per-group counts or sums (top_k, quantiles or continual only)")
        return self.base.release(counts, sums, distinct_units, noise)

    def accuracy_at(self, count: int) -> dict[str, float | None]:
        if self.local is not None:  # ``count`` reports in the window (not a value's count), its frequency at its worst
            _, variance = self.local.estimate_bounds(count)
            return {"reports": float(count), "count_std": variance**0.5, "count_ci95": 1.96 * variance**0.5,
                    "sum_std": None, "sum_ci95": None, "mean_ci95": None, "keep_probability": 1.0}
        if self.base is not None:
            return self.base.accuracy_at(count)
        return {"count": float(count), "count_std": None, "count_ci95": None, "sum_std": None, "sum_ci95": None,
                "mean_ci95": None, "keep_probability": 1.0}

    def describe(self) -> dict[str, Any]:
        """JSON-able statement of every part: the finest level's fields at the top, the options beside them."""
        if self.local is not None:
            described = {"count_scale": None, "sum_scale": None, "selection_threshold": None,
                         "local_dp": {"mechanism": self.local.mechanism, "epsilon": self.local.epsilon,
                                      "domain_size": self.local.domain_size, "p": self.local.p, "q": self.local.q}}
        elif self.continual is not None:
            described = dict(self.continual.describe())
            described.setdefault("count_scale", None)
            described.setdefault("sum_scale", None)
            described.setdefault("selection_threshold", None)
        elif self.base is not None:
            described = self.base.describe()
        else:
            described = {"count_scale": None, "sum_scale": None, "selection_threshold": None}
        described.update(self.loss.to_dict())
        described["shares"] = dict(self.shares)
        if self.hierarchy:
            described["levels"] = [
                {"level": i, **level.loss.to_dict(), "count_scale": level.describe()["count_scale"],
                 "sum_scale": level.describe()["sum_scale"]}
                for i, level in enumerate(self.levels)
            ]
        if self.top_k is not None:
            described["top_k"] = {"mechanism": "permute_and_flip", "k": self.top_k.k, "scale": self.top_k.scale,
                                  **self.top_k.loss.to_dict()}
        if self.quantiles is not None:
            described["quantiles"] = self.quantiles.describe()
        if self.vector is not None:
            described[self.vector.features.kind] = self.vector.describe()
        if self.sample_aggregate is not None:
            described["sample_aggregate"] = self.sample_aggregate.describe()
        return described
