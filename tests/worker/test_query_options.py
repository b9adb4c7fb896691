"""End to end on the real broker and Redis: top_k, quantiles, hierarchy, continual and staircase queries in one worker.

One input topic feeds five queries. The data is known exactly, so each
release is checked against values computed here from the README's semantics,
with bounds wide enough (4x a 95% half-width, or a gap of many noise scales)
that the whole test fails by chance with probability below 1e-3. Every record
must match the release schema.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import jsonschema
import orjson
import pytest
import redis
import yaml
from kafka import KafkaProducer

from stream_dp.budget import RedisBudgetStore, policy_from_config
from stream_dp.config import load_config
from tests.worker._support import consume_all, free_port

pytestmark = [pytest.mark.services, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "deploy/schemas/release.schema.json").read_text())
WINDOW_MS = 5_000
PERIOD_WINDOWS = 4
WINDOWS = 2 * PERIOD_WINDOWS  # two periods
UNITS = 40
# events per unit per window and page: "a" clearly the most popular, then "b", then "c"
PAGE_EVENTS = {"a": 3, "b": 2, "c": 1}
PLACES = {"a": ("FR", "IDF", "Paris"), "b": ("FR", "ARA", "Lyon"), "c": ("DE", "BE", "Berlin")}
MAX_WINDOWS_PER_UNIT = 2


def _query(name: str, topic: str, output: str, namespace: str, **options) -> dict:
    return {
        "name": name, "input_topic": topic, "output_topic": output,
        "privacy_unit": {"namespace": namespace, "field": "user_id"},
        "timestamp_field": "ts",
        "window": {"size": "5s", "allowed_lateness": "1s", "idle_timeout": "2s"},
        "group_by": ["page"], "groups": {"public": list(PAGE_EVENTS)},
        "bounds": {"max_groups_per_unit": 3, "max_events_per_group": 3},
        "release_timeout": "30s",
        **options,
    }


def _config(tmp_path: Path, topic: str, outputs: dict[str, str], namespace: str, tag: str) -> Path:
    config = {
        "namespaces": {namespace: {"budgets": [{"horizon": "1h", "epsilon": 1000.0}]}},
        "queries": [
            _query(f"{tag}_top", topic, outputs["top"], namespace, aggregations={"count": {}, "top_k": {"k": 2}}, epsilon=10.0),
            _query(f"{tag}_quantiles", topic, outputs["quantiles"], namespace, epsilon=10.0, aggregations={
                "count": {}, "quantiles": {"field": "value", "q": [0.5, 0.9], "bounds": [0, 100], "bins": 100}}),
            _query(f"{tag}_places", topic, outputs["places"], namespace, epsilon=10.0,
                   group_by=["country", "region", "city"], groups={"public": [list(p) for p in PLACES.values()]},
                   hierarchy={"split": [1, 1, 2]}, aggregations={"count": {}, "sum": {"field": "value", "clip": [0, 100]}}),
            _query(f"{tag}_today", topic, outputs["today"], namespace, epsilon=10.0,
                   continual={"period": f"{PERIOD_WINDOWS * WINDOW_MS // 1000}s",
                              "max_windows_per_unit": MAX_WINDOWS_PER_UNIT},
                   aggregations={"count": {}, "sum": {"field": "value", "clip": [0, 100]}}),
            _query(f"{tag}_stairs", topic, outputs["stairs"], namespace, epsilon=10.0, mechanism="staircase",
                   aggregations={"count": {}, "sum": {"field": "value", "clip": [0, 100]}, "mean": {"field": "value"}}),
        ],
    }
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _value(unit: int, event: int) -> float:
    """Values 1..UNITS*3 spread evenly: the median of a page's values is known."""
    return float(1 + (unit * 3 + event) % 90)


