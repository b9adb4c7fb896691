"""The bad-input corpus under tests/data/bad_events/: every case is rejected with its file's reason."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stream_dp.windows import EventSchema, RawBatch, RejectReason

from ._support import NOW_MS, event, make_engine

CORPUS = Path(__file__).resolve().parent.parent / "data" / "bad_events"
SCHEMA = EventSchema(
    unit_field="user_id",
    timestamp_field="ts",
    group_by=("page", "country"),
    value_field="value",
    max_message_bytes=4096,
    max_abs_value=1e6,
    max_unit_length=32,
    max_future_skew_ms=300_000,
)
GOOD_TS = NOW_MS - 5_000  # inside the open window [00:09:00, 00:10:00)


def message(case: dict) -> bytes | None:
    if "value_hex" in case:
        return bytes.fromhex(case["value_hex"])
    if "parts" in case:
        return "".join(text * count for text, count in case["parts"]).encode("utf-8")
    return None if case["value"] is None else case["value"].encode("utf-8")


def load_corpus() -> list[tuple[RejectReason, str, bytes | None]]:
    cases = []
    for path in sorted(CORPUS.glob("*.jsonl")):
        reason = RejectReason(path.stem)
        for line in path.read_text(encoding="utf-8").splitlines():
            case = json.loads(line)
            cases.append((reason, case["case"], message(case)))
    return cases


CASES = load_corpus()


def good(unit: str) -> bytes:
    return event(unit, GOOD_TS, country="fr")


def primed_engine():
    engine, _ = make_engine(schema=SCHEMA, partitions=[0])
    result = engine.process(RawBatch([event("primer", NOW_MS, country="fr")], np.array([0]), np.array([0]), np.array([NOW_MS])))
    assert result.accepted == 1
    return engine


# Where a record sits, how it is keyed and stamped, not its bytes: tested in test_placement.py and test_clock.py.
PLACEMENT_REASONS = {RejectReason.WRONG_KEY, RejectReason.WRONG_PARTITION, RejectReason.AHEAD_OF_RECORD}
# Only a local_dp query's schema requires a report tag: tested in test_reports.py.
REPORT_TAG_REASONS = {RejectReason.NOT_RANDOMIZED, RejectReason.RANDOMIZER_MISMATCH}


def test_every_reason_of_a_message_value_has_a_corpus_file():
    assert {reason for reason, _, _ in CASES} == set(RejectReason) - PLACEMENT_REASONS - REPORT_TAG_REASONS


@pytest.mark.parametrize(("reason", "case", "value"), CASES, ids=[f"{r.value}: {c}" for r, c, _ in CASES])
def test_case_is_rejected_with_its_reason(reason, case, value):
    engine = primed_engine()
    # Every record stamped by a producer sending now: a bad one cannot move the clock either.
    result = engine.process(
        RawBatch([good("before"), value, good("after")], np.array([0, 0, 0]), np.array([1, 2, 3]), np.full(3, GOOD_TS))
    )
    assert result.accepted == 2, f"{case}: the good neighbours must still be accepted"
    assert result.rejected == {reason: 1}, f"{case}: {[(r.reason, r.detail) for r in result.rejections]}"
    (rejection,) = result.rejections
    assert (rejection.partition, rejection.offset, rejection.reason) == (0, 2, reason)
    assert rejection.value == value
    assert rejection.detail
    assert result.balanced


def test_whole_corpus_in_one_batch_interleaved_with_good_events():
    engine = primed_engine()
    values: list[bytes | None] = []
    expected: dict[int, RejectReason] = {}
    for i, (reason, _, value) in enumerate(CASES):
        values.append(good(f"good-{i}"))
        expected[len(values)] = reason
        values.append(value)
    offsets = np.arange(1, len(values) + 1)
    result = engine.process(RawBatch(values, np.zeros(len(values), dtype=np.int32), offsets, np.full(len(values), GOOD_TS)))
    assert result.accepted == len(CASES)
    assert {r.offset - 1: r.reason for r in result.rejections} == expected
    assert result.balanced
    assert sum(result.rejected.values()) == len(CASES)
