"""The period register of continual queries: in which windows of a period each unit took part.

A continual query charges a unit the loss of a whole period once, at the
first window of the period it contributes to, and the tree mechanism is
calibrated for a unit in at most ``max_windows`` windows of a period. The
register keeps, per (query, period, input partition, settings), each unit's
windows of the period, so a window's units sort into:

* ``FIRST``: no window registered -- to be charged the period's loss now;
* ``MORE``: fewer than ``max_windows`` registered, not this one -- already
  charged for the period, admitted free;
* ``REPLAY``: this window is registered -- a replay, admitted as before;
* ``FULL``: ``max_windows`` others registered -- left out of the window.

``classify`` only reads. ``register`` adds the window to the units the caller
admitted and returns each unit's class as it was just before, in one check
and write per unit that nothing can interleave with (a Lua script in Redis,
a lock in memory): a unit that became ``FULL`` meanwhile (two windows of one
partition charged at once, by a worker that lost the partition and the one
that took it) is *not* registered, so no unit ever holds more than
``max_windows`` windows of a period. Registering is idempotent per window.

Why the key is per input partition: units are partitioned by key, so a unit
sits in one partition and each call touches one Redis key (one slot of a
Redis Cluster). Should a unit show up in another partition all the same (the
topic's partition count changed), it is ``FIRST`` there and charged the
period again: its windows then number up to ``2 * max_windows``, paid for
twice, and the Laplace loss grows linearly with the contribution, so the
accounting still holds -- in epsilon: a zCDP loss grows with its square, which
is why continual queries are refused in rho-accounted namespaces.

Losing registrations is safe only all at once: a unit forgotten entirely is
charged again at its next window. Losing just the last registration of a
unit would let it into one window more than paid for, so the Redis register
waits for replicas like the charges do (``wait``), and its Redis must keep
what it acknowledged (see :mod:`stream_dp.budget`).

Why the key names the settings: a unit's payment covers the period's tree
under the settings it was charged for (its epsilon, W, window grid, groups,
...). Under other settings the old registrations say nothing -- a unit paid
for W = 1 at epsilon 1 is not paid for W = 4 at epsilon 4, and window 3 of a
grid of 2-minute windows is not window 3 of one of 1-minute windows -- so the
key holds ``settings_fingerprint`` of the query, and a change makes a new
period in which every unit is ``FIRST`` again: charged again at its next
window even if it paid under the old settings (too much, never too little).

Lifetime: a period's key expires ``StoreOptions.record_ttl_ms`` after the
period ends (its max delay and lead, plus a second) -- the time until which a
charge of its last window can still be accepted. Past it, every unit looks
``FIRST`` again, and the budget store refuses such late charges as out of
range: nothing is admitted on a forgotten register.

Memory: one hash field per unit per (query, period, partition, settings): the unit id
and 4 bytes per registered window (at most ``max_windows``), in Redis about
``45 + len(unit id) + 4 * windows`` bytes (hash table entry and two strings;
measured 58 bytes a unit for 13-byte ids in one window, 82 in four), kept for
the period and the store's max delay after it.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

import numpy as np
import redis

from stream_dp.budget import StoreOptions
from stream_dp.budget.batch import encode_unit
from stream_dp.budget.redis_nodes import Call, NodeRunner, ReplicaWait
from stream_dp.worker.store.ledger import LedgerUnavailable

WINDOW_BYTES = 4
DEFAULT_UNITS_PER_CALL = 10_000


class Participation(IntEnum):
    """A unit's standing in a period before a window is registered for it (see the module docstring)."""

    FIRST = 0
    MORE = 1
    REPLAY = 2
    FULL = 3


_CODES = {b"f": Participation.FIRST, b"m": Participation.MORE, b"r": Participation.REPLAY, b"x": Participation.FULL}