def test_options_release_what_the_readme_says(tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name):
    topic = new_topic("in", partitions=2)
    outputs = {k: f"{unique_name}-{k}" for k in ("top", "quantiles", "places", "today", "stairs")}
    namespace = f"{unique_name}-users"
    config_path = _config(tmp_path, topic, outputs, namespace, unique_name.replace("-", "_")[-30:])
    period_ms = PERIOD_WINDOWS * WINDOW_MS
    first_start = (int(time.time() * 1000) - 180_000) // period_ms * period_ms
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    values: dict[str, list[float]] = collections.defaultdict(list)  # per page, every event of one window
    for w in range(WINDOWS):
        for u in range(UNITS):
            for page, events in PAGE_EVENTS.items():
                country, region, city = PLACES[page]
                for e in range(events):
                    ts = first_start + w * WINDOW_MS + 50 * u + e
                    event = {"user_id": f"u{u}", "ts": ts, "page": page, "value": _value(u, e),
                             "country": country, "region": region, "city": city}
                    if w == 0:
                        values[page].append(event["value"])
                    producer.send(topic, key=f"u{u}".encode(), value=orjson.dumps(event), timestamp_ms=ts)
    producer.flush()

    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, REDIS_URL=redis_url,
               STREAM_DP_GROUP_ID=f"{unique_name}-g", STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{unique_name}.",
               STREAM_DP_CONTRIBUTION_SECRET="test-secret-0123456789abcdef", STREAM_DP_METRICS_PORT=str(metrics_port := free_port()))
    log = open(tmp_path / "worker.log", "wb")
    worker = subprocess.Popen([sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(config_path)],
                              env=env, stdout=subprocess.DEVNULL, stderr=log)
    starts = [first_start + w * WINDOW_MS for w in range(WINDOWS)]
    try:
        def windows_of(records, kind=None):
            return {orjson.loads(m.value)["window"]["start_ms"] for m in records
                    if kind is None or orjson.loads(m.value).get("kind") == kind}

        got = {}
        for key, topic_name in outputs.items():
            got[key] = [orjson.loads(m.value) for m in consume_all(
                kafka_bootstrap, topic_name, until=lambda rs: set(starts) <= windows_of(rs), timeout_s=150)]
            assert set(starts) <= {r["window"]["start_ms"] for r in got[key]}, f"{key}: missing windows; log {tmp_path}"
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    finally:
        worker.terminate()
        worker.wait(30)
        log.close()

    validator = jsonschema.Draft202012Validator(SCHEMA)
    for key, records in got.items():
        for record in records:
            validator.validate(record)
        ids = collections.Counter(r["release_id"] for r in records)
        assert max(ids.values()) == 1, f"{key}: a release published twice"

    # top_k: one record per window; "a" (3 events per unit) is far ahead of "b" (2 per unit):
    # a gap of UNITS events = 40 against an exponential scale of k * Linf / epsilon_topk = 2 * 3 / 5 = 1.2.
    tops = [r for r in got["top"] if r.get("kind") == "top_k" and r["window"]["start_ms"] in starts]
    assert len(tops) == WINDOWS
    for record in tops:
        assert [t["group"]["page"] for t in record["top"]] == ["a", "b"], record
        assert record["privacy"]["mechanism"] == "permute_and_flip"
        assert record["privacy"]["epsilon"] <= record["privacy"]["window_epsilon"] + 1e-9

    # quantiles: the released median's rank among page "a"'s values (known) is within 3x the rank error
    # the record states at 95% (the exponential mechanism's tail: probability below 1e-6 per draw).
    ordered = sorted(values["a"])
    for record in got["quantiles"]:
        if record["window"]["start_ms"] not in starts or record["group"]["page"] != "a":
            continue
        released = record["quantiles"]["0.5"]
        below = sum(v < released["value"] for v in ordered)
        at_most = sum(v <= released["value"] for v in ordered)
        target = 0.5 * len(ordered)
        assert below - 3 * released["rank_error"] <= target <= at_most + 3 * released["rank_error"], (record, ordered)
        assert 0 <= released["q_interval"][0] <= released["q_interval"][1] <= 1

    # hierarchy: every level present; children add up to their parent; values near the truth.
    window0 = [r for r in got["places"] if r["window"]["start_ms"] == starts[0]]
    by_level = collections.defaultdict(dict)
    for record in window0:
        by_level[record["level"]][tuple(record["group"].values())] = record
    assert sorted(by_level) == [0, 1, 2]
    assert set(by_level[0]) == {("FR",), ("DE",)}
    assert set(by_level[1]) == {("FR", "IDF"), ("FR", "ARA"), ("DE", "BE")}
    for level in (1, 2):
        totals = collections.defaultdict(float)
        for key, record in by_level[level].items():
            totals[key[:-1]] += record["count"]
        for parent, total in totals.items():
            assert total == pytest.approx(by_level[level - 1][parent]["count"], abs=1e-6)
    for page, place in PLACES.items():
        true_count = UNITS * PAGE_EVENTS[page]
        assert abs(by_level[2][place]["count"] - true_count) <= 4 * by_level[2][place]["ci95"]["count"]

    # continual: running totals since the period's start; a unit counts in its first 2 windows of a period.
    per_window = {p: UNITS * n for p, n in PAGE_EVENTS.items()}
    for record in got["today"]:
        start = record["window"]["start_ms"]
        if start not in starts:
            continue
        t = (start - first_start) % period_ms // WINDOW_MS + 1
        assert record["continual"]["window_index"] == t
        assert record["continual"]["period_start_ms"] == first_start + (start - first_start) // period_ms * period_ms
        true_count = per_window[record["group"]["page"]] * min(t, MAX_WINDOWS_PER_UNIT)
        assert abs(record["count"] - true_count) <= 4 * record["ci95"]["count"], (t, record)
        assert record["privacy"]["charged"] == "per_period"

    # staircase: the record states the law (epsilon per group = 5 / L0 for each of count and sum; stairs as
    # wide as one unit's move of a group); values within 4x the stated 95% half-width of the truth.
    for record in got["stairs"]:
        if record["window"]["start_ms"] not in starts:
            continue
        privacy = record["privacy"]
        assert privacy["mechanism"] == "staircase" and privacy["epsilon"] <= 10.0
        law = privacy["staircase"]
        assert law["count"]["epsilon_per_group"] * 3 <= 5.0 + 1e-12 and law["count"]["stair_width"] == 3
        assert law["sum"]["stair_width"] == pytest.approx(300, rel=1e-5) and law["sum"]["stair_width"] >= 300
        assert law["count"]["grid"] == 1 and 0 < law["sum"]["gamma"] < 0.5
        page = record["group"]["page"]
        assert abs(record["count"] - UNITS * PAGE_EVENTS[page]) <= 4 * record["ci95"]["count"], record
        true_sum = sum(_value(u, e) for u in range(UNITS) for e in range(PAGE_EVENTS[page]))
        assert abs(record["sum"] - true_sum) <= 4 * record["ci95"]["sum"], record

    # the epsilon metric counts a continual query once per period, the others once per window (windows of a
    # continual query are released in order from the first period's start; both series come from one scrape)
    def series(name: str, suffix: str) -> float:
        (value,) = [float(v) for q, v in re.findall(name + r'\{[^}]*query="([^"]+)"[^}]*\} (\S+)', metrics)
                    if q.endswith(suffix)]
        return value

    released_today = series("stream_dp_windows_released_total", "_today")
    assert released_today >= WINDOWS
    assert series("stream_dp_epsilon_released_total", "_today") == pytest.approx(
        10.0 * math.ceil(released_today / PERIOD_WINDOWS), rel=1e-6)
    assert series("stream_dp_epsilon_released_total", "_stairs") == pytest.approx(
        10.0 * series("stream_dp_windows_released_total", "_stairs"), rel=1e-6)

    # charged once per period: two periods, 10 epsilon each, plus the other four queries' windows
    store = RedisBudgetStore(redis.Redis.from_url(redis_url), policy_from_config(load_config(config_path)))
    (hour,) = store.spend(namespace, "u0", int(time.time() * 1000))
    assert hour.spent == pytest.approx(2 * 10.0 + 4 * WINDOWS * 10.0, rel=1e-6)
