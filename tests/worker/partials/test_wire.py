import numpy as np
import orjson
import pytest

from stream_dp.dp.histogram import SparseHistogram
from stream_dp.wire.frame import decode_frame, encode_frame
from stream_dp.worker.partials.wire import (
    PartialAggregate,
    Progress,
    WireFormatError,
    decode_internal,
    decode_partial_payload,
    encode_partial,
    encode_partial_payload,
    encode_progress,
)


def _partial(**overrides):
    values = dict(
        query="q", window_start_ms=60_000, window_end_ms=120_000, partition=2, input_partitions=3,
        groups=[("/a",), ("/b",)], count=np.array([3, 1]), sum=np.array([1.5, 2.0]),
        distinct_units=np.array([2, 1]), units_charged=3, units_excluded=1, closed_at_ms=130_000,
    )
    values.update(overrides)
    return PartialAggregate(**values)


def test_partial_round_trip():
    decoded = decode_internal(encode_partial(_partial()))
    assert isinstance(decoded, PartialAggregate)
    assert decoded.groups == [("/a",), ("/b",)]
    assert decoded.count.dtype == np.int64 and decoded.count.tolist() == [3, 1]
    assert decoded.sum.tolist() == [1.5, 2.0]
    assert (decoded.partition, decoded.units_excluded, decoded.closed_at_ms) == (2, 1, 130_000)


def test_count_only_partial_and_progress_round_trip():
    assert decode_internal(encode_partial(_partial(sum=None))).sum is None
    progress = Progress("q", 1, 3, 180_000)
    assert decode_internal(encode_progress(progress)) == progress


@pytest.mark.parametrize("value", [b"not json", b"{}", b'{"v": 99, "type": "partial"}', b'{"v": 1, "type": "gossip"}', b'{"v": 1, "type": "partial"}'])
def test_corrupt_internal_records_raise_one_error_type(value):
    with pytest.raises(WireFormatError):
        decode_internal(value)


def _histogram(rows=2, bins=4):
    return SparseHistogram.from_cells(rows, bins, np.array([1, 0, 1, 1]), np.array([3, 0, 3, 0]))


def test_a_quantiles_partial_carries_its_histogram_sparse_and_bit_for_bit():
    histogram = _histogram()
    decoded = decode_internal(encode_partial(_partial(histogram=histogram)))
    assert decoded.histogram == histogram
    assert decoded.histogram.dense().tolist() == [[1, 0, 0, 0], [1, 0, 0, 2]]
    assert (decoded.histogram.group.dtype, decoded.histogram.bin.dtype, decoded.histogram.count.dtype) == (
        np.int64, np.uint16, np.int64)
    # other queries' partials (and every partial written before histograms) read with none
    assert decode_internal(encode_partial(_partial())).histogram is None
    empty = SparseHistogram.empty(2, 256)
    assert decode_internal(encode_partial(_partial(histogram=empty))).histogram == empty


def test_a_json_partial_of_wire_version_1_reads_without_histogram():
    legacy = orjson.dumps({
        "v": 1, "type": "partial", "query": "q", "window_start_ms": 0, "window_end_ms": 60_000, "partition": 0,
        "input_partitions": 1, "groups": [["/a"]], "count": [2], "sum": None, "distinct_units": [1],
        "units_charged": 1, "units_excluded": 0, "closed_at_ms": 60_001,
    })
    assert decode_internal(legacy).histogram is None


def test_a_histogram_that_does_not_match_its_groups_is_refused_both_ways():
    with pytest.raises(ValueError, match="build it from the same group totals"):
        encode_partial(_partial(histogram=_histogram(rows=5)))
    # a frame whose cells point past its groups is corrupt
    frame = encode_partial_payload(_partial(groups=[("/a",), ("/b",)], histogram=_histogram()))
    fields, sections = decode_frame(frame).fields, decode_frame(frame).sections
    sections["hist.group"] = sections["hist.group"] + 5
    with pytest.raises(WireFormatError, match="corrupt partial frame"):
        decode_partial_payload(encode_frame(fields, sections))


def test_a_partial_carries_the_fingerprint_of_the_settings_it_was_charged_under():
    assert decode_internal(encode_partial(_partial(settings="5150007720abc2fc"))).settings == "5150007720abc2fc"
    # written without one (as every partial before fingerprints): the header has no field, and it reads as None
    bare = encode_partial_payload(_partial())
    assert "settings" not in decode_frame(bare).fields and decode_partial_payload(bare).settings is None
    legacy = orjson.dumps({
        "v": 1, "type": "partial", "query": "q", "window_start_ms": 0, "window_end_ms": 60_000, "partition": 0,
        "input_partitions": 1, "groups": [["/a"]], "count": [2], "sum": None, "distinct_units": [1],
        "units_charged": 1, "units_excluded": 0, "closed_at_ms": 60_001,
    })
    assert decode_internal(legacy).settings is None


@pytest.mark.parametrize("settings", [7, "", ["a"]])
def test_a_settings_fingerprint_that_is_not_a_string_is_corrupt(settings):
    frame = decode_frame(encode_partial_payload(_partial(settings="5150007720abc2fc")))
    with pytest.raises(WireFormatError, match="settings fingerprint"):
        decode_partial_payload(encode_frame({**frame.fields, "settings": settings}, frame.sections))


def test_a_partial_carries_its_groups_public_positions_or_none():
    positions = np.array([7, -1], dtype=np.int64)
    decoded = decode_internal(encode_partial(_partial(public_positions=positions)))
    assert decoded.public_positions.dtype == np.int64 and decoded.public_positions.tolist() == [7, -1]
    assert decode_internal(encode_partial(_partial())).public_positions is None
    with pytest.raises(ValueError, match="public positions"):
        encode_partial(_partial(public_positions=np.array([1], dtype=np.int64)))
