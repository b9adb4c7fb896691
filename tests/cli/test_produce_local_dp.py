"""``stream-dp produce --local-dp``: what leaves the producer is the unit id, the event time and one randomized
report per unit per window -- never a true value, in any field. No broker: ``_send`` is replaced where the
command runs end to end (tests/worker/test_local_dp.py checks the same against the real broker and worker)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
import yaml

from stream_dp.cli import produce
from stream_dp.cli.main import main

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "queries.example.yaml"
DOMAIN = ["chrome", "safari", "firefox", "edge", "other"]  # browsers_local's groups.public
HOUR = 3_600_000  # browsers_local's window; allowed_lateness 1m
T0 = 1_700_000_000_000 // HOUR * HOUR  # a window start


def _config(tmp_path: Path, *, mechanism: str = "krr", local_first: bool = False) -> Path:
    """The example's queries, browsers_local with ``mechanism`` (and first, if ``local_first``)."""
    document = yaml.safe_load(EXAMPLE.read_text())
    (local,) = [q for q in document["queries"] if q["name"] == "browsers_local"]
    local["local_dp"]["mechanism"] = mechanism
    if local_first:
        document["queries"] = [local] + [q for q in document["queries"] if q is not local]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def _reports(tmp_path: Path, events: list, config: Path = EXAMPLE) -> list[tuple[bytes | None, dict, int | None]]:
    """(key, sent event, record time) of what ``produce --file --local-dp browser`` would send."""
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join((e if isinstance(e, bytes) else orjson.dumps(e)) + b"\n" for e in events))
    args = SimpleNamespace(config=config, query="browsers_local", local_dp="browser")
    local = produce._local_randomizer(args)
    assert local is not None
    return [(key, orjson.loads(value), ms) for key, value, ms in local.apply(produce.file_events(path, produce._fields(args)))]


@pytest.mark.parametrize("mechanism", ["krr", "oue"])
def test_only_the_unit_the_time_and_the_report_are_sent(tmp_path, mechanism):
    events = [
        {"device_id": f"d{i}", "ts": T0 + i, "browser": "firefox", "ua": "firefox", "browser_copy": "firefox",
         "ctx": {"browser": "firefox", "deep": [{"b": "firefox"}]}, "page": "/x", "value": 3.5}
        for i in range(40)
    ]
    sent = _reports(tmp_path, events, _config(tmp_path, mechanism=mechanism))
    assert len(sent) == 40
    for i, (key, event, ms) in enumerate(sent):
        assert set(event) == {"device_id", "ts", "browser"}, event  # no copy of the true value rides along
        assert event["device_id"] == f"d{i}" and key == f"d{i}".encode()
        assert event["ts"] == T0 + i and ms == T0 + i
        if mechanism == "krr":
            assert event["browser"] in DOMAIN
        else:
            assert set(event["browser"]) <= set(DOMAIN)


def test_one_report_per_unit_per_window(tmp_path, capsys):
    events = [{"device_id": "d1", "ts": T0 + i * 60_000, "browser": "safari"} for i in range(50)]  # one hour
    events += [{"device_id": "d2", "ts": T0 + 5, "browser": "chrome"}]
    events += [{"device_id": "d1", "ts": T0 + HOUR + i, "browser": "safari"} for i in range(3)]  # the next hour
    events += [{"device_id": 7, "ts": T0 + 1, "browser": "edge"}, {"device_id": "7", "ts": T0 + 2, "browser": "edge"}]
    sent = _reports(tmp_path, events)
    assert [(e["device_id"], e["ts"]) for _, e, _ in sent] == [("d1", T0), ("d2", T0 + 5), ("d1", T0 + HOUR), (7, T0 + 1)]
    err = capsys.readouterr().err
    assert "52 events were not sent: their unit had already reported in their window" in err  # 49 + 2 + the "7"


