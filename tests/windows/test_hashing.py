from __future__ import annotations

import numpy as np
import pytest

from stream_dp.windows.hashing import (
    ContributionHasher,
    StringHasher,
    derive_key,
    siphash_reference,
    siphash_strings,
    siphash_words,
)

KEY = bytes(range(16))


def test_reference_matches_the_paper_vector():
    # Aumasson and Bernstein 2012, appendix A: SipHash-2-4, key 00..0f, message 00..0e
    assert siphash_reference(KEY, bytes(range(15))) == 0xA129CA6149BE45E5


@pytest.mark.parametrize("rounds", [(1, 3), (2, 4)])
def test_vectorised_words_match_reference(rounds):
    rng = np.random.default_rng(1)
    words = [rng.integers(0, 2**64 - 1, 64, dtype=np.uint64, endpoint=True) for _ in range(3)]
    got = siphash_words(KEY, words, c_rounds=rounds[0], d_rounds=rounds[1])
    for i in range(64):
        message = b"".join(int(w[i]).to_bytes(8, "little") for w in words)
        assert int(got[i]) == siphash_reference(KEY, message, c_rounds=rounds[0], d_rounds=rounds[1])


def test_vectorised_strings_match_reference_for_every_length():
    rng = np.random.default_rng(2)
    strings = [bytes(rng.integers(1, 256, length).astype(np.uint8)) for length in range(0, 70)]
    got = siphash_strings(KEY, np.array(strings, dtype="S"))
    assert [int(h) for h in got] == [siphash_reference(KEY, s, c_rounds=1, d_rounds=3) for s in strings]


def test_string_hash_does_not_depend_on_the_batch_width():
    alone = siphash_strings(KEY, np.array([b"user-1"], dtype="S"))
    with_long_neighbour = siphash_strings(KEY, np.array([b"user-1", b"x" * 100], dtype="S"))
    assert alone[0] == with_long_neighbour[0]


def test_siphash_rejects_bad_keys():
    with pytest.raises(ValueError, match="16-byte key"):
        siphash_words(b"short", [np.zeros(1, np.uint64)])
    with pytest.raises(ValueError, match="at least one word"):
        siphash_words(KEY, [])


def test_derived_keys_differ_by_label_and_secret():
    a = derive_key(b"s" * 32, "units")
    assert a != derive_key(b"s" * 32, "groups")
    assert a != derive_key(b"t" * 32, "units")
    assert derive_key(b"s" * 100, "units") != derive_key(b"s" * 101, "units")  # long secrets are hashed first
    assert len(derive_key(b"s" * 32, "pairs", 16)) == 16


def test_string_hasher_is_keyed_and_deterministic():
    one, two = StringHasher(b"k" * 32), StringHasher(b"j" * 32)
    data = [b"a", b"b", b""]
    assert np.array_equal(one.hash_bytes(data, 3), one.hash_bytes(data, 3))
    assert not np.array_equal(one.hash_bytes(data, 3), two.hash_bytes(data, 3))
    with pytest.raises(ValueError, match="1 to 64 bytes"):
        StringHasher(b"")


def test_contribution_hasher_needs_a_real_secret():
    with pytest.raises(ValueError, match="at least 16 bytes"):
        ContributionHasher(b"short")


def test_contribution_hashes_depend_on_every_input():
    hasher = ContributionHasher(b"q" * 32)
    units = hasher.unit_hashes(np.array([b"alice", b"bob"], dtype="S"))
    groups = hasher.group_hashes([b"s\x00\x00\x00\x01a", b"s\x00\x00\x00\x01b"])
    assert units[0] != units[1] and groups[0] != groups[1]
    u = np.repeat(units[:1], 4)
    g = np.repeat(groups[:1], 4)
    events = hasher.event_hashes(u, g, np.array([0, 1, 0, 0], np.int32), np.array([5, 5, 6, 5], np.int64))
    assert len(set(events[:3].tolist())) == 3 and events[0] == events[3]
    pairs = hasher.pair_hashes(np.array([units[0], units[0], units[1]]), np.array([groups[0], groups[1], groups[0]]))
    assert len(set(pairs.tolist())) == 3
    other = ContributionHasher(b"r" * 32)
    assert other.unit_hashes(np.array([b"alice"], dtype="S"))[0] != units[0]