@dataclass(frozen=True)
class PeriodWindow:
    """A window of a continual query as the register sees it."""

    query: str
    partition: int  # the input partition
    period_start_ms: int
    period_end_ms: int
    index: int  # the window's place in its period, from 1
    max_windows: int  # per unit and period
    settings: str  # ``settings_fingerprint`` of the query: the period's charge holds for these settings only

    def __post_init__(self) -> None:
        if not self.settings.isalnum():  # it goes into a Redis key, inside its hash tag
            raise ValueError(f"settings must be a non-empty fingerprint of letters and digits, got {self.settings!r}")
        if not 1 <= self.index <= (1 << 8 * WINDOW_BYTES) - 1:
            raise ValueError(f"window index {self.index} is out of range; windows of a period count from 1")
        if self.max_windows < 1:
            raise ValueError(f"max_windows must be at least 1, got {self.max_windows}")
        if self.period_end_ms <= self.period_start_ms:
            raise ValueError(f"period [{self.period_start_ms}, {self.period_end_ms}) is empty")

    @property
    def packed(self) -> bytes:
        return self.index.to_bytes(WINDOW_BYTES, "big")


def standing(stored: bytes | None, window: bytes, max_windows: int) -> Participation:
    """The class of a unit whose registered windows are ``stored`` (packed, None for none)."""
    if not stored:
        return Participation.FIRST
    if any(stored[i:i + WINDOW_BYTES] == window for i in range(0, len(stored), WINDOW_BYTES)):
        return Participation.REPLAY
    if len(stored) // WINDOW_BYTES >= max_windows:
        return Participation.FULL
    return Participation.MORE


def classify_stored(stored: Sequence[bytes | None], window: PeriodWindow) -> np.ndarray:
    """``standing`` of every unit, as a uint8 array of ``Participation`` values."""
    packed, cap = window.packed, window.max_windows
    return np.fromiter((standing(s, packed, cap) for s in stored), dtype=np.uint8, count=len(stored))


class PeriodRegister(Protocol):
    def classify(self, window: PeriodWindow, units: Sequence[str]) -> np.ndarray:
        """Each unit's ``Participation`` (uint8 array, aligned with ``units``); reads only."""
        ...

    def register(self, window: PeriodWindow, units: Sequence[str]) -> np.ndarray:
        """Register ``window`` for ``units`` (distinct ids) unless they are ``FULL``; returns each unit's
        ``Participation`` just before (``FULL``: not registered). Raises ``LedgerUnavailable``."""
        ...


# KEYS[1]: the period's hash. ARGV: window (packed), max windows, expiry (unix ms), unit ids.
# Returns one letter per unit, its class before: f(irst), m(ore), r(eplay), x (full, not registered).
_REGISTER = """
local w, cap = ARGV[1], tonumber(ARGV[2])
local n = string.len(w)
local out = {}
for i = 4, #ARGV do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  if not v then
    redis.call('HSET', KEYS[1], ARGV[i], w)
    out[#out + 1] = 'f'
  else
    local seen = false
    for j = 1, string.len(v), n do
      if string.sub(v, j, j + n - 1) == w then seen = true; break end
    end
    if seen then
      out[#out + 1] = 'r'
    elseif string.len(v) / n >= cap then
      out[#out + 1] = 'x'
    else
      redis.call('HSET', KEYS[1], ARGV[i], v .. w)
      out[#out + 1] = 'm'
    end
  end
end
if #ARGV > 3 then
  redis.call('PEXPIREAT', KEYS[1], ARGV[3])
end
return table.concat(out)
"""


def _decode_codes(reply: bytes, count: int) -> np.ndarray:
    if len(reply) != count:
        raise LedgerUnavailable(f"period register answered {len(reply)} classes for {count} units (script mismatch?)")
    return np.fromiter((_CODES[reply[i:i + 1]] for i in range(count)), dtype=np.uint8, count=count)


PERIODS_PREFIX = "stream-dp:periods"
"""The period register's keys start with it and a colon."""


