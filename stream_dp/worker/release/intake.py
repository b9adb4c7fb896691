"""The release stage's intake: partials-topic records in, whole messages out.

A record is a progress marker, a partial of wire version 1 (one JSON
record), or a chunk of a partial of wire version 2. Chunks are reassembled
(``stream_dp.wire.ChunkAssembler``): a partial is handed on once, when
whole, with the position of its first chunk (the release consumer may not
commit past it while the window is pending) and its oldest record timestamp
(the age rule below uses it). Until then its chunks hold the commit too.

Records that cannot be used are counted and skipped, never fatal: corrupt
ones, those of a wire version this worker does not read, those of queries it
does not run, and partials past the release age (see ``too_old_to_release``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.wire import Chunk, ChunkAssembler, Dropped, UnknownWireVersion, WireFormatError
from stream_dp.worker.partials.wire import PartialAggregate, Progress, chunk_stream_key, decode_partial_payload, read_internal

log = logging.getLogger(__name__)

_LOGGED_MAX = 10_000  # windows (and unknown versions) remembered so that each is logged once
Source = tuple[int, int]


def too_old_to_release(window_end_ms: int, record_timestamp_ms: int | None, now_ms: int, age_limit_ms: int) -> bool:
    """Whether a window (or one of its partials) is past the age at which its ledger entry may have expired.

    ``record_timestamp_ms`` is the partial's Kafka record timestamp (for a
    chunked partial, its oldest chunk's); None or negative (no timestamp)
    leaves the window's end alone to decide. Both are at or before the
    window's release: see ``stream_dp.worker.release.stage``.
    """
    oldest = window_end_ms
    if record_timestamp_ms is not None and record_timestamp_ms >= 0:
        oldest = min(oldest, record_timestamp_ms)
    return now_ms - oldest >= age_limit_ms


class PartialsReader:
    """Whole messages from partials-topic records read in order, for tools and tests: a progress marker
    or a partial (on its last chunk), else None. Raises ``WireFormatError`` on a record it cannot use."""

    def __init__(self) -> None:
        self._assembler = ChunkAssembler(chunk_stream_key)

    def read(self, partition: int, offset: int, value: bytes) -> PartialAggregate | Progress | None:
        message = read_internal(value)
        if not isinstance(message, Chunk):
            return message
        whole = self._assembler.add(message, (partition, offset), None)
        return None if whole is None else decode_partial_payload(whole.payload)


@dataclass(frozen=True)
class Taken:
    """A message ready for the combiner: a progress marker, or a whole partial with its first record."""

    message: PartialAggregate | Progress
    source: Source
    timestamp_ms: int | None


class PartialsIntake:
    def __init__(
        self,
        metrics: WorkerMetrics,
        *,
        topic: str,
        age_limit_ms: int,
        quiet_ms: Callable[[str], int | None],
    ) -> None:
        """``quiet_ms(query)``: how long (record time) an incomplete partial of ``query`` may wait for its
        next chunk before it is given up; None for a query this worker does not run."""
        self.metrics = metrics
        self.topic = topic
        self.age_limit_ms = age_limit_ms
        self.quiet_ms = quiet_ms
        self.assembler = ChunkAssembler(chunk_stream_key)
        self._read_through: dict[int, int] = {}  # newest record timestamp read per partials partition
        self._expired: set[tuple[str, int]] = set()
        self._expired_digests: set[str] = set()
        self._versions_logged: set[object] = set()

    def take(self, partition: int, offset: int, value: bytes, timestamp_ms: int | None, now_ms: int) -> Taken | None:
        if timestamp_ms is not None and timestamp_ms > self._read_through.get(partition, -1):
            self._read_through[partition] = timestamp_ms
        source = (partition, offset)
        try:
            message = read_internal(value)
            if isinstance(message, Chunk):
                return self._take_chunk(message, source, timestamp_ms, now_ms)
        except UnknownWireVersion as exc:
            self.metrics.internal_errors.labels("unknown_wire_version").inc()
            if exc.version not in self._versions_logged and len(self._versions_logged) < _LOGGED_MAX:
                self._versions_logged.add(exc.version)
                log.error("skipping %s[%d]@%d: %s", self.topic, partition, offset, exc)
            return None
        except WireFormatError as exc:
            self.metrics.internal_errors.labels("corrupt_internal_record").inc()
            log.error("skipping corrupt record at %s[%d]@%d: %s", self.topic, partition, offset, exc)
            return None
        if self.quiet_ms(message.query) is None:
            self.metrics.internal_errors.labels("unknown_query").inc()
            return None
        if isinstance(message, PartialAggregate) and self._expired_partial(
                message.query, message.window_start_ms, message.window_end_ms, source, timestamp_ms, now_ms):
            return None
        return Taken(message, source, timestamp_ms)

    def _take_chunk(self, chunk: Chunk, source: Source, timestamp_ms: int | None, now_ms: int) -> Taken | None:
        query, start, _partition = self.assembler.key(chunk)
        if self.quiet_ms(query) is None:
            if chunk.index == 0:
                self.metrics.internal_errors.labels("unknown_query").inc()
            return None
        end = int(chunk.stream.get("window_end_ms", start))
        if chunk.digest in self._expired_digests:
            return None
        if too_old_to_release(end, timestamp_ms, now_ms, self.age_limit_ms):
            # The partial's oldest record decides: one chunk too old makes all of it too old.
            key = self.assembler.key(chunk)
            self.assembler.drop(lambda k: k == key)
            self._remember_digest(chunk.digest)
            self._expired_partial(query, start, end, source, timestamp_ms, now_ms)
            return None
        assembled = self.assembler.add(chunk, source, timestamp_ms)
        if assembled is None:
            return None
        started = time.perf_counter()
        partial = decode_partial_payload(assembled.payload)
        self.metrics.release_stage_seconds.labels(query, "decode").observe(time.perf_counter() - started)
        return Taken(partial, assembled.sources[0], assembled.oldest_timestamp_ms)

    def _remember_digest(self, digest: str) -> None:
        if len(self._expired_digests) >= _LOGGED_MAX:
            self._expired_digests.clear()
        self._expired_digests.add(digest)

    def _expired_partial(
        self, query: str, start: int, end: int, source: Source, timestamp_ms: int | None, now_ms: int
    ) -> bool:
        if not too_old_to_release(end, timestamp_ms, now_ms, self.age_limit_ms):
            return False
        self.metrics.partials_expired.labels(query).inc()
        window = (query, start)
        if window in self._expired:
            return True  # one line per window, not per input partition's partial
        if len(self._expired) >= _LOGGED_MAX:
            self._expired.clear()
        self._expired.add(window)
        log.warning(
            "dropping the partials of window %d of %s (first at %s[%d]@%d, window end %d, record time %s, now %d): "
            "older than %d s (STREAM_DP_LEDGER_TTL_S less a margin for clock skew), so its release-ledger entry may "
            "have expired and whether it was released can no longer be known; it is not released",
            start, query, self.topic, source[0], source[1], end, timestamp_ms, now_ms, self.age_limit_ms // 1000,
        )
        return True

    # -- housekeeping ----------------------------------------------------------------------

    def holds(self) -> list[Source]:
        """First records of partials still incomplete: the consumer commits no further."""
        return self.assembler.holds()

    def window_taken(self, query: str, window_start_ms: int) -> None:
        """A window was released (or given up): chunks of it still incomplete will never count."""
        self._report(self.assembler.drop(lambda key: key[:2] == (query, window_start_ms)), "its window was released")

    def drop_stale(self) -> None:
        def quiet(key: Hashable) -> int:
            return self.quiet_ms(key[0]) or 0  # type: ignore[index]

        self._report(self.assembler.drop_stale(self._read_through.get, quiet),
                     "no chunk came for longer than the release timeout (its writer stopped mid-way)")

    def forget(self, partitions: set[int]) -> None:
        self.assembler.forget_partitions(partitions)
        for partition in partitions:
            self._read_through.pop(partition, None)

    def _report(self, dropped: list[Dropped], why: str) -> None:
        for gone in dropped:
            self.metrics.internal_errors.labels("partial_chunks_dropped").inc()
            log.warning("giving up partial %s of %s: %d of its %d chunks came, and %s",
                        gone.key[1:], gone.key[0], gone.received, gone.count, why)  # type: ignore[index]
