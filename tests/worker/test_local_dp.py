"""Local DP end to end: `stream-dp produce --local-dp` randomizes (k-ary randomized response, optimized unary
encoding), the real worker debiases, on the real broker.

The true values are known here, so: what reaches Kafka is checked against the
randomizer's law (the true value in a share p of the events, by a binomial
test at P_MIN = 1e-4), and each released estimate against the truth within 4
of its stated standard deviations (12 estimates: a false failure below 1e-3).

Events that are not reports of the query's randomizer -- true values from a
plain producer, reports of another epsilon -- must be dead-lettered
(``not_randomized``, ``randomizer_mismatch``) and left out of the estimates:
the debiased count of true values is an invertible function of the true counts.
So must a report tagged as the query's own whose value is not in the domain
(``value_out_of_range``), and its unit is never charged.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import orjson
import pytest
import redis
import yaml
from kafka import KafkaProducer
from scipy import stats

from stream_dp.budget import RedisBudgetStore, policy_from_config
from stream_dp.config import load_config
from tests.worker._support import BACKFILL, PRODUCER_STAMPED, consume_all, free_port, iso_ms, metric_sum, scrape

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


def _config(tmp_path: Path, namespace: str, name: str, topic: str, output: str, mechanism: str,
            publish_from_ms: int) -> Path:
    config_path = tmp_path / "queries.yaml"
    config_path.write_text(yaml.safe_dump({
        "namespaces": {namespace: {"budgets": [{"horizon": "1h", "epsilon": 100.0}]}},
        "queries": [{
            "name": name, "input_topic": topic, "output_topic": output,
            "privacy_unit": {"namespace": namespace, "field": "device_id"}, "timestamp_field": "ts",
            # a backfill: published from its first window (the worker's first start is later)
            "window": {"size": "5s", "allowed_lateness": "1s", "idle_timeout": "2s",
                       "publish_from": iso_ms(publish_from_ms)},
            "group_by": ["browser"], "groups": {"public": DOMAIN},
            "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
            "aggregations": {"count": {}}, "release_timeout": "30s",
            "local_dp": {"field": "browser", "mechanism": mechanism, "epsilon": EPSILON}, "epsilon": EPSILON,
            **BACKFILL,  # `produce` stamps each report with its event's time: past windows close as they are read
        }],
    }))
    return config_path


def _produce_reports(tmp_path: Path, env: dict, topic: str, events: Path, config_path: Path, name: str):
    """``stream-dp produce --local-dp browser`` of ``events``, with a fresh producer key."""
    (secret := tmp_path / "local-dp.key").write_bytes(os.urandom(32))  # the producer's key for its reports
    produced = subprocess.run(
        [sys.executable, "-m", "stream_dp.cli.main", "produce", "--topic", topic, "--file", str(events), "--quiet",
         "--config", str(config_path), "--query", name, "--local-dp", "browser",
         "--local-dp-secret-file", str(secret)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert produced.returncode == 0, produced.stderr
    return produced


@contextlib.contextmanager
def _worker(tmp_path: Path, env: dict, config_path: Path, unique_name: str) -> Iterator[int]:
    """A real worker on ``config_path``; yields its metrics port."""
    port = free_port()
    worker_env = dict(env, STREAM_DP_GROUP_ID=f"{unique_name}-g", STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{unique_name}.",
                      STREAM_DP_CONTRIBUTION_SECRET="test-secret-0123456789abcdef",
                      STREAM_DP_METRICS_PORT=str(port))
    log = open(tmp_path / "worker.log", "wb")
    worker = subprocess.Popen([sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(config_path)],
                              env=worker_env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        yield port
    finally:
        worker.terminate()
        worker.wait(30)
        log.close()


def _releases(bootstrap: str, output: str, starts: set[int]) -> list[dict]:
    return [orjson.loads(m.value) for m in consume_all(
        bootstrap, output, timeout_s=120,
        until=lambda rs: starts <= {orjson.loads(m.value)["window"]["start_ms"] for m in rs})]


@pytest.mark.parametrize("mechanism", ["krr", "oue"])
def test_producer_randomizes_and_the_worker_releases_debiased_frequencies(
    tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name, mechanism
):
    topic, output = new_topic("in", partitions=2, configs=PRODUCER_STAMPED), f"{unique_name}-out"
    namespace, name = f"{unique_name}-devices", unique_name.replace("-", "_")[-30:] + "_local"
    first_start = (int(time.time() * 1000) - 120_000) // WINDOW_MS * WINDOW_MS
    config_path = _config(tmp_path, namespace, name, topic, output, mechanism, first_start)
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
    produced = _produce_reports(tmp_path, env, topic, events, config_path, name)
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

    starts = {first_start + w * WINDOW_MS for w in range(WINDOWS)}
    with _worker(tmp_path, env, config_path, unique_name):
        records = _releases(kafka_bootstrap, output, starts)

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


def test_true_values_and_other_randomizers_reports_are_rejected_not_released(
    tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name
):
    """A producer that forgot --local-dp (true values), randomized with other settings or reports a value outside
    the domain shares the topic with `produce --local-dp`: the worker releases the estimate of the tagged reports
    of the domain alone, dead-letters the rest and charges no unit for them."""
    topic, output = new_topic("in", partitions=2, configs=PRODUCER_STAMPED), f"{unique_name}-out"
    namespace, name = f"{unique_name}-devices", unique_name.replace("-", "_")[-30:] + "_local"
    first_start = (int(time.time() * 1000) - 120_000) // WINDOW_MS * WINDOW_MS
    config_path = _config(tmp_path, namespace, name, topic, output, "krr", first_start)
    starts = {first_start + w * WINDOW_MS for w in range(WINDOWS)}
    events = tmp_path / "events.jsonl"
    events.write_bytes(b"".join(
        orjson.dumps({"device_id": f"d{u}", "ts": first_start + w * WINDOW_MS + u, "browser": _truth(u)}) + b"\n"
        for w in range(WINDOWS) for u in range(UNITS)))
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, REDIS_URL=redis_url)
    _produce_reports(tmp_path, env, topic, events, config_path, name)

    # Other units' events on the same topic, keyed and placed as the worker requires: true values (all "d", so
    # that counting them would move d's estimate by far more than its error), and reports tagged as made at
    # epsilon 1 -- the tag as the README defines it, written here from that definition -- and reports with the
    # query's own tag of a value the domain does not hold.
    plain, forged, outside = 600, 40, 30
    digest = hashlib.sha256(orjson.dumps(DOMAIN)).hexdigest()[:16]
    other_epsilon, own = (f"krr:{eps.hex()}:{len(DOMAIN)}:{digest}" for eps in (1.0, EPSILON))
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    for start in sorted(starts):
        for u in range(plain + forged + outside):
            event = {"device_id": f"p{u}", "ts": start + u, "browser": "d" if u < plain + forged else "lynx"}
            if u >= plain:
                event["_local_dp"] = other_epsilon if u < plain + forged else own
            producer.send(topic, key=f"p{u}".encode(), value=orjson.dumps(event), timestamp_ms=event["ts"])
    producer.flush()
    producer.close()

    with _worker(tmp_path, env, config_path, unique_name) as port:
        records = _releases(kafka_bootstrap, output, starts)
        released = {(r["window"]["start_ms"], r["group"]["browser"]): r for r in records}
        for start in starts:
            for value in DOMAIN:
                record = released[(start, value)]
                assert record["local_dp"]["reports"] == UNITS, (start, value, record["local_dp"])
                true_count = sum(_truth(u) == value for u in range(UNITS))
                assert abs(record["count"] - true_count) <= 4 * math.sqrt(record["local_dp"]["variance"]), record

        expected = {"not_randomized": WINDOWS * plain, "randomizer_mismatch": WINDOWS * forged,
                    "value_out_of_range": WINDOWS * outside}
        deadline = time.monotonic() + 30
        while True:
            text = scrape(port)
            counted = {reason: metric_sum(text, "stream_dp_events_rejected_total", query=name, reason=reason)
                       for reason in expected}
            if counted == expected or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert counted == expected

    dead = consume_all(kafka_bootstrap, f"{unique_name}.dead-letter", timeout_s=30,
                       until=lambda rs: len(rs) >= sum(expected.values()))
    reasons = collections.Counter(dict(r.headers)["reason"].decode() for r in dead)
    assert reasons == expected, reasons
    for record in dead:
        event, headers = orjson.loads(record.value), dict(record.headers)  # the original bytes
        assert event["device_id"].startswith("p") and headers["query"] == name.encode()
        assert ("_local_dp" in event) == (headers["reason"] != b"not_randomized")
        assert (event["browser"] == "lynx") == (headers["reason"] == b"value_out_of_range")
    store = RedisBudgetStore(redis.Redis.from_url(redis_url), policy_from_config(load_config(config_path)))
    now_ms = int(time.time() * 1000)
    assert [store.spend(namespace, f"p{u}", now_ms)[0].spent for u in (0, plain, plain + forged)] == [0.0] * 3
    assert store.spend(namespace, "d0", now_ms)[0].spent == pytest.approx(WINDOWS * EPSILON, rel=1e-6)