def test_events_without_a_usable_unit_or_time_are_not_sent(tmp_path, capsys):
    events = [
        {"device_id": "d1", "browser": "chrome"},
        {"device_id": "d2", "ts": None, "browser": "chrome"},
        {"device_id": "d3", "ts": "yesterday", "browser": "chrome"},
        {"device_id": "d4", "ts": True, "browser": "chrome"},
        {"ts": T0, "browser": "chrome"},
        {"device_id": {"id": "d5", "browser": "chrome"}, "ts": T0, "browser": "chrome"},
        {"device_id": "d6", "ts": T0, "browser": "lynx"},
        b"not json",
        {"device_id": "d7", "ts": "2023-11-14T22:00:00Z", "browser": "chrome"},
    ]
    sent = _reports(tmp_path, events)
    assert [e["device_id"] for _, e, _ in sent] == ["d7"]
    assert sent[0][1]["ts"] == "2023-11-14T22:00:00Z"  # the time as given, parsed by the worker with its format
    err = capsys.readouterr().err
    assert "7 events without a string or integer 'device_id' or a parsable 'ts' were not sent" in err
    assert "1 events with no 'browser' in the local_dp domain were not sent" in err  # lynx


def test_windows_far_behind_are_forgotten_and_their_stragglers_not_sent(tmp_path, capsys):
    hours = 300
    events = [{"device_id": "d1", "ts": T0 + h * HOUR, "browser": "chrome"} for h in range(hours)]
    events += [{"device_id": "d1", "ts": T0, "browser": "chrome"},  # a second report for hour 0: never
               {"device_id": "d2", "ts": T0 + HOUR, "browser": "chrome"},  # hour 1 closed long ago at the worker
               {"device_id": "d2", "ts": T0 + (hours - 1) * HOUR, "browser": "chrome"}]  # the newest hour: open
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    args = SimpleNamespace(config=EXAMPLE, query="browsers_local", local_dp="browser")
    local = produce._local_randomizer(args)
    sent = []
    for _, value, _ in local.apply(produce.file_events(path, produce._fields(args))):
        sent.append(orjson.loads(value))
        assert len(local._units_by_window) <= 3  # memory: a few windows, not one per hour of the input
    assert [(e["device_id"], e["ts"]) for e in sent][-1] == ("d2", T0 + (hours - 1) * HOUR)
    assert len(sent) == hours + 1
    assert "2 events were not sent: their window had closed" in capsys.readouterr().err


def test_a_local_query_without_local_dp_is_refused_before_sending(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(produce, "_send", lambda *a, **k: pytest.fail("sent events of a local_dp query as they are"))
    events = tmp_path / "events.jsonl"
    events.write_bytes(orjson.dumps({"device_id": "d1", "ts": T0, "browser": "chrome"}) + b"\n")
    assert main(["produce", "--topic", "t", "--file", str(events), "--config", str(EXAMPLE),
                 "--query", "browsers_local"]) == 1
    err = capsys.readouterr().err
    assert "query 'browsers_local' has local_dp on 'browser'" in err and "add --local-dp browser" in err
    # without --query, produce takes the file's first query: refused alike when that one is local
    assert main(["produce", "--topic", "t", "--synthetic", "10", "--config", str(_config(tmp_path, local_first=True))]) == 1
    assert "add --local-dp browser" in capsys.readouterr().err


def test_produce_local_dp_sends_one_bare_report_per_unit_and_window(tmp_path, monkeypatch):
    captured = {}

    def fake_send(topic, events, total, rate, **options):
        captured["events"] = [(key, orjson.loads(value), ms) for key, value, ms in events]
        return 0

    monkeypatch.setattr(produce, "_send", fake_send)
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"".join(
        orjson.dumps({"device_id": f"d{i % 3}", "ts": T0 + i, "browser": "edge", "ua": "edge"}) + b"\n" for i in range(30)))
    assert main(["produce", "--topic", "t", "--file", str(events), "--config", str(EXAMPLE), "--query", "browsers_local",
                 "--local-dp", "browser", "--quiet"]) == 0
    assert [(key, set(event), ms) for key, event, ms in captured["events"]] == [
        (f"d{i}".encode(), {"device_id", "ts", "browser"}, T0 + i) for i in range(3)]
