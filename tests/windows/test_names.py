from __future__ import annotations

import numpy as np

from stream_dp.windows.names import UnitNames, to_str


def test_round_trip_of_ids_of_different_lengths():
    ids = np.array(["", "a", "ab" * 20, "ü-€"], dtype=object)
    padded = np.array([s.encode() for s in ids], dtype="S")
    hashes = np.array([40, 10, 30, 20], dtype=np.uint64)
    order = np.argsort(hashes)
    names = UnitNames.from_sorted(hashes[order], padded[order])
    assert to_str(names.padded(np.array([30, 20], dtype=np.uint64))) == ["ab" * 20, "ü-€"]
    assert to_str(names.padded(np.array([10], dtype=np.uint64))) == ["a"]
    assert names.nbytes == 4 * 8 + 5 * 8 + len("".join(ids).encode())


def test_empty_store():
    names = UnitNames.empty()
    assert names.padded(np.zeros(0, dtype=np.uint64)).shape == (0,)
    assert to_str(np.zeros(0, dtype="S1")) == []
