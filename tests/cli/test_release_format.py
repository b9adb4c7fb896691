"""``stream-dp tail`` text: every record kind of deploy/schemas/release.schema.json shows its numbers.

release_records.jsonl holds one record of each kind as the worker wrote it (plain counts, staircase
sums, top-k, quantiles, continual, mean_vector, covariance, sample_aggregate mean and median, local DP
krr and oue, hierarchy levels 1 and 2, top-k of selected groups, a mean_vector and a covariance with
too few noisy units for a mean); each is checked against the schema
first, so that the fixture stays what the worker writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest

from stream_dp.cli import tail
from stream_dp.cli.tail import HEADER, format_row

HERE = Path(__file__).resolve().parent
SCHEMA = json.loads((HERE.parents[1] / "deploy" / "schemas" / "release.schema.json").read_text())
RECORDS = [json.loads(line) for line in (HERE / "release_records.jsonl").read_text().splitlines() if line]


def _kind(record: dict) -> str:
    if record.get("kind") == "top_k":
        return "top_k"
    for block in ("level", "continual", "quantiles", "mean_vector", "covariance", "sample_aggregate", "local_dp"):
        if block in record:
            return block
    return record["privacy"]["mechanism"]


def _sig(value: float) -> str:
    return f"{value:.4g}"


def _expected(record: dict) -> list[str]:
    """The numbers a reader of the record must find in its text, written from the schema's fields."""
    if record.get("kind") == "top_k":
        return [f"{entry['rank']}. " + ",".join(map(str, entry["group"].values())) for entry in record["top"]]
    wanted = [",".join(map(str, record["group"].values()))[:24]]
    if record["count"] is not None:
        wanted.append(f"{record['count']:,.1f}" if record["count"] % 1 else f"{int(record['count']):,}")
    if record["sum"] is not None:
        wanted.append(f"{record['sum']:,.1f}")
    if "level" in record:
        wanted.append(f"level {record['level']}")
    if "continual" in record:
        wanted += [f"window {record['continual']['window_index']} of {record['continual']['windows_per_period']}"]
    for q, answer in record.get("quantiles", {}).items():
        wanted += [f"q{q} {_sig(answer['value'])}", _sig(answer["rank_error"])]
    if "mean_vector" in record:
        block = record["mean_vector"]
        if block["mean"] is None:  # fewer noisy units than one: no mean, the units still shown
            wanted += ["mean -", f"units {_sig(block['units'])}"]
        else:
            wanted += [f"{field} {_sig(m)} ±{_sig(ci)}"
                       for field, m, ci in zip(block["fields"], block["mean"], block["mean_ci95"])]
    if "covariance" in record:
        block = record["covariance"]
        if block["covariance"] is None:
            wanted += ["mean -", f"units {_sig(block['units'])}"]
        else:
            wanted += [_sig(v) for row in block["covariance"] for v in row] + [_sig(v) for v in block["mean"]]
    if "sample_aggregate" in record:
        block = record["sample_aggregate"]
        wanted += [_sig(block["value"]), f"{block['blocks']} blocks"]
        wanted.append(_sig(block["rank_error"]) if block.get("aggregate") == "median" else f"±{_sig(block['ci95'])}")
    if "local_dp" in record:
        wanted += [f"{record['local_dp']['reports']:,} reports", record["privacy"]["local_dp"]["mechanism"]]
    return wanted


def test_fixture_holds_every_kind_and_matches_the_schema():
    for record in RECORDS:
        jsonschema.validate(record, SCHEMA)
    kinds = {_kind(r) for r in RECORDS}
    assert kinds >= {"top_k", "level", "continual", "quantiles", "mean_vector", "covariance", "sample_aggregate",
                     "local_dp", "laplace", "staircase"}


@pytest.mark.parametrize("record", RECORDS, ids=[f"{i}-{_kind(r)}" for i, r in enumerate(RECORDS)])
def test_every_kind_shows_its_numbers(record):
    text = format_row(record)
    lines = text.splitlines()
    # the row keeps the table's columns: a fractional count that overflowed its column shifted the rest
    assert len(lines[0]) == len(HEADER), (lines[0], HEADER)
    assert lines[0].startswith(record["window"]["start"])
    for wanted in _expected(record):
        assert wanted in text, (wanted, text)
    # an option block is one indented line; a top-k record lists its k groups, one a line
    blocks = sum(b in record for b in ("level", "continual", "quantiles", "mean_vector", "covariance",
                                       "sample_aggregate", "local_dp"))
    assert len(lines) == 1 + (len(record["top"]) if record.get("kind") == "top_k" else blocks)
    assert all(line.startswith("    ") for line in lines[1:])


def test_a_fractional_count_has_one_decimal():
    record = next(r for r in RECORDS if r.get("level") == 1)
    row = format_row(record).splitlines()[0]
    assert f"{record['count']:,.1f}" in row and repr(record["count"]) not in row


def test_tail_prints_every_kind_and_no_fallback(monkeypatch, capsys):
    """The command loop over the fixture: no record falls back to "(not a release record ...)"."""
    messages = [SimpleNamespace(value=json.dumps(r).encode()) for r in RECORDS]
    messages.append(SimpleNamespace(value=b'{"something": "else"}'))

    class Consumer:
        def __init__(self, *args, **kwargs):
            self.polled = False

        def poll(self, timeout_ms):
            if self.polled:
                return {}
            self.polled = True
            return {"partition": messages}

        def close(self):
            pass

    monkeypatch.setitem(sys.modules, "kafka", SimpleNamespace(KafkaConsumer=Consumer))
    args = SimpleNamespace(topic=["t"], from_beginning=True, json=False, max=len(messages), timeout=5.0, windows=0,
                           max_seconds=0.0)
    assert tail.run(args) == 0
    out = capsys.readouterr().out
    assert out.count("(not a release record") == 1  # only the last message, which is not one
    for record in RECORDS:
        assert format_row(record) in out
