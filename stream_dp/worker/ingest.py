"""The ingest stage: input topics -> window engines -> budget -> partials topic.

One loop iteration (``step``): take a batch from the consumer, run it through
each query's engine, send rejected events to the dead-letter topic, charge the
budget of every window partial that closed, publish the budget-filtered
partials, tell the release stage how far each partition has closed, and
commit only offsets that no open or unpublished window still needs.

Fail closed: a partial whose charge fails is held (and its offsets with it)
and retried; it is published only after the charge succeeded. Exactly-once
bookkeeping: the charge id is ``query/window_start/partition``; a replay after
a crash charges nobody twice and gets the same exclusions back, so the
re-published partial is identical.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.structs import TopicPartition

from stream_dp.budget import BudgetStore, BudgetUnavailable, ChargeConflict, ChargeRejected
from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.windows import RawBatch, RejectReason
from stream_dp.windows.batch import NO_TIMESTAMP
from stream_dp.worker.combiner import window_home
from stream_dp.worker.background import BackgroundRounds
from stream_dp.worker.charge_round import WindowCharge, charge_in_order
from stream_dp.worker.commit_metadata import encode_commit_metadata, restored_progress
from stream_dp.worker.ledger import LedgerUnavailable, ReleaseLedger
from stream_dp.worker.positions import PartitionPositions
from stream_dp.worker.record_columns import RecordColumns
from stream_dp.worker.record_columns import raw_batch as columns_raw_batch
from stream_dp.worker.records import PartialAggregate, Progress, encode_partial, encode_progress, partial_key
from stream_dp.worker.runtime import QueryRuntime

log = logging.getLogger(__name__)

MAX_DEAD_LETTER_BYTES = 900_000  # stay under the producer's default 1 MB request limit


@dataclass
class _HeldPartial:
    """A closed window partial not yet charged and published."""

    query: QueryRuntime
    partial: Any  # stream_dp.windows.WindowPartial
    closed_at_ms: int


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
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        max_records: int = 20_000,
        poll_timeout_ms: int = 200,
        commit_interval_s: float = 1.0,
        progress_interval_s: float = 5.0,
        retry_backoff_s: float = 0.5,
        retry_backoff_max_s: float = 10.0,
    ) -> None:
        self.queries = queries
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
        self.read_commit_metadata = read_commit_metadata
        self.clock_ms = clock_ms
        self.max_records = max_records
        self.poll_timeout_ms = poll_timeout_ms
        self.commit_interval_s = commit_interval_s
        self.progress_interval_s = progress_interval_s
        self.retry_backoff_s = retry_backoff_s
        self.retry_backoff_max_s = retry_backoff_max_s
        self._held: list[_HeldPartial] = []
        self._lock = asyncio.Lock()
        self._last_commit_s = 0.0
        self._last_progress_s = 0.0
        self._sent_progress: dict[tuple[str, int], int] = {}
        self.positions = PartitionPositions(consumer)
        self._joined = False  # an assignment (possibly empty) arrived from the group
        self._charge_attempts = 0
        self._next_charge_s = 0.0
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
                try:
                    metadata = await asyncio.to_thread(self.read_commit_metadata, assigned)
                except Exception as exc:
                    # Without the stored progress, replayed events rebuild windows that were
                    # already released; their charges then conflict and they are not re-emitted.
                    self.metrics.internal_errors.labels("commit_metadata_unreadable").inc()
                    log.error("cannot read committed window progress (%s); replayed windows are detected by their charge ids", exc)
            for topic, queries in self.by_topic.items():
                partitions = [tp.partition for tp in assigned if tp.topic == topic]
                if not partitions:
                    continue
                for query in queries:
                    restored: dict[int, int] = {}
                    replay_until: dict[int, int] = {}
                    clocks: dict[int, int] = {}
                    steps: dict[int, tuple[tuple[int, int], ...]] = {}
                    for tp in assigned:
                        if tp.topic != topic:
                            continue
                        earlier = restored_progress(metadata.get(tp), query.name)
                        if earlier.closed_through_ms is not None:
                            restored[tp.partition] = earlier.closed_through_ms
                            self.positions.restored(query.name, tp, earlier.closed_through_ms)
                        if earlier.next_offset is not None:
                            replay_until[tp.partition] = earlier.next_offset
                        if earlier.record_clock_ms is not None:
                            clocks[tp.partition] = earlier.record_clock_ms
                        if earlier.closure_steps:
                            steps[tp.partition] = earlier.closure_steps
                    query.engine.assign(partitions, closed_through_ms=restored or None,
                                        replay_until_offset=replay_until or None, record_clock_ms=clocks or None,
                                        closure_steps=steps or None)
            self._joined = True
            log.info("assigned %s", sorted(f"{tp.topic}[{tp.partition}]" for tp in assigned))

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
                self._held = [
                    h for h in self._held
                    if not (h.query.config.input_topic == topic and h.partial.partition in lost)
                ]
            self._set_pending_gauge()
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
            await self._emit_held()
            await self._commit(force=True)

    async def step(self) -> None:
        batches = await self.consumer.getmany(timeout_ms=self.poll_timeout_ms, max_records=self.max_records)
        async with self._lock:
            now_ms = self.clock_ms()
            # Before a batch can advance the watermark: partitions that are slow (or were not watched
            # while this loop stalled) are not idle, or another partition's records would close their windows.
            self._hold_open_slow_partitions()
            closed: list[_HeldPartial] = []
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
                batch = _raw_batch(items)
                for query in self.by_topic.get(topic, ()):
                    result = query.engine.process(batch)
                    self._count(query, result)
                    await self._dead_letters(query, topic, result.rejections)
                    closed += [_HeldPartial(query, p, now_ms) for p in result.partials]
            self.positions.note_batches(batches)
            await self.positions.learn_starts()
            for tp in self.consumer.assignment():
                start = self.positions.start_offset(tp)
                if start is not None:
                    for query in self.by_topic.get(tp.topic, ()):
                        query.engine.note_read_position(tp.partition, start)
            self._hold_open_slow_partitions()
            for query in self.queries:
                closed += [_HeldPartial(query, p, now_ms) for p in query.engine.tick()]
                self.metrics.windows_open.labels(query.name).set(len(query.engine.open_windows))
                self.metrics.open_rows.labels(query.name).set(query.engine.open_rows)
                closed_through = query.engine.closed_through_ms
                if closed_through:
                    self.metrics.watermark.labels(query.name).set(min(closed_through.values()) / 1000)
            self._held += closed
            self._rounds.start()  # charge and publish what is held, while the next records are read
            await self._commit()
            # After the commit: progress vouches only for closure that later owners of the partition keep.
            await self._send_progress()
            self._update_lag()

    # -- pieces --------------------------------------------------------------------------

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
        rejected = 0
        for reason, n in result.rejected.items():
            if reason == RejectReason.LATE:
                continue
            self.metrics.rejected.labels(name, reason.value).inc(n)
            rejected += n
        self.metrics.events.labels(name, "rejected").inc(rejected)

    async def _dead_letters(self, query: QueryRuntime, topic: str, rejections: list) -> None:
        for rejection in rejections:
            value = rejection.value if rejection.value is not None else b""
            headers = [
                ("reason", rejection.reason.value.encode()),
                ("detail", rejection.detail.encode()[:500]),
                ("query", query.name.encode()),
                ("source", f"{topic}/{rejection.partition}/{rejection.offset}".encode()),
            ]
            if len(value) > MAX_DEAD_LETTER_BYTES:
                headers.append(("truncated_from_bytes", str(len(value)).encode()))
                value = value[:MAX_DEAD_LETTER_BYTES]
            # Queued in the producer's buffer (the delivery future is not awaited
            # here); the flush before each commit makes them durable before
            # their offsets are committed.
            await self.producer.send(self.dead_letter_topic, value=value, headers=headers)
            self.metrics.dead_letters.labels(query.name).inc()

    async def _emit_round(self) -> None:
        """One background round: charge and publish what is held; once windows went out, commit
        and send progress at once (progress vouches only for committed closure), unless a step
        or a rebalance holds the stage, which then does it."""
        if await self._emit_held() and not self._lock.locked():
            async with self._lock:
                await self._commit(force=True)
                await self._send_progress()

    async def _emit_held(self) -> bool:
        """Charge and publish the held partials (see the module docstring); whether any went out."""
        if not self._held:
            self._set_pending_gauge()
            return False
        now_s = time.monotonic()
        if now_s < self._next_charge_s:
            return False
        still_held: list[_HeldPartial] = []
        sends = []
        # Oldest window first, and an outage stops the round: a unit's windows are
        # always charged in window order, as they would be without the outage.
        ordered = sorted(self._held, key=lambda h: (h.partial.window_start_ms, h.partial.partition))
        windows = [
            WindowCharge(f"{h.query.name}/{h.partial.window_start_ms}/{h.partial.partition}", h.query.namespace,
                         h.query.cost, h.query.delta, h.partial.window_end_ms, h.partial.units)
            for h in ordered
        ]
        results = await asyncio.to_thread(charge_in_order, self.journal, self.budget, windows)
        for position, (held, window, result) in enumerate(zip(ordered, windows, results)):
            query, partial, charge_id = held.query, held.partial, window.charge_id
            units, charged_units, outcome, exc = result.units, result.charged_units, result.outcome, result.error
            if isinstance(exc, (BudgetUnavailable, LedgerUnavailable)):
                self._charge_attempts += 1
                backoff = min(self.retry_backoff_max_s, self.retry_backoff_s * 2 ** (self._charge_attempts - 1))
                self._next_charge_s = now_s + backoff
                self.metrics.budget_failures.labels(query.name, "unavailable").inc()
                log.warning("budget store unavailable for %s (attempt %d): %s; holding %d windows",
                            charge_id, self._charge_attempts, exc, len(ordered) - position)
                still_held.extend(ordered[position:])
                break
            if isinstance(exc, ChargeConflict):
                # The journal makes retries repeat the first unit list, so this means
                # another writer used the same charge id: release nothing.
                self.metrics.budget_failures.labels(query.name, "conflict").inc()
                log.error("charge %s conflicts with an earlier one (%s); the window is dropped unreleased", charge_id, exc)
                continue
            if isinstance(exc, ChargeRejected):
                self.metrics.budget_failures.labels(query.name, "rejected").inc()
                log.error("budget store refused %s: %s; the window is dropped unreleased", charge_id, exc)
                continue
            assert outcome is not None and charged_units is not None
            self._charge_attempts = 0
            excluded = np.asarray(outcome.excluded, dtype=bool)
            if charged_units != units:
                # Rebuilt from another batch than the one charged: keep only units that
                # were charged (and not excluded) the first time.
                self.metrics.internal_errors.labels("replay_rebuilt_differently").inc()
                admitted = {u for u, out in zip(charged_units, excluded.tolist()) if not out}
                excluded = np.fromiter((u not in admitted for u in units), dtype=bool, count=len(units))
                log.warning("window %s was rebuilt with other units than first charged; releasing only the charged ones",
                            charge_id)
            totals = partial.aggregate(excluded if excluded.any() else None)
            n_excluded = int(excluded.sum())
            self.metrics.units_charged.labels(query.name, "charged").inc(len(units) - n_excluded)
            self.metrics.units_charged.labels(query.name, "excluded").inc(n_excluded)
            message = PartialAggregate(
                query=query.name,
                window_start_ms=partial.window_start_ms,
                window_end_ms=partial.window_end_ms,
                partition=partial.partition,
                input_partitions=self._partition_count(query.config.input_topic),
                groups=list(totals.groups),
                count=totals.count,
                sum=totals.sum if query.config.aggregations.sum is not None else None,
                distinct_units=totals.distinct_units,
                units_charged=len(units) - n_excluded,
                units_excluded=n_excluded,
                closed_at_ms=held.closed_at_ms,
                placement_partitions=partial.partition_count,
                placement_changed=partial.partition_count_changed,
            )
            sends.append(await self.producer.send(
                self.partials_topic, key=partial_key(query.name, partial.window_start_ms), value=encode_partial(message),
                partition=window_home(query.name, partial.window_start_ms, self.partials_partitions),
            ))
            for alert in outcome.alerts:
                sends.append(await self.producer.send(self.alerts_topic, key=query.namespace.encode(), value=_alert_json(alert)))
                self.metrics.alerts_published.labels(query.namespace).inc()
            self.metrics.windows_closed.labels(query.name).inc()
        if sends:
            # Partials must be in the topic before progress says their window is closed.
            await asyncio.gather(*sends)
        # Steps may have added partials meanwhile: keep them.
        taken = {id(h) for h in ordered}
        self._held = still_held + [h for h in self._held if id(h) not in taken]
        self._set_pending_gauge()
        return bool(sends)

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
                "input topic %s now has %d partitions: its keys move to other partitions, so windows open across "
                "the change are released without data (noise only) rather than let a unit count on two partitions",
                topic, count,
            )
        return True

    def _partition_count(self, topic: str) -> int:
        partitions = self.consumer.partitions_for_topic(topic)
        return len(partitions) if partitions else 0

    def _progress_through(self, query: QueryRuntime, partition: int) -> int | None:
        closed = query.engine.closed_through_ms.get(partition)
        if closed is None:
            return None
        for held in self._held:
            if held.query is query and held.partial.partition == partition:
                # A held window is not closed for the release stage yet.
                closed = min(closed, held.partial.window_start_ms)
        return closed

    async def _send_progress(self) -> None:
        now_s = time.monotonic()
        heartbeat = now_s - self._last_progress_s >= self.progress_interval_s
        sends = []
        for tp in self.consumer.assignment():
            for query in self.by_topic.get(tp.topic, ()):
                through = self._progress_through(query, tp.partition)
                durable = self.positions.durable_through(query.name, tp)
                if through is None or durable is None:
                    continue
                through = min(through, durable)
                key = (query.name, tp.partition)
                if not heartbeat and self._sent_progress.get(key) == through:
                    continue
                self._sent_progress[key] = through
                value = encode_progress(Progress(query.name, tp.partition, self._partition_count(tp.topic), through))
                # Every release consumer must see every partition's progress:
                # the marker goes to each partition of the partials topic.
                for partials_partition in range(self.partials_partitions):
                    sends.append(await self.producer.send(self.partials_topic, value=value, partition=partials_partition))
        if heartbeat:
            self._last_progress_s = now_s
        if sends:
            await asyncio.gather(*sends)

    def committable(self) -> tuple[dict[TopicPartition, tuple[int, str]], list[tuple[str, TopicPartition, int]]]:
        """Offsets (with metadata) safe to commit: nothing before them is still needed;
        and the (query, partition, closed through) that the metadata makes durable."""
        offsets: dict[TopicPartition, tuple[int, str]] = {}
        closures: list[tuple[str, TopicPartition, int]] = []
        assigned = self.consumer.assignment()
        for topic, queries in self.by_topic.items():
            per_partition: dict[int, int] = {}
            for query in queries:
                for partition, offset in query.engine.committable_offsets().items():
                    per_partition[partition] = min(offset, per_partition.get(partition, offset))
            for held in self._held:
                if held.query.config.input_topic == topic and held.partial.partition in per_partition:
                    first = held.partial.first_offset
                    per_partition[held.partial.partition] = min(per_partition[held.partial.partition], first)
            for tp in assigned:
                # Nothing processed here (an empty or idle partition): commit where reading stands,
                # so that windows closed on it stay closed for the next owner.
                position = self.positions.position(tp)
                if tp.topic == topic and tp.partition not in per_partition and position is not None:
                    if any(self._progress_through(q, tp.partition) is not None for q in queries):
                        per_partition[tp.partition] = position
            for partition, offset in per_partition.items():
                tp = TopicPartition(topic, partition)
                if tp in assigned:
                    # A held window is not closed for a restarted worker either: its
                    # events must be rebuilt, not skipped as replayed.
                    closed = {q.name: self._progress_through(q, partition) for q in queries}
                    processed = [q.engine.next_offsets.get(partition) for q in queries]
                    if not any(o is not None for o in processed):  # nothing read: keep what the earlier owner had
                        processed = [q.engine.replay_until_offsets.get(partition) for q in queries]
                    clocks = [q.engine.record_clock_ms.get(partition) for q in queries]
                    closed = {k: v for k, v in closed.items() if v is not None}
                    closures.extend((name, tp, through) for name, through in closed.items())
                    metadata = encode_commit_metadata(
                        closed,
                        {q.name: q.engine.closure_steps.get(partition, ()) for q in queries},
                        min((o for o in processed if o is not None), default=offset),
                        max((c for c in clocks if c is not None), default=None),
                    )
                    offsets[tp] = (offset, metadata)
        return offsets, closures

    async def _commit(self, *, force: bool = False) -> None:
        now_s = time.monotonic()
        if not force and now_s - self._last_commit_s < self.commit_interval_s:
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
        self._last_commit_s = now_s

    def _update_lag(self) -> None:
        """Lag of every assigned partition, also of those that returned nothing (a stuck one shows)."""
        for tp in self.consumer.assignment():
            lag = self.positions.lag(tp)
            if lag is not None:
                self.metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(lag)

    def _set_pending_gauge(self) -> None:
        for query in self.queries:
            self.metrics.pending_charges.labels(query.name).set(sum(1 for h in self._held if h.query is query))


def _raw_batch(items: list[tuple[TopicPartition, list]]) -> RawBatch:
    if all(isinstance(records, RecordColumns) for _, records in items):
        return columns_raw_batch(items)  # the ColumnarConsumer's records: no object per record
    values: list[bytes | None] = []
    keys: list[bytes | None] = []
    partitions = []
    offsets = []
    timestamps = []
    for tp, records in items:
        values.extend(r.value for r in records)
        keys.extend(r.key for r in records)
        partitions.append(np.full(len(records), tp.partition, dtype=np.int32))
        offsets.append(np.fromiter((r.offset for r in records), dtype=np.int64, count=len(records)))
        # A record of the old message format has no timestamp (None or -1): NO_TIMESTAMP either way.
        timestamps.append(np.fromiter((r.timestamp or NO_TIMESTAMP for r in records), dtype=np.int64, count=len(records)))
    return RawBatch(
        values=values, partitions=np.concatenate(partitions), offsets=np.concatenate(offsets),
        timestamps=np.concatenate(timestamps), keys=keys,
    )


def _alert_json(alert: Any) -> bytes:
    return orjson.dumps({"type": "budget_alert", **dataclasses.asdict(alert)})
