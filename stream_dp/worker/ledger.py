"""The release ledger: a window's noisy values are stored before they are published.

``claim`` stores the records of a (query, window) release unless some release
is already stored, and returns whatever is stored. So noise for a window is
drawn at most once in effect: a retried, replayed or concurrent release
publishes the stored values, never fresh draws. If the process dies after
drawing noise but before the ledger write, those draws were never seen by
anyone, and drawing again is harmless.

The ledger is kept in Redis beside the budget store (same durability). Window
entries expire after ``ttl_s`` (the worker's ``STREAM_DP_LEDGER_TTL_S``): keep
it longer than the input topics' retention, so a replay can never reach a
window whose entry has expired. Past that age the release stage refuses to
noise a window at all (see ``stream_dp.worker.release``), since whether it was
released can no longer be known. The released-through mark of each (query,
partials partition) never expires: it is one small key per pair, and losing it
would turn every old partial into one "never released".
"""

from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass
from typing import Protocol

import redis

from stream_dp.budget.redis_nodes import Call, NodeRunner, ReplicaWait, set_once

WRITTEN = b"written"
PUBLISHED = b"published"

_CLAIM = """
local existing = redis.call('HMGET', KEYS[1], 'payload', 'state')
if existing[1] then
  return {existing[1], existing[2], 0}
end
redis.call('HSET', KEYS[1], 'payload', ARGV[1], 'state', 'written')
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return {false, 'written', 1}
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


Record = tuple[bytes, bytes]  # (Kafka key, record JSON)


@dataclass(frozen=True)
class StoredRelease:
    records: list[Record]
    published: bool
    newly_written: bool


def _pack(records: list[Record]) -> bytes:
    # JSON text never holds a raw tab or newline (orjson escapes control
    # characters), so they can separate keys, values and records.
    return zlib.compress(b"\n".join(key + b"\t" + value for key, value in records), 1)


def _unpack(payload: bytes) -> list[Record]:
    data = zlib.decompress(payload)
    if not data:
        return []
    return [tuple(line.split(b"\t", 1)) for line in data.split(b"\n")]  # type: ignore[misc]


class ReleaseLedger(Protocol):
    def claim(self, query: str, window_start_ms: int, records: list[Record]) -> StoredRelease: ...
    def mark_published(self, query: str, window_start_ms: int) -> None: ...
    def get(self, query: str, window_start_ms: int) -> StoredRelease | None: ...
    def released_through(self, query: str, home: int) -> int | None: ...
    def raise_released_through(self, query: str, home: int, window_end_ms: int) -> None: ...
    def remember_units(self, charge_id: str, units: list[str]) -> list[str]: ...
    def mark_query_start(self, query: str, window_start_ms: int) -> None: ...
    def query_start(self, query: str) -> int | None: ...


class RedisReleaseLedger:
    """The ledger on one Redis or a Redis Cluster: each key carries its query's (or charge's) hash tag.

    ``wait``: replicas that must hold a stored release before it is published,
    and a charge's unit list before it is charged (``WAIT``, see
    :mod:`stream_dp.budget.redis_nodes`); without it a failover could forget a
    published window and a replay would noise it again. The published mark,
    the released-through marks and the query start do not wait: losing one
    can make a replay publish a window's stored records again (the same
    values), never draw new noise for it.
    """

    def __init__(
        self, client: redis.Redis, *, prefix: str = "stream-dp:ledger", ttl_s: int = 7 * 86_400, journal_ttl_s: int = 7_200,
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
        self._claim = client.register_script(_CLAIM)
        self._raise = client.register_script(_RAISE_MARK)

    def _key(self, query: str, window_start_ms: int) -> str:
        return f"{self._prefix}:{{{query}}}:{window_start_ms}"

    def claim(self, query: str, window_start_ms: int, records: list[Record]) -> StoredRelease:
        keys, args = [self._key(query, window_start_ms)], [_pack(records), self._ttl_s]
        try:
            if self._wait is None:
                payload, state, new = self._claim(keys=keys, args=args)
            else:
                sync = f"{self._prefix}:{{{query}}}:sync"
                call = Call(self._claim.sha, self._claim.script, keys, args, sync)
                ((payload, state, new),) = NodeRunner(self._redis, [call], self._wait).run_pending()
        except redis.RedisError as exc:
            raise LedgerUnavailable(f"release ledger write failed ({type(exc).__name__}); not publishing") from exc
        if new:
            return StoredRelease(records, False, True)  # what was just stored; not read back
        return StoredRelease(_unpack(payload), state == PUBLISHED, False)

    def mark_published(self, query: str, window_start_ms: int) -> None:
        try:
            self._redis.hset(self._key(query, window_start_ms), "state", PUBLISHED)
        except redis.RedisError as exc:
            raise LedgerUnavailable(f"release ledger update failed ({type(exc).__name__})") from exc

    def get(self, query: str, window_start_ms: int) -> StoredRelease | None:
        try:
            payload, state = self._redis.hmget(self._key(query, window_start_ms), "payload", "state")
        except redis.RedisError as exc:
            raise LedgerUnavailable(f"release ledger read failed ({type(exc).__name__})") from exc
        if payload is None:
            return None
        return StoredRelease(_unpack(payload), state == PUBLISHED, False)

    def released_through(self, query: str, home: int) -> int | None:
        """End of the latest window released from partials partition ``home`` (windows are homed there).

        Durable (no TTL): a partial of a window at or before it is looked up in the
        ledger instead of being combined as new.
        """
        try:
            value = self._redis.get(f"{self._prefix}:{{{query}}}:released-through:{home}")
        except redis.RedisError as exc:
            raise LedgerUnavailable(f"release ledger read failed ({type(exc).__name__})") from exc
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
            if self._wait is not None:
                # Durable before the charge it guards: a failover that forgot it would let a
                # replay charge a rebuilt unit list.
                sync = f"{self._prefix}:units:{{{charge_id}}}:sync"
                ttl_ms = self._journal_ttl_s * 1000
                stored = set_once(self._redis, key, _pack_units(units), ttl_ms, sync, self._wait)
                return units if stored is None else _unpack_units(stored)
            if self._redis.set(key, _pack_units(units), nx=True, ex=self._journal_ttl_s):
                return units
            stored = self._redis.get(key)
        except redis.RedisError as exc:
            raise LedgerUnavailable(f"charge journal unavailable ({type(exc).__name__}); not charging") from exc
        return units if stored is None else _unpack_units(stored)

    def mark_query_start(self, query: str, window_start_ms: int) -> None:
        """Remember the first window the query released (kept by the first writer)."""
        try:
            self._redis.set(f"{self._prefix}:{{{query}}}:start", window_start_ms, nx=True, ex=self._ttl_s)
        except redis.RedisError as exc:
            raise LedgerUnavailable(f"release ledger update failed ({type(exc).__name__})") from exc

    def query_start(self, query: str) -> int | None:
        try:
            value = self._redis.get(f"{self._prefix}:{{{query}}}:start")
        except redis.RedisError as exc:
            raise LedgerUnavailable(f"release ledger read failed ({type(exc).__name__})") from exc
        return None if value is None else int(value)

    def raise_released_through(self, query: str, home: int, window_end_ms: int) -> None:
        try:
            self._raise(keys=[f"{self._prefix}:{{{query}}}:released-through:{home}"], args=[window_end_ms])
        except redis.RedisError as exc:
            raise LedgerUnavailable(f"release ledger update failed ({type(exc).__name__})") from exc


def _pack_units(units: list[str]) -> bytes:
    # Unit ids never hold NUL (the decoder rejects them), so it separates them.
    return zlib.compress("\0".join(units).encode(), 1)


def _unpack_units(payload: bytes) -> list[str]:
    text = zlib.decompress(payload).decode()
    return text.split("\0") if text else []


class MemoryReleaseLedger:
    """In-process ledger for a single worker without Redis, and for tests."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, int], tuple[bytes, bool]] = {}
        self._through: dict[tuple[str, int], int] = {}
        self._units: dict[str, list[str]] = {}
        self._starts: dict[str, int] = {}
        self._lock = threading.Lock()

    def claim(self, query: str, window_start_ms: int, records: list[Record]) -> StoredRelease:
        with self._lock:
            key = (query, window_start_ms)
            if key in self._entries:
                payload, published = self._entries[key]
                return StoredRelease(_unpack(payload), published, False)
            payload = _pack(records)
            self._entries[key] = (payload, False)
            return StoredRelease(_unpack(payload), False, True)

    def mark_published(self, query: str, window_start_ms: int) -> None:
        with self._lock:
            payload, _ = self._entries[(query, window_start_ms)]
            self._entries[(query, window_start_ms)] = (payload, True)

    def get(self, query: str, window_start_ms: int) -> StoredRelease | None:
        with self._lock:
            entry = self._entries.get((query, window_start_ms))
        return None if entry is None else StoredRelease(_unpack(entry[0]), entry[1], False)

    def remember_units(self, charge_id: str, units: list[str]) -> list[str]:
        with self._lock:
            return list(self._units.setdefault(charge_id, list(units)))

    def mark_query_start(self, query: str, window_start_ms: int) -> None:
        with self._lock:
            self._starts.setdefault(query, window_start_ms)

    def query_start(self, query: str) -> int | None:
        return self._starts.get(query)

    def released_through(self, query: str, home: int) -> int | None:
        return self._through.get((query, home))

    def raise_released_through(self, query: str, home: int, window_end_ms: int) -> None:
        with self._lock:
            self._through[(query, home)] = max(self._through.get((query, home), window_end_ms), window_end_ms)
