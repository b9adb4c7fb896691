"""What a worker builds from the query file before it connects to anything: the budget policy and each
query's runtime (window engine, combiner, plan, privacy statement, sandbox).

``stream-dp run`` and ``stream-dp check-config`` both build through :func:`build_worker_parts`, so the
checker accepts exactly what a worker can start with. No connection and no I/O here beyond starting a
sample-and-aggregate query's sandbox process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from stream_dp.budget import BudgetPolicy, NamespacePolicy, RedisBudgetStore, StoreOptions, policy_from_config
from stream_dp.config import ConfigError, PipelineConfig, QueryConfig, Settings
from stream_dp.config.topic_roles import DEFAULT_INTERNAL_TOPIC_PREFIX, topic_role_clashes
from stream_dp.dp.local import REPORT_TAG_FIELD, report_tag
from stream_dp.windows import BoundingSpec, EventSchema, WindowEngine, WindowSpec
from stream_dp.windows.record_clock import ClockRule
from stream_dp.worker.combine.combiner import WindowCombiner
from stream_dp.worker.kafka.topics import check_release_records
from stream_dp.worker.query.costs import (
    WorkerConfigError,
    build_plan,
    check_cost_fits,
    explain_build_error,
    window_cost,
)
from stream_dp.worker.query.runtime import ContinualCharging, QueryRuntime
from stream_dp.worker.release.build import privacy_statement
from stream_dp.worker.sandbox.runner import FunctionSandbox

_Built = TypeVar("_Built")


def build_runtimes(config: PipelineConfig, *, secret: bytes, clock_ms: Callable[[], int]) -> list[QueryRuntime]:
    runtimes = []
    for query in config.queries:
        namespace = config.namespaces[query.privacy_unit.namespace]
        aggregations = query.aggregations
        clip = aggregations.value_range or (0.0, 0.0)
        # unary local-DP reports are one event per unit and window holding a set of values: the engine keeps
        # them as 0/1 rows of one group; the release turns their sums into one record per value
        unary = query.local_dp is not None and query.local_dp.mechanism == "oue"
        public = tuple(key[0] for key in query.public_group_keys() or ())
        domain = public if unary else ()
        plan = build_plan(query)
        # only reports of the randomizer the release debiases: a true value debiased as a report is released
        # exactly (the debiasing is invertible)
        tag = None if plan.local is None else report_tag(plan.local, public)
        engine = WindowEngine(
            EventSchema(
                unit_field=query.privacy_unit.field,
                timestamp_field=query.timestamp_field,
                group_by=() if unary else tuple(query.group_by),
                # a k-RR report outside its domain is refused when decoded, before its unit is charged
                group_domain=public if query.local_dp is not None and not unary else (),
                report_field=query.local_dp.field if unary else None,  # type: ignore[union-attr]
                report_domain=domain,
                report_tag_field=None if tag is None else REPORT_TAG_FIELD,
                report_tag=tag or "",
                value_field=aggregations.value_field,
                vector_fields=tuple(aggregations.vector.fields) if aggregations.vector is not None else (),
                timestamp_format=query.timestamp_format,
                max_message_bytes=query.max_message_bytes,
                max_future_skew_ms=query.max_future_skew_ms,
            ),
            WindowSpec.of(query.window),
            BoundingSpec(
                max_groups_per_unit=query.bounds.max_groups_per_unit,
                max_events_per_group=query.bounds.max_events_per_group,
                clip_lo=float(clip[0]),
                clip_hi=float(clip[1]),
                secret=secret,
            ),
            clock_ms=clock_ms,
            partitioner=query.partitioner,
            clock_rule=ClockRule(trust_producer_timestamps=query.trust_producer_timestamps),
            # events of groups outside a public list are set aside before bounding (a unary report has no group)
            public_groups=None if unary else query.public_group_keys(),
        )
        described = plan.describe()
        privacy = privacy_statement(query, plan, described)
        combiner = WindowCombiner(
            query.name,
            window_size_ms=query.window.size_ms,
            window_offset_ms=query.window.offset_ms,
            release_timeout_ms=query.release_timeout_ms,
            public_groups=[()] if unary else query.public_group_keys(),
            has_sum=aggregations.sum is not None,
            period=None if query.continual is None else (query.continual.period_ms, query.window.offset_ms),
            quantile_bins=None if aggregations.quantiles is None else aggregations.quantiles.bins,
            feature_width=plan.vector.features.width if plan.vector is not None else (len(domain) if unary else None),
            blocks=plan.sample_aggregate is not None,
        )
        cost, delta = window_cost(plan, namespace.accounting, query.name)
        check_cost_fits(query.name, query.privacy_unit.namespace, namespace, cost, delta)
        runtimes.append(QueryRuntime(
            config=query, engine=engine, plan=plan, combiner=combiner, namespace=query.privacy_unit.namespace,
            cost=cost, delta=delta, privacy=privacy, continual=ContinualCharging.of(query),
            sandbox=None if (sa := aggregations.sample_aggregate) is None else FunctionSandbox(
                sa.function, timeout_s=sa.timeout_ms / 1000),
        ))
    return runtimes


@dataclass(frozen=True)
class WorkerParts:
    """What a worker builds from the query file before it connects to anything."""

    policy: BudgetPolicy
    runtimes: list[QueryRuntime]

    def close(self) -> None:
        """Stop the sandbox processes of sample-and-aggregate queries."""
        for runtime in self.runtimes:
            if runtime.sandbox is not None:
                runtime.sandbox.close()


def build_worker_parts(
    config: PipelineConfig,
    *,
    source: str,
    secret: bytes,
    store_options: StoreOptions,
    clock_ms: Callable[[], int],
    internal_topic_prefix: str = DEFAULT_INTERNAL_TOPIC_PREFIX,
) -> WorkerParts:
    """The budget policy and every query's runtime, or ``ConfigError`` listing every problem.

    The one place where a loaded query file becomes worker objects: ``stream-dp run`` and
    ``stream-dp check-config`` both call it, so the checker accepts exactly what a worker can
    start with. No connection, no secret beyond ``secret`` (a sample-and-aggregate query's function
    is loaded once, in the sandbox process it will run in, to prove it loads); each namespace and query is
    built on its own so that one bad part does not hide the problems of the others. Every line
    of the error names ``source`` and the namespace or query. A query topic with a second role
    (``config.topic_roles``) is refused before anything is built.
    """
    if problems := [f"{source}: queries[{c.index}] ({c.query}).{c.field}: {c.message}"
                    for c in topic_role_clashes(config.queries, internal_topic_prefix)]:
        raise ConfigError("\n".join(problems))

    def attempt(where: str, build: Callable[..., _Built], *args: Any) -> _Built | None:
        try:
            return build(*args)
        except Exception as error:  # the builders only compute: whatever they raise, the file cannot run
            problems.append(f"{source}: {where}: {explain_build_error(error)}")
            return None

    policies: dict[str, NamespacePolicy] = {}
    for name in config.namespaces:
        policy = attempt(f"namespaces.{name}", _namespace_policy, config, name)
        if policy is None:
            continue
        # The Redis store refuses horizons whose buckets it cannot keep for the accepted delay.
        if attempt(f"namespaces.{name}.budgets", RedisBudgetStore.layout_of, policy, store_options) is not None:
            policies[name] = policy
    runtimes = []
    for index, query in enumerate(config.queries):
        where = f"queries[{index}] ({query.name})"
        runtime = attempt(where, _query_runtime, config, query, secret, clock_ms)
        if runtime is None:
            continue
        # a record too large for any output topic would be left out of every window, on every replay
        attempt(where, check_release_records, query)
        # The store's own test of a charge against every limit, in whole micro-units as it charges.
        if runtime.namespace in policies:
            attempt(where, policies[runtime.namespace].cost_units, runtime.cost, runtime.delta)
        if runtime.sandbox is not None:  # the user function must load (in its own process, as it will run)
            attempt(f"{where}.aggregations.sample_aggregate.function", runtime.sandbox.check)
        runtimes.append(runtime)
    whole_policy = None if problems else attempt("namespaces", policy_from_config, config)
    if whole_policy is None:
        raise ConfigError("\n".join(problems))
    return WorkerParts(policy=whole_policy, runtimes=runtimes)


def _namespace_policy(config: PipelineConfig, name: str) -> NamespacePolicy:
    """The policy of one namespace, built as the worker builds all of them."""
    alone = config.model_copy(update={"namespaces": {name: config.namespaces[name]}})
    return policy_from_config(alone).namespace(name)


def _query_runtime(
    config: PipelineConfig, query: QueryConfig, secret: bytes, clock_ms: Callable[[], int]
) -> QueryRuntime:
    """The runtime of one query, built as the worker builds all of them."""
    (runtime,) = build_runtimes(config.model_copy(update={"queries": [query]}), secret=secret, clock_ms=clock_ms)
    return runtime


def contribution_secret(settings: Settings) -> bytes:
    if settings.contribution_secret is None:
        raise WorkerConfigError(
            "STREAM_DP_CONTRIBUTION_SECRET is not set: the worker needs a secret key to choose which contributions "
            "to keep; generate one with `python -c 'import secrets; print(secrets.token_hex(32))'` and keep it stable"
        )
    return settings.contribution_secret.get_secret_value().encode()
