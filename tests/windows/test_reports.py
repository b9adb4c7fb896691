"""Local-DP reports in the window engine: unary (oue) ones, a set of domain values per event, kept as a row of bits;
and of either mechanism, only those tagged as made by the query's own randomizer.

The expected rows are written from the README's definition (a 1 for every
listed value, in domain order); malformed reports are dead-lettered with a
reason, and one report per unit and window is kept. An event without the tag
(a true value, from a producer that did not randomize) or with another
randomizer's tag is dead-lettered as ``not_randomized`` or ``randomizer_mismatch``.
"""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from stream_dp.dp.local import REPORT_TAG_FIELD, LocalRandomizer, UnaryReports, report_tag
from stream_dp.windows import EventSchema
from stream_dp.windows.bulk_decoding import BulkEventDecoder
from stream_dp.windows.classify import classify_message
from stream_dp.windows.decoding import EventDecoder, RejectReason
from tests.reliability.model import Hashes
from tests.windows._support import NOW_MS, SECRET, batch_of, make_engine

DOMAIN = ("chrome", "safari", 7, "edge")
EPSILON = 2.0
TAGS = {mechanism: report_tag(LocalRandomizer.build(mechanism, EPSILON, len(DOMAIN)), DOMAIN)
        for mechanism in ("krr", "oue")}
SCHEMA = EventSchema(unit_field="user_id", timestamp_field="ts", report_field="browser", report_domain=DOMAIN,
                     report_tag_field=REPORT_TAG_FIELD, report_tag=TAGS["oue"])
# k-ary randomized response: the report is the group-by value, one of the domain
KRR_SCHEMA = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("browser",), group_domain=DOMAIN,
                         report_tag_field=REPORT_TAG_FIELD, report_tag=TAGS["krr"])
WINDOW_START = NOW_MS - 120_000
_UNTAGGED = object()


def _report(unit: str, values, offset: int = 0, tag=TAGS["oue"]) -> bytes:
    event = {"user_id": unit, "ts": WINDOW_START + offset, "browser": values}
    if tag is not _UNTAGGED:
        event[REPORT_TAG_FIELD] = tag
    return orjson.dumps(event)


def _close(engine, clock):
    clock.now_ms += 10**9
    (partial,) = engine.tick()
    return partial


def test_reports_become_support_counts_per_value():
    engine, clock = make_engine(schema=SCHEMA, max_groups=1, max_events=1)
    reports = {"u1": ["chrome", 7], "u2": [], "u3": ["edge", "safari", "chrome"], "u4": [7]}
    result = engine.process(batch_of([_report(u, v, i) for i, (u, v) in enumerate(reports.items())]))
    assert result.accepted == 4 and not result.rejections
    totals = _close(engine, clock).aggregate(features=UnaryReports(len(DOMAIN)))
    expected = np.zeros(len(DOMAIN))
    for values in reports.values():
        for value in values:
            expected[DOMAIN.index(value)] += 1
    assert totals.features.tolist() == [expected.tolist()]
    assert int(totals.distinct_units.sum()) == 4  # the empty report is a unit too


def test_malformed_reports_are_rejected_with_a_reason():
    engine, _ = make_engine(schema=SCHEMA)
    bad = [
        _report("u1", ["firefox"]),                 # not in the domain
        _report("u2", ["chrome", "chrome"]),        # a value twice
        _report("u3", "chrome"),                    # not a list
        _report("u4", [True]),                      # a boolean is not 1
        _report("u5", ["7"]),                       # "7" is not 7
        _report("u6", ["chrome", "safari", 7, "edge", "chrome"]),  # longer than the domain
    ]
    result = engine.process(batch_of(bad))
    reasons = [(r.reason, r.detail) for r in sorted(result.rejections, key=lambda r: r.offset)]
    assert [r for r, _ in reasons] == [RejectReason.VALUE_OUT_OF_RANGE, RejectReason.WRONG_TYPE,
                                       RejectReason.WRONG_TYPE, RejectReason.WRONG_TYPE,
                                       RejectReason.VALUE_OUT_OF_RANGE, RejectReason.VALUE_OUT_OF_RANGE]
    assert "'firefox'" in reasons[0][1] and "not in the domain" in reasons[0][1]
    assert "twice" in reasons[1][1]
    assert result.accepted == 0 and result.balanced


