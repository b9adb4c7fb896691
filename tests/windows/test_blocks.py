"""Sample-and-aggregate blocks in closed windows: every kept event's value with its group and its unit's block.

The reference assigns blocks from the README's definition with the
pure-Python SipHash reference, not with the engine's vectorised hasher.
"""

from __future__ import annotations

import numpy as np

from stream_dp.windows.hashing import derive_key, siphash_reference
from tests.windows._support import NOW_MS, SECRET, batch_of, event, make_engine

WINDOW_START = NOW_MS - 120_000
BLOCKS = 7


def _block(unit: str) -> int:
    h = siphash_reference(derive_key(SECRET, "stream-dp/units", 16), unit.encode(), c_rounds=1, d_rounds=3)
    return ((h * 0x9E3779B97F4A7C15 % 2**64) >> 32) % BLOCKS


def test_block_values_match_the_reference_without_excluded_units():
    rng = np.random.default_rng(0)
    events = [(f"u{u}", f"/p{g}", float(v)) for u, g, v in
              zip(rng.integers(0, 50, 500), rng.integers(0, 3, 500), np.round(rng.normal(0, 10, 500), 3))]
    engine, clock = make_engine(clip=(-1e15, 1e15))
    engine.process(batch_of([event(u, WINDOW_START + i, g, v) for i, (u, g, v) in enumerate(events)]))
    clock.now_ms += 10**9
    (partial,) = engine.tick()
    gone = {"u3", "u10"}
    totals = partial.aggregate(partial.unit_mask(gone), blocks=BLOCKS)
    got = sorted(zip([totals.groups[g][0] for g in totals.blocks.group.tolist()], totals.blocks.block.tolist(),
                     totals.blocks.value.tolist()))
    expected = sorted((g, _block(u), v) for u, g, v in events if u not in gone)
    assert got == expected
    assert totals.blocks.group.dtype == np.int32 and totals.blocks.value.dtype == np.float64
