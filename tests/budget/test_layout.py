"""The Redis storage layout: packed states, generations, shards."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.budget import HorizonLimit, NamespacePolicy, StoreOptions
from stream_dp.budget.layout import StorageLayout
from stream_dp.budget.ledger import NamespaceLedger

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
OPTIONS = StoreOptions(max_delay_ms=HOUR_MS, max_lead_ms=900_000)


def layout(shards: int = 64) -> StorageLayout:
    policy = NamespacePolicy(
        "users", "epsilon", [HorizonLimit(HOUR_MS, 1.0, 4), HorizonLimit(DAY_MS, 4.0, 24)], alert_at=(0.8, 1.0)
    )
    return StorageLayout(NamespaceLedger(policy, OPTIONS), shards)


def test_generation_spans_everything_a_state_can_hold() -> None:
    lay = layout()
    # longest horizon + widest bucket + max delay + max lead, in whole seconds, plus a second
    assert lay.generation_ms == DAY_MS + HOUR_MS + HOUR_MS + 900_000 + 1000


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_states_round_trip_through_the_packed_form(data: st.DataObject) -> None:
    lay = layout()
    generation = 20_000
    start = generation * lay.generation_ms
    state: dict[int, int] = {}
    for plan in lay.ledger.horizons:
        # Any bucket a live state can hold: from a generation back to the end of the next one.
        low, high = (start - lay.generation_ms) // plan.bucket_ms, (start + lay.generation_ms) // plan.bucket_ms
        for bucket in data.draw(st.sets(st.integers(low, high), max_size=30)):
            state[plan.field_of(bucket)] = data.draw(st.integers(1, plan.limit_units))
        if data.draw(st.booleans()):
            # A lapse still ahead at the start of the next generation (earlier ones are pruned, not moved).
            seconds = lay.generation_ms // 1000
            lapse_ms = start + data.draw(st.integers(seconds + 1, 2 * seconds)) * 1000
            state[plan.level_field] = lapse_ms * 8 + data.draw(st.integers(1, 2))
    raw = lay.encode(state, generation)
    assert lay.decode(raw, generation) == state
    # Moving a state to the next generation re-bases it without changing it.
    assert lay.decode(lay.encode(state, generation + 1), generation + 1) == state


def test_counters_take_three_bytes_unless_a_limit_needs_four() -> None:
    lay = layout()
    plan = lay.ledger.horizons[0]
    base = lay.base_bucket(plan, 1000)
    small = {plan.field_of(base + 10): 5, plan.field_of(base + 12): 7}
    # flags, (first, count) per horizon, then 3 counters of 3 bytes (one of them a zero inside the run)
    assert len(lay.encode(small, 1000)) == 1 + 2 * 6 + 3 * 3
    assert lay.encode({}, 1000) == b""
    wide_policy = NamespacePolicy("users", "epsilon", [HorizonLimit(HOUR_MS, 20.0, 4)])
    wide = StorageLayout(NamespaceLedger(wide_policy, OPTIONS), 64)
    plan = wide.ledger.horizons[0]
    large = {plan.field_of(wide.base_bucket(plan, 1000) + 10): 2**24}
    assert len(wide.encode(large, 1000)) == 1 + 6 + 4
    assert wide.decode(wide.encode(large, 1000), 1000) == large


@pytest.mark.parametrize("raw", [b"\x00" * 7, b"\x00" * 40, b"\x00\x00\x00\x00\x00\x05\x00"])
def test_corrupt_state_is_reported(raw: bytes) -> None:
    with pytest.raises(ValueError, match="corrupt budget state"):
        layout().decode(raw, 1)


def test_shards_are_a_stable_function_of_the_id() -> None:
    lay = layout(shards=64)
    units = ["alice", "bob", "\udcff-lone-surrogate", "日本"]
    shards = lay.shard_of(units).tolist()
    assert shards[0] == zlib.crc32(b"alice") % 64
    assert shards[3] == zlib.crc32("日本".encode()) % 64
    assert shards == layout(shards=64).shard_of(units).tolist()
    assert all(0 <= s < 64 for s in shards)


def test_layout_rejects_policies_it_cannot_store() -> None:
    policy = NamespacePolicy("users", "epsilon", [HorizonLimit(255_000, 1.0, 255)])
    with pytest.raises(ValueError, match="more than 6000"):
        StorageLayout(NamespaceLedger(policy, StoreOptions(max_delay_ms=DAY_MS)), 64)
    with pytest.raises(ValueError, match="shards must be"):
        layout(shards=0)
