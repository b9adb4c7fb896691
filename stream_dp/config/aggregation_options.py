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
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator

from stream_dp.config.durations import parse_duration_ms
from stream_dp.dp.sample_aggregate import MAX_BLOCKS, check_output_range, parse_function_path
from stream_dp.dp.vectors import MAX_DIMENSIONS
from stream_dp.windows.specs import MAX_ABS_VALUE


class _VectorAggregation(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: ClassVar[str]

    fields: list[str] = Field(min_length=1, examples=[["lat", "lon"]])
    clip_norm: float = Field(examples=[10.0])

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
    function: str = Field(description="package.module:function, called with a block's values",
                          examples=["statistics:median"])
    # The event field the function is handed; `value`, as in the examples, unless named.
    field: str = Field("value", min_length=1)
    blocks: int = Field(ge=2, le=MAX_BLOCKS, examples=[50])
    output_range: tuple[float, float] = Field(examples=[[-20, 50]])
    timeout_ms: Annotated[int, BeforeValidator(parse_duration_ms)] = Field(1_000, alias="timeout", ge=1, le=60_000)
    aggregate: Literal["mean", "median"] = "mean"
    bins: int = Field(64, ge=1, le=4096, description="aggregate: median only: candidates are the bins + 1 edges")
    # With privately selected groups, a window releases at most this many of the groups selection keeps
    # (those with the largest noisy counts): it bounds the function's work, which nothing else bounds when
    # a producer can make up any number of groups. Required then; public groups are bounded by their list.
    max_released_groups: int | None = Field(None, ge=1, le=1_000_000)

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


def worst_case_release_ms(sa: Any, groups: int) -> int:
    """How long a window's blocks take if every one runs out its timeout (each runs in turn, in the sandbox)."""
    return groups * sa.blocks * sa.timeout_ms


def _released_groups(query: Any, sa: Any) -> int | None:
    """The most groups a window releases: the public list's length, else ``max_released_groups``."""
    public = query.public_group_keys()
    return len(public) if public is not None else sa.max_released_groups


def check_release_time_together(queries: list[Any]) -> None:
    """The sample_aggregate queries of one file, taken together: raises ``ValueError`` saying what to lower.

    One worker runs the whole file, and its release stage releases every query's windows one after
    another, so a window's blocks hold up every other query's releases while they run: at worst (every
    block running out its timeout) the windows of all sample_aggregate queries ending together must be
    released within the shortest of their windows, or releases fall further behind with every window.
    Each query's own bound (``_check_release_time``) is this one for a file holding it alone."""
    parts = []
    for query in queries:
        sa = query.aggregations.sample_aggregate
        groups = _released_groups(query, sa) if sa is not None else None
        if groups is not None:  # None: the query is refused on its own (no max_released_groups)
            parts.append((query, worst_case_release_ms(sa, groups)))
    if len(parts) < 2:
        return
    total_ms = sum(worst for _, worst in parts)
    shortest = min(parts, key=lambda part: part[0].window.size_ms)[0]
    window_ms = shortest.window.size_ms
    if total_ms <= window_ms:
        return
    each = ", ".join(f"{query.name} {worst / 1000:g} s" for query, worst in parts)
    raise ValueError(
        f"the sample_aggregate queries take, at worst (every block running out its timeout), {total_ms / 1000:g} s "
        f"of release time together ({each}; each is its released groups x blocks x timeout), more than the "
        f"{window_ms / 1000:g} s window of {shortest.name}: one worker releases every query of the file one "
        "after another, so every query's releases could wait longer than that window, and fall further behind "
        "with every window; lower their timeout, blocks or max_released_groups, or use longer windows"
    )


def _check_release_time(query: Any, sa: Any, fixes: list[str]) -> None:
    """The function runs on every released group, so their number must be bounded: by the public list, or
    with selected groups by ``max_released_groups``; and at worst (every block running out its timeout) a
    window's release must fit the window, or releases fall further behind with every window."""
    public = query.public_group_keys()
    cap = sa.max_released_groups
    window_ms = query.window.size_ms
    if public is not None and cap is not None:
        fixes.append("no max_released_groups with groups.public (every listed group is released; the list bounds "
                     "the function's work)")
        return
    if public is None and cap is None:
        fits = window_ms // (sa.blocks * sa.timeout_ms)
        example = (f"e.g. max_released_groups: {fits} fits the {window_ms / 1000:g} s window at {sa.blocks} blocks "
                   f"x timeout {sa.timeout_ms} ms" if fits else
                   f"not one group fits the {window_ms / 1000:g} s window at {sa.blocks} blocks x timeout "
                   f"{sa.timeout_ms} ms: lower timeout or blocks too")
        fixes.append("max_released_groups with privately selected groups: the most groups a window releases (those "
                     "with the largest noisy counts), which bounds the function's work: a producer can make up any "
                     f"number of groups; {example}")
        return
    groups = len(public) if public is not None else cap
    worst_ms = worst_case_release_ms(sa, groups)
    if worst_ms > window_ms:
        # Blocks run one after another with a fixed time each (a shared deadline would let one unit's slow
        # block fail the blocks after it); at worst every block runs out its timeout.
        what = f"{groups} groups" if public is not None else f"max_released_groups {groups}"
        lower = "timeout or blocks" if public is not None else "max_released_groups, timeout or blocks"
        fixes.append(f"a worst-case release time within the window: {what} x {sa.blocks} blocks "
                     f"x timeout {sa.timeout_ms} ms = {worst_ms / 1000:g} s per window of "
                     f"{window_ms / 1000:g} s; lower {lower}, or use longer windows")


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
        fixes.append("mechanism: gaussian with a delta (its noise is scaled to the l2 norm of the clipped vectors)")
    if kind == "sample_aggregate" and query.mechanism == "staircase":
        fixes.append("mechanism: laplace or gaussian")
    if kind == "sample_aggregate":
        sa = aggregations.sample_aggregate
        if sa.aggregate == "median" and query.mechanism == "gaussian":
            fixes.append("mechanism: laplace with aggregate: median (its exponential mechanism is pure DP)")
        if sa.aggregate == "mean" and "bins" in sa.model_fields_set:
            fixes.append("aggregate: median with bins (the mean has no bins)")
        _check_release_time(query, sa, fixes)
    if query.continual is not None or query.hierarchy or query.local_dp is not None:
        fixes.append("no continual, hierarchy or local_dp")
    if "count" not in aggregations.names() and query.public_group_keys() is None:
        fixes.append("count: {} or groups.public (privately selected groups come from a count release)")
    if fixes:
        # one line each: a fix may hold a "; " of its own (an example), and run into the next
        raise ValueError("\n".join(f"{kind} needs {fix}" for fix in fixes))
