"""The ingest stage: input topics -> window engines -> budget -> partials topic.

One loop iteration (``step``): take a batch from the consumer, run it through
each query's engine, send rejected events to the dead-letter topic, charge the
budget of every window partial that closed, publish the budget-filtered
partials, tell the release stage how far each partition has closed (``ingest.progress_out``), and
commit only offsets that no open or unpublished window still needs.

Fail closed: a partial whose charge fails is held (and its offsets with it)
and retried; it is published only after the charge succeeded (``ingest.closed_windows``).
Exactly-once bookkeeping: the charge id is ``query/window_start/partition``;
a replay after a crash charges nobody twice and gets the same exclusions
back, so the re-published partial has the same contents (its close time and
so its chunks' digest differ: the release stage keeps one of them).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.structs import TopicPartition

from stream_dp.budget import BudgetStore
from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.windows import RejectReason
from stream_dp.worker.guard.store import MemoryStoreMarkers, StoreGuard, StoreReplaced
from stream_dp.worker.ingest.background import BackgroundRounds
from stream_dp.worker.ingest.closed_windows import Emitter, HeldPartial
from stream_dp.worker.ingest.commit_plan import committable_offsets
from stream_dp.worker.ingest.dead_letters import DeadLetters
from stream_dp.worker.ingest.decode import raw_batch
from stream_dp.worker.ingest.partials_out import PartialsOut
from stream_dp.worker.ingest.progress_out import ProgressOut, earliest_held, progress_through
from stream_dp.worker.kafka.commit_metadata import restored_partitions
from stream_dp.worker.kafka.positions import PartitionPositions
from stream_dp.worker.kafka.spacing import Spacing
from stream_dp.worker.query.runtime import QueryRuntime
from stream_dp.worker.store.ledger import ReleaseLedger
from stream_dp.worker.store.period_register import PeriodRegister

log = logging.getLogger(__name__)
_METADATA_ATTEMPTS = 6  # about 8 s of retries, within any rebalance or poll timeout

# The broker's default record limit (message.max.bytes) less room for framing; the worker
# passes the limits it reads from the cluster at start (see ``kafka.topics``).
DEFAULT_RECORD_BYTES = 1_000_000 - 16_384


class IngestStage:
    def __init__(
        self,
        queries: list[QueryRuntime],
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer,
        budget: BudgetStore,
        journal: ReleaseLedger,
        metrics: WorkerMetrics,
        *,
        partials_topic: str,
        partials_partitions: int,
        alerts_topic: str,
        dead_letter_topic: str,
        read_commit_metadata: Callable[[list[TopicPartition]], dict[TopicPartition, str]],
        partials_record_bytes: int = DEFAULT_RECORD_BYTES,
        dead_letter_record_bytes: int = DEFAULT_RECORD_BYTES,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        max_records: int = 20_000,
        poll_timeout_ms: int = 200,
        commit_interval_s: float = 1.0,
        progress_interval_s: float = 5.0,
        retry_backoff_s: float = 0.5,
        retry_backoff_max_s: float = 10.0,
        periods: PeriodRegister | None = None,
        store: StoreGuard | None = None,
    ) -> None:
        self.queries = queries
        self.store = store if store is not None else StoreGuard(MemoryStoreMarkers())
        self.by_topic: dict[str, list[QueryRuntime]] = defaultdict(list)
        for query in queries:
            self.by_topic[query.config.input_topic].append(query)
        self.consumer = consumer
        self.producer = producer
        self.budget = budget
        self.journal = journal
        self.metrics = metrics
        self.partials_topic = partials_topic
        self.partials_partitions = partials_partitions
        self.alerts_topic = alerts_topic
        self.dead_letter_topic = dead_letter_topic
        self.dead_letters = DeadLetters(producer, metrics, topic=dead_letter_topic, max_record_bytes=dead_letter_record_bytes)
        self.emitter = Emitter(
            queries, producer, budget, journal, metrics,
            PartialsOut(producer, metrics, topic=partials_topic, partitions=partials_partitions,
                        max_record_bytes=partials_record_bytes,
                        periods={q.name: q.combiner.period for q in queries if q.combiner.period is not None}),
            alerts_topic=alerts_topic, partition_count=self._partition_count,
            retry_backoff_s=retry_backoff_s, retry_backoff_max_s=retry_backoff_max_s, periods=periods,
            store=self.store,
        )
        self.read_commit_metadata = read_commit_metadata
        self.clock_ms = clock_ms
        self.max_records = max_records
        self.poll_timeout_ms = poll_timeout_ms
        self._lock = asyncio.Lock()
        self._commit_spacing = Spacing(commit_interval_s)  # due at once the first time
        self.progress_out = ProgressOut(producer, topic=partials_topic, partitions=partials_partitions,
                                        interval_s=progress_interval_s)
        self.positions = PartitionPositions(consumer)
        self._joined = False  # an assignment (possibly empty) arrived from the group
        # Charging and publishing closed windows waits mostly on Redis: it runs beside the loop.
        self._rounds = BackgroundRounds(self._emit_round, name="ingest-emit")

    # -- wiring --------------------------------------------------------------------------

    def rebalance_listener(self) -> ConsumerRebalanceListener:
        stage = self

        class _Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked):
                await stage.on_revoked(list(revoked))

            async def on_partitions_assigned(self, assigned):
                await stage.on_assigned(list(assigned))

        return _Listener()

    async def on_assigned(self, assigned: list[TopicPartition]) -> None:
        async with self._lock:
            metadata: dict[TopicPartition, str] = {}
            if assigned:
                metadata = await self._read_commit_metadata(assigned)
            self.store.note_assignment()
            await self._verify_store()
            for topic, queries in self.by_topic.items():
                partitions = [tp.partition for tp in assigned if tp.topic == topic]
                if not partitions:
                    continue
                for query in queries:
                    earlier = restored_partitions(query.name, {tp.partition: metadata.get(tp)
                                                               for tp in assigned if tp.topic == topic})
                    for partition, closed in earlier.closed_through_ms.items():
                        self.positions.restored(query.name, TopicPartition(topic, partition), closed)
                    query.engine.assign(partitions, closed_through_ms=earlier.closed_through_ms or None,
                                        replay_until_offset=earlier.next_offset or None,
                                        record_clock_ms=earlier.record_clock_ms or None,
                                        closure_steps=earlier.closure_steps or None)
            self._joined = True
            log.info("assigned %s", sorted(f"{tp.topic}[{tp.partition}]" for tp in assigned))

    async def _read_commit_metadata(self, assigned: list[TopicPartition]) -> dict[TopicPartition, str]:
        """The progress committed with the assigned partitions' offsets, retried while the broker recovers
        (a group coordinator that just moved or restarted answers with errors for a few seconds).

        Without it the partitions' window clocks start from the records read from here on: an event the
        clock had already passed would be taken as on time. Replayed windows are still caught by their
        charge ids, so after the retries the worker goes on, and says so.
        """
        delay_s = 0.25
        for attempt in range(1, _METADATA_ATTEMPTS + 1):
            try:
                return await asyncio.to_thread(self.read_commit_metadata, assigned)
            except Exception as exc:
                error = exc
                if attempt < _METADATA_ATTEMPTS:
                    log.warning("reading committed window progress failed (%s); retrying in %.2f s", exc, delay_s)
                    await asyncio.sleep(delay_s)
                    delay_s = min(2 * delay_s, 4.0)
        self.metrics.internal_errors.labels("commit_metadata_unreadable").inc()
        log.error("cannot read committed window progress after %d attempts (%s); window clocks restart from the "
                  "records read, replayed windows are detected by their charge ids", _METADATA_ATTEMPTS, error)
        return {}

    async def on_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self._lock:
            await self._rounds.settle()  # no charge or publish of a revoked partition's window after this
            # Commit what is safe for the partitions we are losing; their open
            # windows are rebuilt by the next owner from those offsets.
            await self._commit(force=True)
            for topic, queries in self.by_topic.items():
                partitions = [tp.partition for tp in revoked if tp.topic == topic]
                if not partitions:
                    continue
                for query in queries:
                    query.engine.revoke(partitions)
                lost = set(partitions)
                self.emitter.held = [
                    h for h in self.emitter.held
                    if not (h.query.config.input_topic == topic and h.partial.partition in lost)
                ]
            self.emitter.set_pending_gauge()
            self.positions.forget(revoked)
            for tp in revoked:
                try:
                    self.metrics.consumer_lag.remove(tp.topic, str(tp.partition))
                except KeyError:
                    pass  # never reported
            log.info("revoked %s", sorted(f"{tp.topic}[{tp.partition}]" for tp in revoked))

    def assigned_partitions(self) -> int | None:
        """Input partitions owned now; None until the group first assigned this worker (for readiness)."""
        return len(self.consumer.assignment()) if self._joined else None

    # -- the loop ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.step()
        async with self._lock:
            await self._rounds.settle(raise_failure=True)
            while self.emitter.held and await self.emitter.emit():
                pass  # a round takes a bounded number of windows; stop early only when one sends nothing
            await self._commit(force=True)

    async def _verify_store(self) -> None:
        """Nothing is charged until the store is known to be the one the group's progress was charged on."""
        try:
            verified = await asyncio.to_thread(self.store.verify)
        except StoreReplaced:
            self.metrics.store_checks.labels("replaced").inc()
            return
        self.metrics.store_checks.labels("verified" if verified else "unanswered").inc()

    async def step(self) -> None:
        if self.store.failure is not None:
            raise self.store.failure  # stops the worker: see stream_dp.worker.guard.store
        if self._joined and self.store.due():
            await self._verify_store()
        batches = await self.consumer.getmany(timeout_ms=self.poll_timeout_ms, max_records=self.max_records)
        async with self._lock:
            now_ms = self.clock_ms()
            # Before a batch can advance the watermark: partitions that are slow (or were not watched
            # while this loop stalled) are not idle, or another partition's records would close their windows.
            self._hold_open_slow_partitions()
            closed = await self._process(batches, now_ms)
            self.positions.note_batches(batches)
            await self.positions.learn_starts()
            self._note_read_positions()
            self._hold_open_slow_partitions()
            closed += self._tick(now_ms)
            self.emitter.held += closed
            self._rounds.start()  # charge and publish what is held, while the next records are read
            await self._commit()
            # After the commit: progress vouches only for closure that later owners of the partition keep.
            await self._send_progress()
            self._update_lag()

    # -- pieces --------------------------------------------------------------------------

    async def _process(self, batches: dict[TopicPartition, list], now_ms: int) -> list[HeldPartial]:
        """Run each topic's records through its queries' engines; the windows that closed on them."""
        closed: list[HeldPartial] = []
        by_topic: dict[str, list[tuple[TopicPartition, list]]] = defaultdict(list)
        for tp, records in batches.items():
            if records:
                by_topic[tp.topic].append((tp, records))
        for topic, items in by_topic.items():
            if not self._note_partition_count(topic):
                # Placement cannot be checked without the topic's partition count: read these again later.
                for tp, records in items:
                    self.consumer.seek(tp, records[0].offset)
                continue
            batch = raw_batch(items)
            for query in self.by_topic.get(topic, ()):
                result = query.engine.process(batch)
                self._count(query, result)
                await self.dead_letters.send(query.name, topic, result.rejections)
                closed += [HeldPartial(query, p, now_ms) for p in result.partials]
        return closed

    def _note_read_positions(self) -> None:
        """Tell the engines where reading each owned partition started, once the consumer knows."""
        for tp in self.consumer.assignment():
            start = self.positions.start_offset(tp)
            if start is not None:
                for query in self.by_topic.get(tp.topic, ()):
                    query.engine.note_read_position(tp.partition, start)

    def _tick(self, now_ms: int) -> list[HeldPartial]:
        """The windows the wall clock closed, and each query's open windows and watermark as metrics."""
        closed: list[HeldPartial] = []
        for query in self.queries:
            closed += [HeldPartial(query, p, now_ms) for p in query.engine.tick()]
            self.metrics.windows_open.labels(query.name).set(len(query.engine.open_windows))
            self.metrics.open_rows.labels(query.name).set(query.engine.open_rows)
            closed_through = query.engine.closed_through_ms
            if closed_through:
                self.metrics.watermark.labels(query.name).set(min(closed_through.values()) / 1000)
        return closed

    async def _emit_round(self) -> None:
        """One background round: charge and publish what is held, a bounded batch at a time (windows
        that close meanwhile join the next batch in window order) until nothing is held or a batch
        sends nothing; once windows went out, commit and send progress at once (progress vouches
        only for committed closure), unless a step or a rebalance holds the stage, which then does it."""
        while await self.emitter.emit():
            if self._lock.locked():
                break  # a step (which starts the next round when it ends) or a rebalance holds the stage
            async with self._lock:
                await self._commit(force=True)
                await self._send_progress()
            if not self.emitter.held:
                break

    def _hold_open_slow_partitions(self) -> None:
        """A partition with records waiting, or whose end is not known, is slow, not idle: the wall
        clock (or other partitions' clocks) must not close its windows."""
        not_idle = self.positions.not_idle()
        for query in self.queries:
            query.engine.hold_open(not_idle.get(query.config.input_topic, ()))

    def _count(self, query: QueryRuntime, result: Any) -> None:
        name = query.name
        self.metrics.events.labels(name, "accepted").inc(result.accepted)
        self.metrics.events.labels(name, "late").inc(result.late)
        self.metrics.events.labels(name, "replayed").inc(result.replayed)
        self.metrics.events.labels(name, "unlisted").inc(result.unlisted)
        rejected = 0
        for reason, n in result.rejected.items():
            if reason == RejectReason.LATE:
                continue
            self.metrics.rejected.labels(name, reason.value).inc(n)
            rejected += n
        self.metrics.events.labels(name, "rejected").inc(rejected)

    def _note_partition_count(self, topic: str) -> bool:
        """Tell the topic's engines its current partition count; False while it is unknown."""
        count = self._partition_count(topic)
        if count == 0:
            self.metrics.internal_errors.labels("partition_count_unknown").inc()
            log.warning("partition count of %s is not known yet; its records will be read again", topic)
            return False
        changed = [query.engine.set_partition_count(count) for query in self.by_topic.get(topic, ())]
        if any(changed):
            self.metrics.partition_count_changes.labels(topic).inc()
            log.warning(
                "input topic %s now has %d partitions: its keys move to other partitions. The group rebalances and "
                "windows open now are read again under the new count, where events a unit sent before the change to "
                "the partition its key left are rejected (wrong_partition); a window whose partitions were closed "
                "under different counts is released without data (noise only): no unit counts on two partitions",
                topic, count,
            )
        return True

    def _partition_count(self, topic: str) -> int:
        partitions = self.consumer.partitions_for_topic(topic)
        return len(partitions) if partitions else 0

    def _progress_through(self) -> Callable[[QueryRuntime, int], int | None]:
        """How far each query has closed a partition, by the windows held now (held windows only leave
        outside a step: a progress read later can only be lower than the truth, never higher)."""
        earliest = earliest_held(self.emitter.held)
        return lambda query, partition: progress_through(query, partition, earliest)

    async def _send_progress(self) -> None:
        await self.progress_out.send(
            self.consumer.assignment(), self.by_topic, through=self._progress_through(),
            durable=self.positions.durable_through, partition_count=self._partition_count,
        )

    def committable(self) -> tuple[dict[TopicPartition, tuple[int, str]], list[tuple[str, TopicPartition, int]]]:
        """Offsets (with metadata) safe to commit, and the closures that metadata makes durable."""
        return committable_offsets(
            self.by_topic, self.emitter.held, self.consumer.assignment(),
            position=self.positions.position, progress_through=self._progress_through(),
            store=self.store.token,
        )

    async def _commit(self, *, force: bool = False) -> None:
        if not self.store.ready():
            return  # nothing was charged meanwhile, and the commits keep naming the store they were made with
        now_s = self._commit_spacing.now()
        if not force and not self._commit_spacing.due(now_s):
            return
        offsets, closures = self.committable()
        if not offsets:
            return
        # Dead letters and partials sent so far must be durable before the
        # offsets that produced them are committed.
        await self.producer.flush()
        try:
            await self.consumer.commit(offsets)
        except Exception as exc:  # a rebalance in progress: the next commit catches up
            log.warning("offset commit failed (%s); will retry", exc)
            return
        self.positions.committed(closures)
        self._commit_spacing.done(now_s)

    def _update_lag(self) -> None:
        """Lag of every assigned partition, also of those that returned nothing (a stuck one shows)."""
        for tp in self.consumer.assignment():
            lag = self.positions.lag(tp)
            if lag is not None:
                self.metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(lag)
