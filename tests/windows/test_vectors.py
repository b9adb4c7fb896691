"""Vector queries in the window engine: events' fields decoded as vectors, bounded, per-group feature sums.

The reference computes each unit's mean vector per group from the events
directly (every event kept: the bounds here are loose), clips it in l2 and
builds the features from their definition in the README, independently of
``FeatureSpec``.
"""

from __future__ import annotations

import math

import numpy as np
import orjson
import pytest

from stream_dp.dp import vectors
from stream_dp.dp.vectors import FeatureSpec, group_row_sums
from stream_dp.windows import EventSchema
from stream_dp.windows.decoding import RejectReason
from stream_dp.windows.exact_sums import truncate_features
from tests.windows._support import NOW_MS, batch_of, make_engine

FIELDS = ("x", "y", "z")
SCHEMA = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",), vector_fields=FIELDS)
WINDOW_START = NOW_MS - 120_000
CLIP_NORM = 5.0
UNITS = 30  # the events' units (``_events``)


def _grid_tolerance(spec: FeatureSpec) -> float:
    """Each unit's feature coordinates are cut toward zero to a power-of-two grid of about
    2^-26 of the feature's l2 bound (README): a group's sum is below the reference by at most
    one grid step per unit."""
    return UNITS * 2.0 ** (math.floor(math.log2(spec.norm_bound)) - 26)


def _events(seed: int = 0, n: int = 400) -> list[tuple[str, str, tuple[float, float, float]]]:
    rng = np.random.default_rng(seed)
    units, pages = rng.integers(0, 30, n), rng.integers(0, 4, n)
    vectors = np.round(rng.normal(0.0, 3.0, (n, 3)), 3)
    return [(f"u{u}", f"/p{p}", tuple(v)) for u, p, v in zip(units.tolist(), pages.tolist(), vectors.tolist())]


def _encode(events) -> list[bytes]:
    return [orjson.dumps({"user_id": u, "ts": WINDOW_START + i, "page": page, "x": v[0], "y": v[1], "z": v[2]})
            for i, (u, page, v) in enumerate(events)]


def _closed_partial(messages: list[bytes], cuts: int = 1):
    engine, clock = make_engine(schema=SCHEMA, clip=(0.0, 0.0))  # a per-field clip must not touch vectors
    partials = []
    for part in np.array_split(np.arange(len(messages)), cuts):
        if len(part):
            partials += engine.process(batch_of([messages[i] for i in part], first_offset=int(part[0]))).partials
    clock.now_ms += 10**9
    partials += engine.tick()
    (partial,) = partials
    return partial, engine


def _reference(events, kind: str) -> dict[tuple[str], np.ndarray]:
    """Per group: the sum over units of the features of the unit's clipped mean vector (README semantics)."""
    per_pair: dict[tuple[str, str], list] = {}
    for unit, page, vector in events:
        per_pair.setdefault((unit, page), []).append(vector)
    out: dict[tuple[str], np.ndarray] = {}
    for (_, page), vectors in per_pair.items():
        mean = [sum(v[i] for v in vectors) / len(vectors) for i in range(3)]
        norm = math.sqrt(sum(m * m for m in mean))
        if norm > CLIP_NORM:
            mean = [m * CLIP_NORM / norm for m in mean]
        augmented = [*mean, CLIP_NORM]
        if kind == "mean_vector":
            feature = augmented
        else:
            feature = [augmented[i] * augmented[j] for i in range(4) for j in range(i, 4)]
        out[(page,)] = out.get((page,), np.zeros(len(feature))) + np.array(feature)
    return out


@pytest.mark.parametrize("kind", ["mean_vector", "covariance"])
def test_feature_sums_match_the_reference_however_the_events_arrive(kind):
    events = _events()
    spec = FeatureSpec(kind, 3, CLIP_NORM)
    partial, _ = _closed_partial(_encode(events))
    totals = partial.aggregate(features=spec)
    expected = _reference(events, kind)
    assert [tuple(g) for g in totals.groups] == sorted(expected)
    for row, group in zip(totals.features, totals.groups):
        assert np.allclose(row, expected[tuple(group)], rtol=1e-12, atol=_grid_tolerance(spec))
    # the same records in seven batches: bit-identical sums (replays must round the same way)
    again, _ = _closed_partial(_encode(events), cuts=7)
    assert again.aggregate(features=spec).features.tobytes() == totals.features.tobytes()


