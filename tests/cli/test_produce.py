"""``stream-dp produce --synthetic --config --query``: the synthetic events are ones the query's worker takes.

No broker: ``_send`` is replaced and what it is handed is decoded by the event decoder the worker builds for
the query (``build_runtimes``), which is independent of how ``produce`` writes the events.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
import yaml

from stream_dp.cli import produce
from stream_dp.cli.main import main
from stream_dp.config import parse_config
from stream_dp.windows.decoding import EventDecoder
from stream_dp.worker.assemble.runtimes import build_runtimes

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "queries.example.yaml"


def _sent(monkeypatch, argv: list[str]) -> list[tuple[bytes, bytes, int]]:
    sent: list[tuple[bytes, bytes, int]] = []

    def send(topic, events, *args, **kwargs):
        sent.extend(events)
        return 0

    monkeypatch.setattr(produce, "_send", send)
    assert main(["produce", "--quiet", *argv]) == 0
    return sent


def _decoder(name: str) -> EventDecoder:
    """The decoder the worker builds for the example's query ``name``."""
    document = yaml.safe_load(EXAMPLE.read_text())
    document["queries"] = [q for q in document["queries"] if q["name"] == name]
    (runtime,) = build_runtimes(parse_config(document), secret=b"a test secret of enough bytes", clock_ms=lambda: 0)
    return EventDecoder(runtime.engine.schema)


@pytest.mark.parametrize(("name", "topic"), [
    ("visits_by_place", "events.visits"),  # group_by [country, region, city]
    ("pageviews_by_page", "events.pageviews"),  # group_by [page]
])
def test_synthetic_events_of_a_query_are_all_taken_by_its_decoder_in_its_public_groups(monkeypatch, name, topic):
    sent = _sent(monkeypatch, ["--topic", topic, "--synthetic", "2000", "--config", str(EXAMPLE), "--query", name])
    assert len(sent) == 2000
    decoded, problems = _decoder(name).decode([value for _, value, _ in sent], now_ms=int(time.time() * 1000))
    assert problems == [], problems[:3]
    assert len(decoded) == 2000
    query = parse_config(yaml.safe_load(EXAMPLE.read_text())).query(name)
    public = set(query.public_group_keys())
    keys = {key if isinstance(key, tuple) else (key,) for key in decoded.group_keys}
    assert keys == public  # every event in a listed group, and every listed group drawn
    # keyed by the unit, as the worker checks
    assert all(key == orjson.loads(value)[query.privacy_unit.field].encode() for key, value, _ in sent)


@pytest.mark.parametrize("what", ["missing", "directory"])
def test_an_unreadable_file_is_refused_before_connecting(monkeypatch, tmp_path, capsys, what):
    path = tmp_path / "nonexist.jsonl"
    if what == "directory":
        path.mkdir()
    monkeypatch.setattr(produce, "_send", lambda *a, **k: pytest.fail("connected with no file to read"))
    assert main(["produce", "--topic", "events.pageviews", "--file", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"cannot read {path} (")
    assert "Traceback" not in err


@pytest.mark.parametrize(("topic", "names"), [
    ("events.sensors", ["sensor_means", "sensor_covariance", "sensor_median_temp"]),  # vectors, covariance, a value
    ("events.pageviews", ["pageviews_by_page", "top_pages", "value_quantiles", "pageviews_today"]),
])
def test_without_query_synthetic_events_fit_every_query_reading_the_topic(monkeypatch, topic, names):
    document = yaml.safe_load(EXAMPLE.read_text())
    assert sorted(q["name"] for q in document["queries"] if q["input_topic"] == topic) == sorted(names)
    sent = _sent(monkeypatch, ["--topic", topic, "--synthetic", "500", "--config", str(EXAMPLE)])
    assert len(sent) == 500
    for name in names:
        decoded, problems = _decoder(name).decode([value for _, value, _ in sent], now_ms=int(time.time() * 1000))
        assert problems == [] and len(decoded) == 500, (name, problems[:3])


def test_without_query_a_topic_whose_queries_disagree_is_refused_with_the_fix(monkeypatch, tmp_path, capsys):
    document = yaml.safe_load(EXAMPLE.read_text())
    (means,) = [q for q in document["queries"] if q["name"] == "sensor_means"]
    means["groups"] = {"public": ["east", "west"]}
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(document))
    monkeypatch.setattr(produce, "_send", lambda *a, **k: pytest.fail("sent events that fit one query only"))
    assert main(["produce", "--quiet", "--topic", "events.sensors", "--synthetic", "10", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "queries 'sensor_means' and 'sensor_covariance' both read 'events.sensors' but differ in groups.public" in err
    assert "name the query whose fields to fill with --query" in err


class _Clock:
    """A wall clock that moves only when slept on or pushed (``stall``)."""

    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def time(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds

    def monotonic(self) -> float:
        return self.now_s


def test_live_synthetic_events_carry_the_time_they_are_taken_when_behind_their_schedule(monkeypatch):
    # --rate 1000: one event due every millisecond from the first. After the fifth, the process stalls for a
    # minute (a starved core): the events still due in the past go out at once, stamped with the clock then,
    # so that they reach the broker in the window their time names, not a minute after it.
    clock = _Clock(1_800_000_000.0)
    monkeypatch.setattr(produce, "time", clock)
    stamps: list[int] = []

    def send(topic, events, *args, **kwargs):
        for _key, value, event_ms in events:
            assert orjson.loads(value)["ts"] == event_ms
            stamps.append(event_ms)
            if len(stamps) == 5:
                clock.now_s += 60.0
        return 0

    monkeypatch.setattr(produce, "_send", send)
    assert main(["produce", "--quiet", "--topic", "events.pageviews", "--synthetic", "10", "--rate", "1000",
                 "--config", str(EXAMPLE), "--query", "pageviews_by_page"]) == 0
    start_ms = 1_800_000_000_000
    assert stamps[:5] == [start_ms + i for i in range(5)]  # on schedule: each held until it is due
    assert stamps[5:] == [start_ms + 4 + 60_000] * 5  # behind it: the clock's time when taken, not the schedule's
