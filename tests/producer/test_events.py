"""EventChecker: an event is accepted exactly when the query's worker would take it, and a refusal names the
fix. No broker: the worker's decoder (built by ``build_runtimes``, independently of the producer) judges."""

from __future__ import annotations

import math
import time
from pathlib import Path

import orjson
import pytest
import yaml

from stream_dp.config import parse_config
from stream_dp.producer import EventError
from stream_dp.producer.events import EventChecker
from stream_dp.windows.decoding import EventDecoder
from stream_dp.worker.assemble.runtimes import build_runtimes

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "queries.example.yaml"
CONFIG = parse_config(yaml.safe_load(EXAMPLE.read_text()))
NOW_S = time.time()


def _worker_decoder(name: str) -> EventDecoder:
    document = yaml.safe_load(EXAMPLE.read_text())
    document["queries"] = [q for q in document["queries"] if q["name"] == name]
    (runtime,) = build_runtimes(parse_config(document), secret=b"a test secret of enough bytes", clock_ms=lambda: 0)
    return EventDecoder(runtime.engine.schema)


GOOD = [
    {"user_id": "u1", "ts": NOW_S, "page": "/pricing", "value": 12.5},
    {"user_id": 42, "ts": int(NOW_S * 1000), "page": "/docs", "value": 3},
    {"user_id": "ü-7", "ts": "2026-12-01T10:00:00Z", "page": "/", "value": -1e6, "extra": {"x": [1, 2]}},
]


@pytest.mark.parametrize("event", GOOD)
def test_an_accepted_event_is_one_the_worker_takes_keyed_by_its_unit(event):
    key, value, event_ms = EventChecker(CONFIG.query("pageviews_by_page")).encode(event)
    decoded, problems = _worker_decoder("pageviews_by_page").decode([value], now_ms=int(time.time() * 1000))
    assert problems == [] and len(decoded) == 1
    assert key == str(event["user_id"]).encode() == bytes(decoded.units[0])
    assert event_ms == int(decoded.ts_ms[0])


@pytest.mark.parametrize(("event", "reason", "fix"), [
    ({"ts": NOW_S, "page": "/", "value": 1.0}, "field 'user_id' is missing", "give the event each of them"),
    ({"user_id": "u", "ts": NOW_S, "page": "/", "value": "12"}, "field 'value' must be a number, got a string",
     "the values as numbers"),
    ({"user_id": True, "ts": NOW_S, "page": "/", "value": 1}, "field 'user_id' must be a string or an integer",
     "as strings or integers"),
    ({"user_id": "u", "ts": NOW_S, "page": "/", "value": math.nan}, "field 'value' is nan",
     "send a finite number, or leave the event out"),
    ({"user_id": "u", "ts": math.inf, "page": "/", "value": 1}, "field 'ts' is inf", "send a finite number"),
    ({"user_id": "", "ts": NOW_S, "page": "/", "value": 1}, "(the privacy unit) is an empty string",
     "the id of the user or device"),
    ({"user_id": "u", "ts": "yesterday", "page": "/", "value": 1}, "bad_timestamp", "ISO-8601 time with a zone"),
    ({"user_id": "u", "ts": NOW_S + 3600, "page": "/", "value": 1}, "ahead of the wall clock",
     "when the event happened"),
    ({"user_id": "u", "ts": NOW_S, "page": None, "value": 1}, "field 'page' is null", "a value, not None"),
    (["u", NOW_S], "is a list, not a dict", "as a dict of its fields"),
    ({"user_id": "u", "ts": NOW_S, "page": "/", "value": 1, "when": object()}, "cannot be sent as JSON",
     "strings, numbers, lists or dicts"),
])
def test_a_refused_event_names_what_is_wrong_and_how_to_fix_it(event, reason, fix):
    with pytest.raises(EventError) as raised:
        EventChecker(CONFIG.query("pageviews_by_page")).encode(event, 3)
    message = str(raised.value)
    assert message.startswith("event 3") and reason in message and fix in message, message
    if isinstance(event, dict) and "when" not in event and not any(isinstance(v, float) and not math.isfinite(v)
                                                                   for v in event.values()):
        # the worker refuses it too
        _decoded, problems = _worker_decoder("pageviews_by_page").decode([orjson.dumps(event)],
                                                                         now_ms=int(time.time() * 1000))
        assert problems


def test_a_local_dp_event_holds_a_true_value_of_the_domain():
    checker = EventChecker(CONFIG.query("browsers_local"))
    key, value, _ms = checker.encode({"device_id": "d1", "ts": NOW_S, "browser": "safari"})
    assert key == b"d1" and orjson.loads(value)["browser"] == "safari"
    with pytest.raises(EventError, match="not in the local_dp domain.*send a value of the query's groups.public"):
        checker.encode({"device_id": "d1", "ts": NOW_S, "browser": "netscape"})
