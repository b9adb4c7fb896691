"""The release ledger: a window's noisy values are stored before they are published.

``claim`` stores a (query, window) release unless some release
is already stored, and returns whatever is stored. So noise for a window is
drawn at most once in effect: a retried, replayed or concurrent release
publishes the stored values, never fresh draws. If the process dies after
drawing noise but before the ledger write, those draws were never seen by
anyone, and drawing again is harmless.

What is stored is opaque bytes (``release.entry`` encodes a window's noisy
values in them). Redis values are kept small: a payload larger than
``chunk_bytes`` is written as several hash fields, one write per chunk, staged
under a key of their own and moved into place by the claim, so a claim is
still all or nothing and a large window never becomes one huge command. The
charge journal (unit lists, see ``remember_units``) is stored the same way.

The ledger is kept in Redis beside the budget store (same durability). Window
entries expire after ``ttl_s`` (the worker's ``STREAM_DP_LEDGER_TTL_S``): keep
it longer than the input topics' retention, so a replay can never reach a
window whose entry has expired. Past that age the release stage refuses to
noise a window at all (see ``stream_dp.worker.release.stage``), since whether it was
released can no longer be known. The released-through mark of each (query,
partials partition) never expires: it is one small key per pair, and losing it
would turn every old partial into one "never released". Nor does a public-groups
query's publication start (``release.publication_start``): written once, by the first
worker to run the query, it fixes the query's first published window for good.
"""

from __future__ import annotations

import secrets
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import redis

from stream_dp.budget.redis_nodes import Call, NodeRunner, ReplicaWait
from stream_dp.worker.guard.store import MemoryStoreMarkers, RedisStoreMarkers, StoreMarkers

WRITTEN = b"written"
PUBLISHED = b"published"
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
_STAGING_TTL_S = 3_600  # staged chunks of a claim that never came (the writer died) go away on their own

# KEYS[1]: the entry (a hash); KEYS[2]: the staging hash with chunks 1..n-1.
# ARGV: first chunk, TTL, chunk count n, initial state ('' for none).
# Returns {first chunk or payload, state or false, chunk count, 1 if newly written}.
# Entries of earlier versions: a hash with 'payload' and 'state', or (charge journal) a string.
_PUT_ONCE = """
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'string' then
  return {redis.call('GET', KEYS[1]), false, 1, 0}
end
if kind == 'hash' then
  local found = redis.call('HMGET', KEYS[1], 'payload', 'state', 'chunks', 'c0')
  if found[1] then
    return {found[1], found[2], 1, 0}
  end
  return {found[4], found[2], tonumber(found[3] or '1'), 0}
end
local n = tonumber(ARGV[3])
if n > 1 then
  if redis.call('HLEN', KEYS[2]) ~= n - 1 then
    return redis.error_reply('staged chunks missing: ' .. KEYS[2])
  end
  redis.call('RENAME', KEYS[2], KEYS[1])
end
redis.call('HSET', KEYS[1], 'c0', ARGV[1], 'chunks', n)
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'state', ARGV[4])
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return {false, ARGV[4], n, 1}
"""

# KEYS[1]: a query's publication start; KEYS[2]: the first window it released, as earlier versions kept it.
# ARGV[1]: the query's allowed lateness (ms). Keeps, unless one is kept already, Redis's clock less ARGV[1]
# (or KEYS[2]'s window); returns the start kept. Written once, never expires.
_KEEP_START = """
local kept = redis.call('GET', KEYS[1])
if kept then
  return tonumber(kept)
end
local start = tonumber(redis.call('GET', KEYS[2]) or '')
if not start then
  local t = redis.call('TIME')
  start = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(ARGV[1])
end
redis.call('SET', KEYS[1], string.format('%d', start))
return start
"""

# SET without EX drops any TTL; PERSIST drops the TTL that marks written by
# earlier versions (which expired with the ledger entries) still carry.
_RAISE_MARK = """
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
if tonumber(ARGV[1]) > current then
  redis.call('SET', KEYS[1], ARGV[1])
  return tonumber(ARGV[1])
end
redis.call('PERSIST', KEYS[1])
return current
"""


