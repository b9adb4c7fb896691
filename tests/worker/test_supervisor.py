"""``stream-dp run --processes 2``: two workers in one group behind one endpoint, stopped together.

Real broker and Redis. The two children share the input partitions like two
hosts would; the supervisor's /metrics carries both, told apart by a
``process`` label; /readyz answers for both. A window is released once. When
a child dies the supervisor stops the other and exits non-zero (whatever
restarts it restarts the set); on SIGTERM all stop cleanly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import orjson
import pytest
import yaml
from kafka import KafkaProducer

from tests.worker._support import consume_all, free_port, metric_sum


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listing:
            return [int(p) for p in listing.read().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_two_processes_share_the_group_behind_one_endpoint(tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name):
    name = unique_name.replace("-", "_")[-40:]
    topic = new_topic("in", partitions=4)
    output_topic = f"{unique_name}-out"
    config = {
        "namespaces": {f"{name}-users": {"budgets": [{"horizon": "1h", "epsilon": 100.0}]}},
        "queries": [{
            "name": name, "input_topic": topic, "output_topic": output_topic,
            "privacy_unit": {"namespace": f"{name}-users", "field": "user_id"}, "timestamp_field": "ts",
            "window": {"size": "10s", "allowed_lateness": "1s", "idle_timeout": "3s"},
            "group_by": ["page"], "groups": {"public": ["a"]},
            "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
            "aggregations": {"count": {}}, "epsilon": 4.0,
        }],
    }
    config_path = tmp_path / "queries.yaml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, REDIS_URL=redis_url,
               STREAM_DP_GROUP_ID=f"{unique_name}-g", STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{unique_name}.",
               STREAM_DP_CONTRIBUTION_SECRET="test-secret-0123456789abcdef", STREAM_DP_METRICS_PORT=str(port))
    command = [sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(config_path), "--processes", "2"]

    def start() -> subprocess.Popen:
        with open(tmp_path / "supervisor.log", "ab") as log:
            return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log)

    supervisor = start()
    try:
        deadline = time.monotonic() + 90
        status, body = 0, ""
        while time.monotonic() < deadline and status != 200:
            status, body = _get(port, "/readyz")
            time.sleep(0.5)
        log_text = lambda: (tmp_path / "supervisor.log").read_text(errors="replace")[-3000:]  # noqa: E731
        assert status == 200, f"{body}\n{log_text()}"
        assert body.count("ok: 2 input partitions assigned") == 2, body  # 4 partitions shared by 2 processes

        # Live events (stamped now): the partitions have been idle, so older record times would be late.
        now = int(time.time() * 1000)
        window = now // 10_000 * 10_000
        producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        for u in range(40):
            producer.send(topic, key=f"u{u}".encode(), value=orjson.dumps({"user_id": f"u{u}", "ts": now,
                                                                          "page": "a"}))
        producer.flush()
        producer.close()
        consume_all(kafka_bootstrap, output_topic, timeout_s=60,
                    until=lambda rs: any(orjson.loads(r.value)["window"]["start_ms"] == window for r in rs))
        time.sleep(3)  # a second release of the window, if any, would come now
        records = consume_all(kafka_bootstrap, output_topic, timeout_s=5, until=lambda rs: False)
        released = [orjson.loads(r.value) for r in records if orjson.loads(r.value)["window"]["start_ms"] == window]
        assert len(released) == 1 and abs(released[0]["count"] - 40) <= 5, released

        status, page = _get(port, "/metrics")
        assert status == 200
        per_process = [metric_sum(page, "stream_dp_events_total", query=name, outcome="accepted", process=p)
                       for p in ("0", "1")]
        assert sum(per_process) == 40 and all(per_process), per_process  # both processes read events

        # A child dies: the other is stopped and the supervisor exits non-zero.
        children = _children(supervisor.pid)
        assert len(children) == 2, children
        os.kill(children[0], signal.SIGKILL)
        assert supervisor.wait(timeout=90) != 0
        assert not any(_alive(c) for c in children), "a worker process outlived its supervisor"

        # SIGTERM stops the set cleanly.
        supervisor = start()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and _get(port, "/readyz")[0] != 200:
            time.sleep(0.5)
        children = _children(supervisor.pid)
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=90) == 0, log_text()
        assert len(children) == 2 and not any(_alive(c) for c in children)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