def test_excluded_units_are_left_out_of_the_feature_sums():
    events = _events(seed=3)
    spec = FeatureSpec("mean_vector", 3, CLIP_NORM)
    partial, _ = _closed_partial(_encode(events))
    gone = {"u1", "u2", "u7"}
    totals = partial.aggregate(partial.unit_mask(gone), features=spec)
    expected = _reference([e for e in events if e[0] not in gone], "mean_vector")
    for row, group in zip(totals.features, totals.groups):
        assert np.allclose(row, expected[tuple(group)], rtol=1e-12, atol=_grid_tolerance(spec))
    # the last coordinate counts the units left, times C
    units_left = {(page,): len({u for u, p, _ in events if p == page and u not in gone}) for _, page, _ in events}
    assert {tuple(g): round(r[-1] / CLIP_NORM) for g, r in zip(totals.groups, totals.features)} == units_left


def test_vector_fields_are_checked_like_values():
    engine, _ = make_engine(schema=SCHEMA)
    base = {"user_id": "u1", "ts": WINDOW_START, "page": "/a", "x": 1.0, "y": 2.0, "z": 3.0}
    bad = [
        {k: v for k, v in base.items() if k != "y"},
        {**base, "z": "3"},
        {**base, "x": 1e300},
        {**base, "x": [1, 2]},
    ]
    raw = [orjson.dumps(b) for b in bad] + [b'{"user_id": "u1", "ts": 1, "page": "/a", "x": NaN, "y": 1, "z": 1}']
    result = engine.process(batch_of([orjson.dumps(base), *raw]))
    reasons = [r.reason for r in result.rejections]
    assert reasons == [RejectReason.MISSING_FIELD, RejectReason.WRONG_TYPE, RejectReason.VALUE_OUT_OF_RANGE,
                       RejectReason.WRONG_TYPE, RejectReason.INVALID_JSON]
    assert "'y' is missing" in result.rejections[0].detail
    assert result.accepted == 1


def test_a_schema_reads_a_value_or_a_vector_not_both():
    with pytest.raises(ValueError, match="one of value_field, vector_fields or report_field"):
        EventSchema(unit_field="u", timestamp_field="t", value_field="v", vector_fields=("x",))
    with pytest.raises(ValueError, match="more than one role"):
        EventSchema(unit_field="u", timestamp_field="t", group_by=("x",), vector_fields=("x", "y"))


@pytest.mark.parametrize("kind", ["mean_vector", "covariance"])
def test_feature_sums_in_blocks_are_the_one_shot_sums_bit_for_bit(kind, monkeypatch):
    """The partial sums its pairs' features a block at a time (bounded memory); with blocks of a few pairs,
    cut inside groups, the sums are bit for bit those of every pair's features built at once and added
    per group in pair order, with and without excluded units."""
    spec = FeatureSpec(kind, 3, CLIP_NORM)
    partial, _ = _closed_partial(_encode(_events(seed=5, n=600)))
    gone = partial.unit_mask({"u0", "u4", "u9"})
    expected = {}
    for excluded in (None, gone):
        keep = np.ones(len(partial.pair_group), dtype=bool) if excluded is None else ~excluded[partial.pair_unit]
        starts = np.cumsum(partial.pair_count) - partial.pair_count
        means = (np.add.reduceat(partial.row_value, starts, axis=0) / partial.pair_count[:, None])[keep]
        features = truncate_features(spec.of_means(means), spec.norm_bound)
        sums = group_row_sums(partial.pair_group[keep].astype(np.int64), features, len(partial.groups), spec.width)
        expected[excluded is None] = sums[np.bincount(partial.pair_group[keep], minlength=len(partial.groups)) > 0]
    monkeypatch.setattr(vectors, "FEATURE_BLOCK_ELEMENTS", 3 * spec.width)  # three pairs a block
    assert len(partial.pair_group) > 20 * 3
    for excluded in (None, gone):
        got = partial.aggregate(excluded, features=spec).features
        assert got.tobytes() == expected[excluded is None].tobytes()
