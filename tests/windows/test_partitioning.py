"""Expected partitions against independent references: kafka-python's pure-Python
murmur2 and DefaultPartitioner, zlib's CRC-32, and published test vectors."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.partitioner.default import DefaultPartitioner
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from stream_dp.windows.partitioning import (
    PARTITIONERS,
    crc32,
    expected_partitions,
    murmur2,
)

# Kafka's UtilsTest.testMurmur2 (Java, signed int results); each also checked
# against kafka-python below, so a mistyped vector fails rather than misleads.
JAVA_MURMUR2_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}

# Ids without NUL, 1 to 300 bytes: arbitrary bytes, and UTF-8 text (multi-byte characters included).
raw_ids = st.lists(st.integers(1, 255), min_size=1, max_size=300).map(bytes)
text_ids = (
    st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1, max_size=300)
    .map(lambda s: s.encode("utf-8"))
    .filter(lambda b: len(b) <= 300)
)
ids = st.one_of(raw_ids, text_ids)
batches = st.lists(ids, min_size=0, max_size=40)


def as_array(keys: list[bytes]) -> np.ndarray:
    return np.array(keys, dtype="S")


class AllPartitionsAvailable:
    """The three ClusterMetadata calls DefaultPartitioner makes, for one topic."""

    def __init__(self, topic: str, partitions: int) -> None:
        self.topic, self.partitions = topic, set(range(partitions))

    def topics(self) -> set[str]:
        return {self.topic}

    def partitions_for_topic(self, topic: str) -> set[int]:
        return self.partitions

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return self.partitions


def kafka_python_partition(key: bytes, partitions: int) -> int:
    cluster = AllPartitionsAvailable("events", partitions)
    return DefaultPartitioner().partition("events", key, key, b"{}", b"{}", cluster)


# -- murmur2 ------------------------------------------------------------------------------


def test_murmur2_matches_javas_published_vectors():
    keys = list(JAVA_MURMUR2_VECTORS)
    java_unsigned = [v & 0xFFFFFFFF for v in JAVA_MURMUR2_VECTORS.values()]
    assert [kafka_python_murmur2(k) for k in keys] == java_unsigned
    got = murmur2(as_array(keys))
    assert got.dtype == np.uint32
    assert got.tolist() == java_unsigned
    assert got.view(np.int32).tolist() == list(JAVA_MURMUR2_VECTORS.values())  # Java's signed view


@settings(max_examples=300, deadline=None)
@given(batches)
def test_murmur2_matches_kafka_python(keys):
    assert murmur2(as_array(keys)).tolist() == [kafka_python_murmur2(k) for k in keys]


def test_murmur2_every_length_and_tail_in_one_batch():
    rng = np.random.default_rng(3)
    keys = [bytes(rng.integers(1, 256, length).astype(np.uint8)) for length in range(1, 70)] + [b"x" * 256]
    for batch in (keys, keys[::-1], [keys[0], keys[-1]]):
        assert murmur2(as_array(batch)).tolist() == [kafka_python_murmur2(k) for k in batch]


def test_hash_does_not_depend_on_the_batch_width():
    alone = as_array([b"user-1"])
    with_long_neighbour = as_array([b"user-1", b"z" * 256])
    assert murmur2(alone)[0] == murmur2(with_long_neighbour)[0]
    assert crc32(alone)[0] == crc32(with_long_neighbour)[0]


# -- crc32 --------------------------------------------------------------------------------


def test_crc32_check_value():
    # the CRC-32 (IEEE) catalogue check value of "123456789"
    assert crc32(as_array([b"123456789"])).tolist() == [0xCBF43926]


@settings(max_examples=300, deadline=None)
@given(batches)
def test_crc32_matches_zlib(keys):
    got = crc32(as_array(keys))
    assert got.dtype == np.uint32
    assert got.tolist() == [zlib.crc32(k) for k in keys]


# -- expected partitions ------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(batches, st.integers(1, 1000))
def test_murmur2_partition_is_kafka_pythons_producer_choice(keys, partitions):
    got = expected_partitions(as_array(keys), partitions, "murmur2")
    assert got.dtype == np.int32
    assert got.tolist() == [kafka_python_partition(k, partitions) for k in keys]


@settings(max_examples=200, deadline=None)
@given(batches, st.integers(1, 1000))
def test_crc32_partition_is_librdkafkas_consistent_choice(keys, partitions):
    got = expected_partitions(as_array(keys), partitions, "crc32")
    assert got.dtype == np.int32
    assert got.tolist() == [zlib.crc32(k) % partitions for k in keys]


def test_non_ascii_ids():
    units = ["ユーザー-7", "émilie", "🙂🙂", "ß"]
    keys = [u.encode("utf-8") for u in units]
    arr = np.array(keys, dtype="S")
    assert expected_partitions(arr, 12).tolist() == [kafka_python_partition(k, 12) for k in keys]
    assert expected_partitions(arr, 12, "crc32").tolist() == [zlib.crc32(k) % 12 for k in keys]


def test_large_partition_counts_and_the_sign_bit():
    # keys whose murmur2 has the top bit set: Java's hash is negative, toPositive clears the bit
    keys = [k for k in JAVA_MURMUR2_VECTORS if JAVA_MURMUR2_VECTORS[k] < 0]
    partitions = 2**31 - 1
    got = expected_partitions(as_array(keys), partitions)
    assert got.tolist() == [(kafka_python_murmur2(k) & 0x7FFFFFFF) % partitions for k in keys]
    assert (got >= 0).all()
    crc = expected_partitions(as_array([b"123456789"]), partitions, "crc32")
    assert crc.tolist() == [0xCBF43926 % partitions]


@pytest.mark.parametrize("partitioner", PARTITIONERS)
def test_empty_batch(partitioner):
    for empty in (np.array([], dtype="S"), np.array([], dtype="S40")):
        got = expected_partitions(empty, 8, partitioner)
        assert got.dtype == np.int32 and got.shape == (0,)


def test_strided_slices_of_a_batch():
    keys = as_array([b"u1", b"skip", b"u22", b"skip", b"u333"])
    every_other = keys[::2]
    assert not every_other.flags.c_contiguous
    expected = [kafka_python_partition(k, 7) for k in (b"u1", b"u22", b"u333")]
    assert expected_partitions(every_other, 7).tolist() == expected
    assert crc32(every_other).tolist() == [zlib.crc32(k) for k in (b"u1", b"u22", b"u333")]


def test_one_partition_puts_everything_on_zero():
    keys = as_array([b"a", b"bb", b"ccc"])
    assert expected_partitions(keys, 1).tolist() == [0, 0, 0]
    assert expected_partitions(keys, 1, "crc32").tolist() == [0, 0, 0]


# -- input validation ---------------------------------------------------------------------


@pytest.mark.parametrize("partitions", [0, -3])
def test_rejects_fewer_than_one_partition(partitions):
    with pytest.raises(ValueError, match="between 1 and .*partition count"):
        expected_partitions(as_array([b"u1"]), partitions)


def test_rejects_non_integer_partition_counts():
    with pytest.raises(TypeError, match="integer"):
        expected_partitions(as_array([b"u1"]), 3.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="integer"):
        expected_partitions(as_array([b"u1"]), True)


def test_unknown_partitioner_names_the_known_ones():
    with pytest.raises(ValueError, match="'murmur2', 'crc32'"):
        expected_partitions(as_array([b"u1"]), 3, "consistent_random")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "keys",
    [[b"u1"], np.array(["u1"]), np.array([b"u1", b"u2"], dtype="S").reshape(1, 2), np.array([1, 2])],
)
def test_rejects_keys_that_are_not_a_flat_bytes_array(keys):
    with pytest.raises(TypeError, match="dtype='S'"):
        expected_partitions(keys, 3)
