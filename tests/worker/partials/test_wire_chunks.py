"""Partials on the wire: binary frames in chunk records that fit a given record size, reassembled once by
the release stage's intake; partials of wire version 1 still read; other versions counted and skipped."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml
from prometheus_client import CollectorRegistry

from stream_dp.config import parse_config
from stream_dp.dp.histogram import SparseHistogram
from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.windows import EventSchema
from stream_dp.windows.partial import BlockValues
from stream_dp.wire import UnknownWireVersion, WireFormatError
from stream_dp.worker.combine.combiner import WindowCombiner
from stream_dp.worker.ingest.partials_out import partial_message
from stream_dp.worker.partials.wire import (
    MIN_CHUNK_PAYLOAD,
    PartialAggregate,
    Progress,
    decode_internal,
    encode_progress,
    partial_records,
    read_internal,
)
from stream_dp.worker.query.costs import build_plan
from stream_dp.worker.query.runtime import QueryRuntime
from stream_dp.worker.release.intake import PartialsIntake, PartialsReader
from tests.windows._support import NOW_MS as ENGINE_NOW_MS
from tests.windows._support import batch_of, event, make_engine

REPO = Path(__file__).resolve().parents[3]

HOUR_MS = 3_600_000
NOW_MS = 1_800_000_000_000


def _partial(rows: int = 3, **overrides) -> PartialAggregate:
    rng = np.random.default_rng(rows)
    values = dict(
        query="q", window_start_ms=NOW_MS - 120_000, window_end_ms=NOW_MS - 60_000, partition=2, input_partitions=3,
        groups=[(f"/page/{rng.integers(1 << 40):x}", int(i % 7)) for i in range(rows)],
        count=rng.integers(1, 100, rows), sum=rng.uniform(0, 10, rows), distinct_units=rng.integers(1, 50, rows),
        units_charged=11, units_excluded=2, closed_at_ms=NOW_MS - 50_000, placement_partitions=3,
        placement_changed=False,
    )
    values.update(overrides)
    return PartialAggregate(**values)


def _same(a: PartialAggregate, b: PartialAggregate) -> bool:
    arrays = ("count", "sum", "distinct_units", "histogram")
    plain = {k: v for k, v in a.__dict__.items() if k not in arrays}
    return plain == {k: v for k, v in b.__dict__.items() if k not in arrays} and all(
        (getattr(a, k) is None and getattr(b, k) is None)
        or (k == "histogram" and getattr(a, k) == getattr(b, k))
        or (k != "histogram" and np.array_equal(getattr(a, k), getattr(b, k)))
        for k in arrays)


def _intake(registry: CollectorRegistry, age_limit_ms: int = 7 * 24 * HOUR_MS) -> PartialsIntake:
    return PartialsIntake(WorkerMetrics(registry=registry), topic="p", age_limit_ms=age_limit_ms,
                          quiet_ms=lambda name: 60_000 if name == "q" else None)


def _errors(registry: CollectorRegistry, kind: str) -> float:
    return registry.get_sample_value("stream_dp_internal_errors_total", {"kind": kind}) or 0.0


def test_a_large_partial_takes_several_records_each_within_the_limit_and_comes_back_whole():
    partial = _partial(50_000)
    records = partial_records(partial, 64 * 1024)
    assert len(records) > 5 and max(map(len, records)) <= 64 * 1024
    registry = CollectorRegistry()
    intake = _intake(registry)
    taken = [intake.take(0, 100 + i, value, NOW_MS - 40_000 + i, NOW_MS) for i, value in enumerate(records)]
    assert taken[:-1] == [None] * (len(records) - 1)
    assert intake.holds() == [] and taken[-1].source == (0, 100)  # the commit holds at the first chunk
    assert _same(taken[-1].message, partial) and taken[-1].timestamp_ms == NOW_MS - 40_000
    # mid-way, the commit may not pass the first chunk
    again = _intake(CollectorRegistry())
    for i, value in enumerate(records[:3]):
        again.take(0, 7 + i, value, NOW_MS, NOW_MS)
    assert again.holds() == [(0, 7)]


def test_partials_round_trip_in_one_record_and_from_a_reader():
    for partial in (_partial(), _partial(0), _partial(sum=None), _partial(2, placement_changed=True),
                    _partial(settings="cfbddac1b92b4832")):
        (record,) = partial_records(partial, 1_000_000)
        assert _same(PartialsReader().read(0, 0, record), partial)
    progress = Progress("q", 1, 3, 180_000)
    assert PartialsReader().read(0, 0, encode_progress(progress)) == progress


def test_groups_without_fields_and_with_integer_keys_survive():
    partial = _partial(2, groups=[(), ()])
    assert PartialsReader().read(0, 0, partial_records(partial, 10_000)[0]).groups == [(), ()]


def test_the_settings_fingerprint_comes_back_from_every_chunking():
    """In the partial's frame: every chunking of it (and the one-chunk fast path) returns it as written."""
    for rows, limit in ((50_000, 64 * 1024), (50_000, 16 * 1024), (3, 1_000_000)):
        partial = _partial(rows, settings="cfbddac1b92b4832")
        records = partial_records(partial, limit)
        assert (len(records) > 1) == (rows > 3)
        intake = _intake(CollectorRegistry())
        taken = [intake.take(0, i, value, NOW_MS - 40_000, NOW_MS) for i, value in enumerate(records)][-1]
        assert taken.message.settings == "cfbddac1b92b4832" and _same(taken.message, partial)
        if len(records) == 1:
            assert decode_internal(records[0]).settings == "cfbddac1b92b4832"


