"""``stream-dp budget show|top|reset`` against real Redis, with policies from a real query file."""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import pytest
import redis

from stream_dp.budget import RedisBudgetStore, policy_from_config
from stream_dp.cli.budget import register
from stream_dp.config import load_config

from .conftest import _delete_prefix

CONFIG = """
namespaces:
  users:
    budgets:
      - {horizon: 1h, epsilon: 1.0, delta: 1.0e-5, buckets: 4}
      - {horizon: 24h, epsilon: 4.0, buckets: 24}
    alert_at: [0.8, 1.0]
  devices:
    budgets:
      - {horizon: 1h, rho: 0.5}
queries:
  - name: pageviews
    input_topic: events.pageviews
    output_topic: dp.pageviews
    privacy_unit: {namespace: users, field: user_id}
    timestamp_field: ts
    window: {size: 1m}
    group_by: [page]
    groups: {public: ["/"]}
    bounds: {max_groups_per_unit: 1, max_events_per_group: 1}
    aggregations: {count: {}}
    mechanism: laplace
    epsilon: 0.1
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "queries.yaml"
    path.write_text(CONFIG)
    return path


@pytest.fixture
def cli(redis_url: str, unique_name: str, config_file: Path):
    parser = argparse.ArgumentParser(prog="stream-dp")
    register(parser.add_subparsers(dest="command", required=True))
    prefix = f"{unique_name}:"

    def run(*argv: str) -> int:
        action, rest = argv[0], list(argv[1:])
        args = parser.parse_args(
            ["budget", action, "--config", str(config_file), "--redis-url", redis_url, "--key-prefix", prefix, *rest]
        )
        return int(args.handler(args))

    client = redis.Redis.from_url(redis_url)
    yield run, RedisBudgetStore(client, policy_from_config(load_config(config_file)), key_prefix=prefix)
    _delete_prefix(client, prefix)
    client.close()


def test_policy_comes_from_the_query_file(config_file: Path) -> None:
    policy = policy_from_config(load_config(config_file))
    users = policy.namespace("users")
    assert users.accounting == "epsilon" and users.alert_at == (0.8, 1.0)
    assert [(h.horizon_ms, h.limit, h.buckets, h.delta) for h in users.horizons] == [
        (3_600_000, 1.0, 4, False), (3_600_000, 1e-5, 4, True), (86_400_000, 4.0, 24, False)]
    devices = policy.namespace("devices")
    assert devices.accounting == "rho" and devices.horizons[0].limit == 0.5


def test_show_and_top(cli, capsys: pytest.CaptureFixture[str]) -> None:
    run, store = cli
    now = time.time_ns() // 1_000_000
    store.charge("users", "q/1", ["alice", "bob"], 0.6, now, delta=2e-6)
    store.charge("users", "q/2", ["alice"], 0.3, now)
    assert run("show", "--namespace", "users", "alice") == 0
    out = capsys.readouterr().out
    assert "unit alice" in out
    assert out.splitlines()[1].split() == ["horizon", "currency", "spent", "limit", "remaining", "used"]
    assert "      1h   epsilon      0.900000      1.000000      0.100000    90.0%" in out
    assert "      1h     delta    2.0000e-06    1.0000e-05    8.0000e-06    20.0%" in out
    assert "      1d   epsilon      0.900000      4.000000      3.100000    22.5%" in out
    assert run("show", "--namespace", "users", "alice", "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(h["horizon"], h["currency"]) for h in shown["horizons"]] == [
        ("1h", "epsilon"), ("1h-delta", "delta"), ("1d", "epsilon")]
    assert [h["spent"] for h in shown["horizons"]] == [0.9, 2e-6, 0.9]
    assert [h["remaining"] for h in shown["horizons"]] == pytest.approx([0.1, 8e-6, 3.1])
    assert run("top", "--namespace", "users", "-n", "5") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["1", "90.0%", "alice"]
    assert lines[2].split() == ["2", "60.0%", "bob"]


def test_show_rho_namespace_reports_epsilon(cli, capsys: pytest.CaptureFixture[str]) -> None:
    run, store = cli
    store.charge("devices", "q/1", ["d1"], 0.25, time.time_ns() // 1_000_000)
    assert run("show", "--namespace", "devices", "d1") == 0
    out = capsys.readouterr().out
    assert "(rho)" in out and "epsilon" in out and "delta=1e-09" in out


def test_reset_needs_yes_and_is_logged(
    cli, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    run, store = cli
    now = time.time_ns() // 1_000_000
    store.charge("users", "q/1", ["alice"], 0.6, now)
    assert run("reset", "--namespace", "users", "alice") == 2
    assert "add --yes" in capsys.readouterr().err
    assert store.spend("users", "alice", now)[0].spent == 0.6
    with caplog.at_level(logging.WARNING, logger="stream_dp.budget.admin"):
        assert run("reset", "--namespace", "users", "alice", "--yes") == 0
    assert "reset unit 'alice'" in capsys.readouterr().out
    assert any("budget reset: namespace=users unit='alice'" in r.getMessage() for r in caplog.records)
    assert store.spend("users", "alice", now)[0].spent == 0.0


def test_errors_are_reported_not_raised(cli, capsys: pytest.CaptureFixture[str]) -> None:
    run, _ = cli
    assert run("show", "--namespace", "visitors", "alice") == 1
    assert "known namespaces: devices, users" in capsys.readouterr().err
    assert run("top", "--namespace", "users", "-n", "0") == 2


def test_unreachable_redis_is_an_error(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="stream-dp")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        [
            "budget",
            "show",
            "--config",
            str(config_file),
            "--namespace",
            "users",
            "--redis-url",
            "redis://127.0.0.1:1/0",
            "alice",
        ]
    )
    assert args.handler(args) == 1
    assert "unreachable" in capsys.readouterr().err



def test_the_cli_and_the_worker_use_the_same_delay(
    config_file: Path, redis_url: str, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both derive the store's accepted delay from the input retention, so they share one key layout."""
    from prometheus_client import CollectorRegistry

    from stream_dp.cli.budget import open_store
    from stream_dp.config import Settings
    from stream_dp.worker.app import Worker
    from stream_dp.worker.store.ledger import MemoryReleaseLedger

    parser = argparse.ArgumentParser(prog="stream-dp")
    register(parser.add_subparsers(dest="command", required=True))
    monkeypatch.setenv("STREAM_DP_INPUT_RETENTION_MS", str(2 * 86_400_000))
    monkeypatch.setenv("STREAM_DP_CONTRIBUTION_SECRET", "0123456789abcdef0123")
    monkeypatch.setenv("REDIS_URL", redis_url)
    base = ["budget", "top", "--config", str(config_file), "--namespace", "users", "--key-prefix", f"{unique_name}:"]
    delay = 2 * 86_400_000 + 3_600_000
    cli_store = open_store(parser.parse_args(base))
    flag_store = open_store(parser.parse_args([*base, "--input-retention-ms", "7200000"]))
    worker = Worker(
        load_config(config_file), Settings(), registry=CollectorRegistry(), ledger=MemoryReleaseLedger(),
        serve_metrics=False,
    )
    try:
        assert cli_store.options.max_delay_ms == delay
        assert flag_store.options.max_delay_ms == 7_200_000 + 3_600_000
        assert isinstance(worker.budget, RedisBudgetStore) and worker.budget.options.max_delay_ms == delay
    finally:
        for store in (cli_store, flag_store, worker.budget):
            store.close()
