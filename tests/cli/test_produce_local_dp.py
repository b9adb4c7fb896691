"""``stream-dp produce --local-dp``: what leaves the producer is the unit id, the event time and one randomized
report per unit per window -- never a true value, in any field -- and a re-run with the same secret sends the
same reports, so replays cannot be averaged. No broker: ``_send`` is replaced where the command runs end to end
(tests/worker/test_local_dp.py checks the same against the real broker and worker).

Statistical tests fail below P_MIN = 1e-4 (as tests/dp/test_local.py): a correct randomizer fails one about
once in 10,000 runs; the law with epsilon 20% off gives p-values below 1e-20 on the same reports.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
import yaml
from scipy import stats

from stream_dp.cli import produce
from stream_dp.cli.local_reports import local_reports
from stream_dp.cli.main import main

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "queries.example.yaml"
DOMAIN = ["chrome", "safari", "firefox", "edge", "other"]  # browsers_local's groups.public
EPSILON = 2.0  # browsers_local's local_dp epsilon
HOUR = 3_600_000  # a window of browsers_local where a test sets it, else 120 of its 30 s windows
T0 = 1_700_000_000_000 // HOUR * HOUR  # a window start
P_MIN = 1e-4
SECRET_ENV = "STREAM_DP_LOCAL_DP_SECRET"
FIELDS = {"device_id", "ts", "browser", "_local_dp"}  # the unit, the time, the report and its randomizer's tag


def _tag(mechanism: str, epsilon: float = EPSILON, domain: list = DOMAIN) -> str:
    """The report tag as the README defines it: mechanism, epsilon as float.hex(), k, SHA-256 of the domain."""
    return f"{mechanism}:{float(epsilon).hex()}:{len(domain)}:{hashlib.sha256(orjson.dumps(domain)).hexdigest()[:16]}"


@pytest.fixture(autouse=True)
def _no_secret_in_the_environment(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)


def _secret(tmp_path: Path, content: bytes | None = None, name: str = "local-dp.key") -> Path:
    path = tmp_path / name
    path.write_bytes(os.urandom(32) if content is None else content)
    return path


def _config(tmp_path: Path, *, mechanism: str = "krr", local_first: bool = False, window: str | None = None) -> Path:
    """The example's queries, browsers_local with ``mechanism`` (and first, if ``local_first``; on windows of
    ``window``, if given)."""
    document = yaml.safe_load(EXAMPLE.read_text())
    (local,) = [q for q in document["queries"] if q["name"] == "browsers_local"]
    local["local_dp"]["mechanism"] = mechanism
    if window is not None:
        local["window"] = {"size": window}
    if local_first:
        document["queries"] = [local] + [q for q in document["queries"] if q is not local]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def _reports(tmp_path: Path, events: list, config: Path = EXAMPLE) -> list[tuple[bytes | None, dict, int | None]]:
    """(key, sent event, record time) of what ``produce --file --local-dp browser`` would send."""
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join((e if isinstance(e, bytes) else orjson.dumps(e)) + b"\n" for e in events))
    args = SimpleNamespace(config=config, query="browsers_local", local_dp="browser",
                           local_dp_secret_file=_secret(tmp_path))
    local = local_reports(args)
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
        assert set(event) == FIELDS, event  # no copy of the true value rides along
        assert event["_local_dp"] == _tag(mechanism)
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
    sent = _reports(tmp_path, events, _config(tmp_path, window="1h"))
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
    args = SimpleNamespace(config=EXAMPLE, query="browsers_local", local_dp="browser",
                           local_dp_secret_file=_secret(tmp_path))
    local = local_reports(args)
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
    # without --query, produce fills the queries reading --topic: refused alike when one of them is local
    config = _config(tmp_path, local_first=True)
    assert main(["produce", "--topic", "events.browsers", "--synthetic", "10", "--config", str(config)]) == 1
    assert "add --query browsers_local --local-dp browser" in capsys.readouterr().err
    # and a topic no query reads is no way around it either
    assert main(["produce", "--topic", "t", "--synthetic", "10", "--config", str(config)]) == 1
    assert "reads --topic 't'" in capsys.readouterr().err


def test_local_dp_on_another_field_names_the_field_the_query_randomizes(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(produce, "_send", lambda *a, **k: pytest.fail("sent events with --local-dp on a wrong field"))
    assert main(["produce", "--topic", "t", "--synthetic", "10", "--config", str(EXAMPLE), "--query", "browsers_local",
                 "--local-dp", "os"]) == 1
    err = capsys.readouterr().err
    assert "query 'browsers_local' has its local_dp on field 'browser', not 'os'; use --local-dp browser" in err, err


def test_a_local_querys_topic_without_local_dp_is_refused_whatever_the_query(tmp_path, monkeypatch, capsys):
    """The topic decides where true values would land: another --query, or none, is no way around --local-dp."""
    sent = []
    monkeypatch.setattr(produce, "_send", lambda topic, *a, **k: sent.append(topic) or 0)
    for query in (["--query", "pageviews_by_page"], []):  # the example's first query, pageviews_by_page, is central
        assert main(["produce", "--topic", "events.browsers", "--synthetic", "10", "--config", str(EXAMPLE),
                     *query, "--quiet"]) == 1
        err = capsys.readouterr().err
        assert "--topic 'events.browsers' is the input_topic of query 'browsers_local'" in err, err
        assert "add --query browsers_local --local-dp browser" in err
    assert not sent
    # another query's topic is not refused
    assert main(["produce", "--topic", "events.pageviews", "--synthetic", "10", "--config", str(EXAMPLE),
                 "--query", "pageviews_by_page", "--quiet"]) == 0
    assert sent == ["events.pageviews"]


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
                 "--local-dp", "browser", "--local-dp-secret-file", str(_secret(tmp_path)), "--quiet"]) == 0
    assert [(key, set(event), ms) for key, event, ms in captured["events"]] == [
        (f"d{i}".encode(), FIELDS, T0 + i) for i in range(3)]


def test_live_reports_go_out_at_their_own_time_though_most_events_send_none(tmp_path, monkeypatch):
    """Synthetic events at a rate carry the wall clock's time; a local_dp producer sends one report per unit and
    window of them, far fewer than the rate: each must still leave no earlier than its time (pacing by the
    reports sent would let the event times run ahead of the clock, and the producer end early)."""
    import kafka
    import time as clock

    sends: list[tuple[float, int]] = []

    class Producer:
        def __init__(self, **options):
            pass

        def send(self, topic, key, value, timestamp_ms):
            sends.append((clock.time(), orjson.loads(value)["ts"]))

        def flush(self):
            pass

        def close(self):
            pass

    monkeypatch.setattr(kafka, "KafkaProducer", Producer)
    # 400 events over 2 s, skewed over 20,000 units as the demo's are: new units, and so reports, all along
    assert main(["produce", "--topic", "t", "--synthetic", "400", "--rate", "200", "--units", "20000", "--config",
                 str(EXAMPLE), "--query", "browsers_local", "--local-dp", "browser", "--local-dp-secret-file",
                 str(_secret(tmp_path)), "--quiet"]) == 0
    assert 50 <= len(sends) < 400 and sends[-1][1] - sends[0][1] > 1_000
    assert all(sent_at >= event_ms / 1000 - 0.001 for sent_at, event_ms in sends), sends


def _produce(monkeypatch, events: Path, *options: str, config: Path = EXAMPLE) -> tuple[int, list[tuple]]:
    """Exit code and the (key, value bytes, record time) ``produce --file --local-dp browser`` handed to Kafka."""
    sent: list[tuple] = []

    def fake_send(topic, records, total, rate, **kwargs):
        sent.extend(records)
        return 0

    monkeypatch.setattr(produce, "_send", fake_send)
    code = main(["produce", "--topic", "t", "--file", str(events), "--config", str(config), "--query",
                 "browsers_local", "--local-dp", "browser", "--quiet", *options])
    return code, sent


def _events(tmp_path: Path, units: int, windows: int = 1, truth=lambda u: DOMAIN[u % len(DOMAIN)]) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(
        orjson.dumps({"device_id": f"d{u}", "ts": T0 + w * HOUR + u, "browser": truth(u)}) + b"\n"
        for w in range(windows) for u in range(units)))
    return path


@pytest.mark.parametrize("mechanism", ["krr", "oue"])
def test_a_rerun_with_the_same_secret_sends_byte_identical_reports(tmp_path, monkeypatch, mechanism):
    # A retry after a crash or a replay of the input: were its reports drawn afresh, a reader of the topic could
    # average each unit's independent reports of one true value (a majority vote over a few dozen runs finds
    # every value). The same secret makes them the same reports, whatever the number of runs.
    config, secret, events = _config(tmp_path, mechanism=mechanism), _secret(tmp_path), _events(tmp_path, 300, 2)
    code, first = _produce(monkeypatch, events, "--local-dp-secret-file", str(secret), config=config)
    assert code == 0 and len(first) == 600
    code, again = _produce(monkeypatch, events, "--local-dp-secret-file", str(secret), config=config)
    assert code == 0 and again == first
    # ... and they are randomized: many reports differ from the true value (krr: a share 1 - p = 35% of them)
    truth = {f"d{u}": DOMAIN[u % len(DOMAIN)] for u in range(300)}
    reported = [orjson.loads(value)["browser"] for _, value, _ in first]
    units = [orjson.loads(value)["device_id"] for _, value, _ in first]
    assert sum(r != ([truth[u]] if mechanism == "oue" else truth[u]) for r, u in zip(reported, units)) > 100
    # the same unit and value in another window is a report of its own (drawn from other bits)
    assert reported[:300] != reported[300:]


def test_another_secret_gives_other_reports_and_the_environment_holds_one_like_a_file(tmp_path, monkeypatch):
    events = _events(tmp_path, 300)
    key = os.urandom(16).hex().encode()  # 32 characters
    _, with_file = _produce(monkeypatch, events, "--local-dp-secret-file", str(_secret(tmp_path, key)))
    _, other = _produce(monkeypatch, events, "--local-dp-secret-file", str(_secret(tmp_path, name="other.key")))
    differ = sum(a != b for a, b in zip(with_file, other))
    # independent krr reports of one value agree with probability p^2 + (k - 1) q^2 = 0.44: about 170 of 300 differ
    assert 100 < differ < 240, differ
    monkeypatch.setenv(SECRET_ENV, key.decode())
    _, with_env = _produce(monkeypatch, events)
    assert with_env == with_file


@pytest.mark.parametrize("mechanism", ["krr", "oue"])
def test_keyed_reports_follow_the_randomizers_exact_law(tmp_path, monkeypatch, mechanism):
    # Determinism must not bias the mechanism: over many distinct (unit, window) pairs of one true value, the
    # reports sent follow k-ary randomized response's law, resp. optimized unary encoding's (the true bit with
    # probability 1/2, each of the k - 1 others with q, independently: tallied as the true bit x how many
    # others are set, 0, 1, 2 or 3+).
    units, windows, k = 2_000, 4, len(DOMAIN)
    events = _events(tmp_path, units, windows, truth=lambda u: "firefox")
    code, sent = _produce(monkeypatch, events, "--local-dp-secret-file", str(_secret(tmp_path)),
                          config=_config(tmp_path, mechanism=mechanism))
    assert code == 0 and len(sent) == units * windows
    reports = [orjson.loads(value)["browser"] for _, value, _ in sent]
    if mechanism == "krr":
        observed = [reports.count(v) for v in DOMAIN]

        def law(epsilon):
            q = 1 / (math.exp(epsilon) + k - 1)
            return [math.exp(epsilon) * q if v == "firefox" else q for v in DOMAIN]
    else:
        cells = list(itertools.product([False, True], range(4)))
        tally = [("firefox" in r, min(len(set(r) - {"firefox"}), 3)) for r in reports]
        observed = [tally.count(cell) for cell in cells]

        def law(epsilon):
            q = 1 / (math.exp(epsilon) + 1)
            others = [math.comb(k - 1, j) * q ** j * (1 - q) ** (k - 1 - j) for j in range(3)]
            others.append(1 - sum(others))
            return [0.5 * others[j] for _, j in cells]
    n = len(reports)
    assert stats.chisquare(observed, [n * x for x in law(EPSILON)]).pvalue > P_MIN, observed
    assert stats.chisquare(observed, [n * x for x in law(1.2 * EPSILON)]).pvalue < 1e-20, observed


def test_no_secret_a_short_one_or_two_are_refused_before_sending(tmp_path, monkeypatch, capsys):
    events = _events(tmp_path, 3)
    code, sent = _produce(monkeypatch, events)
    err = capsys.readouterr().err
    assert code == 1 and not sent
    assert "--local-dp needs a secret" in err and "head -c 32 /dev/urandom >" in err
    assert "--local-dp-secret-file" in err
    assert SECRET_ENV in err

    code, sent = _produce(monkeypatch, events, "--local-dp-secret-file", str(_secret(tmp_path, b"0123456789abcde")))
    err = capsys.readouterr().err
    assert code == 1 and not sent
    assert "is 15 bytes" in err and "at least 16" in err and "head -c 32 /dev/urandom >" in err

    code, sent = _produce(monkeypatch, events, "--local-dp-secret-file", str(tmp_path / "missing.key"))
    err = capsys.readouterr().err
    assert code == 1 and not sent
    assert "missing.key" in err and "head -c 32 /dev/urandom >" in err

    monkeypatch.setenv(SECRET_ENV, "xq7z!")
    code, sent = _produce(monkeypatch, events)
    err = capsys.readouterr().err
    assert code == 1 and not sent and f"{SECRET_ENV} is 5 bytes" in err and "at least 16" in err
    assert "xq7z!" not in err  # the value itself is never printed

    monkeypatch.setenv(SECRET_ENV, "0123456789abcdef0123")
    code, sent = _produce(monkeypatch, events, "--local-dp-secret-file", str(_secret(tmp_path)))
    err = capsys.readouterr().err
    assert code == 1 and not sent and "both" in err and SECRET_ENV in err


def test_reports_for_a_topic_that_feeds_a_local_query_of_other_settings_are_refused(tmp_path, monkeypatch, capsys):
    """Its worker takes reports of its own randomizer only: reports at another epsilon would all be dead-lettered."""
    document = yaml.safe_load(EXAMPLE.read_text())
    local = next(q for q in document["queries"] if q["name"] == "browsers_local")
    other = {**local, "name": "browsers_local_4", "input_topic": "events.browsers4", "output_topic": "dp.browsers4",
             "local_dp": {**local["local_dp"], "epsilon": 4.0}, "epsilon": 4.0}
    document["queries"].append(other)
    config = tmp_path / "queries.yaml"
    config.write_text(yaml.safe_dump(document))
    sent = []
    monkeypatch.setattr(produce, "_send", lambda topic, *a, **k: sent.append(topic) or 0)
    base = ["produce", "--synthetic", "10", "--config", str(config), "--query", "browsers_local", "--local-dp",
            "browser", "--local-dp-secret-file", str(_secret(tmp_path)), "--quiet"]
    assert main([*base, "--topic", "events.browsers4"]) == 1
    err = capsys.readouterr().err
    assert "--topic 'events.browsers4' feeds query 'browsers_local_4'" in err and "use --query browsers_local_4" in err
    assert not sent
    assert main([*base, "--topic", "events.browsers"]) == 0  # the query's own topic
    assert sent == ["events.browsers"]