def test_too_small_a_record_limit_is_refused_with_the_size_needed():
    with pytest.raises(ValueError, match=f"at least {MIN_CHUNK_PAYLOAD + 1024} bytes"):
        partial_records(_partial(), MIN_CHUNK_PAYLOAD)


def _json_partial(version: int = 1) -> bytes:
    """A partial as workers of wire version 1 wrote it: one JSON record."""
    return orjson.dumps({
        "v": version, "type": "partial", "query": "q", "window_start_ms": NOW_MS - 120_000,
        "window_end_ms": NOW_MS - 60_000, "partition": 1, "input_partitions": 3, "groups": [["/a"], ["/b"]],
        "count": [3, 1], "sum": [1.5, 2.0], "distinct_units": [2, 1], "units_charged": 3, "units_excluded": 0,
        "closed_at_ms": NOW_MS - 50_000,
    })


def test_partials_of_wire_version_1_are_still_read():
    message = read_internal(_json_partial())
    assert isinstance(message, PartialAggregate)
    assert message.groups == [("/a",), ("/b",)] and message.count.tolist() == [3, 1]
    assert (message.placement_partitions, message.placement_changed) == (0, False)
    assert message.settings is None  # charged under settings it does not state: never combined


def test_records_of_an_unknown_wire_version_are_counted_and_skipped_with_a_clear_error(caplog):
    binary = bytearray(partial_records(_partial(), 100_000)[0])
    binary[4] = 9
    for value in (bytes(binary), _json_partial(version=7)):
        with pytest.raises(UnknownWireVersion, match="run the same version on every worker"):
            read_internal(value)
    registry = CollectorRegistry()
    intake = _intake(registry)
    assert intake.take(0, 0, bytes(binary), NOW_MS, NOW_MS) is None
    assert intake.take(0, 1, _json_partial(version=7), NOW_MS, NOW_MS) is None
    assert _errors(registry, "unknown_wire_version") == 2
    assert "wire version 9" in caplog.text and "wire version 7" in caplog.text


@pytest.mark.parametrize("value", [b"", b"\x00SDP", b"{", b'{"v": 1, "type": "gossip"}', b"\x00SDP\x02F\x02\x00\x00\x00{}"])
def test_corrupt_records_raise_one_error_type_and_are_counted(value):
    with pytest.raises(WireFormatError):
        read_internal(value)
    registry = CollectorRegistry()
    assert _intake(registry).take(0, 0, value, NOW_MS, NOW_MS) is None
    assert _errors(registry, "corrupt_internal_record") == 1


def test_a_partial_with_any_chunk_past_the_release_age_is_dropped_whole():
    records = partial_records(_partial(20_000), 32 * 1024)
    registry = CollectorRegistry()
    intake = _intake(registry, age_limit_ms=HOUR_MS)
    assert intake.take(0, 0, records[0], NOW_MS - 2 * HOUR_MS, NOW_MS) is None  # too old: its stream is dropped
    assert [intake.take(0, i, r, NOW_MS, NOW_MS) for i, r in enumerate(records[1:], 1)] == [None] * (len(records) - 1)
    assert intake.holds() == []  # the rest never completes, and nothing holds the commit
    assert registry.get_sample_value("stream_dp_partials_expired_total", {"query": "q"}) == 1


def test_a_partial_left_incomplete_by_its_writer_is_given_up_after_the_release_timeout():
    records = partial_records(_partial(20_000), 32 * 1024)
    registry = CollectorRegistry()
    intake = _intake(registry)
    intake.take(0, 0, records[0], NOW_MS - 100_000, NOW_MS)
    intake.take(0, 1, encode_progress(Progress("q", 0, 3, NOW_MS - 100_000)), NOW_MS - 50_000, NOW_MS)
    intake.drop_stale()
    assert intake.holds() == [(0, 0)]  # read on 50 s of record time: within the 60 s release timeout
    intake.take(0, 2, encode_progress(Progress("q", 0, 3, NOW_MS)), NOW_MS - 30_000, NOW_MS)
    intake.drop_stale()
    assert intake.holds() == [] and _errors(registry, "partial_chunks_dropped") == 1


