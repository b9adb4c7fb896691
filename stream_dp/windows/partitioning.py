"""The partition a Kafka producer chooses for each privacy-unit id, for a whole batch at once.

Co-partitioning contract: every event's message key is its privacy-unit id
(UTF-8 bytes) and the event sits on the partition the producer's
partitioner assigns to that key. All of a unit's events then land in one
partition, so its contribution is bounded in one place. The engine
dead-letters events found anywhere else, and needs, per batch, the expected
partition of every event's unit; this module computes it with numpy, looping
over byte or block positions, never over keys.

Two partitioners cover the common clients (``Partitioner``):

* ``"murmur2"``: ``toPositive(murmur2(key)) % partitions`` with
  ``toPositive(h) = h & 0x7fffffff`` -- the Java client's default
  (``org.apache.kafka.common.utils.Utils.murmur2``, MurmurHash2 by Austin
  Appleby with Kafka's seed), kafka-python's ``DefaultPartitioner`` and
  librdkafka's ``murmur2`` / ``murmur2_random``;
* ``"crc32"``: ``crc32(key) % partitions`` with the IEEE 802.3 CRC-32
  (reflected polynomial 0xEDB88320, initial value and final XOR 0xFFFFFFFF;
  the same function as ``zlib.crc32``) -- librdkafka's ``consistent`` and its
  default ``consistent_random`` for non-empty keys (confluent-kafka, Go,
  .NET and other librdkafka-based clients).

Ids arrive as a 1-D fixed-width ``S`` array, UTF-8 and never containing NUL
(the decoder rejects such ids), so an id's bytes are exactly those before
the NUL padding. An empty id hashes as the empty key, which is what the Java
client does; librdkafka's ``consistent_random`` would place an empty key at
random, but the decoder rejects empty ids before they get here.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

Partitioner = Literal["murmur2", "crc32"]
PARTITIONERS: tuple[str, ...] = get_args(Partitioner)

_U32 = np.uint32

# MurmurHash2 as in Kafka's Utils.murmur2: seed, multiplier m and shift r.
_MURMUR_SEED = _U32(0x9747B28C)
_MURMUR_M = _U32(0x5BD1E995)
_MURMUR_R = _U32(24)

_CRC32_POLY = 0xEDB88320  # IEEE 802.3, bit-reflected
_CRC32_INIT = _U32(0xFFFFFFFF)  # initial register, also XORed into the result
_BYTE = _U32(0xFF)
_EIGHT = _U32(8)


def _crc32_byte_table() -> np.ndarray:
    """``table[b]``: the CRC register after shifting byte ``b`` through eight reflected steps."""
    table = np.empty(256, dtype=_U32)
    for byte in range(256):
        register = byte
        for _ in range(8):
            register = (register >> 1) ^ _CRC32_POLY if register & 1 else register >> 1
        table[byte] = register
    return table


_CRC32_TABLE = _crc32_byte_table()


def _check_keys(keys: np.ndarray) -> None:
    if not isinstance(keys, np.ndarray) or keys.ndim != 1 or keys.dtype.kind != "S":
        if isinstance(keys, np.ndarray):
            described = f"array of dtype {keys.dtype} with shape {keys.shape}"
        else:
            described = type(keys).__name__
        raise TypeError(
            f"keys must be a 1-D fixed-width bytes array (dtype 'S<width>'), got a {described}; "
            "convert UTF-8 ids with np.array([s.encode('utf-8') for s in ids], dtype='S')"
        )


class _ByLength:
    """A batch's rows ordered by decreasing length, so that the rows still
    running at any byte or block position are a prefix: each step then works
    on a contiguous slice instead of masking every row of the batch.

    When every id has the same length (the usual case: ``u123456``, UUIDs)
    the order is the identity and no copy is made.
    """

    def __init__(self, lengths: np.ndarray, unit: int) -> None:
        steps = lengths // unit
        if len(steps) and steps.min() != steps.max():
            longest = int(steps.max())
            # numpy's stable sort is a radix sort for 16-bit keys: ~15x faster than on int64
            descending = (longest - steps).astype(np.uint16 if longest < 2**16 else np.int64)
            self.order: np.ndarray | None = np.argsort(descending, kind="stable")
            steps = steps[self.order]
        else:
            self.order = None
        self.steps = steps
        self.lengths = lengths if self.order is None else lengths[self.order]
        self.max_steps = int(steps[0]) if len(steps) else 0
        # running[j]: how many rows (a prefix) have more than j whole steps
        self.running = np.searchsorted(-steps, -np.arange(1, self.max_steps + 1), side="right")

    def rows(self, matrix: np.ndarray) -> np.ndarray:
        return matrix if self.order is None else matrix[self.order]

    def restore(self, values: np.ndarray) -> np.ndarray:
        """Values computed in sorted order, back in the caller's order."""
        if self.order is None:
            return values
        out = np.empty_like(values)
        out[self.order] = values
        return out


def _byte_lengths(keys: np.ndarray) -> np.ndarray:
    """Each id's length in bytes: ``str_len`` of an ``S`` array stops at the NUL
    padding, and ids hold no NUL of their own (several times faster than
    counting non-zero bytes)."""
    return np.strings.str_len(keys).astype(np.int64)


