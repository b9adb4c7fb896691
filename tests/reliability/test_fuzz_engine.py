"""Hostile input through the window engine: every message lands in exactly one bucket, with a reason,
and garbage changes nothing about the windows (about 2k generated messages per run).

The clean stream and the odd-but-valid edge cases go through one engine;
the same stream with garbage shuffled in, in batches of random sizes,
through another. Both must close the same windows with the same totals.
Bounds are wide, so that interleaving (which changes offsets, hence the
keyed choice of kept events) cannot change what is kept.
"""

from __future__ import annotations

import numpy as np
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_dp.windows import RawBatch, RejectReason
from tests.reliability.fuzz_messages import edge_cases, garbage
from tests.windows._support import NOW_MS, make_engine

SIZE_MS = 2_000
BASE_MS = NOW_MS - 60_000
SENT_MS = BASE_MS + 6_000  # when every message was sent (its Kafka record timestamp)
CLEAN = [
    orjson.dumps({"user_id": f"c{u}", "ts": BASE_MS + 700 * u % 6_000, "page": "ab"[u % 2], "value": u % 10})
    for u in range(60)
]
KNOWN_REASONS = {r.value for r in RejectReason}


def _run(values: list[bytes], cuts: list[int]):
    engine, clock = make_engine(size_ms=SIZE_MS, lateness_ms=10_000, idle_ms=60_000, clip=(0.0, 10.0),
                                max_groups=1_000, max_events=1_000)
    results = []
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(values)), len(values)]
    for lo, hi in zip(bounds, bounds[1:]):
        if lo == hi:
            continue
        # Every record sent at one time after the clean events': the clock is the same with or without garbage.
        stamps = np.full(hi - lo, SENT_MS)
        results.append(engine.process(RawBatch(values[lo:hi], np.zeros(hi - lo, np.int32), np.arange(lo, hi), stamps)))
    clock.now_ms += 10**9  # every partition idle: every window closes
    partials = [p for r in results for p in r.partials] + engine.tick()
    totals = {}
    for partial in partials:
        agg = partial.aggregate()
        for group, count, total, units in zip(agg.groups, agg.count.tolist(), agg.sum.tolist(),
                                              agg.distinct_units.tolist()):
            totals[(partial.window_start_ms, group)] = (count, total, units)
    return results, totals


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(
    junk=st.lists(garbage(NOW_MS, BASE_MS), min_size=40, max_size=80),
    edge=st.lists(edge_cases(BASE_MS), max_size=12),
    data=st.data(),
)
def test_garbage_is_rejected_with_a_reason_and_leaves_windows_unchanged(junk, edge, data):
    valid = CLEAN + edge
    clean_results, clean_totals = _run(valid, [len(valid) // 2])
    assert sum(r.accepted for r in clean_results) == len(valid)

    slots = data.draw(st.lists(st.integers(0, len(valid)), min_size=len(junk), max_size=len(junk)), label="slots")
    mixed: list[bytes] = []
    allowed: dict[int, frozenset[str] | None] = {}
    by_slot: dict[int, list[int]] = {}
    for j, slot in enumerate(slots):
        by_slot.setdefault(slot, []).append(j)
    for position in range(len(valid) + 1):
        for j in by_slot.get(position, []):
            allowed[len(mixed)] = junk[j][1]
            mixed.append(junk[j][0])
        if position < len(valid):
            mixed.append(valid[position])
    cuts = data.draw(st.lists(st.integers(1, len(mixed) - 1), max_size=6), label="batch cuts")
    results, totals = _run(mixed, cuts)

    assert all(r.balanced for r in results)  # accepted + rejected + replayed == input, batch by batch
    rejections = [x for r in results for x in r.rejections]
    by_offset = {x.offset: x for x in rejections}
    assert len(by_offset) == len(rejections), "a message was rejected twice"
    assert set(by_offset) == set(allowed), "exactly the garbage is rejected"
    for offset, rejection in by_offset.items():
        assert rejection.reason.value in KNOWN_REASONS and rejection.reason != RejectReason.LATE
        assert rejection.detail, rejection
        assert rejection.value == mixed[offset]  # the original bytes, for the dead-letter topic
        reasons = allowed[offset]
        assert reasons is None or rejection.reason.value in reasons, (rejection.reason, rejection.detail,
                                                                      mixed[offset][:200])
    assert sum(r.accepted for r in results) == len(valid)
    assert totals.keys() == clean_totals.keys()
    for key, (count, total, units) in totals.items():
        clean_count, clean_total, clean_units = clean_totals[key]
        assert (count, units) == (clean_count, clean_units), key
        assert abs(total - clean_total) <= 1e-9 * max(1.0, abs(clean_total)), key
