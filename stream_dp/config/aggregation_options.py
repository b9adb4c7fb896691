"""Aggregations of the query file beyond counts and sums: vectors and sample-and-aggregate.

``mean_vector`` and ``covariance`` read several numeric fields; their noise is
Gaussian, scaled to the l2 norm each unit's vector is clipped to
(``stream_dp.dp.vectors``), so a query holding one needs ``mechanism:
gaussian``. ``sample_aggregate`` runs a user function per block of units
(``stream_dp.dp.sample_aggregate``). ``check_option_query`` says what each may
be combined with.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from stream_dp.config.durations import DurationMs
from stream_dp.config.release_time import (
    MAX_RELEASED_GROUPS,
    MAX_RELEASED_GROUPS_DESCRIPTION,
    release_time_fixes,
)
from stream_dp.dp.sample_aggregate import MAX_BLOCKS, check_output_range, parse_function_path
from stream_dp.dp.vectors import MAX_DIMENSIONS
from stream_dp.windows.specs import MAX_ABS_VALUE


class _VectorAggregation(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: ClassVar[str]

    fields: list[str] = Field(min_length=1, examples=[["lat", "lon"]],
                              description="The numeric event fields read as one vector, each once.")
    clip_norm: float = Field(examples=[10.0],
                             description="The l2 norm each unit's vector (the mean of its kept events' vectors) is "
                                         "scaled down to; the noise grows with it.")
    # With privately selected groups: the most groups a window releases (``stream_dp.config.release_time``).
    max_released_groups: int | None = Field(None, ge=1, le=MAX_RELEASED_GROUPS,
                                            description=MAX_RELEASED_GROUPS_DESCRIPTION)

    @field_validator("fields")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if any(not name for name in value):
            raise ValueError("fields must be non-empty JSON keys of the events, e.g. [lat, lon]")
        if len(set(value)) != len(value):
            raise ValueError(f"fields {value} name a field twice; list each field once")
        most = MAX_DIMENSIONS[cls.kind]
        if len(value) > most:
            raise ValueError(f"{cls.kind} takes at most {most} fields; split it over queries")
        return value

    @field_validator("clip_norm")
    @classmethod
    def _norm(cls, value: float, info: ValidationInfo) -> float:
        if not (math.isfinite(value) and value > 0):
            raise ValueError(
                f"clip_norm {value} must be a positive finite number: the l2 norm a unit's vector is scaled down to "
                "(its events' mean vector in a group and window), e.g. the norm of a typical vector"
            )
        # No event carries a value beyond MAX_ABS_VALUE, so no vector is longer than this: a larger norm
        # clips nothing and only inflates the noise, whose calibration (C squared, C to the fourth for a
        # covariance) overflows floating point long before it matters.
        fields = info.data.get("fields")
        longest = math.sqrt(len(fields)) * MAX_ABS_VALUE if fields else None
        if longest is not None and value > longest:
            raise ValueError(
                f"clip_norm {value:g} exceeds {longest:.4g}, the norm of a vector of {len(fields)} fields at "
                f"±{MAX_ABS_VALUE:g}, the largest value an event may carry; a larger norm clips nothing and only "
                "adds noise: use the norm of a typical vector"
            )
        return value


class MeanVectorAggregation(_VectorAggregation):
    """Per group and window: the sum and mean of the units' vectors over ``fields`` (Gaussian vector mechanism)."""

    kind: ClassVar[str] = "mean_vector"


class CovarianceAggregation(_VectorAggregation):
    """Per group and window: the mean and covariance matrix of the units' vectors ("Analyze Gauss", PSD-projected)."""

    kind: ClassVar[str] = "covariance"


