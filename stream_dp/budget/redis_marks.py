"""The two small keys a charge on a Redis Cluster writes besides its group calls.

* The namespace's **layout mark** (``{prefix}m:{namespace}``, no hash tag): the
  group calls each check their group's own mark, and this one tells readers
  (and the CLI) which layout wrote the namespace.
* A charge's **manifest** (the digest of the whole batch, keyed by charge id):
  each group's record catches a changed sub-batch on its own, but a group the
  first batch did not touch would be charged before another group's conflict
  came back, so a charge id reused for another batch is refused before any
  group is charged. The manifest waits for replicas like the charge itself: a
  failover that forgot it could let such a batch charge new groups.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from stream_dp.budget.charge_call import Part
from stream_dp.budget.keys import KeyNames
from stream_dp.budget.layout import key_layout_mismatch
from stream_dp.budget.redis_calls import RedisCaller
from stream_dp.budget.redis_nodes import ReplicaWait, set_once
from stream_dp.budget.store import ChargeConflict, StoreLayoutMismatch


def manifest_digest(parts: Sequence[Part]) -> str:
    """The parts' digests, and where each part's units stand in the batch (its order is part of the call)."""
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(f"{p.group}|{p.chunk}|{p.args[6]}|{len(p.positions)}|".encode())
        h.update(p.positions.astype("<u4").tobytes())
    return h.hexdigest()


def claim_layout(caller: RedisCaller, keys: KeyNames, namespace: str, fingerprint: str) -> None:
    """Mark the namespace's key layout unless marked; raise ``StoreLayoutMismatch`` if another one is."""
    key = keys.meta(namespace)
    stored = caller.call(namespace, "charge", lambda: caller.client.set(key, fingerprint, nx=True, get=True))
    if stored is not None and stored.decode() != fingerprint:
        raise StoreLayoutMismatch(key_layout_mismatch(namespace, stored.decode(), fingerprint))


def check_manifest(
    caller: RedisCaller,
    keys: KeyNames,
    namespace: str,
    charge_id: str,
    parts: Sequence[Part],
    ttl_ms: int,
    wait: ReplicaWait | None,
) -> None:
    """Store the charge's manifest, or raise ``ChargeConflict`` if the charge id holds another batch's."""
    digest = manifest_digest(parts)
    key = keys.manifest(namespace, charge_id)
    sync = keys.manifest_sync(namespace, charge_id)
    stored: Any = caller.call(namespace, "charge", lambda: set_once(caller.client, key, digest, ttl_ms, sync, wait))
    if stored is not None and stored.decode() != digest:
        raise ChargeConflict(
            f"charge id {charge_id!r} was already charged with different units, cost or event time; a retry "
            "must repeat the original call, a new window needs a new charge id"
        )