class LedgerUnavailable(RuntimeError):
    """The ledger could not be read or written; the caller must not publish."""


def _unavailable(what: str, exc: redis.RedisError, then: str = "") -> LedgerUnavailable:
    """The error for a failed ledger call; a full Redis (maxmemory under noeviction) says how to fix it."""
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return LedgerUnavailable(
            f"{what} failed: Redis is out of memory ({exc}){then}. Raise its maxmemory (keep maxmemory-policy "
            "noeviction) or add memory; the release ledger keeps each window for STREAM_DP_LEDGER_TTL_S (see "
            "docs/operations/sizing.md), and held windows are released once Redis accepts writes"
        )
    return LedgerUnavailable(f"{what} failed ({type(exc).__name__}: {exc}){then}")


@dataclass(frozen=True)
class StoredRelease:
    payload: bytes  # as given to ``claim`` (or an earlier version's stored records)
    published: bool
    newly_written: bool


class ReleaseLedger(Protocol):
    def claim(self, query: str, window_start_ms: int, payload: bytes) -> StoredRelease: ...
    def mark_published(self, query: str, window_start_ms: int) -> None: ...
    def get(self, query: str, window_start_ms: int) -> StoredRelease | None: ...
    def released_through(self, query: str, home: int) -> int | None: ...
    def raise_released_through(self, query: str, home: int, window_end_ms: int) -> None: ...
    def remember_units(self, charge_id: str, units: list[str]) -> list[str]: ...
    def publication_start(self, query: str, lateness_ms: int) -> int: ...
    def store_markers(self) -> StoreMarkers: ...


def split_chunks(payload: bytes, chunk_bytes: int) -> list[bytes]:
    """``payload`` in pieces of at most ``chunk_bytes`` (one piece for an empty payload)."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    return [payload[i:i + chunk_bytes] for i in range(0, len(payload), chunk_bytes)] or [b""]


LEDGER_PREFIX = "stream-dp:ledger"
"""The release ledger's keys (entries, charge journals, store markers) start with it and a colon."""


