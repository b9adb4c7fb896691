"""Which partition a producer's partitioner gives a key, for checking co-partitioning.

``murmur2``: Kafka's Java client default (``toPositive(murmur2(key)) % n``),
also kafka-python's and librdkafka's ``murmur2_random``. ``crc32``:
librdkafka's default ``consistent_random`` for keyed messages
(``crc32(key) % n``).
"""

from __future__ import annotations

import zlib
from typing import Literal

import numpy as np

Partitioner = Literal["murmur2", "crc32"]
PARTITIONERS: tuple[str, ...] = ("murmur2", "crc32")

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def check_partitioner(name: str) -> None:
    if name not in PARTITIONERS:
        raise ValueError(f"unknown partitioner {name!r}; use one of {', '.join(PARTITIONERS)}")


def murmur2_one(key: bytes) -> int:
    """Kafka's murmur2 of ``key`` as an unsigned 32-bit integer."""
    length = len(key)
    h = (_SEED ^ length) & _MASK
    body = length - length % 4
    for i in range(0, body, 4):
        k = int.from_bytes(key[i:i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = key[body:]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def expected_partitions(keys: np.ndarray, num_partitions: int, partitioner: Partitioner) -> np.ndarray:
    """Per key (a 1-D ``S`` array of keys without NUL bytes), the partition ``partitioner`` gives it."""
    check_partitioner(partitioner)
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be at least 1, got {num_partitions}")
    if partitioner == "crc32":
        return np.fromiter((zlib.crc32(k) % num_partitions for k in keys.tolist()), np.int32, count=len(keys))
    return np.fromiter(((murmur2_one(k) & 0x7FFFFFFF) % num_partitions for k in keys.tolist()), np.int32,
                       count=len(keys))
