"""Release records: schema-valid, only released groups, nothing un-noised."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path

import jsonschema
import numpy as np
import orjson
import pytest
import yaml
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2

from stream_dp.config import parse_config
from stream_dp.dp import OpenDPNoise
from stream_dp.worker.assemble.runtimes import build_runtimes
from stream_dp.worker.combine.combiner import CombinedWindow
from stream_dp.worker.kafka.output_producer import OutputProducer, OutputPublishFailed
from stream_dp.worker.release.entry import build_entry
from stream_dp.worker.release.publish import encode_releases, output_partitions, publish_release
from tests.worker._support import consume_all

REPO = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((REPO / "deploy/schemas/release.schema.json").read_text())


def _runtime(groups: dict):
    data = yaml.safe_load((REPO / "deploy/queries.example.yaml").read_text())
    data["queries"][0]["groups"] = groups
    data["queries"][0]["epsilon"] = 1.0
    config = parse_config(data)
    return build_runtimes(config, secret=b"k" * 32, clock_ms=lambda: 0)[0]


def _window(groups, counts):
    counts = np.asarray(counts, dtype=np.int64)
    return CombinedWindow("pageviews_by_page", 60_000, 120_000, 0, groups, counts, counts * 7.0,
                          (counts + 1) // 2, [], 0, 0, None)


def test_public_groups_all_released_and_valid():
    runtime = _runtime({"public": ["/", "/pricing", "/docs"]})
    window = _window([("/",), ("/pricing",), ("/docs",)], [0, 40, 4000])
    noisy = runtime.plan.release(window.count, window.sum, window.distinct_units, OpenDPNoise())
    records = encode_releases(runtime, window, noisy, 123_000)
    assert [k for k, _ in records] == [b'["/"]', b'["/pricing"]', b'["/docs"]']
    for key, value in records:
        record = orjson.loads(value)
        jsonschema.validate(record, SCHEMA)
        assert list(record["group"].values()) == orjson.loads(key)
        assert record["count"] >= 0 and record["privacy"]["epsilon"] <= 1.0
        assert record["window"]["start_ms"] == 60_000 and record["released_at_ms"] == 123_000
    assert len({orjson.loads(v)["release_id"] for _, v in records}) == 3


def test_selected_groups_only_kept_ones_and_exact_totals_never_appear():
    runtime = _runtime({"select": {"delta": 1e-6}})
    # One tiny group (2 units) never passes the threshold; a huge one always does.
    window = _window([("/rare",), ("/popular",)], [3, 200_000])
    noisy = runtime.plan.release(window.count, window.sum, window.distinct_units, OpenDPNoise())
    records = [orjson.loads(v) for _, v in encode_releases(runtime, window, noisy, 0)]
    assert [r["group"]["page"] for r in records] == ["/popular"]
    (popular,) = records
    jsonschema.validate(popular, SCHEMA)
    assert popular["privacy"]["groups"] == "selected" and popular["privacy"]["delta"] > 0
    # The count is noisy: over a few releases it is not always the exact total.
    draws = {
        runtime.plan.release(window.count, window.sum, window.distinct_units, OpenDPNoise()).count[1]
        for _ in range(5)
    }
    assert len(draws) > 1


def test_output_partitions_are_kafkas_default_partitioner_for_any_key():
    keys = [orjson.dumps([f"/p/{i}", i]) for i in range(2_000)] + [orjson.dumps(["x" * n]) for n in (255, 300, 5_000)]
    for partitions in (1, 3, 7):
        expected = [(murmur2(k) & 0x7FFFFFFF) % partitions for k in keys]
        assert output_partitions(keys, partitions).tolist() == expected


def _producer(kind: str, bootstrap: str, batch_bytes: int):
    """The worker's output producer (librdkafka), or an aiokafka producer as tools and earlier versions use."""
    if kind == "output":
        return OutputProducer({"bootstrap.servers": bootstrap}, client_id="test-output", batch_bytes=batch_bytes,
                              max_record_bytes=batch_bytes, topic_wait_s=40.0)
    return AIOKafkaProducer(bootstrap_servers=bootstrap, max_batch_size=batch_bytes, linger_ms=5, compression_type="lz4")