class RedisPeriodRegister:
    """The register on one Redis or a Redis Cluster: one hash per (query, period, partition, settings), its own slot.

    ``options``: the budget store's (``StoreOptions``), whose delays set how long a
    period is kept. ``wait``: replicas that must hold a registration before it counts
    (see the module docstring). ``units_per_call``: a window's units are registered in
    calls of at most this many, so one call does not block Redis for long; each unit's
    check and write is still one, which is all the rule needs.
    """

    def __init__(
        self, client: redis.Redis, *, options: StoreOptions, prefix: str = PERIODS_PREFIX,
        wait: ReplicaWait | None = None, units_per_call: int = DEFAULT_UNITS_PER_CALL,
    ) -> None:
        if units_per_call < 1:
            raise ValueError(f"units_per_call must be positive, got {units_per_call}")
        self._redis = client
        self._prefix = prefix
        self._keep_ms = options.record_ttl_ms
        self._wait = wait
        self._per_call = units_per_call
        self._script = client.register_script(_REGISTER)

    def key(self, window: PeriodWindow) -> str:
        return f"{self._prefix}:{{{window.query}/{window.period_start_ms}/{window.partition}/{window.settings}}}"

    def classify(self, window: PeriodWindow, units: Sequence[str]) -> np.ndarray:
        key, listed = self.key(window), [encode_unit(u) for u in units]
        try:
            stored: list[bytes | None] = []
            for first in range(0, len(listed), self._per_call):
                stored += self._redis.hmget(key, listed[first:first + self._per_call])
        except redis.RedisError as exc:
            raise LedgerUnavailable(f"period register unavailable ({type(exc).__name__}: {exc}); not charging") from exc
        return classify_stored(stored, window)

    def register(self, window: PeriodWindow, units: Sequence[str]) -> np.ndarray:
        key, listed = self.key(window), [encode_unit(u) for u in units]
        head = [window.packed, window.max_windows, window.period_end_ms + self._keep_ms]
        script = self._script
        calls = [
            Call(script.sha, script.script, [key], head + listed[first:first + self._per_call], f"{key}:sync")
            for first in range(0, len(listed), self._per_call)
        ]
        if not calls:
            return np.zeros(0, dtype=np.uint8)
        try:
            replies = NodeRunner(self._redis, calls, self._wait).run_pending()
        except redis.RedisError as exc:
            raise LedgerUnavailable(
                f"period register unavailable ({type(exc).__name__}: {exc}); not releasing"
            ) from exc
        return np.concatenate([_decode_codes(r, len(c.args) - len(head)) for r, c in zip(replies, calls, strict=True)])


class MemoryPeriodRegister:
    """In-process register for a single worker without Redis, and for tests; ``clock_ms`` expires periods."""

    def __init__(self, options: StoreOptions | None = None, *, clock_ms: Callable[[], int] | None = None) -> None:
        self._keep_ms = (options or StoreOptions()).record_ttl_ms
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._periods: dict[tuple[str, int, int, str], dict[str, bytes]] = {}
        self._expiry: list[tuple[int, tuple[str, int, int, str]]] = []
        self._lock = threading.Lock()

    def _period(self, window: PeriodWindow, create: bool) -> dict[str, bytes]:
        """The window's period (lock held), after forgetting expired ones."""
        now = self._clock_ms()
        while self._expiry and self._expiry[0][0] <= now:
            _, gone = heapq.heappop(self._expiry)
            self._periods.pop(gone, None)
        key = (window.query, window.period_start_ms, window.partition, window.settings)
        expires = window.period_end_ms + self._keep_ms
        if key not in self._periods and create and expires > now:
            self._periods[key] = {}
            heapq.heappush(self._expiry, (expires, key))
        return self._periods.get(key, {})

    def classify(self, window: PeriodWindow, units: Sequence[str]) -> np.ndarray:
        with self._lock:
            period = self._period(window, create=False)
            return classify_stored([period.get(u) for u in units], window)

    def register(self, window: PeriodWindow, units: Sequence[str]) -> np.ndarray:
        packed, cap = window.packed, window.max_windows
        with self._lock:
            period = self._period(window, create=bool(units))
            codes = np.zeros(len(units), dtype=np.uint8)
            for i, unit in enumerate(units):
                codes[i] = was = standing(period.get(unit), packed, cap)
                if was in (Participation.FIRST, Participation.MORE):
                    period[unit] = period.get(unit, b"") + packed
            return codes
