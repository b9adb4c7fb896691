"""The combine-and-release stage: partials topic -> combine -> noise once -> ledger -> output topics.

Each window of each query is noised once: the records are written to the
release ledger before they are published, and a retried or replayed window
publishes what the ledger holds. Partials-topic offsets are committed only
past partials whose window is published, so a crash replays the pending ones.

A window is released at most once, ever, and the ledger only remembers a
release for its TTL, so no window is noised once the ledger could have
forgotten it (``too_old_to_release``). Why that suffices: a window's ledger
entry is written when it is released, at time t_r, and expires at t_r + TTL.
A partial's Kafka record timestamp t_p (the producing worker's CreateTime or
the broker's LogAppendTime) is at or before t_r, since the partial is in the
topic before any release reads it; the window's end t_e is at or before t_r
too, since no window closes, let alone is released, before the wall clock
passes its end -- and unlike t_p this still holds for a partial written again
by an ingest replay after the release. So with t = min(t_p, t_e), the entry
expires at t_r + TTL >= t + TTL: while now < t + TTL - margin (the margin
covers clock skew between workers) a window that was ever claimed still has
its entry, and the ledger answers for it. An older partial is dropped
(``stream_dp_partials_expired_total``), never combined as "never released";
a window taken without partials (an empty window of public groups) is held
to the same rule by its end (``stream_dp_windows_expired_total``). Whatever
the partials topic's retention or the release group's committed offsets, a
replay therefore never releases a window a second time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener

from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.wire import WireFormatError
from stream_dp.worker.combine.combiner import COMBINE_FAILED, CombinedWindow
from stream_dp.worker.kafka.output_producer import OutputPublishFailed, OutputTopicUnavailable
from stream_dp.worker.partials.wire import PartialAggregate
from stream_dp.worker.query.runtime import QueryRuntime
from stream_dp.worker.release.continual import PreviousTrees, opens_period
from stream_dp.worker.release.draw import draw_ahead, draw_payload
from stream_dp.worker.release.entry import ReleaseEntry, StoredRecords, decode_entry
from stream_dp.worker.release.intake import PartialsIntake, too_old_to_release
from stream_dp.worker.release.partials_commits import PartialsCommits
from stream_dp.worker.release.partition_check import BrokerPartitions
from stream_dp.worker.release.publication_start import PublicationStarts
from stream_dp.worker.release.publish import publish_release
from stream_dp.worker.release.waits import PartitionWaits, home_position
from stream_dp.worker.store.ledger import LedgerUnavailable, ReleaseLedger

log = logging.getLogger(__name__)

__all__ = ["ReleaseStage", "too_old_to_release"]
DEFAULT_OUTPUT_BATCH_BYTES = 1_000_000 - 16_384  # the broker's default record limit, less room for framing


@dataclass
class _Unpublished:
    """A window taken from the combiner whose records are not yet published."""

    query: QueryRuntime
    window_start_ms: int
    window_end_ms: int
    window: CombinedWindow | None = None  # None: republishing a stored release
    payload: bytes | None = None  # the release as the ledger stores it (``release.entry``)
    release: ReleaseEntry | StoredRecords | None = None  # ``payload`` read back, when this worker drew it
    sources: list[tuple[int, int]] = field(default_factory=list)
    attempts: int = 0
    next_attempt_s: float = -math.inf  # due at once, whatever the monotonic clock's zero
    opens_period: bool = False  # a continual window drawn as its query's first release of the period
    claimed: bool = False  # this worker's claim wrote the ledger entry (in this or an earlier attempt)
    ahead: tuple | None = None  # the next window's noise to draw once this one is published (``release.draw``)


class ReleaseStage:
    def __init__(
        self,
        queries: list[QueryRuntime],
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer,
        ledger: ReleaseLedger,
        noise,
        metrics: WorkerMetrics,
        *,
        partials_topic: str,
        release_age_limit_ms: int,
        output_batch_bytes: int = DEFAULT_OUTPUT_BATCH_BYTES,
        output_record_bytes: dict[str, int] | None = None,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        poll_timeout_ms: int = 200,
        commit_interval_s: float = 1.0,
        retry_backoff_s: float = 0.5,
        retry_backoff_max_s: float = 10.0,
        store_ready: Callable[[], bool] = lambda: True,
        publish_budget_s: float = 60.0,
        partition_check: BrokerPartitions | None = None,
        input_partition_counts: Callable[[str], int] = lambda topic: 0,
        broker_stamps: Callable[[QueryRuntime], bool] = lambda query: True,
    ) -> None:
        """``release.partition_check``: the broker's answers about input partitions that overdue windows wait for
        (None: such windows wait for the partitions' own reports); ``input_partition_counts(topic)``: the
        input topic's partition count in the metadata (0: unknown), which every window waits for;
        ``broker_stamps(query)``: whether the broker's record timestamps are the query's window clock
        (``release.waits``)."""
        self.queries = {q.name: q for q in queries}
        # False until the ledger's Redis is known to be the one released from so far (``guard.store``).
        self.store_ready = store_ready
        self.consumer = consumer
        self.producer = producer
        self.ledger = ledger
        self.noise = noise
        self.metrics = metrics
        self.partials_topic = partials_topic
        if release_age_limit_ms <= 0:
            raise ValueError(f"release_age_limit_ms must be positive, got {release_age_limit_ms}")
        self.release_age_limit_ms = release_age_limit_ms
        self.clock_ms = clock_ms
        self.poll_timeout_ms = poll_timeout_ms
        self.retry_backoff_s = retry_backoff_s
        self.retry_backoff_max_s = retry_backoff_max_s
        # A step publishes windows for this long at most, then polls again: after a restart with a backlog of
        # windows, publishing them all in one step would outlast the release consumer's max_poll_interval_ms
        # (``kafka.clients.release_poll_interval_ms``) and lose its partitions mid-backlog.
        self.publish_budget_s = publish_budget_s
        self._unpublished: list[_Unpublished] = []
        self.commits = PartialsCommits(consumer, partials_topic, interval_s=commit_interval_s)
        self._lock = asyncio.Lock()
        self.trees = PreviousTrees(ledger)
        self.starts = PublicationStarts(ledger, metrics, store_ready)
        # The output producer's batch size: it fits every output topic's record limit (see ``kafka.topic_setup``);
        # a topic sized for larger records (a top_k list) takes one of them alone in a batch of its own.
        self.output_batch_bytes = output_batch_bytes
        self.output_record_bytes = dict(output_record_bytes or {})
        self.waits = PartitionWaits(self.queries, metrics, partials_topic=partials_topic, check=partition_check,
                                    partition_counts=input_partition_counts, broker_stamps=broker_stamps)
        self.intake = PartialsIntake(
            metrics, topic=partials_topic, age_limit_ms=release_age_limit_ms,
            quiet_ms=lambda name: q.combiner.release_timeout_ms if (q := self.queries.get(name)) else None)

    def rebalance_listener(self) -> ConsumerRebalanceListener:
        stage = self

        class _Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked):
                await stage.on_revoked({tp.partition for tp in revoked})

            async def on_partitions_assigned(self, assigned):
                await stage.on_assigned({tp.partition for tp in assigned})

        return _Listener()

    async def on_assigned(self, homes: set[int]) -> None:
        """Load how far each query was released from these homes, so public windows continue from there."""
        log.info("release homes assigned %s", sorted(homes))
        async with self._lock:
            for query in self.queries.values():
                for home in homes:
                    await self.starts.read_mark(query, home)

    async def on_revoked(self, homes: set[int]) -> None:
        """Hand over: commit what is released, forget the rest (the new owner replays it)."""
        async with self._lock:
            await self._commit(force=True)
            for query in self.queries.values():
                query.combiner.revoke(homes)
            # Never published: the new owner replays their partials and publishes (the ledger's values if any).
            self._unpublished = [u for u in self._unpublished if u.query.combiner.home(u.window_start_ms) not in homes]
            self.intake.forget(homes)
            self.commits.forget(homes)
            self.waits.forget(homes)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.step()
        async with self._lock:
            await self._commit(force=True)

    async def step(self) -> None:
        batches = await self.consumer.getmany(timeout_ms=self.poll_timeout_ms)
        async with self._lock:
            await self._step(batches)

    async def _step(self, batches: dict) -> None:
        now_ms = self.clock_ms()
        owned = {tp.partition for tp in self.consumer.assignment()}
        await self.starts.learn(list(self.queries.values()))
        for tp, records in batches.items():
            for record in records:
                await self._take_record(tp.partition, record.offset, record.value, now_ms, record.timestamp)
            if records:
                self.commits.read_through(tp.partition, records[-1].offset)
        self.waits.follow_partition_counts()
        await self.waits.step(now_ms, owned, home_position(self.consumer, self.partials_topic))
        for query in self.queries.values():
            for start, partials in query.combiner.discard_unreleasable(owned):
                await self._unreleasable(query, start, start + query.combiner.window_size_ms, partials)
            expired: list[int] = []
            for start in query.combiner.ready(owned):
                started = time.perf_counter()
                window = query.combiner.take(start)
                self.metrics.release_stage_seconds.labels(query.name, "combine").observe(time.perf_counter() - started)
                if window.withheld == COMBINE_FAILED:  # logged by the combiner; released as if empty
                    self.metrics.internal_errors.labels(COMBINE_FAILED).inc()
                self.intake.window_taken(query.name, start)
                # Empty windows had no partial to check: their end alone decides (see the module docstring).
                if too_old_to_release(window.window_end_ms, None, now_ms, self.release_age_limit_ms):
                    expired.append(start)
                    continue
                self._unpublished.append(
                    _Unpublished(query, start, window.window_end_ms, window=window, sources=window.source_offsets)
                )
            if expired:
                self.metrics.windows_expired.labels(query.name).inc(len(expired))
                log.warning(
                    "not releasing %d windows of %s starting %d..%d: they ended more than %d s ago (the release "
                    "ledger TTL less a margin for clock skew), so whether they were released can no longer be known",
                    len(expired), query.name, expired[0], expired[-1], self.release_age_limit_ms // 1000,
                )
        self.intake.drop_stale()
        await self._publish_pending()
        await self._commit()

    async def _unreleasable(self, query: QueryRuntime, start: int, end: int, partials: int) -> None:
        """Partials of a public-groups window its home never releases (``WindowCombiner.unreleasable``)."""
        stored = await self.starts.unreleasable(query, start, end, partials)
        if stored is not None:  # stored by an earlier run and never published: published now, as stored
            self._unpublished.append(_Unpublished(query, start, end, payload=stored.payload))

    async def _take_record(
        self, partition: int, offset: int, value: bytes, now_ms: int, timestamp_ms: int | None = None
    ) -> None:
        taken = self.intake.take(partition, offset, value, timestamp_ms, now_ms)
        if taken is None:
            return
        message, source = taken.message, taken.source
        query = self.queries[message.query]
        if not isinstance(message, PartialAggregate):
            query.combiner.add_progress(message, partition)
            return
        if query.combiner.add_partial(message, now_ms, source):
            return
        if query.combiner.unreleasable(message.window_start_ms):
            await self._unreleasable(query, message.window_start_ms, message.window_end_ms, 1)
            return
        # A window at or before what this home released: ask the ledger what became of it.
        try:
            stored = await asyncio.to_thread(self.ledger.get, query.name, message.window_start_ms)
        except LedgerUnavailable:
            # Take it as pending: releasing it needs the ledger's claim, which
            # returns the stored records if the window was in fact released.
            self.metrics.internal_errors.labels("ledger_unavailable").inc()
            stored = None
        if stored is None:
            # Never released (selected groups: a later window of this home went first): combine it normally.
            query.combiner.add_partial(message, now_ms, source, unreleased=True)
        elif not stored.published:
            self._unpublished.append(
                _Unpublished(query, message.window_start_ms, message.window_end_ms, payload=stored.payload)
            )
        else:
            self.metrics.late_partials.labels(query.name).inc()

    async def _publish_pending(self) -> None:
        if not self.store_ready():
            return
        now_s = time.monotonic()
        remaining: list[_Unpublished] = []
        # After a held window, the later ones of its home wait too, so a home's released mark never passes a
        # window it has not published: one behind the mark is then published or never released, data or not.
        # A continual query's window continues the tree of the one before: the later ones of the query wait.
        held: set[tuple[str, int | None]] = set()

        def hold(item: _Unpublished) -> None:
            remaining.append(item)
            continual = item.query.plan.continual is not None
            held.add((item.query.name, None if continual else item.query.combiner.home(item.window_start_ms)))

        deadline_s = now_s + self.publish_budget_s
        attempted = False
        for item in sorted(self._unpublished, key=lambda u: u.window_start_ms):
            out_of_time = attempted and time.monotonic() > deadline_s  # the rest waits for the next step, in order
            home = item.query.combiner.home(item.window_start_ms)
            if (out_of_time or item.next_attempt_s > now_s or (item.query.name, None) in held
                    or (item.query.name, home) in held):
                hold(item)
                continue
            attempted = True
            try:
                await self._publish(item)
            except (LedgerUnavailable, OutputTopicUnavailable, OutputPublishFailed) as exc:
                item.attempts += 1  # the next attempt publishes what the ledger holds, if the claim went through
                item.next_attempt_s = now_s + min(self.retry_backoff_max_s, self.retry_backoff_s * 2 ** (item.attempts - 1))
                self.metrics.internal_errors.labels(
                    "ledger_unavailable" if isinstance(exc, LedgerUnavailable) else "output_unavailable").inc()
                log.warning("release of %s/%d held: %s", item.query.name, item.window_start_ms, exc)
                hold(item)
        self._unpublished = remaining

    async def _publish(self, item: _Unpublished) -> None:
        query = item.query
        timing = self.metrics.release_stage_seconds
        if item.payload is None and not await self._draw(item):
            return  # dropped, so its partials are committed past
        window = item.window
        started = time.perf_counter()
        stored = await asyncio.to_thread(self.ledger.claim, query.name, item.window_start_ms, item.payload)
        timing.labels(query.name, "ledger").observe(time.perf_counter() - started)
        if stored.published:
            return  # another worker or an earlier run published this window
        item.claimed = item.claimed or stored.newly_written
        if not item.claimed:
            self.metrics.republished.labels(query.name).inc()
        started = time.perf_counter()
        try:
            # what this worker drew and read back, if that is what the ledger took; else what it holds
            release = item.release if item.claimed and item.release is not None else decode_entry(stored.payload)
        except WireFormatError as exc:
            # Nothing else could publish it either: count it and never retry (a retry loop would stall the stage).
            self.metrics.internal_errors.labels("unreadable_ledger_entry").inc()
            log.error("the stored release of %s/%d cannot be read (%s); it is not published", query.name,
                      item.window_start_ms, exc)
            return
        if query.plan.continual is not None:
            # What the ledger holds, which an earlier run may have drawn: the next window continues from it.
            self.trees.published(query.name, item.window_start_ms, release.state)
        topic = query.config.output_topic

        def too_large(size: int) -> None:
            self.metrics.internal_errors.labels("release_record_too_large").inc()
            log.error("a release record of %d bytes of %s/%d is larger than output topic %s takes; it is left out: "
                      "raise the topic's max.message.bytes", size, query.name, item.window_start_ms, topic)

        published, rendering_s = await publish_release(
            self.producer, topic, release, max_batch_bytes=self.output_batch_bytes, on_too_large=too_large,
            max_record_bytes=self.output_record_bytes.get(topic, self.output_batch_bytes))
        timing.labels(query.name, "render").observe(rendering_s)
        timing.labels(query.name, "publish").observe(time.perf_counter() - started - rendering_s)
        item.ahead = draw_ahead(item.ahead)  # once published: drawn beside the publish, it slowed it
        started = time.perf_counter()
        await asyncio.to_thread(self.ledger.mark_published, query.name, item.window_start_ms)
        home = query.combiner.home(item.window_start_ms)
        await asyncio.to_thread(self.ledger.raise_released_through, query.name, home, item.window_end_ms)
        timing.labels(query.name, "ledger").observe(time.perf_counter() - started)
        if item.claimed and window is not None:
            self._count_release(item, window, published)

    async def _draw(self, item: _Unpublished) -> bool:
        """Draw the window's release into ``item`` (every noise draw, once); False when there is none to publish."""
        query, window = item.query, item.window
        assert window is not None
        previous = None
        if query.plan.continual is not None:
            previous = await self.trees.before(query, item.window_start_ms)
            # Asked before this window's own publish raises the ledger's released-through past it.
            item.opens_period = previous is None and await asyncio.to_thread(
                opens_period, self.ledger, query, item.window_start_ms)  # LedgerUnavailable: held
        drawn = await draw_payload(query, window, self.noise, self.metrics, self.clock_ms(), previous)
        if drawn is None:  # not even as if empty (``release.draw``), unless an earlier run stored its release
            earlier = await asyncio.to_thread(self.ledger.get, query.name, item.window_start_ms)
            if earlier is None:
                return False
            item.payload = earlier.payload
        else:
            # the window as drawn: without its data if the build fell back (``withheld`` says why)
            item.window, item.payload, item.release, item.ahead = drawn.window, drawn.payload, drawn.release, drawn.ahead
        return True

    def _count_release(self, item: _Unpublished, window: CombinedWindow, published: int) -> None:
        """A window this worker released first: its metrics, and the privacy loss it spent."""
        query = item.query
        self.metrics.windows_released.labels(query.name).inc()
        self.metrics.groups_released.labels(query.name).inc(published)
        if query.plan.continual is None or item.opens_period:
            self.metrics.epsilon_spent.labels(query.name, query.namespace).inc(query.privacy["epsilon"])
        if window.partitions_missing:
            self.metrics.partitions_missing.labels(query.name).inc(len(window.partitions_missing))
        if window.withheld:
            self.metrics.windows_withheld.labels(query.name, window.withheld).inc()
            log.warning("window %s of %s released without data: %s", window.window_start_ms, query.name, window.withheld)
        if window.closed_at_ms is not None:
            self.metrics.release_latency.labels(query.name).observe(max(0.0, (self.clock_ms() - window.closed_at_ms) / 1000))

    def _holds(self) -> dict[int, int]:
        """Lowest partials-topic offset per partition that an unreleased window still needs."""
        holds: dict[int, int] = {}
        sources = [s for q in self.queries.values() for s in q.combiner.pending_source_offsets()]
        sources += [s for item in self._unpublished for s in item.sources]
        sources += self.intake.holds()  # the first chunk of every partial still incomplete
        for partition, offset in sources:
            holds[partition] = min(offset, holds.get(partition, offset))
        return holds

    async def _commit(self, *, force: bool = False) -> None:
        await self.commits.commit(self._holds, force=force)
