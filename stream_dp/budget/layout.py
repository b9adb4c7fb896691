"""How the Redis backend lays a namespace's units out in memory.

A unit's state (see :mod:`stream_dp.budget.ledger`) is one packed string,
little-endian:

* ``uint8 flags``: bit ``i`` set if horizon ``i`` (0-based) has an alert
  level; bit 7 set if counters take 4 bytes (else 3: below 2**24 micro-units);
* one ``uint32`` per level present: ``lapse_s * 8 + level``, ``lapse_s`` the
  lapse time in seconds after the start of the state's generation;
* per horizon, ``int32 first`` and ``uint16 count``;
* then the counters of every horizon in turn: ``count`` of them for buckets
  ``base + first`` .. ``base + first + count - 1`` (dense, zeros inside, none
  at the ends), where ``base = floor((g - 2) * E / w)`` for generation ``g``.

With headers first and counters dense, Lua reads a state with two unpacks
and writes it with one, whatever its size; a horizon holds at most its
retained buckets (``buckets`` plus ``(max_delay_ms + max_lead_ms) / w`` plus 3).

States live as fields of hashes ``{prefix}s:{namespace}:{g}:{shard}``: the
generation ``g = floor(now / E)`` on the store clock, with
``E >= longest horizon + widest bucket + max_delay_ms + max_lead_ms``, and the
shard a hash of the unit id. Every field of a state written at time ``now`` is
past its deadline by ``now + E``, so a state stored in generation ``g - 2`` or
older is dead: the script reads generations ``g`` and ``g - 1``, moves a unit
found in ``g - 1`` into ``g``, and each generation's hashes expire at
``(g + 2) E``. Batching a shard's units into one HMGET and one HSET is what
makes a 10k-unit batch cost a few hundred Redis calls instead of 20k; one
packed string per unit (no per-field overhead) is what keeps memory small.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib

import numpy as np

from stream_dp.budget.batch import encode_unit
from stream_dp.budget.ledger import FIELD_STRIDE, HorizonPlan, NamespaceLedger
from stream_dp.budget.store import LEGACY_MAX_DELAY_MS

MAX_ENTRIES = 6000
"""Counters per unit state. Lua unpacks a whole state in one call, and Lua 5.1 returns at most
8000 values from one C call (LUAI_MAXCSTACK): 6000 counters plus the header stay well inside
(tests/budget/test_redis_store.py charges a unit holding over 4000)."""

WIDE_VALUES = 0x80
_FIRST_LIMIT = 2**31


class StorageLayout:
    """Generations, shards and the packed state codec of one namespace."""

    def __init__(
        self, ledger: NamespaceLedger, shards: int, generation_ms: int | None = None, groups: int | None = None
    ) -> None:
        if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= 65535:
            raise ValueError(f"shards must be an integer in [1, 65535], got {shards!r}")
        if groups is not None and (isinstance(groups, bool) or not isinstance(groups, int) or not 1 <= groups <= shards):
            raise ValueError(f"slot groups must be an integer in [1, shards={shards}], got {groups!r}")
        self.ledger = ledger
        self.shards = shards
        self.groups = groups
        """Slot groups of the Redis Cluster key layout (:mod:`stream_dp.budget.keys`); None on one Redis."""
        opts = ledger.options
        span = (
            max(p.horizon_ms for p in ledger.horizons)
            + max(p.bucket_ms for p in ledger.horizons)
            + opts.max_delay_ms
            + opts.max_lead_ms
        )
        self.generation_ms = -(-span // 1000) * 1000 + 1000
        if generation_ms is not None:
            # Adopting the layout another worker stored (for reading only).
            self.generation_ms = generation_ms
        name = ledger.policy.name
        entries = len(ledger.horizons)
        for plan in ledger.horizons:
            if (3 * self.generation_ms + opts.max_lead_ms) // plan.bucket_ms + 3 >= _FIRST_LIMIT:
                raise ValueError(
                    f"namespace {name}: the {plan.label} horizon's buckets ({plan.bucket_ms} ms) are too narrow "
                    "for the stored time span; use fewer buckets"
                )
            entries += plan.buckets + (opts.max_delay_ms + opts.max_lead_ms) // plan.bucket_ms + 3
        if entries > MAX_ENTRIES:
            raise ValueError(
                f"namespace {name}: a unit could hold up to {entries} buckets (more than {MAX_ENTRIES}); "
                "use fewer buckets or a smaller max_delay_ms (the worker's is STREAM_DP_INPUT_RETENTION_MS + 1 h)"
            )
        self.max_entries = entries

    @property
    def fingerprint(self) -> str:
        """What every writer of the namespace must agree on: stored in Redis by the first one.

        Workers with another generation length, shard count or horizon/bucket
        list would read and write different fields for the same unit, each
        seeing only part of its spending.
        """
        # A delta limit is marked ":d"; namespaces without one keep the fingerprint they always had.
        horizons = ",".join(f"{p.horizon_ms}:{p.buckets}" + (":d" if p.delta else "") for p in self.ledger.horizons)
        # The cluster key layout names every key differently: "|g<groups>" keeps the two from mixing.
        cluster = "" if self.groups is None else f"|g{self.groups}"
        return f"v1|{self.generation_ms}|{self.shards}|{horizons}{cluster}"

    def adopt(self, fingerprint: str) -> StorageLayout:
        """This namespace laid out as ``fingerprint`` says (to read what other workers wrote)."""
        if fingerprint == self.fingerprint:
            return self
        stored_groups = fingerprint_groups(fingerprint)
        if stored_groups != self.groups:
            raise ValueError(key_layout_mismatch(self.ledger.policy.name, fingerprint, self.fingerprint))
        try:
            version, generation_ms, shards, horizons = fingerprint.split("|")[:4]
            ok = version == "v1" and horizons == self.fingerprint.split("|")[3]
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(
                f"namespace {self.ledger.policy.name}: budgets in Redis were written with layout {fingerprint!r}, "
                f"this policy needs {self.fingerprint!r} (horizon_ms:buckets differ); changing a namespace's "
                "horizons or buckets needs a new key prefix"
            )
        return StorageLayout(self.ledger, int(shards), int(generation_ms), self.groups)

    def generation_of(self, now_ms: int) -> int:
        return now_ms // self.generation_ms

    def base_bucket(self, plan: HorizonPlan, generation: int) -> int:
        return ((generation - 2) * self.generation_ms) // plan.bucket_ms

    def decode(self, raw: bytes, generation: int) -> dict[int, int]:
        """A packed state (as stored in ``generation``) as a ledger mapping."""
        try:
            return self._decode(raw, generation)
        except (struct.error, IndexError) as error:
            raise ValueError(f"corrupt budget state ({len(raw)} bytes): {error}") from None

    def _decode(self, raw: bytes, generation: int) -> dict[int, int]:
        start_ms = generation * self.generation_ms
        state: dict[int, int] = {}
        if not raw:
            return state
        (flags,) = struct.unpack_from("<B", raw, 0)
        pos = 1
        for plan in self.ledger.horizons:
            if flags & (1 << plan.index):
                (value,) = struct.unpack_from("<I", raw, pos)
                pos += 4
                lapse_ms = start_ms + (value // FIELD_STRIDE) * 1000
                state[plan.level_field] = lapse_ms * FIELD_STRIDE + value % FIELD_STRIDE
        headers = []
        for _ in self.ledger.horizons:
            headers.append(struct.unpack_from("<iH", raw, pos))
            pos += 6
        width = 4 if flags & WIDE_VALUES else 3
        for plan, (first, count) in zip(self.ledger.horizons, headers, strict=True):
            first += self.base_bucket(plan, generation)
            for k in range(count):
                chunk = raw[pos : pos + width]
                if len(chunk) != width:
                    raise IndexError("state ends inside a counter")
                pos += width
                value = int.from_bytes(chunk, "little")
                if value:
                    state[plan.field_of(first + k)] = value
        if pos != len(raw):
            raise IndexError(f"{len(raw) - pos} bytes left over")
        return state

    def encode(self, state: dict[int, int], generation: int) -> bytes:
        """A ledger mapping packed for storage in ``generation`` (canonical: same bytes as charge.lua)."""
        start_ms = generation * self.generation_ms
        flags, levels = 0, []
        for plan in self.ledger.horizons:
            record = state.get(plan.level_field)
            if record is not None:
                lapse_ms, level = divmod(record, FIELD_STRIDE)
                flags |= 1 << plan.index
                levels.append(((lapse_ms - start_ms) // 1000) * FIELD_STRIDE + level)
        width = 4 if max(p.limit_units for p in self.ledger.horizons) >= 2**24 else 3
        if width == 4:
            flags |= WIDE_VALUES
        headers: list[bytes] = []
        counters: list[bytes] = []
        for plan in self.ledger.horizons:
            buckets = [f // FIELD_STRIDE for f, v in state.items() if f >= 0 and v and f % FIELD_STRIDE == plan.index]
            if not buckets:
                headers.append(struct.pack("<iH", 0, 0))
                continue
            first, last = min(buckets), max(buckets)
            headers.append(struct.pack("<iH", first - self.base_bucket(plan, generation), last - first + 1))
            counters.extend(state.get(plan.field_of(b), 0).to_bytes(width, "little") for b in range(first, last + 1))
        if not levels and not counters:
            return b""
        return b"".join([struct.pack(f"<B{len(levels)}I", flags, *levels), *headers, *counters])

    def shard_of(self, units: list[str]) -> np.ndarray:
        """Shard of each unit (uint16): CRC-32 of the id's UTF-8 bytes, modulo ``shards``."""
        try:
            crcs = list(map(zlib.crc32, map(str.encode, units)))
        except UnicodeEncodeError:
            crcs = [zlib.crc32(encode_unit(u)) for u in units]
        return (np.array(crcs, dtype=np.uint32) % self.shards).astype(np.uint16)


