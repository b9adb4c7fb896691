"""The option blocks of a query: its groups, bounds, continual releases, local DP and hierarchy.

Each field carries an example of how it is written (``examples``), which the messages refusing a value
written otherwise show (``stream_dp.config.examples``).
"""

from __future__ import annotations

import difflib
import math
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from stream_dp.config.durations import DurationMs


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PublicGroups(_Strict):
    """Groups known in advance, released every window, even when empty."""

    public: list[Any] = Field(
        min_length=1, examples=[["/", "/pricing", "/docs"]],
        description="The groups, each listed once: one string or integer per group, or a list of them, one per "
                    "group_by field. Events of other groups are left out.")


class SelectGroups(_Strict):
    """Groups chosen privately from the data: a window releases the groups whose noisy count passes a threshold."""

    class Select(_Strict):
        """Partition selection's settings."""

        delta: float = Field(gt=0, lt=1e-3, allow_inf_nan=False, examples=[1e-6],
                             description="The delta partition selection spends per window, charged beside the "
                                         "query's epsilon (an epsilon namespace with a delta limit).")

    select: Select = Field(description="Partition selection's settings.")


_GROUPS_FORMS = "groups: {public: [a, b, ...]} (the groups released every window) or groups: {select: {delta: 1e-6}} " \
                "(groups chosen privately from the data)"


def check_groups_form(value: Any) -> Any:
    """``groups`` holds one of ``public`` and ``select``: says which to give, before either is validated,
    so that the settings of the one given are checked alone (not reported as unknown to the other)."""
    if not isinstance(value, dict):
        if isinstance(value, (PublicGroups, SelectGroups)):
            return value
        raise ValueError(f"groups takes its settings as a mapping, got {value!r}; write {_GROUPS_FORMS}")
    given = {"public", "select"} & value.keys()
    if given == {"public", "select"}:
        raise ValueError("groups gives both public and select: give either public (the groups released every "
                         "window) or select (groups chosen privately from the data), not both")
    if not given:
        keys = sorted(str(key) for key in value)
        near = [m for key in keys for m in difflib.get_close_matches(key, ["public", "select"], n=1)]
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ValueError(f"groups needs public or select, got {keys or 'neither'}{hint}; write {_GROUPS_FORMS}")
    return value


def _groups_branch(value: Any) -> str:
    if isinstance(value, dict):
        return "Select" if "select" in value else "Public"
    return "Select" if isinstance(value, SelectGroups) else "Public"


# The branch is the key given (check_groups_form makes it one): a problem in it is reported alone. The tags
# are capitalised, so that the loader's messages do not name them as fields.
Groups = Annotated[
    Union[Annotated[PublicGroups, Tag("Public")], Annotated[SelectGroups, Tag("Select")]],
    Discriminator(_groups_branch),
]


class BoundsConfig(_Strict):
    """Contribution bounds: what one unit may add to one window, kept by keyed hashes, not by arrival order."""

    max_groups_per_unit: int = Field(ge=1, le=10_000, examples=[3],
                                     description="The most groups one unit may touch per window (L0 bound).")
    max_events_per_group: int = Field(ge=1, le=10_000, examples=[2],
                                      description="The most events one unit may add to one group per window "
                                                  "(Linf bound).")


class ContinualConfig(_Strict):
    """Running totals since the start of each ``period``, released after every window (binary tree mechanism).
    The period's loss is charged once, at the first window a unit contributes to."""

    period_ms: DurationMs = Field(alias="period", examples=["1d"],
                                  description="How long the running totals run before they start over, a multiple "
                                              "of at least two windows; a unit is charged once per period.")
    max_windows_per_unit: int = Field(1, ge=1, le=10_000,
                                      description="In how many windows of a period a unit counts; its events in later "
                                                  "windows of the period are left out.")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class LocalDPConfig(_Strict):
    """Reports randomized by their producer (``stream-dp produce --local-dp FIELD``): the worker never sees a
    true value of ``field`` and releases debiased frequency estimates of the domain (``groups.public``)."""

    field: str = Field(min_length=1, examples=["browser"],
                       description="The event field the producers randomize; its domain is groups.public.")
    mechanism: Literal["krr", "oue"] = Field(
        "krr", description="The randomizer: k-ary randomized response (krr), or optimized unary encoding (oue) "
                           "for large domains (at most 4,096 values).")
    # at most the query epsilon's limit: the query's epsilon is this one (a window costs a unit one report's
    # epsilon), taken from here when the query leaves it out (stream_dp.config.implied)
    epsilon: float = Field(gt=0, le=10, allow_inf_nan=False, examples=[2.0],
                           description="The epsilon of one report, which is what a window costs a unit: the query's "
                                       "epsilon, which may be left out.")