def test_one_report_per_unit_and_window_is_kept_whole():
    """Two reports of one unit in a window: one of them, never a mix of their values."""
    engine, clock = make_engine(schema=SCHEMA, max_groups=1, max_events=1)
    engine.process(batch_of([_report("u1", ["chrome", "safari"], 0), _report("u1", [7, "edge"], 1)]))
    (row,) = _close(engine, clock).aggregate(features=UnaryReports(len(DOMAIN))).features.tolist()
    assert row in ([1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0])


def test_krr_reports_outside_the_domain_are_rejected_at_decode():
    """A tagged k-RR report of a value the domain does not hold is dead-lettered as value_out_of_range, as an
    unary report holding one is: never kept (so never charged), by the fast and the reference decoder alike."""
    inside = ["chrome", 7, "edge", "safari"]
    outside = ["firefox", "7", 8, "", "Chrome"]  # "7" is not 7; the domain is matched exactly
    values = [_report(f"u{i}", v, i, TAGS["krr"]) for i, v in enumerate(inside + outside)]
    expected_rows = list(range(len(inside)))
    reference = EventDecoder(KRR_SCHEMA).decode(values, NOW_MS)
    bulk = BulkEventDecoder(KRR_SCHEMA)
    decoded = bulk.decode(values, NOW_MS)
    for events, problems in (reference, decoded):
        assert events.index.tolist() == expected_rows and events.group_keys == inside
        assert [(i, r) for i, r, _ in problems] == [(len(inside) + j, RejectReason.VALUE_OUT_OF_RANGE)
                                                    for j in range(len(outside))]
        for (_, _, detail), value in zip(problems, outside):
            assert repr(value) in detail and "groups.public" in detail, detail
    assert decoded[1] == reference[1]
    for raw, value in zip(values, inside + outside):  # the slow reading names the same reason
        found = classify_message(raw, KRR_SCHEMA)
        assert found == (None if value in inside else next(p[1:] for p in reference[1] if values[p[0]] == raw))
    # a batch of reports inside the domain pays nothing for the check: it takes the fast path
    fast = BulkEventDecoder(KRR_SCHEMA)
    events, problems = fast.decode(values[: len(inside)], NOW_MS)
    assert (fast.fast_batches, fast.reference_batches, len(events), problems) == (1, 0, len(inside), [])

    engine, _ = make_engine(schema=KRR_SCHEMA, max_groups=1, max_events=1)
    result = engine.process(batch_of(values))
    assert result.accepted == len(inside)
    assert sorted(r.offset for r in result.rejections) == list(range(len(inside), len(values)))
    assert {r.reason for r in result.rejections} == {RejectReason.VALUE_OUT_OF_RANGE}


@pytest.mark.parametrize("mechanism", ["krr", "oue"])
def test_only_reports_tagged_with_the_querys_randomizer_are_kept(mechanism):
    schema = KRR_SCHEMA if mechanism == "krr" else SCHEMA
    value = "chrome" if mechanism == "krr" else ["chrome"]
    other = "oue" if mechanism == "krr" else "krr"
    domain = list(DOMAIN)
    tags = {
        "right": TAGS[mechanism],
        "none": _UNTAGGED,  # a true value from a producer that did not randomize
        "null": None,
        "epsilon 1": report_tag(LocalRandomizer.build(mechanism, 1.0, len(domain)), domain),
        "other mechanism": report_tag(LocalRandomizer.build(other, EPSILON, len(domain)), domain),
        "domain reordered": report_tag(LocalRandomizer.build(mechanism, EPSILON, len(domain)), domain[::-1]),
        "domain extended": report_tag(LocalRandomizer.build(mechanism, EPSILON, 5), [*domain, "lynx"]),
        "a number": 2.0,
    }
    engine, _ = make_engine(schema=schema, max_groups=1, max_events=1)
    result = engine.process(batch_of([_report(f"u{i}", value, i, tag) for i, tag in enumerate(tags.values())]))
    assert result.accepted == 1
    got = {list(tags)[r.offset]: (r.reason, r.detail) for r in result.rejections}
    assert {case: reason for case, (reason, _) in got.items()} == {
        "none": RejectReason.NOT_RANDOMIZED, "null": RejectReason.NOT_RANDOMIZED,
        **{case: RejectReason.RANDOMIZER_MISMATCH for case in list(tags)[3:]},
    }
    assert "--local-dp" in got["none"][1] and REPORT_TAG_FIELD in got["none"][1]
    assert tags["epsilon 1"] in got["epsilon 1"][1] and TAGS[mechanism] in got["epsilon 1"][1]