class SampleAggregateAggregation(BaseModel):
    """Per group and window: a user function's statistic on each of ``blocks`` disjoint blocks of units,
    clipped into ``output_range``, averaged with noise (sample-and-aggregate)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    # No min_length: the path check below says how to write one, which a length bound would not.
    function: str = Field(description="package.module:function, importable by the worker, called with a block's "
                                      "values (a numpy array) and returning a real number.",
                          examples=["statistics:median"])
    # The event field the function is handed; `value`, as in the examples, unless named.
    field: str = Field("value", min_length=1, description="The numeric event field the function is handed.")
    blocks: int = Field(ge=2, le=MAX_BLOCKS, examples=[50],
                        description="Into how many disjoint blocks units are split by a keyed hash of their id: "
                                    "more blocks, less noise, fewer units per block.")
    output_range: tuple[float, float] = Field(examples=[[-20, 50]],
                                              description="[lo, hi]: each block's output is clipped into it; the "
                                                          "noise scales with hi - lo.")
    timeout_ms: DurationMs = Field(1_000, alias="timeout", ge=1, le=60_000,
                                   description="How long one block's call may run (at most 1m); a block that runs "
                                               "over counts as the range's midpoint.")
    aggregate: Literal["mean", "median"] = Field(
        "mean", description="How the blocks' outputs are combined: a noisy mean, or a median drawn by the "
                            "exponential mechanism (mechanism: laplace).")
    bins: int = Field(64, ge=1, le=4096, description="With aggregate: median only: the candidates are the bins + 1 "
                                                     "edges of output_range.")
    # With privately selected groups, a window releases at most this many of the groups selection keeps
    # (those with the largest noisy counts): it bounds the function's work, which nothing else bounds when
    # a producer can make up any number of groups. Required then; public groups are bounded by their list
    # (``stream_dp.config.release_time``; quantiles and vectors hold the same option).
    max_released_groups: int | None = Field(None, ge=1, le=MAX_RELEASED_GROUPS,
                                            description=MAX_RELEASED_GROUPS_DESCRIPTION)

    @field_validator("function")
    @classmethod
    def _path(cls, value: str) -> str:
        parse_function_path(value)
        return value

    @field_validator("output_range")
    @classmethod
    def _range(cls, value: tuple[float, float]) -> tuple[float, float]:
        lo, hi = value
        # The cap of event values (and of sum clips): a wider range only adds noise, and far wider ones
        # overflow the noise's calibration.
        if math.isfinite(lo) and math.isfinite(hi) and max(abs(lo), abs(hi)) > MAX_ABS_VALUE:
            raise ValueError(
                f"output_range [{lo:g}, {hi:g}] reaches beyond ±{MAX_ABS_VALUE:g}, the largest value an event may "
                "carry; narrow it to the values the function returns (rescale the field if they are larger)"
            )
        check_output_range(lo, hi)
        return value


def check_option_query(query: Any) -> None:
    """What a query with a vector or sample-and-aggregate aggregation may hold; raises ``ValueError``
    saying how to fix it."""
    aggregations = query.aggregations
    kind = aggregations.vector_kind or ("sample_aggregate" if aggregations.sample_aggregate is not None else None)
    if kind is None:
        return
    fixes = []
    others = sorted(aggregations.names() - {"count", kind})
    if others:
        fixes.append(f"no {others} beside it (only count: {{}}); release them with another query")
    if kind != "sample_aggregate" and query.mechanism != "gaussian":
        fixes.append("mechanism: gaussian with a delta (its noise is scaled to the l2 norm of the clipped vectors): "
                     "write mechanism: gaussian and delta: 1.0e-7, say, within the namespace's delta limits")
    if kind == "sample_aggregate" and query.mechanism == "staircase":
        fixes.append("mechanism: laplace or gaussian")
    if kind == "sample_aggregate":
        sa = aggregations.sample_aggregate
        if sa.aggregate == "median" and query.mechanism == "gaussian":
            fixes.append("mechanism: laplace with aggregate: median (its exponential mechanism is pure DP)")
        if sa.aggregate == "mean" and "bins" in sa.model_fields_set:
            fixes.append("aggregate: median with bins (the mean has no bins)")
    if kind == "sample_aggregate":
        fixes += release_time_fixes(query, kind, aggregations.sample_aggregate)
    else:
        fixes += release_time_fixes(query, kind, aggregations.vector)
    if query.continual is not None or query.hierarchy or query.local_dp is not None:
        fixes.append("no continual, hierarchy or local_dp")
    if "count" not in aggregations.names() and query.public_group_keys() is None:
        fixes.append("count: {} or groups.public (privately selected groups come from a count release)")
    if fixes:
        # one line each: a fix may hold a "; " of its own (an example), and run into the next
        raise ValueError("\n".join(f"{kind} needs {fix}" for fix in fixes))
