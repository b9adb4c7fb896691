"""The ``stream-dp`` command: its subcommands, and produce/tail against the real broker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from kafka import KafkaConsumer

from stream_dp.cli.main import SUBCOMMANDS, build_parser, main
from stream_dp.cli.tail import format_row

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "queries.example.yaml"


def test_help_lists_the_six_subcommands():
    out = subprocess.run([sys.executable, "-m", "stream_dp.cli.main", "--help"], capture_output=True, text=True, check=True)
    for name in ("run", "check-config", "plan", "produce", "tail", "budget"):
        assert name in out.stdout
    assert set(SUBCOMMANDS) == {"run", "check-config", "plan", "produce", "tail", "budget"}
    assert build_parser().parse_args(["check-config", "x.yaml"]).config == "x.yaml"


def test_check_config_ok_and_failing(tmp_path, capsys):
    assert main(["check-config", str(EXAMPLE)]) == 0
    assert "OK (10 queries)" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("epsilon: 0.1 ", "epsilon: -0.1 "))
    assert main(["check-config", str(bad)]) == 1
    assert "pageviews_by_page" in capsys.readouterr().err


def test_plan_json_states_loss_scales_and_budget_use(capsys):
    assert main(["plan", str(EXAMPLE), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)[0]
    assert plan["per_window_loss"]["epsilon"] == pytest.approx(0.1, rel=1e-6)
    assert plan["count_scale"] > 0 and plan["sum_scale"] > 0
    hour = plan["horizons"][0]
    assert hour["windows_in_horizon"] == 60 and hour["windows_a_unit_can_join"] == 10
    counts = [a["count"] for a in plan["accuracy"]]
    assert counts == sorted(counts) and all(a["count_ci95"] > 0 for a in plan["accuracy"])


def test_plan_shows_the_delta_a_fully_active_unit_spends(tmp_path, capsys):
    selecting = tmp_path / "select.yaml"
    first_query = EXAMPLE.read_text().split("  # --- options")[0]  # the options need public groups
    text = first_query.replace("public: [\"/\", \"/pricing\", \"/docs\"]", "select: {delta: 1.0e-6}")
    assert "select: {delta: 1.0e-6}" in text
    selecting.write_text(text)
    assert main(["plan", str(selecting), "--json"]) == 0
    (plan,) = json.loads(capsys.readouterr().out)
    assert 0.99e-6 < plan["per_window_delta"] <= 1e-6  # the selection threshold may spend a little less
    hour, day = plan["horizons"]
    # epsilon 0.1 per window: 10 windows fit 1.0 per hour; delta 1e-6 per window: 10 fit 1e-5
    assert hour["windows_a_unit_can_join"] == 10
    assert hour["fully_active_unit_spends"]["delta"] == pytest.approx(10 * plan["per_window_delta"])
    assert day["fully_active_unit_spends"] == {"epsilon": pytest.approx(4.0),
                                               "delta": pytest.approx(40 * plan["per_window_delta"])}
    assert main(["plan", str(selecting)]) == 0
    assert "delta 9.93e-06 per 1h" in capsys.readouterr().out
    # Without a delta limit the query's delta would be unbounded: plan (and run) refuse it.
    no_delta = tmp_path / "no_delta.yaml"
    no_delta.write_text(text.replace(", delta: 1.0e-5}", "}").replace(", delta: 4.0e-5}", "}"))
    assert main(["plan", str(no_delta)]) == 1
    assert "has no delta limit" in capsys.readouterr().err


def test_run_without_secret_explains_how_to_set_it(monkeypatch, capsys):
    monkeypatch.delenv("STREAM_DP_CONTRIBUTION_SECRET", raising=False)
    assert main(["run", "--config", str(EXAMPLE)]) == 1
    assert "STREAM_DP_CONTRIBUTION_SECRET is not set" in capsys.readouterr().err


def test_produce_synthetic_is_keyed_by_unit_and_uses_the_query_fields(kafka_bootstrap, new_topic, monkeypatch):
    topic = new_topic("events", partitions=2)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    assert main(["produce", "--topic", topic, "--synthetic", "500", "--units", "20", "--config", str(EXAMPLE),
                 "--query", "pageviews_by_page", "--quiet"]) == 0
    consumer = KafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                             consumer_timeout_ms=5000)
    events = [(m.key, m.partition, orjson.loads(m.value)) for m in consumer]
    consumer.close()
    assert len(events) == 500
    partition_of_unit = {}
    for key, partition, event in events:
        assert key == event["user_id"].encode()
        assert event["page"] in {"/", "/pricing", "/docs"}
        assert partition_of_unit.setdefault(key, partition) == partition  # all of a unit's events in one partition
    times = [e["ts"] for _, _, e in events]
    assert max(times) - min(times) == pytest.approx(499, abs=1)


def test_tail_prints_release_records(kafka_bootstrap, new_topic, monkeypatch, capsys):
    from kafka import KafkaProducer

    topic = new_topic("releases")
    record = {
        "release_id": "q:0:ab", "query": "q", "window": {"start": "2026-01-01T00:00:00.000Z", "end": "x", "start_ms": 0, "end_ms": 1},
        "group": {"page": "/docs"}, "count": 12, "sum": 3.5, "mean": 0.29, "ci95": {"count": 4.0, "sum": 2.0, "mean": 1.0},
        "std": {"count": 1.0, "sum": 1.0}, "privacy": {"epsilon": 0.1}, "released_at_ms": 1, "released_at": "x",
    }
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    producer.send(topic, orjson.dumps(record))
    producer.flush()
    producer.close()
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    assert main(["tail", "--topic", topic, "--from-beginning", "--max", "1", "--timeout", "20"]) == 0
    out = capsys.readouterr().out
    assert format_row(record) in out and "/docs" in out
