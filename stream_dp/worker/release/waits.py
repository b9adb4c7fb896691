"""Windows past their release timeout: which input partitions they wait for, and why.

A window is released once every input partition is accounted for (``combine.combiner``); time alone
never releases it. Past ``release_timeout`` (wall clock, from its first partial) a window is
overdue, and this stage asks the broker about each partition it still waits for
(``release.partition_check``, judged by ``release.partition_lag``):

* a partition whose records show nothing more for the window is left out of it -- once the
  release consumer has read the window's home partition of the partials topic up to where it
  ended after that answer, so that no partial the ingest stage sent before committing is
  still unread;
* a partition that may still hold events of the window (its worker is behind, down, paused
  or held by the budget store) is waited for: ``stream_dp_release_waiting_windows`` and
  ``stream_dp_release_wait_seconds`` say so (alert ``StreamDpReleaseWaitingForPartition``), and
  a warning names the partitions and how many records each has left to read before the
  window's close time, repeated every ``log_interval_s``.

Every decision here reads configuration, the broker's offsets and timestamps and the wall
clock: never the data.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.windows.watermarks import window_close_ms
from stream_dp.worker.combine.combiner import Overdue
from stream_dp.worker.query.runtime import QueryRuntime
from stream_dp.worker.release.partition_check import BrokerPartitions, PartitionCheckFailed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _LeftOut:
    """Partitions the broker showed to hold nothing more for a window, applied once the home is read far enough."""

    query: str
    window_start_ms: int
    partitions: frozenset[int]
    home: int
    home_end: int


def home_position(consumer: AIOKafkaConsumer, partials_topic: str) -> Callable[[int], Awaitable[int | None]]:
    """The next offset ``consumer`` returns from a partials partition (None: not assigned or not known)."""

    async def position(home: int) -> int | None:
        tp = TopicPartition(partials_topic, home)
        if tp not in consumer.assignment():
            return None
        try:
            return await consumer.position(tp)
        except Exception as exc:  # revoked meanwhile, or no position yet: the left-out partitions wait
            log.debug("no position on %s yet: %s", tp, exc)
            return None

    return position


class PartitionWaits:
    def __init__(
        self,
        queries: dict[str, QueryRuntime],
        metrics: WorkerMetrics,
        *,
        partials_topic: str,
        check: BrokerPartitions | None,
        partition_counts: Callable[[str], int] = lambda topic: 0,
        broker_stamps: Callable[[QueryRuntime], bool] = lambda query: True,
        check_interval_s: float = 2.0,
        log_interval_s: float = 60.0,
        max_checks_per_step: int = 8,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        """``check``: the broker's answers (None: overdue windows wait for their partitions' own reports);
        ``partition_counts(topic)``: the input topic's partition count in the metadata (0: unknown);
        ``broker_stamps(query)``: whether the broker's record timestamps are the query's window clock."""
        self.queries = queries
        self.metrics = metrics
        self.partials_topic = partials_topic
        self.check = check
        self.partition_counts = partition_counts
        self.broker_stamps = broker_stamps
        self.check_interval_s = check_interval_s
        self.log_interval_s = log_interval_s
        self.max_checks_per_step = max_checks_per_step
        self.clock_s = clock_s
        self._left_out: list[_LeftOut] = []
        self._next_check_s: dict[tuple[str, int], float] = {}
        self._next_log_s: dict[tuple[str, int], float] = {}

    def follow_partition_counts(self) -> None:
        """Windows wait for every partition the input topic's metadata lists (a grown topic's new ones too)."""
        for query in self.queries.values():
            count = self.partition_counts(query.config.input_topic)
            if count > 0:
                query.combiner.note_input_partitions(count)

    async def step(self, now_ms: int, owned: set[int], home_position: Callable[[int], Awaitable[int | None]]) -> None:
        """Apply the broker's answers the home partitions are read far enough for, report the windows that
        wait, and ask about the partitions of those due for a check."""
        await self._apply_left_out(home_position)
        overdue = {name: q.combiner.overdue(now_ms, owned) for name, q in self.queries.items()}
        for name, windows in overdue.items():
            self.metrics.release_waiting_windows.labels(name).set(len(windows))
            oldest = min((w.first_seen_ms for w in windows), default=None)
            self.metrics.release_wait_seconds.labels(name).set(0 if oldest is None else max(0, now_ms - oldest) / 1000)
        waiting = {(name, w.window_start_ms) for name, windows in overdue.items() for w in windows}
        for timers in (self._next_check_s, self._next_log_s):
            for key in [k for k in timers if k not in waiting]:
                del timers[key]
        checks = 0
        for name, windows in overdue.items():
            for window in windows:
                if checks >= self.max_checks_per_step:
                    return
                if await self._consider(self.queries[name], window, now_ms):
                    checks += 1

    def forget(self, homes: set[int]) -> None:
        """Revoked homes: their windows are the next owner's."""
        self._left_out = [v for v in self._left_out if v.home not in homes]

    async def _apply_left_out(self, home_position: Callable[[int], Awaitable[int | None]]) -> None:
        remaining = []
        for verdict in self._left_out:
            position = await home_position(verdict.home)
            if position is None or position < verdict.home_end:
                remaining.append(verdict)
                continue
            query = self.queries[verdict.query]
            query.combiner.leave_out(verdict.window_start_ms, set(verdict.partitions))
            log.info("window %d of %s: input partition(s) %s of %s hold nothing more for it (their committed offsets "
                     "reached the window's close offset); it is released without them", verdict.window_start_ms,
                     verdict.query, sorted(verdict.partitions), query.config.input_topic)
        self._left_out = remaining

    async def _consider(self, query: QueryRuntime, window: Overdue, now_ms: int) -> bool:
        """Ask the broker about one overdue window if due; whether it was asked."""
        key = (query.name, window.window_start_ms)
        now_s = self.clock_s()
        close_ms = window_close_ms(window.window_end_ms, query.config.window.allowed_lateness_ms)
        topic = query.config.input_topic
        if self.check is None or now_ms < close_ms or now_s < self._next_check_s.get(key, 0.0):
            if self.check is None:
                self._log_waiting(key, query, window, f"partition(s) {window.partitions} have not reported it closed")
            return False
        self._next_check_s[key] = now_s + self.check_interval_s
        partitions = [TopicPartition(topic, p) for p in window.partitions]
        try:
            evidence = await self.check.evidence(partitions, close_ms, broker_stamps=self.broker_stamps(query))
            nothing = frozenset(tp.partition for tp, e in evidence.items() if e.nothing_more)
            if nothing:
                home = TopicPartition(self.partials_topic, window.home)
                home_end = (await self.check.end_offsets([home]))[home]
                self._left_out.append(_LeftOut(query.name, window.window_start_ms, nothing, window.home, home_end))
        except PartitionCheckFailed as exc:
            self.metrics.internal_errors.labels("partition_check_failed").inc()
            log.warning("window %d of %s waits for input partition(s) %s of %s; asking the broker about them failed "
                        "(%s): asked again in %.0f s", window.window_start_ms, query.name, window.partitions, topic,
                        exc, self.check_interval_s)
            return True
        behind = {tp.partition: e for tp, e in evidence.items() if not e.nothing_more}
        if behind:
            self._log_waiting(key, query, window, "; ".join(f"partition {p}: {e.describe()}"
                                                            for p, e in sorted(behind.items())))
        return True

    def _log_waiting(self, key: tuple[str, int], query: QueryRuntime, window: Overdue, why: str) -> None:
        now_s = self.clock_s()
        if now_s < self._next_log_s.get(key, 0.0):
            return
        self._next_log_s[key] = now_s + self.log_interval_s
        log.warning("window %d of %s waits for input partition(s) %s of %s, past its release_timeout of %d s: %s. A "
                    "window is never released without a partition that may still hold its events; check those "
                    "partitions' consumer lag, their workers' logs and the dead-letter topic (a flood of rejected "
                    "messages)", window.window_start_ms, query.name, window.partitions, query.config.input_topic,
                    query.combiner.release_timeout_ms // 1000, why)
