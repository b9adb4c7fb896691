"""Unary (oue) local-DP reports in the window engine: a set of domain values per event, kept as a 0/1 row.

The expected rows are written from the README's definition (a 1 for every
listed value, in domain order); malformed reports are dead-lettered with a
reason, and one report per unit and window is kept.
"""

from __future__ import annotations

import numpy as np
import orjson

from stream_dp.dp.local import UnaryReports
from stream_dp.windows import EventSchema
from stream_dp.windows.decoding import RejectReason
from tests.windows._support import NOW_MS, batch_of, make_engine

DOMAIN = ("chrome", "safari", 7, "edge")
SCHEMA = EventSchema(unit_field="user_id", timestamp_field="ts", report_field="browser", report_domain=DOMAIN)
WINDOW_START = NOW_MS - 120_000


def _report(unit: str, values, offset: int = 0) -> bytes:
    return orjson.dumps({"user_id": unit, "ts": WINDOW_START + offset, "browser": values})


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
