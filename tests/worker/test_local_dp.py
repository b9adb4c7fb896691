"""Local DP end to end: `stream-dp produce --local-dp` randomizes (k-ary randomized response, optimized unary
encoding), the real worker debiases, on the real broker.

The true values are known here, so: what reaches Kafka is checked against the
randomizer's law (the true value in a share p of the events, by a binomial
test at P_MIN = 1e-4), and each released estimate against the truth within 4
of its stated standard deviations (12 estimates: a false failure below 1e-3).
"""

from __future__ import annotations

import collections
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import orjson
import pytest
import redis
import yaml
from scipy import stats

from stream_dp.budget import RedisBudgetStore, policy_from_config
from stream_dp.config import load_config
from tests.worker._support import consume_all, free_port

pytestmark = [pytest.mark.services, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "deploy/schemas/release.schema.json").read_text())
DOMAIN = ["a", "b", "c", "d"]
SHARES = [0.5, 0.3, 0.15, 0.05]
UNITS = 3_000
WINDOWS = 3
WINDOW_MS = 5_000
EPSILON = 2.0
P_MIN = 1e-4


def _truth(unit: int) -> str:
    """Unit u's true value: the first SHARES[0] of the units say "a", and so on."""
    edge, cumulative = unit / UNITS, 0.0
    for value, share in zip(DOMAIN, SHARES):
        cumulative += share
        if edge < cumulative:
            return value
    return DOMAIN[-1]


@pytest.mark.parametrize("mechanism", ["krr", "oue"])
def test_producer_randomizes_and_the_worker_releases_debiased_frequencies(
    tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name, mechanism
):
    topic, output = new_topic("in", partitions=2), f"{unique_name}-out"
    namespace, name = f"{unique_name}-devices", unique_name.replace("-", "_")[-30:] + "_local"
    config_path = tmp_path / "queries.yaml"
    config_path.write_text(yaml.safe_dump({
        "namespaces": {namespace: {"budgets": [{"horizon": "1h", "epsilon": 100.0}]}},
        "queries": [{
            "name": name, "input_topic": topic, "output_topic": output,
            "privacy_unit": {"namespace": namespace, "field": "device_id"}, "timestamp_field": "ts",
            "window": {"size": "5s", "allowed_lateness": "1s", "idle_timeout": "2s"},
            "group_by": ["browser"], "groups": {"public": DOMAIN},
            "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
            "aggregations": {"count": {}}, "release_timeout": "30s",
            "local_dp": {"field": "browser", "mechanism": mechanism, "epsilon": EPSILON}, "epsilon": EPSILON,
        }],
    }))
    first_start = (int(time.time() * 1000) - 120_000) // WINDOW_MS * WINDOW_MS
    events = tmp_path / "events.jsonl"
    truth: dict[tuple[str, int], str] = {}
    with events.open("wb") as handle:
        for w in range(WINDOWS):
            for u in range(UNITS):
                ts = first_start + w * WINDOW_MS + u  # within the window
                truth[(f"d{u}", ts)] = _truth(u)
                handle.write(orjson.dumps({"device_id": f"d{u}", "ts": ts, "browser": _truth(u)}) + b"\n")
        handle.write(orjson.dumps({"device_id": "x", "ts": first_start, "browser": "lynx"}) + b"\n")  # not in domain

    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, REDIS_URL=redis_url)
    (secret := tmp_path / "local-dp.key").write_bytes(os.urandom(32))  # the producer's key for its reports
    produced = subprocess.run(
        [sys.executable, "-m", "stream_dp.cli.main", "produce", "--topic", topic, "--file", str(events), "--quiet",
         "--config", str(config_path), "--query", name, "--local-dp", "browser",
         "--local-dp-secret-file", str(secret)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert produced.returncode == 0, produced.stderr
    assert "1 events with no 'browser' in the local_dp domain were not sent" in produced.stderr

    # What Kafka holds: randomized reports only, the true value in a share p = e^eps / (e^eps + k - 1).
    sent = [orjson.loads(m.value) for m in consume_all(kafka_bootstrap, topic, until=lambda rs: len(rs) >= WINDOWS * UNITS,
                                                       timeout_s=60)]
    assert len(sent) == WINDOWS * UNITS
    if mechanism == "krr":
        assert all(e["browser"] in DOMAIN for e in sent)
        kept = sum(e["browser"] == truth[(e["device_id"], e["ts"])] for e in sent)
        p = math.exp(EPSILON) / (math.exp(EPSILON) + len(DOMAIN) - 1)
        assert stats.binomtest(kept, len(sent), p).pvalue > P_MIN, (kept, len(sent), p)
    else:
        # optimized unary encoding: a set of values; the true one in it with p = 1/2, each other with
        # q = 1 / (e^eps + 1), independently
        assert all(set(e["browser"]) <= set(DOMAIN) and len(set(e["browser"])) == len(e["browser"]) for e in sent)
        kept = sum(truth[(e["device_id"], e["ts"])] in e["browser"] for e in sent)
        others = sum(len(e["browser"]) for e in sent) - kept
        assert stats.binomtest(kept, len(sent), 0.5).pvalue > P_MIN, kept
        q = 1 / (math.exp(EPSILON) + 1)
        assert stats.binomtest(others, len(sent) * (len(DOMAIN) - 1), q).pvalue > P_MIN, others

    worker_env = dict(env, STREAM_DP_GROUP_ID=f"{unique_name}-g", STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{unique_name}.",
                      STREAM_DP_CONTRIBUTION_SECRET="test-secret-0123456789abcdef",
                      STREAM_DP_METRICS_PORT=str(free_port()))
    log = open(tmp_path / "worker.log", "wb")
    worker = subprocess.Popen([sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(config_path)],
                              env=worker_env, stdout=subprocess.DEVNULL, stderr=log)
    starts = {first_start + w * WINDOW_MS for w in range(WINDOWS)}
    try:
        records = [orjson.loads(m.value) for m in consume_all(
            kafka_bootstrap, output, timeout_s=120,
            until=lambda rs: starts <= {orjson.loads(m.value)["window"]["start_ms"] for m in rs})]
    finally:
        worker.terminate()
        worker.wait(30)
        log.close()

    validator = jsonschema.Draft202012Validator(SCHEMA)
    released = collections.defaultdict(dict)
    for record in records:
        validator.validate(record)
        assert record["privacy"]["trust_model"] == "local" and record["privacy"]["mechanism"] == f"local_{mechanism}"
        released[record["window"]["start_ms"]][record["group"]["browser"]] = record
    for start in starts:
        assert set(released[start]) == set(DOMAIN), f"window {start}: {sorted(released[start])}; log {tmp_path}"
        for value, share in zip(DOMAIN, SHARES):
            record = released[start][value]
            assert record["local_dp"]["reports"] == UNITS
            true_count = sum(_truth(u) == value for u in range(UNITS))
            assert abs(record["count"] - true_count) <= 4 * math.sqrt(record["local_dp"]["variance"]), record
            assert record["ci95"]["count"] >= 1.96 * math.sqrt(record["local_dp"]["variance"]) - 1e-9

    # Each device is charged its report's epsilon once per window it reported in.
    store = RedisBudgetStore(redis.Redis.from_url(redis_url), policy_from_config(load_config(config_path)))
    (hour,) = store.spend(namespace, "d0", int(time.time() * 1000))
    assert hour.spent == pytest.approx(WINDOWS * EPSILON, rel=1e-6)
