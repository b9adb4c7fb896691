"""Refuse to charge or release on a Redis that lost what it acknowledged.

The budget bound and "released once" both rest on Redis keeping its data. A
Redis restarted without its append-only file, flushed, a cluster master that
came back empty, or a ``REDIS_URL`` pointed at another server would otherwise
go unnoticed: every unit would get its whole budget back, and a replayed
window could be noised a second time.

So the store carries a token, written once (``SET`` if absent, no expiry) to
``MARKERS`` keys whose hash tags fall one in each 64-slot band of the
cluster's slot space (see ``stream_dp.budget.keys.group_tags``): every master
serving 128 contiguous slots or more holds some. The token goes with every
input offset the worker commits (``kafka.commit_metadata``), so Kafka remembers
which store the group's progress was made with. Before it charges, releases
or commits anything, and again after each partition assignment, the worker
reads the markers and the tokens committed on every input partition of its
group (not only its own: a worker without partitions must find them too):

* every marker holds the same token, and every committed token is it: go on;
* no marker and no committed token: a new deployment; write the markers;
* some markers hold a token and the others none, with no committed token:
  a first start cut short while writing them; complete them;
* otherwise (a committed token the store does not hold, markers that hold
  different tokens, some markers missing once a commit named the token):
  the store is not the one the progress was made with. Stop, and say how
  to fix it.

Commits that cannot be read are no evidence of a new deployment: nothing is
verified until they are. A verified worker reads the markers again every
``recheck_s`` and after any failed Redis call.

Not covered: a Redis restored from a snapshot taken after the first start
holds the token and passes, though it lacks what was charged since (restore
the append-only file, never an older snapshot); a group whose consumer
offsets were deleted too (or a new group id) together with the store is a
new deployment, which reads what the input topics retain and releases it
again, to the output topics it is given.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from stream_dp.budget.keys import group_tags
from stream_dp.budget.redis_nodes import Call, NodeRunner, ReplicaWait
from stream_dp.worker.kafka.commit_metadata import committed_store

log = logging.getLogger(__name__)
MARKERS = 256  # one per 64-slot band: every master serving 128 contiguous slots or more holds one

_MARK_ONCE = """
local stored = redis.call('GET', KEYS[1])
if stored then return stored end
redis.call('SET', KEYS[1], ARGV[1])
return false
"""
_MARK_ONCE_SHA = hashlib.sha1(_MARK_ONCE.encode()).hexdigest()


class StoreReplaced(RuntimeError):
    """The Redis answering is not the store the consumer group's committed progress was made with."""


class StoreMarkers(Protocol):
    def read(self) -> list[str | None]:
        """The token each marker holds (None where a marker is absent), in marker order."""
        ...

    def fill(self, token: str) -> list[str | None]:
        """Write ``token`` to every marker that holds none; the tokens held afterwards."""
        ...


class RedisStoreMarkers:
    def __init__(self, client: Any, *, prefix: str, wait: ReplicaWait | None = None) -> None:
        self._client = client
        self._wait = wait
        self.keys = _marker_keys(prefix)

    def read(self) -> list[str | None]:
        pipe = self._client.pipeline(transaction=False)
        for key in self.keys:
            pipe.get(key)
        return [_text(value) for value in pipe.execute()]

    def fill(self, token: str) -> list[str | None]:
        # The token must be on the replicas before anything is charged under it (a failover
        # right after would otherwise bring back a master without it: a false alarm, not a loss).
        # The first marker decides: workers starting together all copy the token it holds.
        (first,) = NodeRunner(self._client, [self._call(self.keys[0], token)], self._wait).run_pending()
        token = _text(first) or token
        calls = [self._call(key, token) for key in self.keys[1:]]
        held = NodeRunner(self._client, calls, self._wait).run_pending()
        return [token] + [_text(value) or token for value in held]

    @staticmethod
    def _call(key: str, token: str) -> Call:
        return Call(_MARK_ONCE_SHA, _MARK_ONCE, [key], [token], f"{key}:sync")  # the sync key shares the slot


class MemoryStoreMarkers:
    """Markers of an in-process store: they live and die with it."""

    def __init__(self) -> None:
        self._held: list[str | None] = [None] * MARKERS

    def read(self) -> list[str | None]:
        return list(self._held)

    def fill(self, token: str) -> list[str | None]:
        self._held = [held or token for held in self._held]
        return list(self._held)


@dataclass(frozen=True)
class Verdict:
    """What the markers and the committed tokens say: the store's token, whether to write the missing
    markers, or why the store is not the one the progress was made with."""

    token: str | None
    fill: bool = False
    problem: str | None = None


def judge(markers: list[str | None], committed: Iterable[str]) -> Verdict:
    """Pure: compare the markers with the tokens committed beside the input offsets."""
    held = {token for token in markers if token is not None}
    named = set(committed)
    missing = sum(token is None for token in markers)
    if len(held) > 1:
        return Verdict(None, problem=f"its store markers hold {len(held)} different tokens {sorted(held)}")
    token = next(iter(held), None)
    if named - held:
        what = f"holds token {token}" if token is not None else "holds no store token at all (it is empty or new)"
        return Verdict(None, problem=f"the group's committed progress was made with store token(s) "
                                     f"{sorted(named - held)}, but this Redis {what}")
    if token is not None and missing and named:
        return Verdict(None, problem=f"{missing} of {len(markers)} store markers are gone (a node lost its data)")
    if token is None:
        return Verdict(secrets.token_hex(16), fill=True)
    return Verdict(token, fill=bool(missing))


