"""Where the ingest consumer stands on each input partition, and what it has made durable.

Two questions the window clock and the release stage depend on:

* **Has a partition anything left to deliver?** Only a partition known to be
  read up to its end may count as idle (and have its windows closed by the
  wall clock). One with records waiting -- a backlog, a slow fetch, a busy
  worker -- or whose end is not known is slow, not idle: closing its
  windows by the wall clock would make its waiting events late. The end is
  known from a fetch response of the last ``fresh_fetch_ms``: while the
  broker does not answer (an outage, a leader moving), nothing is idle, so
  the events producers buffer meanwhile are on time when they arrive. For a
  partition nothing was read from yet, "read up to" is where reading starts:
  the group's committed offset, else the log start (``auto_offset_reset``
  earliest), looked up once per assignment.
* **Which closure is durable?** A progress marker tells the release stage
  that an input partition has closed every window through some time, so a
  window may be released without waiting for that partition's partial. That
  is only sound if every later owner of the partition also treats those
  windows as closed, i.e. once the closure is in the committed offset
  metadata. Otherwise a worker that closed windows by the wall clock during
  a short assignment and then lost the partition would have vouched for
  windows the next owner goes on to fill, and their partials would arrive
  after the release.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

log = logging.getLogger(__name__)


class PartitionPositions:
    """Read positions, start offsets and durable closure of the assigned input partitions."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        *,
        fresh_fetch_ms: int = 3_000,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        if fresh_fetch_ms <= 0:
            raise ValueError(f"fresh_fetch_ms must be positive, got {fresh_fetch_ms}; 3000 suits most brokers (fetches answer within 0.5 s)")
        self.consumer = consumer
        self.fresh_fetch_ms = fresh_fetch_ms
        self.clock_ms = clock_ms
        self._consumed: dict[TopicPartition, int] = {}  # offset after the last record read
        self._start: dict[TopicPartition, int] = {}  # where reading began, for partitions not read from yet
        self._durable: dict[tuple[str, TopicPartition], int] = {}  # (query, partition) -> committed closed_through
        self._watched_at: int | None = None  # when not_idle last looked

    # -- reading ------------------------------------------------------------------------

    def note_batches(self, batches: dict) -> None:
        for tp, records in batches.items():
            if records:
                self._consumed[tp] = records[-1].offset + 1

    def position(self, tp: TopicPartition) -> int | None:
        """The offset after the last record read, or where reading starts (None while unknown)."""
        consumed = self._consumed.get(tp)
        return consumed if consumed is not None else self._start.get(tp)

    def start_offset(self, tp: TopicPartition) -> int | None:
        """Where reading starts on a partition nothing was read from yet (None once read from, or unknown)."""
        return None if tp in self._consumed else self._start.get(tp)

    async def learn_starts(self) -> None:
        """Look up where reading starts on assigned partitions nothing was read from (once per assignment)."""
        unknown = [tp for tp in self.consumer.assignment() if tp not in self._consumed and tp not in self._start]
        if not unknown:
            return
        try:
            beginning = await self.consumer.beginning_offsets(unknown)
            for tp in unknown:
                committed = await self.consumer.committed(tp)
                # A committed offset below the log start was deleted by retention: reading resets to the start.
                self._start[tp] = beginning[tp] if committed is None else max(committed, beginning[tp])
        except Exception as exc:  # the broker is slow or away: ask again next step; meanwhile nothing is idle
            log.warning("cannot look up start offsets of %s yet (%s)", sorted(map(str, unknown)), exc)

    def not_idle(self) -> dict[str, set[int]]:
        """Per topic, the assigned partitions not known to be read up to their end.

        After a gap of more than ``fresh_fetch_ms`` since the last call (the worker's loop was
        stalled, e.g. on a broker outage), every partition: nobody watched them meanwhile, so
        their silence is unknown, and records producers buffered may be about to arrive.
        """
        out: dict[str, set[int]] = {}
        now = self.clock_ms()
        unwatched = self._watched_at is not None and now - self._watched_at > self.fresh_fetch_ms
        self._watched_at = now
        for tp in self.consumer.assignment():
            if unwatched:
                out.setdefault(tp.topic, set()).add(tp.partition)
                continue
            highwater = self.consumer.highwater(tp)
            position = self.position(tp)
            fetched_at = self.consumer.last_poll_timestamp(tp)  # the last fetch response for tp (aiokafka, ms)
            stale = fetched_at is None or now - fetched_at > self.fresh_fetch_ms
            if highwater is None or position is None or highwater > position or stale:
                out.setdefault(tp.topic, set()).add(tp.partition)
        return out

    def lag(self, tp: TopicPartition) -> int | None:
        highwater, position = self.consumer.highwater(tp), self.position(tp)
        if highwater is None or position is None:
            return None
        return max(0, highwater - position)

    # -- durable closure ----------------------------------------------------------------

    def restored(self, query: str, tp: TopicPartition, closed_through_ms: int) -> None:
        """A closure read back from the committed metadata is durable."""
        self._raise(query, tp, closed_through_ms)

    def committed(self, closures: Iterable[tuple[str, TopicPartition, int]]) -> None:
        """Closures whose offsets and metadata the broker accepted."""
        for query, tp, through in closures:
            self._raise(query, tp, through)

    def durable_through(self, query: str, tp: TopicPartition) -> int | None:
        return self._durable.get((query, tp))

    def _raise(self, query: str, tp: TopicPartition, through: int) -> None:
        key = (query, tp)
        if through > self._durable.get(key, -(2**62)):
            self._durable[key] = through

    def forget(self, revoked: Iterable[TopicPartition]) -> None:
        gone = set(revoked)
        for tp in gone:
            self._consumed.pop(tp, None)
            self._start.pop(tp, None)
        for key in [k for k in self._durable if k[1] in gone]:
            del self._durable[key]
