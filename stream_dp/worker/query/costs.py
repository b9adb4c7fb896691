"""What one window of a query costs a unit: the query's privacy plan and its charge.

``build_plan`` turns a validated query into the ``QueryPlan`` the worker
releases with and ``plan``/``check-config`` print; ``window_cost`` states its
loss in the namespace's accounting; ``check_cost_fits`` refuses a query whose
one window could never be charged.
"""

from __future__ import annotations

from typing import Any

from stream_dp.config import QueryConfig
from stream_dp.dp import ClipRange, ContributionBounds
from stream_dp.dp.query_plan import ContinualRequest, QuantileRequest, QueryPlan, SampleAggregateRequest, VectorRequest


class WorkerConfigError(ValueError):
    """The configuration and settings cannot run a worker; the message says how to fix it."""


def explain_build_error(error: Exception) -> str:
    """The builders raise ValueError/TypeError with a message saying what to fix; anything else is named."""
    if isinstance(error, (ValueError, TypeError)) and str(error):
        return str(error)
    return f"{type(error).__name__}: {error} (the worker cannot be built from these values)"


def build_plan(query: QueryConfig) -> QueryPlan:
    aggregations = query.aggregations
    clip = ClipRange(*aggregations.sum.clip) if aggregations.sum is not None else None
    names = set(aggregations.names()) & {"count", "sum", "mean"}
    if "mean" in names:
        names.add("count")  # a mean is noisy sum over noisy count
    quantiles = aggregations.quantiles
    continual = query.continual
    return QueryPlan.build(
        mechanism=query.mechanism,
        epsilon=query.epsilon,
        delta=query.delta,
        bounds=ContributionBounds(query.bounds.max_groups_per_unit, query.bounds.max_events_per_group),
        clip=clip,
        aggregations=frozenset(names),
        selection_delta=None if query.public_group_keys() is not None else query.groups.select.delta,  # type: ignore[union-attr]
        hierarchy_split=query.hierarchy_split,
        top_k=aggregations.top_k.k if aggregations.top_k is not None else None,
        quantiles=None if quantiles is None else QuantileRequest(
            tuple(quantiles.q), float(quantiles.bounds[0]), float(quantiles.bounds[1]), quantiles.bins,
            quantiles.value_interval),
        continual=None if continual is None else ContinualRequest(
            continual.period_ms // query.window.size_ms, continual.max_windows_per_unit),
        local=None if query.local_dp is None else (
            query.local_dp.mechanism, query.local_dp.epsilon, len(query.public_group_keys() or ())),
        vector=None if aggregations.vector is None else VectorRequest(
            aggregations.vector_kind, tuple(aggregations.vector.fields), float(aggregations.vector.clip_norm)),
        sample_aggregate=None if (sa := aggregations.sample_aggregate) is None else SampleAggregateRequest(
            sa.function, sa.blocks, float(sa.output_range[0]), float(sa.output_range[1]), sa.aggregate, sa.bins),
    )


def window_cost(plan: QueryPlan, accounting: str, query: str) -> tuple[float, float]:
    """One window's per-unit loss as (cost in the namespace's unit, delta charged beside it).

    An epsilon namespace is charged the window's (epsilon, delta): delta from
    Gaussian noise and from partition selection. A rho namespace is charged
    rho and holds no delta.
    """
    loss = plan.loss
    if accounting == "epsilon":
        return loss.epsilon, loss.delta
    if plan.continual is not None:
        # A unit seen in a second input partition (the topic's partition count changed), or whose
        # registrations were lost, is charged the period again and may fill W windows more of the same
        # tree: twice the move per level, which costs twice the epsilon but four times the rho.
        raise WorkerConfigError(
            f"query {query!r} is a continual release, charged once per period for up to W windows of a unit; "
            "that charge holds in epsilon, where a unit charged twice for twice the windows has paid for them, "
            "but not in rho, where twice the windows cost four times as much; account its namespace in epsilon "
            "(budgets: [{horizon: 1d, epsilon: ...}])"
        )
    if loss.rho is not None:
        # A zCDP loss (Gaussian noise, public groups): its delta only states it as (epsilon, delta).
        # With partition selection the loss has an (epsilon, delta) part and no rho (below).
        return loss.rho, 0.0
    if loss.delta == 0:
        return loss.epsilon**2 / 2, 0.0  # pure epsilon-DP implies (epsilon^2 / 2)-zCDP (Bun & Steinke 2016, Prop. 1.4)
    raise WorkerConfigError(
        f"query {query!r} is (epsilon, delta)-DP (partition selection spends delta={loss.delta:g}), which a "
        "rho-accounted namespace cannot hold; use public groups or account its namespace in epsilon"
    )


def check_cost_fits(query: str, namespace_name: str, namespace: Any, cost: float, delta: float) -> None:
    """A query's per-window charge must fit every limit of its namespace, and its delta needs a delta limit."""
    smallest = min(namespace.budgets, key=lambda b: b.limit)
    if cost > smallest.limit:
        raise WorkerConfigError(
            f"query {query!r} charges {cost:g} {namespace.accounting} per window, more than the "
            f"{smallest.limit:g} limit per {smallest.horizon_ms} ms of namespace {namespace_name!r}: "
            "no unit could ever be released; lower the query's epsilon or raise the limit"
        )
    if delta <= 0:
        return
    delta_limits = [b for b in namespace.budgets if b.delta is not None]
    if not delta_limits:
        raise WorkerConfigError(
            f"query {query!r} spends delta={delta:g} per window (Gaussian noise or partition selection), but "
            f"namespace {namespace_name!r} has no delta limit, so a unit's delta would be unbounded: add one to "
            "its budgets, e.g. {horizon: 1h, epsilon: 1.0, delta: 1e-6}"
        )
    tightest = min(delta_limits, key=lambda b: b.delta)
    if delta > tightest.delta:
        raise WorkerConfigError(
            f"query {query!r} spends delta={delta:g} per window, more than the delta limit {tightest.delta:g} per "
            f"{tightest.horizon_ms} ms of namespace {namespace_name!r}: no unit could ever be released; lower the "
            "query's delta (or its selection delta) or raise the limit"
        )
