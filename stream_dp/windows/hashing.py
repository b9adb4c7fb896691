"""Keyed hashes that choose which contributions survive bounding.

Two keyed PRFs, each use under its own sub-key derived from one secret:

* SipHash-1-3 (Aumasson and Bernstein, "SipHash: a fast short-input PRF",
  2012; the 1-3 round variant is the one CPython and Rust use for their hash
  tables), evaluated over whole numpy arrays at once, for privacy-unit ids
  (their UTF-8 bytes), for (unit hash, group hash) -- the per-unit group
  choice -- and for (unit hash, group hash, partition, offset) -- the
  per-group event choice;
* keyed BLAKE2b with an 8-byte digest (RFC 7693) for encoded group keys,
  once per distinct group.

Keeping the k smallest values of a PRF is a uniformly random choice of k
items for anyone who does not hold the secret, yet the same input always
gives the same choice: bounding is unbiased and deterministic under replay.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

_U64 = np.uint64
_SIP_INIT = (0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573)
_MASK64 = (1 << 64) - 1


def derive_key(secret: bytes, label: str, size: int = 32) -> bytes:
    """A sub-key for one use, so that no two constructions share a key.

    ``BLAKE2b(key=secret', data=label)`` where ``secret'`` is the secret itself
    when it fits BLAKE2b's 64-byte key, else its unkeyed BLAKE2b digest.
    """
    base = secret if len(secret) <= 64 else hashlib.blake2b(secret).digest()
    return hashlib.blake2b(label.encode("ascii"), key=base, digest_size=size).digest()


class StringHasher:
    """Keyed BLAKE2b-64 of byte strings, as unsigned 64-bit integers."""

    def __init__(self, key: bytes) -> None:
        if not 1 <= len(key) <= 64:
            raise ValueError(f"BLAKE2b keys are 1 to 64 bytes long, got {len(key)}; derive one with derive_key()")
        self._template = hashlib.blake2b(key=key, digest_size=8)

    def hash_bytes(self, data: Iterable[bytes], count: int) -> np.ndarray:
        """Hash ``count`` byte strings; returns a ``uint64`` array in input order."""
        template = self._template
        digests = bytearray()
        for item in data:
            h = template.copy()
            h.update(item)
            digests += h.digest()
        out = np.frombuffer(bytes(digests), dtype="<u8", count=count)
        return out.astype(_U64, copy=True)


def _rotl(x: np.ndarray, bits: int, scratch: np.ndarray) -> None:
    np.left_shift(x, _U64(bits), out=scratch)
    np.right_shift(x, _U64(64 - bits), out=x)
    np.bitwise_or(x, scratch, out=x)


def _sip_round(v0: np.ndarray, v1: np.ndarray, v2: np.ndarray, v3: np.ndarray, t: np.ndarray) -> None:
    v0 += v1
    _rotl(v1, 13, t)
    v1 ^= v0
    _rotl(v0, 32, t)
    v2 += v3
    _rotl(v3, 16, t)
    v3 ^= v2
    v0 += v3
    _rotl(v3, 21, t)
    v3 ^= v0
    v2 += v1
    _rotl(v1, 17, t)
    v1 ^= v2
    _rotl(v2, 32, t)


def _siphash_blocks(key: bytes, blocks: list[np.ndarray], n: int, c_rounds: int, d_rounds: int) -> np.ndarray:
    """SipHash-c-d over ready-made 64-bit blocks (the last one already holding the length byte)."""
    if len(key) != 16:
        raise ValueError(f"SipHash takes a 16-byte key, got {len(key)} bytes")
    k0 = int.from_bytes(key[:8], "little")
    k1 = int.from_bytes(key[8:], "little")
    v0 = np.full(n, k0 ^ _SIP_INIT[0], _U64)
    v1 = np.full(n, k1 ^ _SIP_INIT[1], _U64)
    v2 = np.full(n, k0 ^ _SIP_INIT[2], _U64)
    v3 = np.full(n, k1 ^ _SIP_INIT[3], _U64)
    scratch = np.empty(n, _U64)
    for m in blocks:
        v3 ^= m
        for _ in range(c_rounds):
            _sip_round(v0, v1, v2, v3, scratch)
        v0 ^= m
    v2 ^= _U64(0xFF)
    for _ in range(d_rounds):
        _sip_round(v0, v1, v2, v3, scratch)
    v0 ^= v1
    v2 ^= v3
    v0 ^= v2
    return v0


def siphash_words(key: bytes, words: list[np.ndarray], *, c_rounds: int = 1, d_rounds: int = 3) -> np.ndarray:
    """SipHash-c-d of each row of 64-bit little-endian words, vectorised.

    Row ``i`` is the message ``words[0][i] || words[1][i] || ...`` (each word
    8 bytes, little-endian), so the result equals the reference SipHash of
    that ``8 * len(words)``-byte string under the 16-byte ``key``.
    """
    if not words:
        raise ValueError("SipHash needs at least one word column")
    blocks = [np.asarray(w).astype(_U64, copy=False) for w in words]
    blocks.append(_U64(((8 * len(words)) & 0xFF) << 56))
    return _siphash_blocks(key, blocks, len(words[0]), c_rounds, d_rounds)


def byte_lengths(padded: np.ndarray) -> np.ndarray:
    """Lengths of the strings of a fixed-width ``S`` array whose strings contain no NUL byte."""
    width = padded.dtype.itemsize
    if width == 0 or len(padded) == 0:
        return np.zeros(len(padded), dtype=np.int64)
    matrix = padded.view(np.uint8).reshape(len(padded), width)
    return np.count_nonzero(matrix, axis=1).astype(np.int64)


def siphash_strings(key: bytes, padded: np.ndarray, *, c_rounds: int = 1, d_rounds: int = 3) -> np.ndarray:
    """Reference SipHash-c-d of each string of a fixed-width ``S`` array (strings without NUL bytes).

    Rows are bucketed by their number of whole 8-byte words, so every row
    is hashed over exactly its own bytes whatever the array's width.
    """
    n = len(padded)
    width = padded.dtype.itemsize
    lengths = byte_lengths(padded)
    words_per_row = (width + 7) // 8 + 1  # one spare zero word for the final block
    matrix = np.zeros((n, words_per_row * 8), dtype=np.uint8)
    if width:
        matrix[:, :width] = padded.view(np.uint8).reshape(n, width)
    words = matrix.view("<u8").astype(_U64)
    out = np.empty(n, dtype=_U64)
    whole = lengths // 8
    for count in np.unique(whole).tolist():
        rows = np.flatnonzero(whole == count)
        final = words[rows, count] | ((lengths[rows].astype(_U64) & _U64(0xFF)) << _U64(56))
        blocks = [words[rows, j] for j in range(count)] + [final]
        out[rows] = _siphash_blocks(key, blocks, len(rows), c_rounds, d_rounds)
    return out


def siphash_reference(key: bytes, message: bytes, *, c_rounds: int = 2, d_rounds: int = 4) -> int:
    """Scalar SipHash-c-d straight from the paper, to check the vectorised one."""
    k0 = int.from_bytes(key[:8], "little")
    k1 = int.from_bytes(key[8:16], "little")
    v = [k0 ^ _SIP_INIT[0], k1 ^ _SIP_INIT[1], k0 ^ _SIP_INIT[2], k1 ^ _SIP_INIT[3]]

    def rotl(x: int, b: int) -> int:
        return ((x << b) | (x >> (64 - b))) & _MASK64

    def sip_round() -> None:
        v[0] = (v[0] + v[1]) & _MASK64
        v[1] = rotl(v[1], 13) ^ v[0]
        v[0] = rotl(v[0], 32)
        v[2] = (v[2] + v[3]) & _MASK64
        v[3] = rotl(v[3], 16) ^ v[2]
        v[0] = (v[0] + v[3]) & _MASK64
        v[3] = rotl(v[3], 21) ^ v[0]
        v[2] = (v[2] + v[1]) & _MASK64
        v[1] = rotl(v[1], 17) ^ v[2]
        v[2] = rotl(v[2], 32)

    tail = len(message) % 8
    blocks = [int.from_bytes(message[i : i + 8], "little") for i in range(0, len(message) - tail, 8)]
    last = int.from_bytes(message[len(message) - tail :], "little") | ((len(message) & 0xFF) << 56)
    for m in [*blocks, last]:
        v[3] ^= m
        for _ in range(c_rounds):
            sip_round()
        v[0] ^= m
    v[2] ^= 0xFF
    for _ in range(d_rounds):
        sip_round()
    return v[0] ^ v[1] ^ v[2] ^ v[3]


class ContributionHasher:
    """All keyed hashes bounding needs, from one secret.

    * ``unit_hashes``: SipHash-1-3 of the unit id's UTF-8 bytes, over a
      whole batch at once (the ids arrive as a fixed-width ``S`` array);
    * ``group_hashes``: BLAKE2b-64 of the encoded group key, once per distinct group;
    * ``pair_hashes``: SipHash-1-3 of (unit hash, group hash) -- the order in
      which a unit's groups are kept;
    * ``event_hashes``: SipHash-1-3 of (unit hash, group hash, partition,
      offset) -- the order in which a (unit, group)'s events are kept.
    """

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError(
                f"the bounding secret must be at least 16 bytes, got {len(secret)}; "
                "generate one with secrets.token_bytes(32) and keep it in the worker's secret store"
            )
        self._unit_key = derive_key(secret, "stream-dp/units", 16)
        self._groups = StringHasher(derive_key(secret, "stream-dp/groups"))
        self._pair_key = derive_key(secret, "stream-dp/pairs", 16)
        self._event_key = derive_key(secret, "stream-dp/events", 16)

    def unit_hashes(self, padded_units: np.ndarray) -> np.ndarray:
        return siphash_strings(self._unit_key, padded_units)

    def group_hashes(self, encoded_keys: list[bytes]) -> np.ndarray:
        return self._groups.hash_bytes(encoded_keys, len(encoded_keys))

    def pair_hashes(self, unit_hash: np.ndarray, group_hash: np.ndarray) -> np.ndarray:
        return siphash_words(self._pair_key, [unit_hash, group_hash])

    def event_hashes(
        self, unit_hash: np.ndarray, group_hash: np.ndarray, partitions: np.ndarray, offsets: np.ndarray
    ) -> np.ndarray:
        # partition and offset are reinterpreted as their two's-complement 64-bit words
        return siphash_words(
            self._event_key,
            [unit_hash, group_hash, partitions.astype(np.int64).view(_U64), offsets.astype(np.int64).view(_U64)],
        )