@pytest.mark.services
@pytest.mark.parametrize("kind", ["output", "aiokafka"])
def test_a_release_is_published_in_batches_within_the_limit_each_record_once(kafka_bootstrap, new_topic, kind):
    topic = new_topic("out", partitions=3)
    runtime = _runtime({"select": {"delta": 1e-6}})
    n = 30_000
    window = _window([(f"/p/{i}",) for i in range(n)] + [("/" + "y" * 70_000,)], [50_000] * (n + 1))
    noisy = runtime.plan.release(window.count, window.sum, window.distinct_units, OpenDPNoise())
    entry = build_entry(runtime, window, noisy, 0)
    too_large: list[int] = []

    async def publish() -> int:
        producer = _producer(kind, kafka_bootstrap, 64 * 1024)
        await producer.start()
        try:
            published, _ = await publish_release(producer, topic, entry, max_batch_bytes=64 * 1024,
                                                 on_too_large=too_large.append, slice_rows=7_000)
            return published
        finally:
            await producer.stop()

    published = asyncio.run(publish())
    assert published == n and len(too_large) == 1 and too_large[0] > 140_000  # the huge group is left out
    records = consume_all(kafka_bootstrap, topic, until=lambda rs: len(rs) >= n, timeout_s=60)
    assert sorted(r.key for r in records) == sorted(k for k, _ in entry.render()[:n])
    assert all(r.partition == (murmur2(r.key) & 0x7FFFFFFF) % 3 for r in records)
    assert dict((r.key, r.value) for r in records) == dict(entry.render()[:n])


@pytest.mark.services
def test_a_record_the_broker_refuses_fails_the_publish(kafka_bootstrap, new_topic):
    """A record the output topic does not take (larger than its max.message.bytes, though within the producer's
    limit) is reported by librdkafka: the publish raises, so the window is not marked published."""
    topic = new_topic("small", configs={"max.message.bytes": "20000"})
    # records of ~60 KB whose random group names lz4 cannot shrink below the topic's limit
    runtime = _runtime({"public": ["/" + secrets.token_hex(30_000) for _ in range(3)]})
    window = _window(list(runtime.public_groups), [5, 6, 7])
    noisy = runtime.plan.release(window.count, window.sum, window.distinct_units, OpenDPNoise())
    entry = build_entry(runtime, window, noisy, 0)

    async def publish() -> None:
        producer = _producer("output", kafka_bootstrap, 256 * 1024)
        await producer.start()
        try:
            await publish_release(producer, topic, entry, max_batch_bytes=256 * 1024, on_too_large=lambda size: None)
        finally:
            await producer.stop()

    with pytest.raises(OutputPublishFailed, match="not acknowledged"):
        asyncio.run(publish())


def test_the_documented_example_record_is_one_the_worker_would_publish():
    """The example record of docs/reference/output-records.md validates against the schema and has exactly the
    fields (and privacy fields) of a record the worker builds for the example query: the documentation cannot
    drift from the output."""
    page = (REPO / "docs" / "reference" / "output-records.md").read_text()
    example = json.loads(page.split("```json", 1)[1].split("```", 1)[0])
    jsonschema.validate(example, SCHEMA)
    runtime = _runtime({"public": ["/", "/pricing", "/docs"]})
    window = _window([("/",), ("/pricing",), ("/docs",)], [0, 40, 4000])
    noisy = runtime.plan.release(window.count, window.sum, window.distinct_units, OpenDPNoise())
    record = orjson.loads(encode_releases(runtime, window, noisy, 123_000)[1][1])
    assert sorted(example) == sorted(record)
    assert sorted(example["privacy"]) == sorted(record["privacy"])
    assert {k: v for k, v in example["privacy"].items() if "scale" not in k and k not in ("rho", "epsilon")} == {
        k: v for k, v in record["privacy"].items() if "scale" not in k and k not in ("rho", "epsilon")}
