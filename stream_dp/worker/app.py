"""The worker process: builds every query's runtime, connects Kafka, Redis and the metrics endpoint, and
runs the ingest and release stages until stopped."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from stream_dp.budget import BudgetPolicy, BudgetStore, NamespacePolicy, RedisBudgetStore, StoreOptions, policy_from_config
from stream_dp.budget.redis_nodes import ping as redis_ping
from stream_dp.budget.redis_url import client_from_url
from stream_dp.config import ConfigError, PipelineConfig, QueryConfig, Settings
from stream_dp.config.release_time import together_release_ms
from stream_dp.config.topic_roles import DEFAULT_INTERNAL_TOPIC_PREFIX, deployment_problem, topic_role_clashes
from stream_dp.dp import noise_source
from stream_dp.dp.local import REPORT_TAG_FIELD, report_tag
from stream_dp.metrics.budget import BudgetMetrics
from stream_dp.metrics.health import Health
from stream_dp.metrics.health import watch as watch_health
from stream_dp.metrics.http import serve as serve_http
from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.windows import BoundingSpec, EventSchema, WindowEngine, WindowSpec
from stream_dp.windows.record_clock import ClockRule
from stream_dp.worker.access.check import check_kafka_access, worker_needs
from stream_dp.worker.combine.combiner import WindowCombiner
from stream_dp.worker.guard.store import StoreGuard
from stream_dp.worker.ingest.stage import IngestStage
from stream_dp.worker.kafka.admin import read_commit_metadata, read_group_metadata
from stream_dp.worker.kafka.clients import kafka_clients, rdkafka_options, release_poll_interval_ms
from stream_dp.worker.kafka.topic_setup import TopicLimits, prepare_topics
from stream_dp.worker.kafka.topics import TopicSettingsError, check_release_records
from stream_dp.worker.process.tuning import tune_process
from stream_dp.worker.query.costs import (
    WorkerConfigError,
    build_plan,
    check_cost_fits,
    explain_build_error,
    window_cost,
)
from stream_dp.worker.query.runtime import ContinualCharging, QueryRuntime
from stream_dp.worker.release.build import privacy_statement
from stream_dp.worker.release.partition_check import BrokerPartitions, committed_by
from stream_dp.worker.release.stage import ReleaseStage
from stream_dp.worker.sandbox.runner import FunctionSandbox
from stream_dp.worker.store.ledger import RedisReleaseLedger, ReleaseLedger
from stream_dp.worker.store.period_register import MemoryPeriodRegister, PeriodRegister, RedisPeriodRegister

log = logging.getLogger(__name__)

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


class Worker:
    """One worker process: both stages on one event loop."""

    def __init__(
        self,
        config: PipelineConfig,
        settings: Settings,
        *,
        registry: CollectorRegistry,
        budget: BudgetStore | None = None,
        ledger: ReleaseLedger | None = None,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        serve_metrics: bool = True,
        client_id: str = "stream-dp",
        config_source: str = "query configuration",
    ) -> None:
        self.config = config
        self.settings = settings
        self.registry = registry
        self.clock_ms = clock_ms
        self.serve_metrics = serve_metrics
        self.client_id = client_id
        self.config_source = config_source
        self.metrics = WorkerMetrics(registry)
        if shared := deployment_problem(settings.group_id, settings.internal_topic_prefix):  # before anything is built
            raise WorkerConfigError(shared)
        parts = build_worker_parts(
            config, source=config_source, secret=contribution_secret(settings),
            store_options=settings.budget_store_options(), clock_ms=clock_ms,
            internal_topic_prefix=settings.internal_topic_prefix,
        )
        self.runtimes = parts.runtimes
        self._redis: Any = None
        wait = settings.replica_wait()
        self._wait_replicas = wait.replicas if wait is not None else 0
        if ledger is None:
            self._redis = client_from_url(settings.redis_url.get_secret_value(), timeout_s=settings.redis_timeout_s)
        if budget is None:
            # The store retries itself (safe: charges are idempotent); redis-py's own retries are off.
            budget = RedisBudgetStore.from_url(
                settings.redis_url.get_secret_value(), parts.policy, settings.budget_store_options(),
                socket_timeout_s=settings.redis_timeout_s, retries=settings.redis_retries,
                metrics=BudgetMetrics(registry=registry), wait=wait,
            )
            try:
                for warning in budget.durability_warnings():
                    log.warning("Redis durability: %s", warning)
            except Exception as exc:  # the server may not be up yet; charges fail closed until it is
                log.warning("could not check Redis durability settings: %s", exc)
        self.budget = budget
        self.ledger = ledger or RedisReleaseLedger(self._redis, ttl_s=settings.ledger_ttl_s, wait=wait)
        # Continual queries' registrations live beside the ledger, as long as the budget store accepts their charges.
        self.periods: PeriodRegister = (
            RedisPeriodRegister(self._redis, options=settings.budget_store_options(), wait=wait)
            if self._redis is not None else MemoryPeriodRegister(settings.budget_store_options())
        )
        self.stop_event = asyncio.Event()
        self.health = Health(stall_after_s=settings.health_stall_s)
        self._metrics_server: Any = None

    def request_stop(self) -> None:
        self.stop_event.set()

    async def _prepare_topics(self, options: dict[str, Any]) -> TopicLimits:
        try:
            return await prepare_topics(self.settings, self.runtimes, options)
        except TopicSettingsError as exc:
            raise WorkerConfigError(str(exc)) from None

    def _ping_redis(self) -> object:
        """Readiness: the ledger's Redis (the budget store's too, unless injected) answers, on a Redis Cluster every
        master, each with the replicas charges wait for."""
        if self._redis is None:
            return True
        return redis_ping(self._redis, self._wait_replicas)

    def _close_stores(self) -> None:
        if self._redis is not None:
            self._redis.close()
        self.budget.close()

    async def run(self) -> None:
        settings = self.settings
        options = settings.kafka_client_options()
        try:  # what the broker lets the worker do, before it creates, reads or writes anything (AccessError)
            needs, access = worker_needs(self.config, settings), {"settings": settings, "config_source": self.config_source}
            absent = await check_kafka_access(options, needs, **access)
            limits = await self._prepare_topics(options)
            if absent:  # created just now: only now does the broker say what the worker may do on them
                await check_kafka_access(options, needs, **access, only_topics=absent)
        except BaseException:
            self._close_stores()
            for runtime in self.runtimes:
                if runtime.sandbox is not None:
                    runtime.sandbox.close()
            raise
        partials_partitions = limits.partials_partitions
        for runtime in self.runtimes:
            runtime.combiner.partials_partitions = partials_partitions
        if self.serve_metrics:
            self._metrics_server = serve_http(settings.metrics_port, settings.metrics_host, self.registry, self.health)
        together_ms = together_release_ms([runtime.config for runtime in self.runtimes])
        clients = kafka_clients(settings.aiokafka_options(), rdkafka=rdkafka_options(settings.kafka_client_options()),
                                client_id=self.client_id, group_id=settings.group_id,
                                limits=limits, session_timeout_ms=settings.consumer_session_timeout_ms,
                                max_poll_interval_ms=release_poll_interval_ms(together_ms))
        noise_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="noise")
        # Checked at every input assignment, before anything is charged or released.
        input_topics = {q.config.input_topic for q in self.runtimes}
        store = StoreGuard(self.ledger.store_markers(),
                           lambda: read_group_metadata(options, settings.group_id, input_topics))
        ingest = IngestStage(
            self.runtimes, clients.ingest_consumer, clients.producer, self.budget, self.ledger, self.metrics,
            partials_topic=settings.partials_topic, partials_partitions=partials_partitions,
            alerts_topic=settings.alerts_topic,
            dead_letter_topic=settings.dead_letter_topic,
            read_commit_metadata=lambda tps: read_commit_metadata(options, settings.group_id, tps),
            partials_record_bytes=limits.partials_record_bytes, dead_letter_record_bytes=limits.dead_letter_record_bytes,
            clock_ms=self.clock_ms, periods=self.periods, store=store,
        )
        release = ReleaseStage(
            self.runtimes, clients.release_consumer, clients.output_producer, self.ledger,
            noise_source(settings.noise_sampler, executor=noise_pool), self.metrics,
            partials_topic=settings.partials_topic, release_age_limit_ms=settings.release_age_limit_ms,
            output_batch_bytes=limits.output_batch_bytes, output_record_bytes=limits.output_record_bytes,
            clock_ms=self.clock_ms, store_ready=store.ready,
            partition_check=BrokerPartitions(clients.release_consumer, committed_by(clients.ingest_consumer)),
            input_partition_counts=lambda topic: len(clients.ingest_consumer.partitions_for_topic(topic) or ()),
            # a query trusting its producers' stamps closes windows by a quorum of them, which no one record's
            # timestamp the broker can look up meets (``stream_dp.windows.record_clock``)
            broker_stamps=lambda query: not query.config.trust_producer_timestamps,
        )
        clients.release_consumer.subscribe([settings.partials_topic], listener=release.rebalance_listener())
        clients.ingest_consumer.subscribe(sorted(input_topics),
                                          listener=ingest.rebalance_listener())
        await clients.start()
        log.info("worker running: %d queries, group %s", len(self.runtimes), settings.group_id)
        try:
            watcher = asyncio.create_task(watch_health(
                self.health, self.stop_event, assigned=ingest.assigned_partitions, ping_redis=self._ping_redis,
            ))
            tasks = [asyncio.create_task(ingest.run(self.stop_event)), asyncio.create_task(release.run(self.stop_event))]
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            self.stop_event.set()
            for task in pending:
                await task
            await watcher
            for task in done:
                task.result()  # re-raise a stage's failure
        finally:
            await clients.stop()
            noise_pool.shutdown(wait=False)
            if self._metrics_server is not None:
                server, _thread = self._metrics_server
                server.shutdown()
            self._close_stores()
            for runtime in self.runtimes:
                if runtime.sandbox is not None:
                    runtime.sandbox.close()


def run_worker(config: PipelineConfig, settings: Settings, *, config_source: str = "query configuration") -> int:
    """Run until SIGINT/SIGTERM; returns the process exit code. ``config_source`` names the file in errors."""
    worker = Worker(config, settings, registry=CollectorRegistry(), config_source=config_source)
    tune_process(settings.heap_trim_s)  # after start-up built its objects: garbage collector, C heap (process.tuning)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, worker.request_stop)
        await worker.run()

    asyncio.run(main())
    return 0
