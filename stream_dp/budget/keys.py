"""Key names of the Redis budget store, on one Redis and on a Redis Cluster (pure: no I/O).

On one Redis every key of a namespace sits beside the others and one Lua call
charges a whole batch (``{prefix}s:{ns}:{g}:{shard}`` and so on, see
:mod:`stream_dp.budget.redis_store`). A Redis Cluster runs a Lua call only on
keys of one hash slot, so there the shards of a namespace are dealt into
``groups`` *slot groups*, each with a hash tag of its own: shard ``s`` belongs
to group ``s % groups``, and every key a charge of that group touches (its
shard hashes, charge record, top set and layout mark) carries the group's tag.
A batch becomes one call per group present in it; a unit always falls in the
same group, so its check-and-charge stays one atomic, idempotent call.

The two layouts name keys differently, and the layout fingerprint says which
one wrote a namespace (:meth:`StorageLayout.fingerprint`), so a store never
reads half of its units under the other names.
"""

from __future__ import annotations

import hashlib

import numpy as np
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

DEFAULT_GROUPS = 16
"""Slot groups per namespace on a cluster: enough to spread a namespace over a few masters, few enough
that a batch costs few calls (one per group present) and a charge few records."""


def key_slot_of(key: str) -> int:
    """The cluster hash slot of ``key`` (CRC16 of its hash tag, or of the whole key without one)."""
    return int(key_slot(key.encode("utf-8", "surrogatepass")))


def group_tags(namespace: str, groups: int) -> list[str]:
    """The hash tag of each slot group of ``namespace``: group ``k``'s tag hashes into the ``k``-th of
    ``groups`` equal slot ranges.

    ``redis-cli --cluster create`` gives each master one contiguous range of
    slots, so tags spread like this put nearly the same number of groups on
    every master (plain ``ns.k`` tags would land where CRC16 puts them).
    Deterministic: every worker computes the same tags.
    """
    if isinstance(groups, bool) or not isinstance(groups, int) or not 1 <= groups <= 1024:
        raise ValueError(f"slot groups must be an integer in [1, 1024], got {groups!r}")
    tags = []
    for k in range(groups):
        n = 0
        while key_slot_of(f"{{{namespace}.{k}.{n}}}") * groups // REDIS_CLUSTER_HASH_SLOTS != k:
            n += 1
        tags.append(f"{namespace}.{k}.{n}")
    return tags


def split_by_group(shards: np.ndarray, groups: int) -> list[tuple[int, np.ndarray]]:
    """Positions of the units of each slot group present, groups in ascending order, positions in input order."""
    group_of = shards.astype(np.int64) % groups
    order = np.argsort(group_of, kind="stable")
    present, starts = np.unique(group_of[order], return_index=True)
    bounds = [*starts.tolist(), len(order)]
    return [(int(g), order[bounds[i] : bounds[i + 1]]) for i, g in enumerate(present.tolist())]


def _charge_tag(charge_id: str) -> str:
    return hashlib.blake2b(charge_id.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()


class KeyNames:
    """The store's key names: ``groups=None`` for one Redis (as ever), an integer for a cluster.

    ``group`` arguments are ignored on one Redis (every key belongs to the one batch call).
    """

    def __init__(self, prefix: str, groups: int | None = None) -> None:
        if groups is not None and ("{" in prefix or "}" in prefix):
            raise ValueError(
                f"key prefix {prefix!r} holds a brace: on a Redis Cluster the store puts its own hash tags in its "
                "keys, and a brace in the prefix would move them; use a prefix without '{' or '}'"
            )
        self.prefix = prefix
        self.groups = groups
        self._tags: dict[str, list[str]] = {}

    @property
    def clustered(self) -> bool:
        return self.groups is not None

    def tag(self, namespace: str, group: int) -> str:
        """``{tag}`` of the group (with braces), "" on one Redis."""
        if self.groups is None:
            return ""
        tags = self._tags.get(namespace)
        if tags is None:
            tags = self._tags[namespace] = group_tags(namespace, self.groups)
        return f"{{{tags[group]}}}"

    def shard_prefix(self, namespace: str, group: int = 0) -> str:
        """Shard hashes are this prefix + ``{generation}:{shard}`` (charge.lua builds them so)."""
        if self.groups is None:
            return f"{self.prefix}s:{namespace}:"
        return f"{self.prefix}s:{namespace}:{self.tag(namespace, group)}:"

    def shard(self, namespace: str, generation: int, shard: int) -> str:
        group = shard % self.groups if self.groups else 0
        return f"{self.shard_prefix(namespace, group)}{generation}:{shard}"

    def record(self, namespace: str, charge_id: str, chunk: int, group: int = 0) -> str:
        suffix = f"#{chunk}" if chunk else ""
        if self.groups is None:
            return f"{self.prefix}c:{namespace}:{charge_id}{suffix}"
        return f"{self.prefix}c:{namespace}:{self.tag(namespace, group)}:{charge_id}{suffix}"

    def top_prefix(self, namespace: str, group: int = 0) -> str:
        if self.groups is None:
            return f"{self.prefix}t:{namespace}:"
        return f"{self.prefix}t:{namespace}:{self.tag(namespace, group)}:"

    def top(self, namespace: str, period: int, group: int = 0) -> str:
        return f"{self.top_prefix(namespace, group)}{period}"

    def meta(self, namespace: str, group: int | None = None) -> str:
        """The namespace's layout mark; on a cluster each group has one too (``group``), checked by its calls."""
        if group is None or self.groups is None:
            return f"{self.prefix}m:{namespace}"
        return f"{self.prefix}m:{namespace}:{self.tag(namespace, group)}"

    def manifest(self, namespace: str, charge_id: str) -> str:
        """Digest of a whole charge on a cluster, written before its group calls (one slot, by charge id)."""
        return f"{self.prefix}c:{namespace}:{{{_charge_tag(charge_id)}}}:{charge_id}"

    def manifest_sync(self, namespace: str, charge_id: str) -> str:
        """The WAIT write beside a manifest (same slot)."""
        return f"{self.prefix}w:{namespace}:{{{_charge_tag(charge_id)}}}"

    def sync(self, namespace: str, group: int) -> str:
        """A key written right before WAIT, so that WAIT also covers a replayed call that wrote nothing."""
        return f"{self.prefix}w:{namespace}:{self.tag(namespace, group)}"
