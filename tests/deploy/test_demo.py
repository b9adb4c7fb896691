"""The README's first command, ``bash deploy/demo.sh``, end to end on the real services, as a user runs it.

The demo runs on a copy of ``deploy/queries.example.yaml`` whose topics, queries and namespaces carry a
name of this run (so earlier runs' events, releases, ledger entries and budgets play no part); its
volume, rate and every other setting are the demo's defaults. It must exit 0, and every query of the
example must have printed its releases and released records valid against the release schema; of the
two windows the demo prints, at least one must be full: begun after its input topic's first event and
ended before its last.

In those full windows every released value must exceed the 95% error stated beside it (a count its
``ci95.count``, a quantile's group size at the quantile's rank its ``rank_error``, a mean vector's
coordinate its ``mean_ci95``, ...). At the demo's volume the example's settings make each value about
eight times its 95% half-width or more (``stream-dp plan`` sets them side by side at each query's
``expected`` counts; the quantile ranks are about three times their stated error, but neither side of
that comparison is a large noise draw: a stated rank error and a count noised by ±9), so a value falls
below its error only with a noise draw beyond seven half-widths -- for Laplace noise a chance below 1e-9
per value, for Gaussian far less -- or when the demo's events did not arrive.

With ``-s`` it prints, per query, when its first release and its first release of a full window came,
counted from the demo's start.
"""

from __future__ import annotations

import collections
import json
import math
import os
import subprocess
import time
import warnings
from pathlib import Path

import jsonschema
import orjson
import pytest
import yaml

from tests.reliability.topics import delete_topics, read_topic
from tests.worker._support import free_port

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "deploy/schemas/release.schema.json").read_text())
Z95 = 1.959963984540054  # the two-sided 95% normal quantile


def _renamed_example(path: Path, tag: str) -> tuple[Path, dict]:
    document = yaml.safe_load((REPO / "deploy/queries.example.yaml").read_text())
    document["namespaces"] = {f"{tag}_{name}": ns for name, ns in document["namespaces"].items()}
    for query in document["queries"]:
        query["name"] = f"{tag}_{query['name']}"
        query["privacy_unit"]["namespace"] = f"{tag}_{query['privacy_unit']['namespace']}"
        query["input_topic"] = f"{tag}.{query['input_topic']}"
        query["output_topic"] = f"{tag}.{query['output_topic']}"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path, document