def _byte_matrix(keys: np.ndarray, width: int) -> np.ndarray:
    """The ids' bytes as an ``(n, width)`` uint8 matrix, zero-padded (``width`` >= the array's)."""
    matrix = np.zeros((len(keys), width), dtype=np.uint8)
    if keys.dtype.itemsize:
        # a strided slice of a batch cannot be viewed as bytes in place
        contiguous = np.ascontiguousarray(keys)
        matrix[:, : keys.dtype.itemsize] = contiguous.view(np.uint8).reshape(len(keys), keys.dtype.itemsize)
    return matrix


def murmur2(keys: np.ndarray) -> np.ndarray:
    """Kafka's MurmurHash2 of each id, as **unsigned** 32-bit integers (``uint32``).

    Java's ``Utils.murmur2`` returns the same 32 bits as a signed ``int``;
    kafka-python returns them unsigned, as here. Per key of length ``L``::

        h = seed ^ L
        for each little-endian 4-byte block k:
            k *= m; k ^= k >>> r; k *= m
            h *= m; h ^= k
        if L % 4: h ^= tail bytes (little-endian); h *= m
        h ^= h >>> 13; h *= m; h ^= h >>> 15

    all modulo 2**32, with ``seed = 0x9747b28c``, ``m = 0x5bd1e995``, ``r = 24``.
    """
    _check_keys(keys)
    n = len(keys)
    lengths = _byte_lengths(keys)
    by_length = _ByLength(lengths, 4)
    # one spare zero word so that every key has a (possibly empty) tail word
    words = by_length.rows(_byte_matrix(keys, (keys.dtype.itemsize // 4 + 1) * 4)).view("<u4")
    h = _MURMUR_SEED ^ by_length.lengths.astype(_U32)
    k = np.empty(n, dtype=_U32)
    for block in range(by_length.max_steps):
        running = int(by_length.running[block])
        k_run, h_run = k[:running], h[:running]
        np.multiply(words[:running, block], _MURMUR_M, out=k_run)
        k_run ^= k_run >> _MURMUR_R
        k_run *= _MURMUR_M
        h_run *= _MURMUR_M
        h_run ^= k_run
    # The tail bytes read as a little-endian word are exactly Java's XORs of
    # byte << 16, << 8 and << 0, since the padding beyond the key is zero.
    h ^= words[np.arange(n), by_length.steps]
    has_tail = (by_length.lengths % 4) != 0
    h[has_tail] *= _MURMUR_M
    h ^= h >> _U32(13)
    h *= _MURMUR_M
    h ^= h >> _U32(15)
    return by_length.restore(h)


def crc32(keys: np.ndarray) -> np.ndarray:
    """CRC-32 (IEEE 802.3, as ``zlib.crc32``) of each id, as unsigned 32-bit integers.

    Table-driven, reflected: starting from ``c = 0xFFFFFFFF``, for each byte
    ``b``: ``c = table[(c ^ b) & 0xFF] ^ (c >> 8)``; the result is
    ``c ^ 0xFFFFFFFF``. The loop runs over byte positions, each step over the
    ids still that long. (At 20k ids of 7 to 36 bytes, of one length or mixed, this matched or beat
    one ``zlib.crc32`` call per id; ``tests/perf/bench_partitioning.py``
    measures both.)
    """
    _check_keys(keys)
    n = len(keys)
    by_length = _ByLength(_byte_lengths(keys), 1)
    matrix = by_length.rows(_byte_matrix(keys, keys.dtype.itemsize))
    register = np.full(n, _CRC32_INIT, dtype=_U32)
    index = np.empty(n, dtype=_U32)
    for position in range(by_length.max_steps):
        running = int(by_length.running[position])
        reg_run, index_run = register[:running], index[:running]
        np.bitwise_xor(reg_run, matrix[:running, position], out=index_run)
        index_run &= _BYTE
        reg_run >>= _EIGHT
        reg_run ^= _CRC32_TABLE[index_run]
    register ^= _CRC32_INIT
    return by_length.restore(register)


def check_partitioner(partitioner: str) -> None:
    """Raise ``ValueError`` unless ``partitioner`` is one of ``PARTITIONERS``."""
    if partitioner not in PARTITIONERS:
        raise ValueError(
            f"unknown partitioner {partitioner!r}; use one of {', '.join(map(repr, PARTITIONERS))} "
            "('murmur2' for the Java client, kafka-python and librdkafka's murmur2_random; "
            "'crc32' for librdkafka's default consistent_random)"
        )


def expected_partitions(keys: np.ndarray, num_partitions: int, partitioner: Partitioner = "murmur2") -> np.ndarray:
    """The partition (``int32``) the producer's ``partitioner`` assigns to each id's key.

    * ``"murmur2"``: ``(murmur2(key) & 0x7fffffff) % num_partitions``;
    * ``"crc32"``: ``crc32(key) % num_partitions`` (unsigned CRC, as librdkafka).
    """
    check_partitioner(partitioner)
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, (int, np.integer)):
        raise TypeError(f"num_partitions must be an integer, got {type(num_partitions).__name__}")
    if not 1 <= num_partitions <= 2**31 - 1:
        raise ValueError(
            f"num_partitions must be between 1 and 2**31 - 1, got {num_partitions}; "
            "pass the input topic's partition count"
        )
    if partitioner == "murmur2":
        hashes = murmur2(keys) & _U32(0x7FFFFFFF)
    else:
        hashes = crc32(keys)
    return (hashes % _U32(num_partitions)).astype(np.int32)