def legacy_layout(ledger: NamespaceLedger, shards: int, stored_fingerprint: str) -> StorageLayout | None:
    """The layout of budgets written before the accepted delay followed the input retention, if that is what is stored.

    Those workers always used a delay of ``LEGACY_MAX_DELAY_MS``, and the
    generation length in the fingerprint follows from the delay. Buckets older
    than that delay may already be pruned, so a charge later than it could not
    be checked: a writer that finds such budgets must keep the legacy delay
    (and with it the stored generation length) to stay sound; it then refuses
    backlogs older than an hour, as before. Returns None for anything else.
    """
    if ledger.options.max_delay_ms == LEGACY_MAX_DELAY_MS:
        return None
    options = dataclasses.replace(ledger.options, max_delay_ms=LEGACY_MAX_DELAY_MS)
    layout = StorageLayout(NamespaceLedger(ledger.policy, options), shards)
    return layout if layout.fingerprint == stored_fingerprint else None


def fingerprint_groups(fingerprint: str) -> int | None:
    """The slot groups a stored fingerprint names (cluster key layout), None for the one-Redis layout."""
    last = fingerprint.rsplit("|", 1)[-1]
    return int(last[1:]) if last.startswith("g") and last[1:].isdigit() else None


def key_layout_mismatch(namespace: str, stored: str, wanted: str) -> str:
    """Why a store refuses budgets written under the other key layout (one Redis vs cluster), and what to do."""
    stored_groups, wanted_groups = fingerprint_groups(stored), fingerprint_groups(wanted)
    if stored_groups is not None and wanted_groups is not None:
        return (
            f"namespace {namespace}: budgets were written in the cluster key layout with {stored_groups} slot "
            f"groups ({stored!r}), this store uses {wanted_groups} ({wanted!r}); every worker must use the same "
            "slot groups (RedisBudgetStore groups=), changing them needs a new key prefix"
        )
    if stored_groups is None:
        return (
            f"namespace {namespace}: budgets under this key prefix were written by a single Redis in its key "
            f"layout ({stored!r}), and this store runs on a Redis Cluster, which needs hash-tagged keys "
            f"({wanted!r}). Those keys are not migrated: keep this deployment on one Redis (a redis:// REDIS_URL), "
            "or start the cluster on a new key prefix once the old budgets' longest horizon plus "
            "STREAM_DP_INPUT_RETENTION_MS has passed (see docs/operations/redis.md)"
        )
    return (
        f"namespace {namespace}: budgets under this key prefix were written on a Redis Cluster in its hash-tagged "
        f"key layout ({stored!r}), and this store uses the single-Redis layout ({wanted!r}). Point REDIS_URL "
        "at the cluster (redis+cluster://host:port,...), or use another key prefix"
    )