def test_a_batch_of_tagged_reports_takes_the_fast_path_and_an_untagged_event_the_reference():
    """The tag costs valid batches no per-event check: a missing or other tag fails the typed decoder."""
    good = [_report(f"u{i}", ["chrome"], i) for i in range(50)]
    decoder = BulkEventDecoder(SCHEMA)
    events, problems = decoder.decode(good, NOW_MS)
    assert (decoder.fast_batches, decoder.reference_batches, len(events), problems) == (1, 0, 50, [])
    mixed = [*good, _report("v", ["chrome"], tag=_UNTAGGED), _report("w", ["chrome"], tag=TAGS["krr"])]
    events, problems = decoder.decode(mixed, NOW_MS)
    assert (decoder.fast_batches, decoder.reference_batches, len(events)) == (1, 1, 50)
    assert [(i, r) for i, r, _ in problems] == [(50, RejectReason.NOT_RANDOMIZED),
                                                (51, RejectReason.RANDOMIZER_MISMATCH)]
    assert problems == EventDecoder(SCHEMA).decode(mixed, NOW_MS)[1]


@pytest.mark.parametrize("domain_size", [37, 4096])
def test_support_counts_are_those_of_each_units_kept_report_bit_for_bit(domain_size):
    """The counts a partial hands on, against the README's oue semantics computed here from the secret alone:
    per value, how many kept reports list it, a unit's kept report being its event with the smallest keyed
    event hash (README "Bounding, precisely"), with or without excluded units. A random batch, over
    batches that are compacted, so packed reports are concatenated, pruned and taken as the engine goes."""
    rng = np.random.default_rng(domain_size)
    domain = tuple(f"v{i}" for i in range(domain_size))
    tag = report_tag(LocalRandomizer.build("oue", EPSILON, domain_size), domain)
    schema = EventSchema(unit_field="user_id", timestamp_field="ts", report_field="browser", report_domain=domain,
                         report_tag_field=REPORT_TAG_FIELD, report_tag=tag)
    units = [f"u{i}" for i in rng.integers(0, 200, 400)]  # most units send two reports or more
    reports = [np.flatnonzero(rng.random(domain_size) < rng.choice([0.0, 0.02, 0.12, 0.9])) for _ in units]
    values = [_report(u, [domain[v] for v in r.tolist()], i, tag) for i, (u, r) in enumerate(zip(units, reports))]
    engine, clock = make_engine(schema=schema, max_groups=1, max_events=1, compact_min_rows=32)
    for first in range(0, len(values), 50):
        batch = values[first:first + 50]
        assert engine.process(batch_of(batch, first_offset=first)).accepted == len(batch)
    partial = _close(engine, clock)

    hashes = Hashes(SECRET)
    group_hash = hashes.group(())  # a query without group_by: every event is of the one group ()
    kept: dict[str, tuple[int, int]] = {}  # unit -> (smallest event hash, its report's position)
    for offset, unit in enumerate(units):
        event_hash = hashes.event(hashes.unit(unit), group_hash, 0, offset)
        kept[unit] = min(kept.get(unit, (event_hash, offset)), (event_hash, offset))
    excluded = set(rng.choice(sorted(kept), 40, replace=False).tolist())
    spec = UnaryReports(domain_size)
    for leave_out in (set(), excluded):
        expected = np.zeros((1, domain_size), dtype=np.float64)
        for unit, (_, position) in kept.items():
            if unit not in leave_out:
                expected[0, reports[position]] += 1.0
        totals = partial.aggregate(partial.unit_mask(leave_out) if leave_out else None, features=spec)
        assert totals.features.dtype == np.float64 and totals.features.shape == expected.shape
        assert totals.features.tobytes() == expected.tobytes()
        assert totals.distinct_units.tolist() == [len(kept) - len(leave_out)]
