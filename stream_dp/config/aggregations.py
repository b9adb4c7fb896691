"""The query file's ``aggregations:`` block: counts, sums, means, top-k and quantiles.

Vectors and sample-and-aggregate are in ``aggregation_options``; ``Aggregations``
holds one of each and checks the combinations one query can release (a query
clips one value field, once, before bounding).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from stream_dp.config.aggregation_options import (
    CovarianceAggregation,
    MeanVectorAggregation,
    SampleAggregateAggregation,
)
from stream_dp.config.examples import refuse_empty_options
from stream_dp.config.release_time import MAX_RELEASED_GROUPS, MAX_RELEASED_GROUPS_DESCRIPTION
from stream_dp.dp.quantiles import opendp_alpha, opendp_level
from stream_dp.windows.specs import MAX_ABS_VALUE


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CountAggregation(_Strict):
    """The group's noisy count of bounded events; written ``count: {}``."""


class SumAggregation(_Strict):
    """The group's noisy sum of a numeric field, each value clipped into a range first."""

    field: str = Field(min_length=1, examples=["value"], description="The numeric event field summed.")
    clip: tuple[float, float] = Field(examples=[[0, 100]],
                                      description="[lo, hi]: each value is clipped into this range before it is "
                                                  "added; the noise grows with its larger end.")

    @field_validator("clip")
    @classmethod
    def _clip(cls, value: tuple[float, float]) -> tuple[float, float]:
        return _check_range(value, "clip")


class MeanAggregation(_Strict):
    """The noisy sum over the noisy count (post-processing, no extra cost); needs the sum of the same field."""

    field: str = Field(min_length=1, examples=["value"], description="The field of the query's sum.")


def _check_range(value: tuple[float, float], name: str) -> tuple[float, float]:
    lo, hi = value
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo >= hi:
        raise ValueError(f"{name} {list(value)} must be two finite numbers [lo, hi] with lo < hi, e.g. [0, 100]")
    if max(abs(lo), abs(hi)) > MAX_ABS_VALUE:
        raise ValueError(
            f"{name} {list(value)} reaches beyond ±{MAX_ABS_VALUE:g}, the largest value an event may carry; "
            "narrow it to the values you expect"
        )
    return value


class TopKAggregation(_Strict):
    """The ``k`` groups with the most bounded events of each window, best first (permute-and-flip)."""

    k: int = Field(ge=1, le=1000, examples=[10],
                   description="How many groups a window ranks, best first: fewer than the public groups (each pick is "
                               "charged, and the last one left is forced).")


class QuantilesAggregation(_Strict):
    """Quantiles of ``field`` per group per window (exponential mechanism over ``bins`` candidates in ``bounds``)."""

    field: str = Field(min_length=1, examples=["value"], description="The numeric event field.")
    q: list[float] = Field(min_length=1, max_length=20, examples=[[0.5, 0.9, 0.99]],
                           description="The quantile levels, strictly between 0 and 1, increasing, at most four "
                                       "decimals; each takes an equal part of the quantiles' share.")
    bounds: tuple[float, float] = Field(examples=[[0, 500]],
                                        description="[lo, hi]: values are clipped into it, and the candidates are "
                                                    "spread evenly over it (the sum's clip, when both are given).")
    bins: int = Field(256, ge=2, le=4096,
                      description="The candidates are the bins + 1 evenly spaced edges of bounds; choose bins "
                                  "finer than the field's steps.")
    # A 95% interval in the field's units per quantile, from a noisy histogram that takes half the quantiles'
    # share of epsilon (``stream_dp.dp.quantile_intervals``). Left out of dumps when off, so that a query
    # without it keeps the settings fingerprint (``worker.query.runtime``) it had before the option existed.
    value_interval: bool = Field(False, exclude_if=lambda on: not on,
                                 description="Also release, per q, a 95% interval [lower, upper] in the field's "
                                             "units, read off a noisy histogram that takes half the quantiles' "
                                             "share.")
    # With privately selected groups: the most groups a window releases, those with the largest noisy
    # counts; required then, as each group takes an OpenDP draw per q (``stream_dp.config.release_time``).
    max_released_groups: int | None = Field(None, ge=1, le=MAX_RELEASED_GROUPS,
                                            description=MAX_RELEASED_GROUPS_DESCRIPTION)

    @field_validator("q")
    @classmethod
    def _probabilities(cls, value: list[float]) -> list[float]:
        for q in value:
            if not (0.0 < q < 1.0):
                raise ValueError(f"quantile {q} is not strictly between 0 and 1; use e.g. q: [0.5, 0.9, 0.99]")
            num, den = opendp_alpha(opendp_level(q))
            if num / den != q:
                # OpenDP's score aims at num/den, not q: every stated error would be off by |q - num/den| n ranks
                nearest = [f"{level:g}" for level in (math.floor(q * 1e4) / 1e4, math.floor(q * 1e4 + 1) / 1e4)
                           if 0.0 < level < 1.0]
                raise ValueError(
                    f"quantile {q} is resolved by OpenDP's quantile score to {num}/{den} = {num / den:g}, and its "
                    f"errors would be stated for that level; use q: {' or '.join(nearest)} "
                    "(at most four decimals, or a fraction with a denominator below 10000)"
                )
        if len(set(value)) != len(value) or value != sorted(value):
            raise ValueError(f"quantiles {value} must be distinct and in increasing order, e.g. [0.5, 0.9, 0.99]")
        return value

    @field_validator("bounds")
    @classmethod
    def _bounds(cls, value: tuple[float, float]) -> tuple[float, float]:
        return _check_range(value, "quantile bounds")