def test_a_large_histogram_travels_in_chunks_and_comes_back_bit_for_bit():
    rows, bins = 20_000, 256
    rng = np.random.default_rng(7)
    cells = rng.integers(0, rows * bins, 200_000)
    histogram = SparseHistogram.from_cells(rows, bins, cells // bins, cells % bins)
    partial = _partial(rows, histogram=histogram)
    records = partial_records(partial, 64 * 1024)
    assert len(records) > 5 and max(map(len, records)) <= 64 * 1024
    intake = _intake(CollectorRegistry())
    taken = [intake.take(0, i, value, NOW_MS - 40_000, NOW_MS) for i, value in enumerate(records)]
    message = taken[-1].message
    assert _same(message, partial) and message.histogram == histogram
    # sparse: about 10 bytes a cell before compression, nothing for empty cells
    assert sum(map(len, records)) < 16 * len(histogram) + 40 * rows


def _quantiles_runtime(bins: int = 16):
    data = yaml.safe_load((REPO / "deploy/queries.example.yaml").read_text())
    data["queries"][0]["aggregations"] = {
        "count": {}, "quantiles": {"field": "value", "q": [0.5, 0.9], "bounds": [0, 160], "bins": bins}}
    config = parse_config(data).queries[0]
    return QueryRuntime(config=config, engine=None, plan=None, combiner=None, namespace="users", cost=0.0,
                        delta=0.0, privacy={})


def _through_the_wire(engine, runtime, combiner, out_of_budget: set[str], start: int):
    """Close the engine's windows, leave ``out_of_budget`` out and aggregate as the ingest stage does, send
    every partial through its binary records into ``combiner``, and take the window starting at ``start``."""
    for partial in engine.tick():
        excluded = partial.unit_mask(out_of_budget)
        totals = partial.aggregate(excluded, histogram=runtime.histogram, features=runtime.features,
                                   blocks=runtime.blocks)
        message = partial_message(runtime, partial, totals, input_partitions=2, units=len(partial.units),
                                  excluded=int(excluded.sum()), closed_at_ms=ENGINE_NOW_MS)
        for record in partial_records(message, 1_000_000):
            assert combiner.add_partial(PartialsReader().read(0, 0, record), now_ms=ENGINE_NOW_MS)
    return combiner.take(start)


def test_events_reach_the_combined_window_as_one_histogram_without_excluded_units():
    """Engine (two input partitions) -> budget-filtered partials -> binary records -> combined window."""
    runtime = _quantiles_runtime()
    spec = runtime.histogram
    assert (spec.bins, spec.lo, spec.hi) == (16, 0.0, 160.0)
    engine, clock = make_engine(partitions=(0, 1), clip=(spec.lo, spec.hi))
    engine.set_partition_count(2)  # partials of several partitions are added up only when placement was checked
    rng = np.random.default_rng(3)
    start = ENGINE_NOW_MS - 120_000
    events = [(f"u{int(u)}", f"/p{int(g)}", float(v))
              for u, g, v in zip(rng.integers(0, 30, 400), rng.integers(0, 3, 400), rng.uniform(-5, 170, 400))]
    for p in (0, 1):
        mine = [(u, g, v) for u, g, v in events if int(u[1:]) % 2 == p]
        engine.process(batch_of([event(u, start + i, g, v) for i, (u, g, v) in enumerate(mine)], partition=p))
    clock.now_ms += 10**9
    combiner = WindowCombiner("pageviews_by_page", window_size_ms=60_000, window_offset_ms=0,
                              release_timeout_ms=1, public_groups=[("/p0",), ("/p1",), ("/p2",), ("/none",)],
                              has_sum=False, quantile_bins=spec.bins)
    out_of_budget = {"u4", "u7"}
    window = _through_the_wire(engine, runtime, combiner, out_of_budget, start)
    assert window.withheld is None and window.partitions_missing == []
    expected = np.zeros((4, spec.bins), dtype=np.int64)
    for u, g, v in events:
        if u not in out_of_budget:
            expected[int(g[2:]), spec.bin_of(np.array([v]))[0]] += 1
    assert np.array_equal(window.histogram.dense(), expected)
    assert window.histogram.totals().tolist() == window.count.tolist()


def test_events_reach_the_combined_window_as_feature_sums_without_excluded_units():
    """A covariance query: engine (two partitions) -> partials with feature sums -> records -> combined window,
    against per-unit mean vectors computed here (no unit's vector is long enough to be clipped)."""
    data = yaml.safe_load((REPO / "deploy/queries.example.yaml").read_text())
    config = parse_config(data).query("sensor_covariance")
    runtime = QueryRuntime(config=config, engine=None, plan=build_plan(config), combiner=None, namespace="devices",
                           cost=0.0, delta=0.0, privacy={})
    spec = runtime.features
    assert (spec.kind, spec.dimensions, spec.width) == ("covariance", 3, 10)
    fields = config.aggregations.covariance.fields
    schema = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",), vector_fields=tuple(fields))
    engine, clock = make_engine(schema=schema, partitions=(0, 1))
    engine.set_partition_count(2)
    rng = np.random.default_rng(4)
    start = ENGINE_NOW_MS - 120_000
    events = [(f"u{int(u)}", f"/p{int(g)}", rng.normal(0, 2, 3).round(3).tolist())
              for u, g in zip(rng.integers(0, 30, 300), rng.integers(0, 2, 300))]
    for p in (0, 1):
        mine = [(i, u, g, v) for i, (u, g, v) in enumerate(events) if int(u[1:]) % 2 == p]
        engine.process(batch_of([orjson.dumps({"user_id": u, "ts": start + i, "page": g, **dict(zip(fields, v))})
                                 for i, u, g, v in mine], partition=p))
    clock.now_ms += 10**9
    combiner = WindowCombiner(config.name, window_size_ms=60_000, window_offset_ms=0, release_timeout_ms=1,
                              public_groups=[("/p0",), ("/p1",), ("/none",)], has_sum=False, feature_width=spec.width)
    out_of_budget = {"u4", "u7"}
    window = _through_the_wire(engine, runtime, combiner, out_of_budget, start)
    assert window.withheld is None and window.features.shape == (3, 10)
    per_pair: dict = {}
    for u, g, v in events:
        if u not in out_of_budget:
            per_pair.setdefault((u, g), []).append(v)
    expected = np.zeros((3, 10))
    upper = [(i, j) for i in range(4) for j in range(i, 4)]
    clip_norm = float(config.aggregations.covariance.clip_norm)  # 5 in the example
    for (u, g), vectors in per_pair.items():
        assert np.linalg.norm(np.mean(vectors, axis=0)) < clip_norm  # none clipped
        x = [*np.mean(vectors, axis=0).tolist(), clip_norm]  # (mean, C)
        expected[int(g[2:])] += [x[i] * x[j] for i, j in upper]
    # each unit's feature is cut toward zero to a grid of about 2^-26 of its l2 bound (README): at most
    # one grid step per unit below the reference; 30 units
    grid = 2.0 ** (math.floor(math.log2(spec.norm_bound)) - 26)
    assert np.allclose(window.features, expected, rtol=1e-12, atol=30 * grid)
    # a partial without feature sums cannot be added up: the window is withheld, not half-released
    bare = _partial(2, groups=[("/p0",), ("/p1",)], partition=0, input_partitions=1)
    other = WindowCombiner(config.name, window_size_ms=60_000, window_offset_ms=0, release_timeout_ms=1,
                           public_groups=[("/p0",), ("/p1",)], has_sum=False, feature_width=spec.width)
    other.add_partial(bare, now_ms=NOW_MS)
    withheld = other.take(bare.window_start_ms)
    assert withheld.withheld == "features_missing" and not withheld.features.any()


def test_block_values_travel_in_chunks_and_come_back_bit_for_bit():
    rows, n = 50, 30_000
    rng = np.random.default_rng(9)
    blocks = BlockValues(rng.integers(0, rows, n).astype(np.int32), rng.integers(0, 50, n).astype(np.int32),
                         rng.normal(0, 1e3, n))
    partial = _partial(rows, blocks=blocks)
    records = partial_records(partial, 64 * 1024)
    assert len(records) > 2
    intake = _intake(CollectorRegistry())
    message = [intake.take(0, i, value, NOW_MS - 40_000, NOW_MS) for i, value in enumerate(records)][-1].message
    for name in ("group", "block", "value"):
        got, sent = getattr(message.blocks, name), getattr(blocks, name)
        assert got.dtype == sent.dtype and got.tobytes() == sent.tobytes()
    # a group index past the partial's groups is refused, not released against the wrong group
    with pytest.raises(ValueError, match="name a group it does not hold"):
        partial_records(_partial(3, blocks=BlockValues(np.array([3], np.int32), np.array([0], np.int32),
                                                       np.array([1.0]))), 64 * 1024)