class RedisReleaseLedger:
    """The ledger on one Redis or a Redis Cluster: each key carries its query's (or charge's) hash tag.

    ``wait``: replicas that must hold a stored release before it is published,
    and a charge's unit list before it is charged (``WAIT``, see
    :mod:`stream_dp.budget.redis_nodes`); without it a failover could forget a
    published window and a replay would noise it again. A query's publication
    start waits too: a later one written after a failover would leave out the
    windows between the two on homes that had released none. The published
    mark and the released-through marks do not wait: losing one can make a
    replay publish a window's stored records again (the same values), never
    draw new noise for it.
    """

    def __init__(
        self, client: redis.Redis, *, prefix: str = LEDGER_PREFIX, ttl_s: int = 7 * 86_400, journal_ttl_s: int = 7_200,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        wait: ReplicaWait | None = None,
    ) -> None:
        if ttl_s < 3_600:
            raise ValueError(f"ledger ttl_s={ttl_s} is under an hour; keep entries longer than the input topics' retention")
        self._redis = client
        self._wait = wait
        self._prefix = prefix
        self._ttl_s = ttl_s
        # Unit lists are only needed while a replay can still rebuild the window, which is
        # soon after it was charged (a crash before the commit). Counted from the charge,
        # not from the window's time, so a backlog charged late keeps them as long. A replay
        # later than this that rebuilds a window differently fails closed (ChargeConflict).
        self._journal_ttl_s = journal_ttl_s
        self._chunk_bytes = chunk_bytes
        self._put_once = client.register_script(_PUT_ONCE)
        self._raise = client.register_script(_RAISE_MARK)
        self._keep_start = client.register_script(_KEEP_START)

    def _key(self, query: str, window_start_ms: int) -> str:
        return f"{self._prefix}:{{{query}}}:{window_start_ms}"

    def store_markers(self) -> StoreMarkers:
        """The markers that tell this Redis from one that lost its data (``stream_dp.worker.guard.store``)."""
        return RedisStoreMarkers(self._redis, prefix=self._prefix, wait=self._wait)

    def _store_once(
        self, key: str, payload: bytes, ttl_s: int, state: bytes, sync_key: str
    ) -> tuple[bytes, bytes | None, bool]:
        """(stored payload, state, newly written): ``payload`` unless ``key`` already held one; with ``wait``,
        returns only once the replicas hold what is stored (``sync_key``: a key of the same slot for WAIT)."""
        chunks = split_chunks(payload, self._chunk_bytes)
        # The staging key shares the entry's hash tag, so both sit on one Redis Cluster slot; the claim's
        # WAIT covers the staged writes too (one ordered replication stream per master).
        staging = f"{key}:staging:{secrets.token_hex(8)}"
        for index, chunk in enumerate(chunks[1:], start=1):
            self._redis.hset(staging, f"c{index}", chunk)
            if index == 1:
                # at once, not after the last chunk: a write refused midway (a full Redis) must not leave
                # a staging key that never expires (EXPIRE is accepted even when Redis is out of memory)
                self._redis.expire(staging, _STAGING_TTL_S)
        keys, args = [key, staging], [chunks[0], ttl_s, len(chunks), state]
        if self._wait is None:
            first, stored_state, count, new = self._put_once(keys=keys, args=args)
        else:
            call = Call(self._put_once.sha, self._put_once.script, keys, args, sync_key)
            ((first, stored_state, count, new),) = NodeRunner(self._redis, [call], self._wait).run_pending()
        if new:
            return payload, state or None, True
        if len(chunks) > 1:
            self._redis.delete(staging)
        return self._rest(key, first, int(count)), stored_state or None, False

    def _rest(self, key: str, first: bytes | None, count: int) -> bytes:
        """A stored payload from its first chunk and the remaining ``count - 1`` chunk fields."""
        if count <= 1:
            return first or b""
        rest = self._redis.hmget(key, [f"c{i}" for i in range(1, count)])
        if first is None or any(chunk is None for chunk in rest):
            raise redis.RedisError(f"ledger entry {key} lost chunks (expired while being read?)")
        return first + b"".join(rest)

    def claim(self, query: str, window_start_ms: int, payload: bytes) -> StoredRelease:
        _check_payload(payload)
        try:
            stored, state, new = self._store_once(self._key(query, window_start_ms), payload, self._ttl_s, WRITTEN,
                                                  f"{self._prefix}:{{{query}}}:sync")
        except redis.RedisError as exc:
            raise _unavailable("release ledger write", exc, "; not publishing") from exc
        return StoredRelease(stored, state == PUBLISHED, new)

    def mark_published(self, query: str, window_start_ms: int) -> None:
        try:
            self._redis.hset(self._key(query, window_start_ms), "state", PUBLISHED)
        except redis.RedisError as exc:
            raise _unavailable("release ledger update", exc) from exc

    def get(self, query: str, window_start_ms: int) -> StoredRelease | None:
        key = self._key(query, window_start_ms)
        try:
            legacy, state, count, first = self._redis.hmget(key, "payload", "state", "chunks", "c0")
            if state is None:
                return None
            payload = legacy if legacy is not None else self._rest(key, first, int(count or 1))
        except redis.RedisError as exc:
            raise _unavailable("release ledger read", exc) from exc
        return StoredRelease(payload, state == PUBLISHED, False)

    def released_through(self, query: str, home: int) -> int | None:
        """End of the latest window released from partials partition ``home`` (windows are homed there).

        Durable (no TTL): a partial of a window at or before it is looked up in the
        ledger instead of being combined as new.
        """
        try:
            value = self._redis.get(f"{self._prefix}:{{{query}}}:released-through:{home}")
        except redis.RedisError as exc:
            raise _unavailable("release ledger read", exc) from exc
        return None if value is None else int(value)

    def remember_units(self, charge_id: str, units: list[str]) -> list[str]:
        """Store the units of a window charge unless some are stored; return the stored ones.

        A replay after a crash can rebuild a window from a different batch (an
        event that was late the first time may now land inside). The first
        unit list is the one that was charged, so the replay charges and
        releases by that list, never by a new one.
        """
        key = f"{self._prefix}:units:{{{charge_id}}}"
        try:
            sync = f"{self._prefix}:units:{{{charge_id}}}:sync"
            stored, _, new = self._store_once(key, _pack_units(units), self._journal_ttl_s, b"", sync)
        except redis.RedisError as exc:
            raise _unavailable("charge journal", exc, "; not charging") from exc
        return units if new else _unpack_units(stored)

    def publication_start(self, query: str, lateness_ms: int) -> int:
        """The instant a public-groups query's publication starts at: Redis's clock the first time any worker
        asks, less ``lateness_ms`` (kept for good), else the one kept. One clock for every worker, as the
        budget store's: a worker whose own clock is off cannot move it. A query that earlier versions released
        keeps the first window they released (their ``start`` key, which expired with the ledger's entries)."""
        prefix = f"{self._prefix}:{{{query}}}"
        keys, args = [f"{prefix}:publication-start", f"{prefix}:start"], [lateness_ms]
        try:
            if self._wait is None:
                return int(self._keep_start(keys=keys, args=args))
            call = Call(self._keep_start.sha, self._keep_start.script, keys, args, f"{prefix}:sync")
            (kept,) = NodeRunner(self._redis, [call], self._wait).run_pending()
            return int(kept)
        except redis.RedisError as exc:
            raise _unavailable("release ledger publication start", exc) from exc

    def raise_released_through(self, query: str, home: int, window_end_ms: int) -> None:
        try:
            self._raise(keys=[f"{self._prefix}:{{{query}}}:released-through:{home}"], args=[window_end_ms])
        except redis.RedisError as exc:
            raise _unavailable("release ledger update", exc) from exc


