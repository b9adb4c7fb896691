"""Release entries: the columnar rendering gives, byte for byte, the records of the per-group encoder it
replaced; a stored entry renders the same records again; entries of earlier versions are still read."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.wire import UnknownWireVersion, WireFormatError
from stream_dp.wire.frame import BINARY_VERSION
from stream_dp.worker.release.entry import (
    ReleaseEntry,
    StoredRecords,
    build_entry,
    decode_entry,
    encode_entry,
    pack_records,
)
from stream_dp.worker.release.ids import iso_utc, release_id

PRIVACY = {"namespace": "users", "mechanism": "laplace", "epsilon": 0.5, "delta": 0.0, "groups": "selected"}


def _reference_records(query, window, noisy, released_at_ms: int) -> list[tuple[bytes, bytes]]:
    """The per-group encoder of earlier versions (one dict and one ``orjson.dumps`` per group): the oracle."""
    aggregations = query.config.aggregations

    def finite(value):
        return None if value is None or not math.isfinite(value) else float(value)

    def column(values, index, requested):
        if not requested or values is None:
            return [None] * len(index)
        array = np.asarray(values)
        if array.ndim == 0:
            return [finite(array.item())] * len(index)
        picked = array[index]
        if picked.dtype.kind == "f":
            picked = np.where(np.isfinite(picked), picked, np.nan)
            return [None if v != v else v for v in picked.tolist()]
        return picked.tolist()

    want_count, want_sum, want_mean = (aggregations.count is not None, aggregations.sum is not None,
                                       aggregations.mean is not None)
    index = np.flatnonzero(np.asarray(noisy.keep, dtype=bool))
    counts, sums = column(noisy.count, index, want_count), column(noisy.sum, index, want_sum)
    means, mean_ci = column(noisy.mean, index, want_mean), column(noisy.mean_ci95, index, want_mean)
    window_block = {"start": iso_utc(window.window_start_ms), "end": iso_utc(window.window_end_ms),
                    "start_ms": window.window_start_ms, "end_ms": window.window_end_ms}
    prefix = b'{"query":' + orjson.dumps(query.name) + b',"window":' + orjson.dumps(window_block)
    tail = orjson.dumps({
        "std": {"count": finite(noisy.count_std) if want_count else None,
                "sum": finite(noisy.sum_std) if want_sum else None},
        "privacy": query.privacy, "released_at_ms": released_at_ms, "released_at": iso_utc(released_at_ms),
    })[1:]
    ci_count = orjson.dumps(finite(noisy.count_ci95) if want_count else None)
    ci_sum = orjson.dumps(finite(noisy.sum_ci95) if want_sum else None)
    out = []
    for j, i in enumerate(index.tolist()):
        group = window.groups[i]
        out.append((orjson.dumps(list(group)), b"".join((
            prefix, b',"release_id":', orjson.dumps(release_id(query.name, window.window_start_ms, group)),
            b',"group":', orjson.dumps(dict(zip(query.config.group_by, group))),
            b',"count":', orjson.dumps(counts[j]), b',"sum":', orjson.dumps(sums[j]),
            b',"mean":', orjson.dumps(means[j]),
            b',"ci95":{"count":', ci_count, b',"sum":', ci_sum, b',"mean":', orjson.dumps(mean_ci[j]), b"},", tail,
        ))))
    return out


def _query(width: int, aggregations: set[str], name: str = "pages") -> SimpleNamespace:
    def asked(name: str) -> object:
        return object() if name in aggregations else None

    config = SimpleNamespace(aggregations=SimpleNamespace(count=asked("count"), sum=asked("sum"), mean=asked("mean")),
                             group_by=[f"f{i}" for i in range(width)])
    return SimpleNamespace(name=name, config=config, privacy=PRIVACY)


TEXT = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=8)
FLOAT = st.floats(allow_nan=True, allow_infinity=True, width=64)


@st.composite
def _releases(draw):
    width = draw(st.integers(0, 3))
    groups = draw(st.lists(st.tuples(*[st.one_of(TEXT, st.integers(-(2**63), 2**63 - 1))] * width),
                           max_size=25, unique=True))
    n = len(groups)
    aggregations = draw(st.sets(st.sampled_from(["count", "sum", "mean"]), min_size=1))
    counts = draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n))
    noisy = SimpleNamespace(
        keep=draw(st.lists(st.booleans(), min_size=n, max_size=n)),
        count=np.array(counts, dtype=np.int64),
        sum=draw(st.one_of(st.none(), st.lists(FLOAT, min_size=n, max_size=n).map(np.array))),
        mean=draw(st.one_of(st.none(), st.lists(FLOAT, min_size=n, max_size=n).map(np.array))),
        mean_ci95=draw(st.one_of(st.none(), FLOAT.map(np.float64), st.lists(FLOAT, min_size=n, max_size=n).map(np.array))),
        count_std=draw(st.one_of(st.none(), FLOAT)), sum_std=draw(st.one_of(st.none(), FLOAT)),
        count_ci95=draw(st.one_of(st.none(), FLOAT)), sum_ci95=draw(st.one_of(st.none(), FLOAT)),
    )
    start = draw(st.integers(0, 2**42))
    window = SimpleNamespace(window_start_ms=start, window_end_ms=start + 60_000, groups=groups)
    return _query(width, aggregations, draw(st.sampled_from(["pages", 'q"\\uote', "é"]))), window, noisy


@settings(max_examples=300, deadline=None)
@given(_releases(), st.integers(0, 2**42), st.integers(1, 7))
def test_records_are_those_of_the_per_group_encoder_byte_for_byte(release, released_at_ms, slice_rows):
    query, window, noisy = release
    expected = _reference_records(query, window, noisy, released_at_ms)
    entry = build_entry(query, window, noisy, released_at_ms)
    assert entry.render() == expected
    # in slices, as the publisher renders them
    assert [r for s in range(0, entry.rows, slice_rows) for r in entry.render(s, s + slice_rows)] == expected
    # stored and read back, as a republication renders them
    stored = decode_entry(encode_entry(entry))
    assert isinstance(stored, ReleaseEntry) and stored.render() == expected


def test_entries_of_earlier_versions_are_still_read():
    records = [(b'["/a"]', b'{"count":5}'), (b'["/b"]', b'{"count":7,"note":"tab\\tnewline\\n"}')]
    stored = decode_entry(pack_records(records))
    assert isinstance(stored, StoredRecords) and stored.rows == 2
    assert stored.render() == records and stored.render(1, 5) == records[1:]
    assert decode_entry(pack_records([])).render() == []


def test_an_entry_of_an_unknown_version_or_corrupt_is_refused():
    window = SimpleNamespace(window_start_ms=0, window_end_ms=60_000, groups=[("/a",)])
    noisy = SimpleNamespace(keep=[True], count=np.array([3]), sum=None, mean=None, mean_ci95=None,
                            count_std=1.0, sum_std=None, count_ci95=2.0, sum_ci95=None)
    payload = bytearray(encode_entry(build_entry(_query(1, {"count"}), window, noisy, 0)))
    payload[4] = BINARY_VERSION + 1
    with pytest.raises(UnknownWireVersion, match=f"wire version {BINARY_VERSION + 1}"):
        decode_entry(bytes(payload))
    with pytest.raises(WireFormatError):
        decode_entry(b"neither zlib nor a frame")


def test_a_million_released_groups_take_a_few_bytes_each():
    n = 1_000_000
    groups = [(f"/p/{i:x}",) for i in range(n)]
    rng = np.random.default_rng(3)
    noisy = SimpleNamespace(keep=np.ones(n, dtype=bool), count=rng.integers(0, 1_000, n), sum=None, mean=None,
                            mean_ci95=None, count_std=1.4, sum_std=None, count_ci95=3.0, sum_ci95=None)
    window = SimpleNamespace(window_start_ms=0, window_end_ms=60_000, groups=groups)
    entry = build_entry(_query(1, {"count"}), window, noisy, 0)
    payload = encode_entry(entry)
    assert len(payload) < 8 * n  # the rendered records are ~400 bytes each
    back = decode_entry(payload)
    assert back.rows == n and back.render(n - 2) == entry.render(n - 2)
