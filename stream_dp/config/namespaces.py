"""Namespaces: kinds of privacy unit, each with its per-unit budget policy over rolling horizons.

Validated with pydantic as part of the query file (``stream_dp.config.queries``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from stream_dp.budget.policy import MAX_HORIZONS, MAX_LIMIT_UNITS, MAX_THRESHOLDS, MICRO, to_units_down
from stream_dp.config.durations import DurationMs


class StrictModel(BaseModel):
    """A frozen model that refuses unknown fields (a typo in the query file is an error, not a default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class HorizonBudget(StrictModel):
    """A rolling-horizon limit: at most ``epsilon`` (or ``rho``) per ``horizon``, and at most ``delta``.

    ``delta`` (epsilon namespaces only) bounds the delta that Gaussian queries
    and partition selection spend: without it, such queries cannot charge the
    namespace.
    """

    horizon_ms: DurationMs = Field(
        alias="horizon", examples=["1h"],
        description="The horizon's length in event time: a unit's charges in any interval this long stay within "
                    "the limit (at least 1s; typically 1h and 24h).")
    epsilon: float | None = Field(
        None, gt=0, allow_inf_nan=False, examples=[1.0],
        description="The most epsilon a unit may be charged per horizon (an epsilon namespace). Give exactly one of "
                    "epsilon and rho, and the same one in every budget of the namespace.")
    rho: float | None = Field(
        None, gt=0, allow_inf_nan=False, examples=[0.05],
        description="The most rho (zero-concentrated DP) a unit may be charged per horizon (a rho namespace): "
                    "Gaussian queries charge their rho, Laplace ones epsilon squared over 2. Give exactly one of "
                    "epsilon and rho.")
    delta: float | None = Field(
        None, gt=0, lt=1, allow_inf_nan=False, examples=[1e-5],
        description="The most delta a unit may be charged per horizon, in epsilon namespaces only: queries that "
                    "spend delta (Gaussian noise, partition selection) cannot charge a namespace without it.")
    buckets: int = Field(
        12, ge=1, le=240,
        description="How many equal buckets the horizon is split into (they must divide it): a charge is admitted "
                    "only if every run of buckets + 1 consecutive buckets around it stays within the limit. More "
                    "buckets waste less budget and keep a few more bytes per active unit.")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True,
                              json_schema_extra={"examples": [{"horizon": "1h", "epsilon": 1.0}]})

    @field_validator("epsilon", "rho")
    @classmethod
    def _fits_the_ledger(cls, value: float | None) -> float | None:
        # The budget ledger keeps whole micro-units in 32-bit counters (stream_dp.budget.policy).
        if value is None:
            return value
        if to_units_down(value) < 1:
            raise ValueError(f"limit {value:g} is below 1e-6, the smallest amount the budget ledger counts; raise it")
        if to_units_down(value) > MAX_LIMIT_UNITS:
            raise ValueError(
                f"limit {value:g} is above {MAX_LIMIT_UNITS / MICRO:g}, the largest the budget ledger holds; lower it"
            )
        return value

    @model_validator(mode="after")
    def _one_unit(self) -> HorizonBudget:
        if (self.epsilon is None) == (self.rho is None):
            raise ValueError("give exactly one of epsilon or rho for each budget horizon, e.g. {horizon: 1h, epsilon: 1.0}")
        if self.horizon_ms < 1000:
            raise ValueError(f"horizon of {self.horizon_ms} ms is too short; use at least 1s (typically 1h and 24h)")
        if self.horizon_ms % self.buckets:
            raise ValueError(f"horizon of {self.horizon_ms} ms does not split into {self.buckets} equal buckets; pick buckets that divide it")
        return self

    @property
    def limit(self) -> float:
        return self.epsilon if self.epsilon is not None else self.rho  # type: ignore[return-value]


class NamespaceConfig(StrictModel):
    """A kind of privacy unit and its per-unit budget policy."""

    budgets: list[HorizonBudget] = Field(
        min_length=1,
        description=f"The rolling-horizon limits every query reading the namespace draws on, one per horizon (at "
                    f"most {MAX_HORIZONS}), all in epsilon or all in rho: typically a short horizon and a long "
                    "backstop.")
    alert_at: list[float] = Field(
        default_factory=lambda: [0.8, 1.0],
        description=f"Fractions of a limit, in (0, 1], at which a unit raises an alert (metrics, alert rules and "
                    f"the alerts topic); at most {MAX_THRESHOLDS}.")

    @field_validator("budgets")
    @classmethod
    def _few_horizons(cls, value: list[HorizonBudget]) -> list[HorizonBudget]:
        if len(value) > MAX_HORIZONS:
            raise ValueError(f"{len(value)} budget horizons; a namespace holds at most {MAX_HORIZONS}, drop some")
        return value

    @field_validator("alert_at")
    @classmethod
    def _fractions(cls, value: list[float]) -> list[float]:
        for fraction in value:
            if not (0 < fraction <= 1):
                raise ValueError(f"alert threshold {fraction} is not a fraction of the limit; use values in (0, 1], e.g. [0.8, 1.0]")
        thresholds = sorted(set(value))
        if len(thresholds) > MAX_THRESHOLDS:
            raise ValueError(f"{len(thresholds)} alert thresholds; a namespace holds at most {MAX_THRESHOLDS}, drop some")
        return thresholds

    @model_validator(mode="after")
    def _one_accounting(self) -> NamespaceConfig:
        units = {"epsilon" if b.epsilon is not None else "rho" for b in self.budgets}
        if len(units) > 1:
            raise ValueError("mix of epsilon and rho budgets in one namespace; account a namespace in one unit")
        if units == {"rho"} and any(b.delta is not None for b in self.budgets):
            raise ValueError(
                "a delta limit in a rho namespace: zCDP queries spend no delta; account the namespace in epsilon "
                "to limit delta (Gaussian queries and partition selection)"
            )
        horizons = [b.horizon_ms for b in self.budgets]
        if len(set(horizons)) != len(horizons):
            raise ValueError("two budgets with the same horizon; keep one limit per horizon")
        return self

    @property
    def accounting(self) -> Literal["epsilon", "rho"]:
        return "epsilon" if self.budgets[0].epsilon is not None else "rho"

    @property
    def limits_delta(self) -> bool:
        return any(b.delta is not None for b in self.budgets)
