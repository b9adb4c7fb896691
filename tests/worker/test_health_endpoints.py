"""A running worker answers /healthz and /readyz on its metrics port, from its real connections.

Ready once its ingest consumer has joined the group and Redis answers; a
Redis outage makes it not ready (it cannot charge, so it releases nothing)
but still live (it holds its windows and retries; a restart would not help).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.reliability.services import PrivateRedis
from tests.worker._support import free_port

REPO = Path(__file__).resolve().parents[2]


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:  # not listening yet
        return 0, str(error)


def _wait(port: int, path: str, status: int, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    last = (0, "")
    while time.monotonic() < deadline:
        last = _get(port, path)
        if last[0] == status:
            return last[1]
        time.sleep(0.25)
    raise AssertionError(f"{path} answered {last} instead of {status} within {timeout_s:.0f} s")


def one_query_config(tmp_path, new_topic, unique_name, *, partitions: int = 2):
    """A query file of one count query over a new input topic of ``partitions`` partitions."""
    name = unique_name.replace("-", "_")[-40:]
    config = {
        "namespaces": {f"{name}-users": {"budgets": [{"horizon": "1h", "epsilon": 10.0}]}},
        "queries": [{
            "name": name, "input_topic": new_topic("in", partitions=partitions), "output_topic": f"{unique_name}-out",
            "privacy_unit": {"namespace": f"{name}-users", "field": "user_id"}, "timestamp_field": "ts",
            "window": {"size": "10s"}, "group_by": ["page"], "groups": {"public": ["a"]},
            "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
            "aggregations": {"count": {}}, "epsilon": 1.0,
        }],
    }
    config_path = tmp_path / "queries.yaml"
    config_path.write_text(yaml.safe_dump(config))
    return config_path


def start_worker(config_path, kafka_bootstrap, unique_name, redis_url, port, log_path, **env):
    """A worker process on ``config_path`` with its metrics on ``port`` and its log in ``log_path``; ``env``
    adds settings (e.g. ``STREAM_DP_REDIS_TIMEOUT_S``)."""
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, REDIS_URL=redis_url,
               STREAM_DP_GROUP_ID=f"{unique_name}-g", STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{unique_name}.",
               STREAM_DP_CONTRIBUTION_SECRET="test-secret-0123456789abcdef", STREAM_DP_METRICS_PORT=str(port), **env)
    with open(log_path, "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(config_path)],
                                env=env, stdout=subprocess.DEVNULL, stderr=log, cwd=REPO)


def _stop(worker):
    worker.terminate()
    try:
        worker.wait(timeout=20)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


@pytest.mark.slow
def test_readiness_follows_the_group_and_redis_liveness_the_event_loop(tmp_path, kafka_bootstrap, new_topic, unique_name):
    config_path = one_query_config(tmp_path, new_topic, unique_name)
    redis_server = PrivateRedis(tmp_path / "redis")
    redis_server.start()
    port = free_port()
    worker = start_worker(config_path, kafka_bootstrap, unique_name, redis_server.url(), port, tmp_path / "worker.log",
                          STREAM_DP_REDIS_TIMEOUT_S="0.5")
    try:
        assert _wait(port, "/readyz", 200) == "ok: 2 input partitions assigned\n"
        assert _get(port, "/healthz") == (200, "ok\n")

        redis_server.stop()
        assert "Redis cannot be used" in _wait(port, "/readyz", 503)
        assert _get(port, "/healthz") == (200, "ok\n")  # holding and retrying, not dead

        redis_server.start()
        _wait(port, "/readyz", 200)
        assert worker.poll() is None, (tmp_path / "worker.log").read_text(errors="replace")[-3000:]
    finally:
        _stop(worker)
        redis_server.stop()


@pytest.mark.slow
def test_a_worker_on_a_redis_cluster_is_ready(tmp_path, kafka_bootstrap, redis_cluster_url, new_topic, unique_name):
    """REDIS_URL=redis+cluster://...: the budget store, the ledger and /readyz's ping all use the cluster."""
    config_path = one_query_config(tmp_path, new_topic, unique_name)
    port = free_port()
    worker = start_worker(config_path, kafka_bootstrap, unique_name, redis_cluster_url, port, tmp_path / "worker.log")
    try:
        assert _wait(port, "/readyz", 200) == "ok: 2 input partitions assigned\n", (
            (tmp_path / "worker.log").read_text(errors="replace")[-3000:]
        )
        assert worker.poll() is None
    finally:
        _stop(worker)
    assert "Redis durability" not in (tmp_path / "worker.log").read_text(errors="replace")