def _first_and_last_timestamps(bootstrap: str, topic: str) -> tuple[int, int]:
    """The earliest and the latest Kafka record timestamp of ``topic`` (its first and last record per partition)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python 3.x import-time warnings
        from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        assert tps, f"input topic {topic} does not exist: the demo published nothing to it"
        consumer.assign(tps)
        firsts, lasts = [], []
        for tp, end in consumer.end_offsets(tps).items():
            for offset, into in ((0, firsts), (end - 1, lasts)):
                consumer.seek(tp, max(offset, consumer.beginning_offsets([tp])[tp]))
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    records = consumer.poll(timeout_ms=500, max_records=1).get(tp)
                    if records:
                        into.append(records[0].timestamp)
                        break
        return min(firsts), max(lasts)
    finally:
        consumer.close()


def _errors_above_values(record: dict) -> list[str]:
    """Each released value of ``record`` that its stated 95% error does not stay below, as text."""
    problems = []

    def below(what: str, value: float | None, error: float | None) -> None:
        if value is not None and error is not None and not abs(value) > error:
            problems.append(f"{what} {value:.6g} ± {error:.6g}")

    ci95 = record.get("ci95") or {}
    for name in ("count", "sum", "mean"):
        if "local_dp" not in record:
            below(name, record.get(name), ci95.get(name))
    if "local_dp" in record:  # a debiased frequency and its variance
        below("frequency", record["count"], Z95 * math.sqrt(record["local_dp"]["variance"]))
    for q, answer in (record.get("quantiles") or {}).items():
        # the quantile's rank in the group against the stated rank error: past it, the q_interval reaches
        # beyond the group's smallest or largest value
        below(f"rank of q{q}", record["count"] * min(float(q), 1 - float(q)), answer["rank_error"])
    vector = record.get("mean_vector")
    if vector is not None:
        assert vector["mean"] is not None, record
        for field, mean, error in zip(vector["fields"], vector["mean"], vector["mean_ci95"], strict=True):
            below(f"mean {field}", mean, error)
    covariance = record.get("covariance")
    if covariance is not None:
        assert covariance["covariance"] is not None, record
        # an entry of sum / units carries noise of sd entry_sd / units (first order, as `plan` states it)
        error = Z95 * covariance["entry_sd"] / covariance["units"]
        for field, row, i in zip(covariance["fields"], covariance["covariance"], range(len(covariance["fields"]))):
            below(f"variance of {field}", row[i], error)
    sample = record.get("sample_aggregate")
    if sample is not None:
        below("sample_aggregate", sample["value"], sample.get("ci95"))
    return problems


def test_the_demo_releases_every_example_query(tmp_path, kafka_bootstrap, redis_url, unique_name):
    tag = "demo_" + unique_name.rsplit("-", 1)[1]
    config, document = _renamed_example(tmp_path / "queries.yaml", tag)
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, REDIS_URL=redis_url, DEMO_CONFIG=str(config),
               STREAM_DP_RUN_DIR=str(tmp_path / "run"), STREAM_DP_GROUP_ID=f"{tag}-g",
               STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{tag}.", STREAM_DP_METRICS_PORT=str(free_port()))
    for name in ("STREAM_DP_CONTRIBUTION_SECRET", "DEMO_RATE", "DEMO_UNITS", "DEMO_SECONDS"):
        env.pop(name, None)  # the demo's own: a secret per run directory, its default volume
    outputs = [q["output_topic"] for q in document["queries"]]
    inputs = sorted({q["input_topic"] for q in document["queries"]})
    topics = outputs + inputs + [f"{tag}.{t}" for t in ("partials", "alerts", "dead-letter")]
    try:
        started_ms = int(time.time() * 1000)
        done = subprocess.run(["bash", str(REPO / "deploy/demo.sh")], env=env, cwd=REPO, capture_output=True,
                              timeout=600)
        ended_ms = int(time.time() * 1000)
        out = done.stdout.decode()
        assert done.returncode == 0, f"demo exited {done.returncode}:\n{out[-3000:]}\n{done.stderr.decode()[-3000:]}"
        produced = {topic: _first_and_last_timestamps(kafka_bootstrap, topic) for topic in inputs}
        validator = jsonschema.Draft202012Validator(SCHEMA)
        problems, timings = [], []
        for query in document["queries"]:
            name = query["name"]
            records = [orjson.loads(r.value) for r in read_topic(kafka_bootstrap, query["output_topic"])]
            if f"releases on {query['output_topic']}" not in out:
                problems.append(f"{name}: the demo did not print its releases")
            if not records:
                problems.append(f"{name}: no record on {query['output_topic']}")
                continue
            problems += [f"{name}: {e.message}" for r in records for e in validator.iter_errors(r)][:3]
            first_ms, last_ms = produced[query["input_topic"]]
            printed = sorted({r["window"]["start_ms"] for r in records})[:2]  # the demo shows the first two
            full = [r for r in records if r["window"]["start_ms"] in printed
                    and r["window"]["start_ms"] >= first_ms and r["window"]["end_ms"] <= last_ms]
            if not full:
                problems.append(f"{name}: no record of a full window (events from {first_ms} to {last_ms}; "
                                f"windows {sorted({r['window']['start_ms'] for r in records})})")
            for record in full:
                problems += [f"{name} window {record['window']['start']} {record.get('group')}: {p}"
                             for p in _errors_above_values(record)][:3]
            kinds = collections.Counter(r.get("kind", "group") for r in records)
            if "top_k" in query["aggregations"] and not kinds["top_k"]:
                problems.append(f"{name}: no top_k record")
            if "local_dp" in query and any(r["privacy"]["trust_model"] != "local" for r in records):
                problems.append(f"{name}: a record of the local_dp query not marked local")
            first_full = min((r["released_at_ms"] for r in full), default=None)
            timings.append((query["name"].removeprefix(f"{tag}_"), min(r["released_at_ms"] for r in records),
                            first_full))
        print(f"\ndemo: {(ended_ms - started_ms) / 1000:.0f} s in all; from its start, per query, its first release "
              "and its first release of a full window:")
        for name, first, first_full in timings:
            full_s = "-" if first_full is None else f"{(first_full - started_ms) / 1000:.0f} s"
            print(f"  {name:<20} {(first - started_ms) / 1000:>4.0f} s  {full_s:>6}")
        print("\n".join(line for line in out.splitlines() if line.startswith(("[+", "releases on"))))
        assert not problems, "\n".join(problems) + f"\ndemo output:\n{out[-4000:]}"
    finally:
        delete_topics(kafka_bootstrap, topics)