class Aggregations(_Strict):
    """What each record releases: at least one aggregation; every one given takes an equal share of epsilon
    (a mean is free)."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra={"examples": [{"count": {}}]})

    count: CountAggregation | None = Field(None, description="The noisy count of bounded events.")
    sum: SumAggregation | None = Field(None, description="The noisy sum of a clipped field.")
    mean: MeanAggregation | None = Field(None, description="The sum over the count, with a 95% interval.")
    top_k: TopKAggregation | None = Field(None, description="One record per window ranking the k groups with the "
                                                            "most events.")
    quantiles: QuantilesAggregation | None = Field(None, description="Quantiles of a field per group.")
    mean_vector: MeanVectorAggregation | None = Field(None, description="The mean of several fields as one vector "
                                                                        "(mechanism: gaussian).")
    covariance: CovarianceAggregation | None = Field(None, description="The mean and covariance matrix of several "
                                                                       "fields (mechanism: gaussian).")
    sample_aggregate: SampleAggregateAggregation | None = Field(
        None, description="A statistic of your own function, computed on disjoint blocks of units and released "
                          "with noise.")

    @field_validator("*", mode="before")
    @classmethod
    def _no_empty_option(cls, value: Any, info: ValidationInfo) -> Any:
        # `count:` is `count: {}`; `top_k:` with no settings is refused, not read as no top_k
        return refuse_empty_options(cls, value, str(info.field_name))

    @model_validator(mode="after")
    def _consistent(self) -> Aggregations:
        if not self.names():
            raise ValueError("no aggregation; add at least `count: {}`")
        if self.mean_vector is not None and self.covariance is not None:
            raise ValueError("mean_vector and covariance in one query: keep covariance (its records carry the mean too)")
        if self.mean is not None:
            if self.sum is None:
                raise ValueError("mean needs a sum with a clip range on the same field, e.g. sum: {field: value, clip: [0, 100]}")
            if self.mean.field != self.sum.field:
                raise ValueError(f"mean.field {self.mean.field!r} differs from sum.field {self.sum.field!r}; a mean is the sum over the count of one field")
        if self.quantiles is not None and self.sum is not None:
            # The worker clips one value field per query, once, before bounding.
            if self.quantiles.field != self.sum.field:
                raise ValueError(
                    f"quantiles.field {self.quantiles.field!r} differs from sum.field {self.sum.field!r}; a query reads "
                    "one value field: use the same field, or a second query for the other field"
                )
            if tuple(self.quantiles.bounds) != tuple(self.sum.clip):
                raise ValueError(
                    f"quantiles.bounds {list(self.quantiles.bounds)} differ from sum.clip {list(self.sum.clip)}; values "
                    "are clipped once per query: give both the same range"
                )
        return self

    @property
    def value_field(self) -> str | None:
        if self.sum is not None:
            return self.sum.field
        if self.sample_aggregate is not None:
            return self.sample_aggregate.field
        return self.quantiles.field if self.quantiles is not None else None

    @property
    def value_range(self) -> tuple[float, float] | None:
        """The range every value is clipped into (the sum's clip, else the quantiles' bounds; a
        sample-and-aggregate function sees the values as sent: only its output is clipped)."""
        if self.sum is not None:
            return tuple(self.sum.clip)  # type: ignore[return-value]
        if self.sample_aggregate is not None:
            return (-MAX_ABS_VALUE, MAX_ABS_VALUE)
        return tuple(self.quantiles.bounds) if self.quantiles is not None else None  # type: ignore[return-value]

    @property
    def vector(self) -> MeanVectorAggregation | CovarianceAggregation | None:
        return self.mean_vector if self.mean_vector is not None else self.covariance

    @property
    def vector_kind(self) -> str | None:
        """``"mean_vector"``, ``"covariance"`` or None."""
        if self.mean_vector is not None:
            return "mean_vector"
        return "covariance" if self.covariance is not None else None

    def names(self) -> frozenset[str]:
        return frozenset(n for n in ("count", "sum", "mean", "top_k", "quantiles", "mean_vector", "covariance",
                                     "sample_aggregate") if getattr(self, n) is not None)
