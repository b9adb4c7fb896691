"""The independent model agrees with the worker's own engine where both apply, and its hashes are SipHash.

The model is written from the README (see "Bounding, precisely"); the
engine replay (``reference``) is the production code run once without
faults. On a seeded stream with units far over both bounds and a budget
that runs out, both must produce the same partials, exclusions and late set:
if they differ, the README, the model or the engine is wrong.
"""

from __future__ import annotations

import math
import time

import pytest

from stream_dp.config import load_config
from tests.reliability.model import compute_truth, siphash_1_3
from tests.reliability.reference import compute_reference
from tests.reliability.topics import TopicRecord
from tests.reliability.workload import GAUSS_DELTA_WINDOWS, StreamSpec, encode_event, schedule, write_config

SECRET = b"model-secret-0123456789abcdef"


def test_siphash_1_3_matches_the_engines_vectorised_one():
    import numpy as np

    from stream_dp.windows.hashing import siphash_strings

    key = bytes(range(16))
    for message in (b"", b"a", b"user-0001", b"exactly8", "ünïcode-ıd".encode() * 3):
        padded = np.array([message], dtype=f"S{max(1, len(message))}")
        assert siphash_1_3(key, message) == int(siphash_strings(key, padded)[0]), message


@pytest.mark.parametrize("gaussian", [False, True], ids=["laplace", "with-gaussian-on-two-horizons-selected-groups-and-top-k"])
def test_the_model_and_the_engine_agree_on_a_seeded_stream(tmp_path, gaussian):
    spec = StreamSpec(seed=11, gaussian=gaussian, selected=gaussian, top_k=gaussian)
    write_config(tmp_path / "q.yaml", "m", "in", spec)
    config = load_config(tmp_path / "q.yaml")
    start_ms = (int(time.time() * 1000) - 60_000) // 2000 * 2000
    offsets: dict[int, int] = {}
    records = []
    for event in schedule(spec):
        offset = offsets[event.partition] = offsets.get(event.partition, -1) + 1
        records.append(TopicRecord(event.partition, offset, event.unit.encode(), encode_event(event, start_ms), {},
                                   start_ms + int(event.at_s * 1000)))
    truth = compute_truth(config, SECRET, records)
    reference = compute_reference(config, SECRET, records, spec.partitions, truth.late)
    assert set(reference.partials) == set(truth.partials)
    bounded = 0
    for key, engine in reference.partials.items():
        model = truth.partials[key]
        assert set(engine.units) == model.units and set(engine.excluded) == model.excluded, key
        cells = {g: (c, d) for g, c, d in zip(engine.groups, engine.count, engine.distinct_units) if c}
        assert cells == {g: (c, d) for g, (c, _, d) in model.groups.items() if c}, key
        for group, total in zip(engine.groups, engine.sum):
            assert math.isclose(total, model.groups.get(group, [0, 0.0])[1], abs_tol=1e-9), key
        bounded += engine.accepted_events - engine.kept_events
    assert bounded > 100, "the stream must push units over the bounds, or the hash choice goes untested"
    assert any(p.excluded for p in truth.partials.values()), "and exhaust budgets"
    for query in truth.namespace:
        assert truth.accepted[query] == reference.accepted[query]
        assert len(truth.late[query]) == spec.late_events
    if gaussian:
        # its delta limit, not its epsilon one, ends a unit's windows: three admitted, the fourth excluded
        namespace = truth.namespace["m_gauss"]
        assert truth.limits[namespace] == [(False, 1000 * 10**6), (True, GAUSS_DELTA_WINDOWS * 10**5),
                                           (False, 5 * 2 * 10**6)]
        assert truth.costs["m_gauss"] == [2 * 10**6, 10**5, 2 * 10**6]
        admitted = [len(a) for (ns, _), a in truth.admitted.items() if ns == namespace]
        assert max(admitted) == GAUSS_DELTA_WINDOWS
        assert any(p.excluded for (q, _, _), p in truth.partials.items() if q == "m_gauss")
        # selected groups: the query's epsilon and selection's delta per window, on every group with data
        assert truth.costs["m_select"] == [2 * 10**6, 10**6]
        assert {g for (q, _, _), p in truth.partials.items() if q == "m_select" for g in p.groups} == {
            ("home",), ("search",), ("cart",)}


def test_the_per_record_clock_and_the_warm_up_records(tmp_path):
    """An event is late by the newest record stamp before it, its own batch's stamp too (the strictest a
    worker's clock can be); a warm-up record is no event (rejected) but moves the clock like any record."""
    import orjson

    from tests.reliability.workload import WARM_UP_RECORD

    spec = StreamSpec(seed=3)
    write_config(tmp_path / "q.yaml", "b", "in", spec)
    config = load_config(tmp_path / "q.yaml")
    window = spec.window_ms

    def record(offset: int, event_ms: int, stamp: int) -> TopicRecord:
        value = orjson.dumps({"user_id": "u1", "ts": event_ms, "page": "home", "value": 1.0})
        return TopicRecord(0, offset, b"u1", value, {}, stamp)

    base = 1_800_000_000_000
    burst = base + 5 * window  # a stall: three events of window 1 all stamped in window 5
    records = [record(0, base + 10, base + 100), record(1, base + window + 10, burst),
               record(2, base + window + 20, burst), record(3, base + window + 30, burst + 1),
               TopicRecord(0, 4, None, WARM_UP_RECORD, {}, base + 9 * window), record(5, base + 7 * window, burst + 2)]
    truth = compute_truth(config, SECRET, records)
    assert truth.late["b_free"] == {(0, 2), (0, 3), (0, 5)}, truth.late
    assert truth.late_ends["b_free"] == {(0, 2): base + 2 * window, (0, 3): base + 2 * window,
                                         (0, 5): base + 8 * window}
    assert truth.rejected["b_free"] == {(0, 4)}
