"""The worker process: builds every query's runtime, connects Kafka, Redis and
the metrics endpoint, and runs the ingest and release stages until stopped.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from prometheus_client import CollectorRegistry, start_http_server

from stream_dp.budget import BudgetStore, RedisBudgetStore
from stream_dp.cli.budget import policy_from_config
from stream_dp.config import PipelineConfig, QueryConfig, Settings
from stream_dp.dp import ClipRange, ContributionBounds, OpenDPNoise, ReleasePlan
from stream_dp.metrics.budget import BudgetMetrics
from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.windows import BoundingSpec, EventSchema, WindowEngine, WindowSpec
from stream_dp.worker.combiner import WindowCombiner
from stream_dp.worker.ingest import IngestStage
from stream_dp.worker.kafka_admin import (
    RETENTION_CONFIGS,
    ensure_topics,
    partials_retention_problem,
    read_commit_metadata,
    read_topic_config,
)
from stream_dp.worker.ledger import RedisReleaseLedger, ReleaseLedger
from stream_dp.worker.release import ReleaseStage
from stream_dp.worker.runtime import QueryRuntime

log = logging.getLogger(__name__)


class WorkerConfigError(ValueError):
    """The configuration and settings cannot run a worker; the message says how to fix it."""


def build_plan(query: QueryConfig) -> ReleasePlan:
    aggregations = query.aggregations
    clip = ClipRange(*aggregations.sum.clip) if aggregations.sum is not None else None
    names = set(aggregations.names())
    if "mean" in names:
        names.add("count")  # a mean is noisy sum over noisy count
    return ReleasePlan.build(
        mechanism=query.mechanism,
        epsilon=query.epsilon,
        delta=query.delta,
        bounds=ContributionBounds(query.bounds.max_groups_per_unit, query.bounds.max_events_per_group),
        clip=clip,
        aggregations=frozenset(names),
        selection_delta=None if query.public_group_keys() is not None else query.groups.select.delta,  # type: ignore[union-attr]
    )


def window_cost(plan: ReleasePlan, accounting: str, query: str) -> float:
    """One window's per-unit loss in the namespace's unit."""
    loss = plan.loss
    if accounting == "epsilon":
        return loss.epsilon
    if loss.rho is not None and loss.delta == 0:
        return loss.rho
    if loss.rho is not None:
        # zCDP noise plus an (epsilon, delta) part (partition selection) cannot be one rho.
        raise WorkerConfigError(
            f"query {query!r} spends delta={loss.delta:g} besides rho, which a rho-accounted namespace cannot hold; "
            "use public groups or an epsilon-accounted namespace"
        )
    if loss.delta == 0:
        return loss.epsilon**2 / 2  # pure epsilon-DP implies (epsilon^2 / 2)-zCDP (Bun & Steinke 2016, Prop. 1.4)
    raise WorkerConfigError(
        f"query {query!r} is (epsilon, delta)-DP, which a rho-accounted namespace cannot hold; account its namespace in epsilon"
    )


def build_runtimes(config: PipelineConfig, *, secret: bytes, clock_ms: Callable[[], int]) -> list[QueryRuntime]:
    runtimes = []
    for query in config.queries:
        namespace = config.namespaces[query.privacy_unit.namespace]
        aggregations = query.aggregations
        clip = aggregations.sum.clip if aggregations.sum is not None else (0.0, 0.0)
        engine = WindowEngine(
            EventSchema(
                unit_field=query.privacy_unit.field,
                timestamp_field=query.timestamp_field,
                group_by=tuple(query.group_by),
                value_field=aggregations.value_field,
                timestamp_format=query.timestamp_format,
                max_message_bytes=query.max_message_bytes,
                max_future_skew_ms=query.max_future_skew_ms,
            ),
            WindowSpec(
                size_ms=query.window.size_ms,
                offset_ms=query.window.offset_ms,
                allowed_lateness_ms=query.window.allowed_lateness_ms,
                idle_timeout_ms=query.window.idle_timeout_ms,
            ),
            BoundingSpec(
                max_groups_per_unit=query.bounds.max_groups_per_unit,
                max_events_per_group=query.bounds.max_events_per_group,
                clip_lo=float(clip[0]),
                clip_hi=float(clip[1]),
                secret=secret,
            ),
            clock_ms=clock_ms,
            partitioner=query.partitioner,
        )
        plan = build_plan(query)
        described = plan.describe()
        privacy = {
            "namespace": query.privacy_unit.namespace,
            "unit_field": query.privacy_unit.field,
            "mechanism": query.mechanism,
            "epsilon": plan.loss.epsilon,
            "delta": plan.loss.delta,
            "rho": plan.loss.rho,
            "count_scale": described["count_scale"],
            "sum_scale": described["sum_scale"],
            "groups": "public" if query.public_group_keys() is not None else "selected",
            "max_groups_per_unit": query.bounds.max_groups_per_unit,
            "max_events_per_group": query.bounds.max_events_per_group,
            "clip": list(aggregations.sum.clip) if aggregations.sum is not None else None,
        }
        combiner = WindowCombiner(
            query.name,
            window_size_ms=query.window.size_ms,
            window_offset_ms=query.window.offset_ms,
            release_timeout_ms=query.release_timeout_ms,
            public_groups=query.public_group_keys(),
            has_sum=aggregations.sum is not None,
        )
        cost = window_cost(plan, namespace.accounting, query.name)
        smallest = min(namespace.budgets, key=lambda b: b.limit)
        if cost > smallest.limit:
            raise WorkerConfigError(
                f"query {query.name!r} charges {cost:g} {namespace.accounting} per window, more than the "
                f"{smallest.limit:g} limit per {smallest.horizon_ms} ms of namespace {query.privacy_unit.namespace!r}: "
                "no unit could ever be released; lower the query's epsilon or raise the limit"
            )
        runtimes.append(QueryRuntime(
            config=query, engine=engine, plan=plan, combiner=combiner, namespace=query.privacy_unit.namespace,
            cost=cost, privacy=privacy,
        ))
    return runtimes


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
    ) -> None:
        self.config = config
        self.settings = settings
        self.registry = registry
        self.clock_ms = clock_ms
        self.serve_metrics = serve_metrics
        self.client_id = client_id
        self.metrics = WorkerMetrics(registry)
        self.runtimes = build_runtimes(config, secret=contribution_secret(settings), clock_ms=clock_ms)
        self._redis: redis.Redis | None = None
        if ledger is None:
            self._redis = redis.Redis.from_url(
                settings.redis_url.get_secret_value(),
                socket_timeout=settings.redis_timeout_s,
                socket_connect_timeout=settings.redis_timeout_s,
            )
        if budget is None:
            # The store retries itself (safe: charges are idempotent); redis-py's own retries are off.
            budget = RedisBudgetStore.from_url(
                settings.redis_url.get_secret_value(), policy_from_config(config), settings.budget_store_options(),
                socket_timeout_s=settings.redis_timeout_s, retries=settings.redis_retries,
                metrics=BudgetMetrics(registry=registry),
            )
            try:
                for warning in budget.durability_warnings():
                    log.warning("Redis durability: %s", warning)
            except Exception as exc:  # the server may not be up yet; charges fail closed until it is
                log.warning("could not check Redis durability settings: %s", exc)
        self.budget = budget
        self.ledger = ledger or RedisReleaseLedger(self._redis, ttl_s=settings.ledger_ttl_s)
        self.stop_event = asyncio.Event()
        self._metrics_server: Any = None

    def request_stop(self) -> None:
        self.stop_event.set()

    async def _prepare_topics(self, options: dict[str, Any]) -> int:
        """Create missing topics, refuse a partials topic that outlives the ledger; returns its partition count."""
        settings = self.settings
        topics = {settings.partials_topic: settings.partials_partitions, settings.alerts_topic: 1,
                  settings.dead_letter_topic: 1}
        topics.update({q.config.output_topic: settings.output_partitions for q in self.runtimes})
        partition_counts = await asyncio.to_thread(
            ensure_topics, options, topics, configs={settings.partials_topic: settings.partials_topic_configs()}
        )
        in_force = await asyncio.to_thread(read_topic_config, options, settings.partials_topic, RETENTION_CONFIGS)
        problem = partials_retention_problem(
            settings.partials_topic, in_force, ledger_ttl_s=settings.ledger_ttl_s,
            wanted=settings.partials_topic_configs(), bootstrap=settings.kafka_bootstrap_servers,
        )
        if problem is not None:
            raise WorkerConfigError(problem)
        return partition_counts[settings.partials_topic]

    def _close_stores(self) -> None:
        if self._redis is not None:
            self._redis.close()
        self.budget.close()

    async def run(self) -> None:
        settings = self.settings
        options = settings.kafka_client_options()
        try:
            partials_partitions = await self._prepare_topics(options)
        except BaseException:
            self._close_stores()
            raise
        for runtime in self.runtimes:
            runtime.combiner.partials_partitions = partials_partitions
        if self.serve_metrics:
            self._metrics_server = start_http_server(settings.metrics_port, settings.metrics_host, registry=self.registry)
        aio = settings.aiokafka_options()
        producer = AIOKafkaProducer(**aio, client_id=f"{self.client_id}-producer", acks="all",
                                    enable_idempotence=True, linger_ms=5, max_request_size=4 * 1024 * 1024)
        ingest_consumer = AIOKafkaConsumer(
            **aio, client_id=f"{self.client_id}-ingest", group_id=settings.group_id, enable_auto_commit=False,
            auto_offset_reset="earliest", max_partition_fetch_bytes=8 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024,
        )
        release_consumer = AIOKafkaConsumer(
            **aio, client_id=f"{self.client_id}-release", group_id=f"{settings.group_id}-release",
            enable_auto_commit=False, auto_offset_reset="earliest",
        )
        noise_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="noise")
        ingest = IngestStage(
            self.runtimes, ingest_consumer, producer, self.budget, self.ledger, self.metrics,
            partials_topic=settings.partials_topic, partials_partitions=partials_partitions,
            alerts_topic=settings.alerts_topic,
            dead_letter_topic=settings.dead_letter_topic,
            read_commit_metadata=lambda tps: read_commit_metadata(options, settings.group_id, tps),
            clock_ms=self.clock_ms,
        )
        release = ReleaseStage(
            self.runtimes, release_consumer, producer, self.ledger, OpenDPNoise(executor=noise_pool), self.metrics,
            partials_topic=settings.partials_topic, release_age_limit_ms=settings.release_age_limit_ms,
            clock_ms=self.clock_ms,
        )
        release_consumer.subscribe([settings.partials_topic], listener=release.rebalance_listener())
        ingest_consumer.subscribe(sorted({q.config.input_topic for q in self.runtimes}), listener=ingest.rebalance_listener())
        await producer.start()
        await ingest_consumer.start()
        await release_consumer.start()
        log.info("worker running: %d queries, group %s", len(self.runtimes), settings.group_id)
        try:
            tasks = [asyncio.create_task(ingest.run(self.stop_event)), asyncio.create_task(release.run(self.stop_event))]
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            self.stop_event.set()
            for task in pending:
                await task
            for task in done:
                task.result()  # re-raise a stage's failure
        finally:
            await ingest_consumer.stop()
            await release_consumer.stop()
            await producer.stop()
            noise_pool.shutdown(wait=False)
            if self._metrics_server is not None:
                server, _thread = self._metrics_server
                server.shutdown()
            self._close_stores()


def run_worker(config: PipelineConfig, settings: Settings) -> int:
    """Run until SIGINT/SIGTERM; returns the process exit code."""
    worker = Worker(config, settings, registry=CollectorRegistry())

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, worker.request_stop)
        await worker.run()

    asyncio.run(main())
    return 0
