"""Dense integer ids for group keys, with their keyed hashes and canonical encodings.

Each batch's keys are first deduplicated in a small batch-local dict (C-level,
cache-friendly), then only the distinct keys are looked up in the table. Ids
mean something only inside one engine: partials list groups in the order of
their canonical encoding, never by id.
"""

from __future__ import annotations

from collections.abc import Hashable
from itertools import repeat
from typing import Any

import numpy as np

from stream_dp.windows.hashing import ContributionHasher


def encode_group_key(key: Hashable) -> bytes:
    """A canonical, type-tagged byte encoding of a group key.

    ``"1"`` and ``1`` are different groups, and a tuple's parts cannot run
    into one another: each part is tagged and length-prefixed.
    """
    parts = key if isinstance(key, tuple) else (key,)
    out = bytearray()
    for part in parts:
        if isinstance(part, str):
            data = part.encode("utf-8", "surrogatepass")
            out += b"s"
        else:
            data = str(int(part)).encode("ascii")  # type: ignore[call-overload]
            out += b"i"
        out += len(data).to_bytes(4, "big")
        out += data
    return bytes(out)


class GroupTable:
    """Group keys -> dense ids, keyed BLAKE2b hashes and canonical encodings."""

    def __init__(self, hasher: ContributionHasher, public: dict[Hashable, int] | None = None) -> None:
        """``public``: a query's public groups (as decoded keys) and their positions in its public list; each key
        added then keeps its position (-1: not public), looked up once, when the key is first seen."""
        self._hasher = hasher
        self._ids: dict[Hashable, int] = {}
        self.keys: list[Hashable] = []
        self.encoded: list[bytes] = []
        self._hashes = np.zeros(64, dtype=np.uint64)
        self._ranks: np.ndarray | None = None
        self._public = public
        self._positions = np.full(64, -1, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def hashes(self) -> np.ndarray:
        """Keyed hash of each id (a view: re-read it after ``ids_for``)."""
        return self._hashes[: len(self.keys)]

    def ids_for(self, keys: list[Hashable]) -> np.ndarray:
        """The id of each key (int64), adding keys not seen before."""
        local = dict.fromkeys(keys)
        table = self._ids
        fresh = [k for k in local if k not in table]
        if fresh:
            self._add(fresh)
        for key in local:
            local[key] = table[key]
        return np.fromiter(map(local.__getitem__, keys), dtype=np.int64, count=len(keys))

    def canonical_ranks(self) -> np.ndarray:
        """Each id's position in the order of the canonical encodings (cached until keys change)."""
        if self._ranks is None:
            order = sorted(range(len(self.encoded)), key=self.encoded.__getitem__)
            ranks = np.empty(len(order), dtype=np.int64)
            ranks[np.array(order, dtype=np.int64)] = np.arange(len(order), dtype=np.int64)
            self._ranks = ranks
        return self._ranks

    def public_positions(self, ids: np.ndarray) -> np.ndarray | None:
        """Each id's position in the public list (-1: not public); None without a public list."""
        return None if self._public is None else self._positions[ids]

    def as_tuples(self, ids: np.ndarray) -> list[tuple[Any, ...]]:
        keys = self.keys
        return [k if type(k) is tuple else (k,) for k in map(keys.__getitem__, ids.tolist())]

    def _add(self, fresh: list[Hashable]) -> None:
        self._ranks = None
        first = len(self.keys)
        encoded = [encode_group_key(k) for k in fresh]
        for i, key in enumerate(fresh, start=first):
            self._ids[key] = i
        self.keys.extend(fresh)
        self.encoded.extend(encoded)
        needed = len(self.keys)
        if needed > len(self._hashes):
            grown = np.zeros(max(needed, 2 * len(self._hashes)), dtype=np.uint64)
            grown[:first] = self._hashes[:first]
            self._hashes = grown
        self._hashes[first:needed] = self._hasher.group_hashes(encoded)
        if self._public is not None:
            if needed > len(self._positions):
                grown_positions = np.full(max(needed, 2 * len(self._positions)), -1, dtype=np.int64)
                grown_positions[:first] = self._positions[:first]
                self._positions = grown_positions
            self._positions[first:needed] = np.fromiter(map(self._public.get, fresh, repeat(-1)), dtype=np.int64,
                                                        count=len(fresh))

    def retain(self, live_ids: np.ndarray) -> np.ndarray:
        """Forget every id not in ``live_ids``; returns the map old id -> new id (-1 if forgotten)."""
        self._ranks = None
        live = np.unique(live_ids)
        remap = np.full(len(self.keys), -1, dtype=np.int64)
        remap[live] = np.arange(len(live), dtype=np.int64)
        keep = live.tolist()
        self.keys = [self.keys[i] for i in keep]
        self.encoded = [self.encoded[i] for i in keep]
        self._ids = {key: i for i, key in enumerate(self.keys)}
        hashes = np.zeros(max(64, 2 * len(keep)), dtype=np.uint64)
        hashes[: len(keep)] = self._hashes[live]
        self._hashes = hashes
        if self._public is not None:
            positions = np.full(len(hashes), -1, dtype=np.int64)
            positions[: len(keep)] = self._positions[live]
            self._positions = positions
        return remap

    def nbytes(self) -> int:
        """Approximate memory: hashes, encodings, and per key a dict entry, a list slot and the key."""
        per_key_overhead = 36 + 8 + 8 + 64  # dict entry at ~2/3 load, two list slots, a small key object
        return int(self._hashes.nbytes + sum(map(len, self.encoded)) + len(self.keys) * per_key_overhead)