# A level with less than this share of the count-and-sum budget releases noise a million times that of the
# whole budget: nothing but noise, and far smaller shares overflow the noise's calibration.
MIN_LEVEL_SHARE = 1e-6


class HierarchyConfig(_Strict):
    """Release every prefix level of ``group_by``; ``split`` weighs each level's share of the budget (coarsest first)."""

    split: list[float] | None = Field(None, examples=[[1, 1, 2]],
                                      description="Positive weights, one per group_by level, coarsest first; left "
                                                  "out, every level weighs the same.")

    @field_validator("split")
    @classmethod
    def _weights(cls, value: list[float] | None) -> list[float] | None:
        if value is None:
            return value
        if not all(math.isfinite(w) and w > 0 for w in value):
            raise ValueError(f"hierarchy.split {value} must be positive weights, one per group_by level, e.g. [1, 1, 2]")
        total = sum(value)
        if not math.isfinite(total):
            raise ValueError(f"hierarchy.split {value} sums to infinity; only the weights' ratios matter: use small "
                             "numbers, e.g. [1, 1, 2]")
        level, weight = min(enumerate(value), key=lambda item: item[1])
        if weight / total < MIN_LEVEL_SHARE * (1 - 1e-4):  # not [1e-6, 0.5, 0.5], off by rounding
            raise ValueError(
                f"hierarchy.split {value} gives level {level} a share of {weight / total:.3g} of the count and sum "
                f"budget: its noise would be {total / weight:.3g} times that of the whole budget (or overflow); give "
                f"every level at least {MIN_LEVEL_SHARE:g} of the total, e.g. [1, 1, 2]"
            )
        return value


class ExpectedConfig(_Strict):
    """What a typical group holds in one window, so that ``plan`` and ``check-config`` can set each 95% error
    beside the value it qualifies and warn when the error is the larger (a hint for planning: nothing a worker
    does or releases depends on it).

    ``events_per_group``: its bounded events (what its count counts; a hierarchy's finest groups).
    ``units_per_group``: its units (a mean_vector or covariance group; for local_dp, the reports of one
    value, with as many for every value of the domain). ``value``: a typical value of what the
    query aggregates: of the summed field (a sum is then events x value, a mean the value), of a mean_vector's
    coordinates, of a covariance's variances, of the sample_aggregate function's output.
    """

    events_per_group: int | None = Field(
        None, ge=1, examples=[2000],
        description="The bounded events a typical group holds per window (a hierarchy's finest groups).")
    units_per_group: int | None = Field(
        None, ge=1, examples=[500],
        description="The units a typical mean_vector or covariance group holds per window; for local_dp, the "
                    "reports of one value per window.")
    value: float | None = Field(
        None, allow_inf_nan=False, examples=[40.0],
        description="A typical value of what the query aggregates (not 0): the summed field's, a mean_vector's "
                    "coordinate, a covariance's variance, the sample_aggregate function's output.")

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra={"minProperties": 1})

    @field_validator("value")
    @classmethod
    def _not_zero(cls, value: float | None) -> float | None:
        if value == 0:
            raise ValueError("expected.value 0 leaves nothing for an error to be compared with; give a typical "
                             "non-zero value, or leave value out")
        return value

    @model_validator(mode="after")
    def _something(self) -> ExpectedConfig:
        if self.events_per_group is None and self.units_per_group is None and self.value is None:
            raise ValueError("expected gives none of events_per_group, units_per_group and value; give what a typical "
                             "group holds per window, e.g. expected: {events_per_group: 2000, value: 40}, or remove it")
        return self
