"""The harness's own pure parts: the RESP request parser, the fault triggers and the invariant checks.

The checks are shown to fail on doctored evidence, so that a green fault
run means something.
"""

from __future__ import annotations

import orjson
import pytest

from tests.reliability.checks import CheckReport, Observed, check_accounting, check_outputs, check_release_records
from tests.reliability.redis_proxy import RespRequestParser, Trigger, is_budget_charge, is_ledger_claim, is_mark_published
from tests.reliability.reference import ExpectedPartial, Reference
from tests.reliability.topics import TopicRecord


def _resp(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def test_parser_splits_commands_across_any_chunking():
    stream = _resp(b"EVALSHA", b"abc", b"3", b"dp:c:ns:q/1/0", b"x\r\ny") + _resp(b"GET", b"k") + _resp(b"PING")
    for step in (1, 2, 7, len(stream)):
        parser = RespRequestParser()
        out = []
        for i in range(0, len(stream), step):
            out += parser.feed(stream[i:i + step])
        assert [c for c, _ in out] == [[b"EVALSHA", b"abc", b"3", b"dp:c:ns:q/1/0", b"x\r\ny"], [b"GET", b"k"], [b"PING"]]
        assert b"".join(raw for _, raw in out) == stream


def test_parser_refuses_what_redis_py_never_sends():
    with pytest.raises(ValueError, match="RESP array"):
        RespRequestParser().feed(b"PING\r\n")


def test_step_predicates_and_trigger_counting():
    charge = [b"EVALSHA", b"sha", b"3", b"dp:c:users:q/100/2", b"dp:t:users:0", b"dp:m:users"]
    claim = [b"EVALSHA", b"sha", b"1", b"stream-dp:ledger:{q}:100", b"payload", b"604800"]
    raise_mark = [b"EVALSHA", b"sha", b"1", b"stream-dp:ledger:{q}:released-through:0", b"100", b"604800"]
    mark = [b"HSET", b"stream-dp:ledger:{q}:100", b"state", b"published"]
    assert is_budget_charge(charge) and not is_budget_charge(claim)
    assert is_ledger_claim(claim) and not is_ledger_claim(raise_mark) and not is_ledger_claim(charge)
    assert is_mark_published(mark) and not is_mark_published(claim)
    trigger = Trigger(is_budget_charge, occurrence=2)
    assert not trigger.count(charge, 1) and trigger.count(charge, 2) and not trigger.count(charge, 3)
    assert trigger.fired_by == 2 and trigger.command == charge


def _release(query: str, start: int, page: str, count: int, *, release_id: str | None = None) -> TopicRecord:
    record = {"release_id": release_id or f"{query}:{start}:{page}", "query": query,
              "window": {"start": "2026-01-01T00:00:00.000Z", "end": "2026-01-01T00:00:02.000Z",
                         "start_ms": start, "end_ms": start + 2000},
              "group": {"page": page}, "count": count, "sum": 10.0, "mean": 1.0,
              "ci95": {"count": 3.0, "sum": 30.0, "mean": 10.0}, "std": {"count": 1.4, "sum": 14.1},
              "privacy": {"namespace": "ns", "unit_field": "user_id", "mechanism": "laplace", "epsilon": 1.0,
                          "delta": 0.0, "rho": None, "count_scale": 1.0, "sum_scale": 10.0},
              "released_at_ms": 1, "released_at": "2026-01-01T00:00:03.000Z"}
    return TopicRecord(0, 0, None, orjson.dumps(record), {})


def _world(outputs: list[TopicRecord], dead: list[TopicRecord] = (), late: set[bytes] = frozenset()):
    reference = Reference(namespace={"q": "ns"}, cost={"q": 1.0}, windows={"q": {0, 2000}})
    for start in (0, 2000):
        reference.partials[("q", start, 0)] = ExpectedPartial(
            "q", start, start + 2000, 0, [("a",)], [10], [10.0], [5], ["u1"], [], 10, 10)
    reference.accepted["q"] = 20
    inputs = [TopicRecord(0, i, None, b"x%d" % i, {}) for i in range(20)]
    inputs += [TopicRecord(0, 20 + i, None, v, {}) for i, v in enumerate(sorted(late))]
    observed = Observed("in", inputs, [], {"q": outputs}, list(dead), set(late), {"q": [("a",)]}, 2000)
    return observed, reference


def test_output_check_passes_a_clean_run_and_flags_twice_drawn_noise_and_lost_windows():
    good, reference = _world([_release("q", 0, "a", 10), _release("q", 2000, "a", 11)])
    report = CheckReport()
    check_outputs(good, reference, report)
    assert not report.violations, report.violations

    doctored, reference = _world([_release("q", 0, "a", 10), _release("q", 0, "a", 12)])
    report = CheckReport()
    check_outputs(doctored, reference, report)
    assert report.kinds["noise drawn twice"] == 1 and report.kinds["window lost"] == 1, report.violations


def test_accounting_flags_a_late_event_missing_from_the_dead_letter_topic():
    observed, reference = _world([], late={b"late-one"})
    report = CheckReport()
    check_accounting(observed, reference, report)
    assert report.kinds["late not dead-lettered"] == 1, report.violations

    dead = [TopicRecord(0, 0, None, b"late-one", {"source": b"in/0/20", "query": b"q", "reason": b"late"})]
    observed, reference = _world([], dead=dead, late={b"late-one"})
    report = CheckReport()
    check_accounting(observed, reference, report)
    assert not report.violations, report.violations


def test_release_records_are_checked_against_the_schema_and_for_unit_ids():
    report = CheckReport()
    check_release_records([_release("q", 0, "a", 10).value], {"u1"}, report)
    assert not report.violations and report.stats["release records validated"] == 1
    leaking = orjson.loads(_release("q", 0, "u1", 10).value)
    leaking["extra"] = 1
    check_release_records([orjson.dumps(leaking)], {"u1"}, report)
    assert report.kinds["schema"] == 1 and report.kinds["unit id in output"] == 1, report.violations
