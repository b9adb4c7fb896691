"""The worker process: builds every query's runtime (``parts``), connects Kafka, Redis and the metrics
endpoint, and runs the ingest and release stages until stopped."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import CollectorRegistry

from stream_dp.budget import BudgetStore
from stream_dp.budget.redis_nodes import ping as redis_ping
from stream_dp.budget.redis_restarts import ServerWatch
from stream_dp.budget.redis_url import client_from_url, is_cluster_url
from stream_dp.config import PipelineConfig, Settings
from stream_dp.config.release_time import together_release_ms
from stream_dp.config.topic_roles import deployment_problem
from stream_dp.dp import noise_source
from stream_dp.metrics.health import Health
from stream_dp.metrics.health import watch as watch_health
from stream_dp.metrics.http import serve as serve_http
from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.worker.access.check import check_kafka_access, worker_needs
from stream_dp.worker.access.redis_probe import RedisRights
from stream_dp.worker.guard.store import StoreGuard
from stream_dp.worker.ingest.stage import IngestStage
from stream_dp.worker.kafka.admin import read_commit_metadata, read_group_metadata
from stream_dp.worker.kafka.clients import kafka_clients, rdkafka_options, release_poll_interval_ms
from stream_dp.worker.kafka.topic_setup import TopicLimits, prepare_topics
from stream_dp.worker.kafka.topics import TopicSettingsError
from stream_dp.worker.assemble.runtimes import build_worker_parts, contribution_secret
from stream_dp.worker.process.loop_errors import quiet_connection_errors
from stream_dp.worker.process.tuning import tune_process
from stream_dp.worker.query.costs import WorkerConfigError
from stream_dp.worker.release.partition_check import BrokerPartitions, committed_by
from stream_dp.worker.release.stage import ReleaseStage
from stream_dp.worker.store.budget_client import open_budget_store
from stream_dp.worker.store.ledger import RedisReleaseLedger, ReleaseLedger
from stream_dp.worker.store.period_register import MemoryPeriodRegister, PeriodRegister, RedisPeriodRegister

log = logging.getLogger(__name__)


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
        self._markers_redis: Any = None
        wait = settings.replica_wait()
        self._wait_replicas = wait.replicas if wait is not None else 0
        url = settings.redis_url.get_secret_value()
        self._rights: RedisRights | None = None  # what the worker's Redis user may do, tried once
        # The ledger's and budget store's connections check the server is the verified one; the markers' do not.
        self.restarts = ServerWatch()
        watched = self.restarts.client_options(url)
        if ledger is None:
            self._redis = client_from_url(url, timeout_s=settings.redis_timeout_s, **watched)
            self._markers_redis = client_from_url(url, timeout_s=settings.redis_timeout_s)
            self._rights = RedisRights(self._redis, url, cluster=is_cluster_url(url), replicas=self._wait_replicas > 0)
        self.budget = budget or open_budget_store(url, parts.policy, settings, registry, wait, **watched)
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
        answer = redis_ping(self._redis, self._wait_replicas)
        if self._rights is not None:  # a Redis down at start: its rights are tried at its first answer
            self._rights.verify()
        return answer

    def _close_stores(self) -> None:
        for client in (c for c in (self._redis, self._markers_redis) if c is not None):
            client.close()
        self.budget.close()

    async def run(self) -> None:
        settings = self.settings
        options = settings.kafka_client_options()
        try:  # what Redis and the broker let the worker do, before it creates, reads or writes anything
            if self._rights is not None:
                await asyncio.to_thread(self._rights.verify_at_start)
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
                                output_wait_s=settings.output_wait_s,
                                max_poll_interval_ms=release_poll_interval_ms(together_ms))
        noise_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="noise")
        # Checked at every input assignment, before anything is charged or released.
        input_topics = {q.config.input_topic for q in self.runtimes}
        store = StoreGuard(self.ledger.store_markers(self._markers_redis),
                           lambda: read_group_metadata(options, settings.group_id, input_topics),
                           on_verified=self.restarts.accept)
        self.restarts.listen(store.suspect)
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
        loop.set_exception_handler(quiet_connection_errors)  # a broker's reset socket is not a crash
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, worker.request_stop)
        await worker.run()

    asyncio.run(main())
    return 0