def check(markers: StoreMarkers, committed: Iterable[str], *, redis_hint: str = "REDIS_URL") -> str:
    """The store's token, after writing missing markers when that is safe; raises ``StoreReplaced`` otherwise."""
    committed = list(committed)
    verdict = judge(markers.read(), committed)
    if verdict.fill:
        assert verdict.token is not None  # a new token, or the one the markers already hold
        verdict = judge(markers.fill(verdict.token), committed)
        if verdict.fill:
            raise StoreReplaced("store markers still missing right after writing them; is the Redis read-only?")
    if verdict.problem is not None:
        raise StoreReplaced(
            f"The Redis at {redis_hint} is not the store this consumer group's progress was made with: "
            f"{verdict.problem}. It lost its data (restarted without its append-only file, flushed, a master back "
            "empty) or the URL points at another Redis. Charging on it would give "
            "every unit its whole budget again, and a replayed window could be noised a second time, so nothing "
            f"is charged or released. Fix: restore that Redis's data (its appendonly directory or a current "
            f"backup) or point {redis_hint} at the right server. To start over deliberately, run with a new "
            "STREAM_DP_GROUP_ID and new output topics: everything the input topics retain is released again there."
        )
    assert verdict.token is not None
    return verdict.token


@functools.lru_cache(maxsize=16)
def _marker_keys(prefix: str) -> list[str]:
    return [f"{prefix}:store:{{{tag}}}" for tag in group_tags(f"{prefix}:store", MARKERS)]


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


class StoreGuard:
    """The worker's view of its store: verified (``token``), not yet (``ready()`` false: nothing is charged,
    released or committed), or replaced (``failure``: the worker stops). Shared by the ingest and release stages.

    ``read_committed``: the commit metadata of every input partition the consumer group ever committed
    (not only this worker's: a worker without partitions must find the group's token too). It is read
    at the first check and again after each assignment; until it has been read once, nothing is verified
    (an unreadable metadata is no evidence of a new deployment).
    """

    def __init__(self, markers: StoreMarkers, read_committed: Callable[[], Iterable[str]] | None = None, *,
                 redis_hint: str = "REDIS_URL", retry_s: float = 2.0, recheck_s: float = 5.0,
                 on_verified: Callable[[], None] | None = None) -> None:
        """``on_verified``: called after every check that found the store (``budget.redis_restarts`` then
        lets connections to a restarted server go on)."""
        self._markers = markers
        self._on_verified = on_verified
        self._read_committed = read_committed
        self._redis_hint = redis_hint
        self._retry_s = retry_s
        self._recheck_s = recheck_s
        self._committed: set[str] = set()
        self._committed_read = read_committed is None
        self._assignments = 0
        self._next_try_s = -math.inf
        self._next_recheck_s = -math.inf
        self._lock = threading.Lock()
        self.token: str | None = None
        self.failure: StoreReplaced | None = None

    def ready(self) -> bool:
        return self.token is not None and self.failure is None

    def due(self) -> bool:
        """A check is wanted: not verified yet, or verified ``recheck_s`` ago (a Redis restarted empty
        under a running worker is caught by the next one)."""
        return self.failure is None and (self.token is None or time.monotonic() >= self._next_recheck_s)

    def note_assignment(self) -> None:
        """Partitions moved: the group's commits are read again before anything more is charged."""
        with self._lock:
            self._assignments += 1
            if self._read_committed is not None:
                self._committed_read = False
            if self.token is not None:
                self._committed.add(self.token)
            self.token = None
            self._next_try_s = -math.inf

    def suspect(self) -> None:
        """Redis failed a call: it may come back as another (restarted without its data). Nothing more is
        charged until the markers are checked again."""
        with self._lock:
            if self.token is not None:
                self._committed.add(self.token)  # the store verified so far is the one to find again
                self.token = None
                self._next_try_s = -math.inf

    def verify(self) -> bool:
        """Check the store now (blocking; run it off the event loop). True when verified; False when Redis
        or the broker did not answer (tried again after ``retry_s``); raises ``StoreReplaced``."""
        with self._lock:
            if self.failure is not None:
                raise self.failure
            now_s = time.monotonic()
            if self.token is not None:
                if now_s < self._next_recheck_s:
                    return True
                self._committed.add(self.token)  # from now on the markers must hold it
            elif now_s < self._next_try_s:
                return False
            self._next_try_s = now_s + self._retry_s
            committed, read, assignments = set(self._committed), self._committed_read, self._assignments
        try:
            if not read:
                assert self._read_committed is not None
                committed |= {token for text in self._read_committed() if (token := committed_store(text))}
            token = check(self._markers, committed, redis_hint=self._redis_hint)
        except StoreReplaced as exc:
            with self._lock:
                self.failure = exc
            log.error("%s", exc)
            raise
        except Exception as exc:  # Redis or the broker down: nothing is charged until they answer
            log.warning("cannot check the store (%s: %s); charging and releasing wait", type(exc).__name__, exc)
            with self._lock:
                self.token = None
            return False
        with self._lock:
            self._committed |= committed
            if assignments != self._assignments:  # partitions moved meanwhile: read the group again
                return False
            self._committed_read = True
            self.token = token
            self._next_recheck_s = time.monotonic() + self._recheck_s
        if self._on_verified is not None:
            self._on_verified()
        return True