def _check_payload(payload: object) -> None:
    # A wrong type must not pass for a Redis outage (LedgerUnavailable is retried forever).
    if not isinstance(payload, (bytes, bytearray)):
        raise TypeError(f"a release is stored as bytes (release_entry.encode_entry), got {type(payload).__name__}")


def _pack_units(units: list[str]) -> bytes:
    # Unit ids never hold NUL (the decoder rejects them), so it separates them.
    return zlib.compress("\0".join(units).encode(), 1)


def _unpack_units(payload: bytes) -> list[str]:
    text = zlib.decompress(payload).decode()
    return text.split("\0") if text else []


class MemoryReleaseLedger:
    """In-process ledger for a single worker without Redis, and for tests."""

    def __init__(self, clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self._clock_ms = clock_ms  # the store's clock (``release.publication_start``)
        self._entries: dict[tuple[str, int], tuple[bytes, bool]] = {}
        self._through: dict[tuple[str, int], int] = {}
        self._units: dict[str, list[str]] = {}
        self._starts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._markers = MemoryStoreMarkers()

    def store_markers(self) -> StoreMarkers:
        return self._markers

    def claim(self, query: str, window_start_ms: int, payload: bytes) -> StoredRelease:
        _check_payload(payload)
        with self._lock:
            key = (query, window_start_ms)
            if key in self._entries:
                stored, published = self._entries[key]
                return StoredRelease(stored, published, False)
            self._entries[key] = (bytes(payload), False)
            return StoredRelease(bytes(payload), False, True)

    def mark_published(self, query: str, window_start_ms: int) -> None:
        with self._lock:
            payload, _ = self._entries[(query, window_start_ms)]
            self._entries[(query, window_start_ms)] = (payload, True)

    def get(self, query: str, window_start_ms: int) -> StoredRelease | None:
        with self._lock:
            entry = self._entries.get((query, window_start_ms))
        return None if entry is None else StoredRelease(entry[0], entry[1], False)

    def remember_units(self, charge_id: str, units: list[str]) -> list[str]:
        with self._lock:
            return list(self._units.setdefault(charge_id, list(units)))

    def publication_start(self, query: str, lateness_ms: int) -> int:
        with self._lock:
            return self._starts.setdefault(query, self._clock_ms() - lateness_ms)

    def released_through(self, query: str, home: int) -> int | None:
        return self._through.get((query, home))

    def raise_released_through(self, query: str, home: int, window_end_ms: int) -> None:
        with self._lock:
            self._through[(query, home)] = max(self._through.get((query, home), window_end_ms), window_end_ms)
