"""Per-group value histograms of closed windows: bins, sparse cells, bounding, excluded units, determinism."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from stream_dp.windows import EventSchema
from stream_dp.dp.histogram import HistogramSpec, SparseHistogram, add_histograms
from tests.windows._support import NOW_MS, batch_of, by_key, event, make_engine
from tests.windows.test_properties import CLIP, SIZE, Event, arrange, batches, crash_and_replay

SPEC = HistogramSpec(bins=10, lo=0.0, hi=100.0)
WINDOW_START = NOW_MS - 120_000  # a closed minute before the fake clock


def _closed_partial(events: list[bytes], *, cuts: int = 1, **engine_options):
    """The one partial of ``events`` (all in one window), fed in ``cuts`` batches, closed by idleness."""
    engine, clock = make_engine(clip=(0.0, 100.0), **engine_options)
    partials = []
    for part in np.array_split(np.arange(len(events)), cuts):
        if len(part):
            partials += engine.process(batch_of([events[i] for i in part], first_offset=int(part[0]))).partials
    clock.now_ms += 10**9
    partials += engine.tick()
    (partial,) = partials
    return partial


def _expected(events: list[tuple[str, str, float]], groups: list, spec: HistogramSpec = SPEC) -> np.ndarray:
    dense = np.zeros((len(groups), spec.bins), dtype=np.int64)
    for _, page, value in events:
        dense[groups.index((page,)), spec.bin_of(np.array([min(max(value, spec.lo), spec.hi)]))[0]] += 1
    return dense


def _events(seed: int = 0, n: int = 300) -> list[tuple[str, str, float]]:
    rng = np.random.default_rng(seed)
    return [
        (f"u{int(u)}", f"/p{int(g)}", float(v))
        for u, g, v in zip(rng.integers(0, 40, n), rng.integers(0, 5, n), np.round(rng.uniform(-10, 110, n), 2))
    ]


def _encode(events: list[tuple[str, str, float]]) -> list[bytes]:
    return [event(u, WINDOW_START + i, page, value) for i, (u, page, value) in enumerate(events)]


def test_bins_are_half_open_and_the_upper_bound_falls_in_the_last_bin():
    spec = HistogramSpec(bins=4, lo=-2.0, hi=2.0)
    values = np.array([-2.0, -1.0000001, -1.0, 0.0, 1.9999, 2.0, -5.0, 7.0])
    assert spec.bin_of(values).tolist() == [0, 0, 1, 2, 3, 3, 0, 3]
    assert spec.edges().tolist() == [-2.0, -1.0, 0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    ("kwargs", "hint"),
    [
        ({"bins": 0, "lo": 0, "hi": 1}, "256 is typical"),
        ({"bins": 1 << 17, "lo": 0, "hi": 1}, "256 is typical"),
        ({"bins": 8, "lo": 1, "hi": 1}, "use the query's quantile bounds"),
        ({"bins": 8, "lo": 0, "hi": float("inf")}, "finite number"),
    ],
)
def test_histogram_spec_says_how_to_fix(kwargs, hint):
    with pytest.raises(ValueError, match=hint):
        HistogramSpec(**kwargs)


def test_sparse_cells_are_added_up_the_same_by_both_paths_and_read_back_dense():
    rng = np.random.default_rng(1)
    group, bins = rng.integers(0, 50, 2_000), rng.integers(0, 8, 2_000)
    counts = rng.integers(1, 5, 2_000)
    small = SparseHistogram.from_cells(50, 8, group, bins, counts)  # dense bincount path
    sparse = SparseHistogram.from_cells(10**6, 8, group, bins, counts)  # sort path (8M cells for 2k values)
    assert small.group.tolist() == sparse.group.tolist() and small.count.tolist() == sparse.count.tolist()
    expected = np.zeros((50, 8), dtype=np.int64)
    np.add.at(expected, (group, bins), counts)
    assert np.array_equal(small.dense(), expected)
    assert np.array_equal(small.dense(10, 20), expected[10:20])
    assert np.array_equal(small.totals(), expected.sum(axis=1))
    assert small.group.dtype == np.int64 and small.bin.dtype == np.uint16 and small.count.dtype == np.int64
    both = add_histograms([small, small], 50, 8)
    assert np.array_equal(both.dense(), 2 * expected)


@pytest.mark.parametrize(
    ("columns", "hint"),
    [
        (([0, 0], [1, 1], [1, 1]), "use from_cells"),
        (([1, 0], [0, 0], [1, 1]), "use from_cells"),
        (([0], [0], [0]), "leave empty cells out"),
        (([5], [0], [1]), "build the histogram with SparseHistogram.from_cells"),
    ],
)
def test_sparse_histograms_refuse_cells_that_are_not_canonical(columns, hint):
    with pytest.raises(ValueError, match=hint):
        SparseHistogram(3, 4, *(np.array(c) for c in columns))


def test_histogram_counts_the_bounded_clipped_values_of_each_group():
    events = _events()
    partial = _closed_partial(_encode(events))  # bounds of 100 keep everything
    totals = partial.aggregate(histogram=SPEC)
    assert totals.histogram is not None and totals.histogram.shape == (len(totals.groups), SPEC.bins)
    assert np.array_equal(totals.histogram.dense(), _expected(events, totals.groups))
    assert np.array_equal(totals.histogram.totals(), totals.count)
    assert partial.aggregate().histogram is None  # only when asked


def test_histogram_holds_only_the_events_that_bounding_kept():
    events = _events(2, 600)
    partial = _closed_partial(_encode(events), max_groups=2, max_events=3)
    totals = partial.aggregate(histogram=SPEC)
    assert totals.count.sum() < len(events)  # bounding dropped some
    assert np.array_equal(totals.histogram.totals(), totals.count)
    # each pair's kept values are among that unit's values in that group
    starts = np.cumsum(partial.pair_count) - partial.pair_count
    raw: dict[tuple[str, str], list[float]] = {}
    for u, page, value in events:
        raw.setdefault((u, page), []).append(min(max(value, 0.0), 100.0))
    for k in range(len(partial.pair_count)):
        kept = partial.row_value[starts[k]:starts[k] + partial.pair_count[k]].tolist()
        pool = raw[(partial.units[partial.pair_unit[k]], partial.groups[partial.pair_group[k]][0])]
        assert all(v in pool for v in kept) and len(kept) <= 3


def test_excluded_units_are_left_out_of_the_histogram_and_their_own_groups_dropped():
    events = _events(3) + [("loner", "/only-loner", 55.0), ("loner", "/p1", 99.0)]
    partial = _closed_partial(_encode(events))
    excluded = partial.unit_mask(["loner", "u1", "u7"])
    totals = partial.aggregate(excluded, histogram=SPEC)
    assert ("/only-loner",) not in totals.groups
    kept = [e for e in events if e[0] not in {"loner", "u1", "u7"}]
    assert np.array_equal(totals.histogram.dense(), _expected(kept, totals.groups))
    assert np.array_equal(totals.histogram.totals(), totals.count)


def test_histograms_and_partials_do_not_depend_on_arrival_order_or_batching():
    events = _events(4, 500)
    encoded = _encode(events)
    reference = _closed_partial(encoded, max_groups=2, max_events=2)
    order = np.random.default_rng(9).permutation(len(encoded))
    # offsets follow arrival, so each message keeps its offset: shuffle (value, offset) pairs within one batch set
    engine, clock = make_engine(clip=(0.0, 100.0), max_groups=2, max_events=2, compact_min_rows=7)
    for part in np.array_split(order, 9):
        batch = batch_of([encoded[i] for i in part])
        batch.offsets[:] = part  # the same offsets as in the reference run
        engine.process(batch)
    clock.now_ms += 10**9
    (shuffled,) = engine.tick()
    assert shuffled == reference  # bit for bit, row values included
    mask = reference.unit_mask(["u3", "u5"])
    a, b = reference.aggregate(mask, histogram=SPEC), shuffled.aggregate(mask, histogram=SPEC)
    assert a.histogram == b.histogram and a.groups == b.groups


def test_count_only_queries_keep_no_values():
    schema = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",))
    partial = _closed_partial([event("a", WINDOW_START, "/x", None), event("b", WINDOW_START + 1, "/x", None)],
                              schema=schema)
    assert partial.row_value is None and partial.aggregate().histogram is None


def test_a_partial_without_row_values_says_so():
    partial = _closed_partial(_encode(_events(5, 10)))
    bare = replace(partial, row_value=None)
    assert bare != partial
    with pytest.raises(ValueError, match="build it with build_partial"):
        bare.aggregate(histogram=SPEC)


def test_a_replay_after_a_crash_rebuilds_bit_identical_values_and_histograms():
    rng = np.random.default_rng(6)
    events = [
        Event(int(rng.integers(0, 40)), int(rng.integers(0, 6)), int(t), float(rng.uniform(-10, 110)))
        for t in np.sort(rng.integers(0, 12 * SIZE, 1_500))
    ]
    stream = batches(arrange(events, [0, 150, 400], 3), list(range(0, 1_500, 111)))
    after_crash, replayed = map(by_key, crash_and_replay(stream, 5, 3, 2))
    assert len(after_crash) > 10 and replayed.keys() == after_crash.keys()
    spec = HistogramSpec(bins=16, lo=CLIP[0], hi=CLIP[1])
    for key, partial in after_crash.items():
        again = replayed[key]
        assert again.row_value.tobytes() == partial.row_value.tobytes()
        excluded = partial.unit_mask(partial.units[::3])
        assert again.aggregate(again.unit_mask(partial.units[::3]), histogram=spec).histogram == partial.aggregate(
            excluded, histogram=spec).histogram
