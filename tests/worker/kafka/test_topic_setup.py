"""Topic setup on the real broker: topics created with the planned settings (a missing input topic with the
broker's clock); existing ones that break an assumption reported (or refused) with their fix, an input topic its
producers stamp among them; record sizes taken from the limits in force, down to a partials topic far below
1 MB and a dead letter larger than its topic takes."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
import yaml
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from stream_dp.config import Settings, load_config
from stream_dp.wire import is_binary, read_prefix
from stream_dp.wire.chunks import payload_digest
from stream_dp.wire.letters import DEAD_LETTER_HEAD_BYTES, reassemble
from stream_dp.worker.assemble.runtimes import build_runtimes
from stream_dp.worker.kafka.admin import describe_topics
from stream_dp.worker.kafka.clients import kafka_clients
from stream_dp.worker.kafka.output_producer import rdkafka_options
from stream_dp.worker.kafka.topic_setup import prepare_topics
from stream_dp.worker.kafka.topics import RECORD_HEADROOM, TopicSettingsError
from stream_dp.worker.release.entry import decode_entry
from stream_dp.worker.store.ledger import RedisReleaseLedger
from tests.worker import _big_window as big
from tests.worker._support import PRODUCER_STAMPED, free_port

DAY_MS = 86_400_000


def _config(path: Path, unique_name: str, **query: Any) -> Path:
    path.write_text(yaml.safe_dump({
        "namespaces": {"users": {"budgets": [{"horizon": "1h", "epsilon": 1.0}]}},
        "queries": [{
            "name": "q", "input_topic": f"{unique_name}-in", "output_topic": f"{unique_name}-out",
            "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
            "window": {"size": "1m"}, "group_by": ["page"], "groups": {"public": ["a"]},
            "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1}, "aggregations": {"count": {}},
            "epsilon": 0.5, **query,
        }],
    }))
    return path


def _prepare(tmp_path: Path, kafka_bootstrap: str, unique_name: str, query: dict[str, Any] | None = None, **env: str):
    settings = Settings(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{unique_name}.",
                        STREAM_DP_INTERNAL_RETENTION_MS=str(2 * DAY_MS), **env)
    runtimes = build_runtimes(load_config(_config(tmp_path / "q.yaml", unique_name, **(query or {}))),
                              secret=b"k" * 32, clock_ms=lambda: 0)
    return settings, asyncio.run(prepare_topics(settings, runtimes, settings.kafka_client_options()))


@pytest.fixture
def admin(kafka_bootstrap, unique_name):
    client = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="stream-dp-tests")
    yield client
    present = [t for t in client.list_topics() if t.startswith(unique_name)]
    if present:
        client.delete_topics(present)
    client.close()


@pytest.mark.services
def test_topics_are_created_with_the_planned_settings(tmp_path, kafka_bootstrap, unique_name, admin):
    settings, limits = _prepare(tmp_path, kafka_bootstrap, unique_name)
    names = [settings.partials_topic, settings.alerts_topic, settings.dead_letter_topic, f"{unique_name}-out"]
    states = describe_topics({"bootstrap_servers": kafka_bootstrap}, names)
    for name in names:
        assert states[name].replication_factor == 1  # min(3, brokers) on this one-broker cluster
        assert states[name].configs["min.insync.replicas"] == "1"
        assert states[name].configs["cleanup.policy"] == "delete"
    assert states[settings.alerts_topic].configs["retention.ms"] == str(2 * DAY_MS)
    assert states[settings.dead_letter_topic].configs["retention.ms"] == str(2 * DAY_MS)
    assert states[f"{unique_name}-out"].configs["retention.ms"] == str(7 * DAY_MS)
    assert states[settings.partials_topic].configs["retention.ms"] == str(settings.partials_topic_retention_ms)
    broker_max = int(states[settings.partials_topic].configs["max.message.bytes"])  # the broker's default here
    assert limits.partials_record_bytes == limits.dead_letter_record_bytes == broker_max - RECORD_HEADROOM
    assert limits.partials_partitions == settings.partials_partitions


@pytest.mark.services
def test_an_output_topic_takes_a_top_k_list_of_k_groups_each_as_long_as_an_event(
    tmp_path, kafka_bootstrap, unique_name, admin
):
    """A top_k record lists k groups' values, each up to an event's size: the output topic and the worker's
    output producer are sized for one of k=100 such groups of 12,100-byte events (a record Kafka's 1 MB
    default refuses), and the broker takes a record that large from that producer."""
    event_bytes, k = 12_100, 100
    query = {"max_message_bytes": event_bytes, "groups": {"public": [f"p{i}" for i in range(150)]},
             "aggregations": {"count": {}, "top_k": {"k": k}}}
    settings, limits = _prepare(tmp_path, kafka_bootstrap, unique_name, query)
    # the list's entries ({"rank": r, "group": {...}}) beside the groups' values, then window, privacy, ...
    largest = k * (event_bytes + 64) + 64 * 1024
    assert largest > 1_048_588
    out = f"{unique_name}-out"
    assert int(describe_topics({"bootstrap_servers": kafka_bootstrap}, [out])[out].configs["max.message.bytes"]) >= largest
    assert limits.output_batch_bytes >= largest

    async def publish() -> None:
        clients = kafka_clients(settings.aiokafka_options(), rdkafka=rdkafka_options(settings.kafka_client_options()),
                                client_id=unique_name, group_id=unique_name,
                                limits=limits, output_wait_s=settings.output_wait_s)
        try:  # incompressible, so that lz4 does not shrink it below the limits
            await clients.output_producer.start()
            await clients.output_producer.send_and_wait(out, key=b'["top_k"]', value=os.urandom(largest - 9))
        finally:
            await clients.stop()

    asyncio.run(publish())


@pytest.mark.services
def test_existing_topics_that_break_an_assumption_are_reported_or_refused(
    tmp_path, kafka_bootstrap, unique_name, admin, caplog
):
    prefix = f"{unique_name}."
    admin.create_topics([NewTopic(f"{prefix}alerts", 1, 1, topic_configs={"retention.ms": "-1"})])
    caplog.set_level(logging.WARNING, logger="stream_dp.worker.kafka.topic_setup")
    _prepare(tmp_path, kafka_bootstrap, unique_name)  # a warning, not a refusal
    assert f"alerts topic '{prefix}alerts' keeps records for retention.ms=-1" in caplog.text
    assert f"--entity-name {prefix}alerts --add-config retention.ms={2 * DAY_MS}" in caplog.text

    admin.delete_topics([f"{prefix}partials", f"{prefix}dead-letter"])
    time.sleep(2)  # deletion is asynchronous on the broker
    admin.create_topics([
        NewTopic(f"{prefix}partials", 2, 1, topic_configs={"cleanup.policy": "compact,delete", "retention.ms": "3600000",
                                                           "segment.ms": "3600000"}),
        NewTopic(f"{prefix}dead-letter", 1, 1, topic_configs={"max.message.bytes": "4000"}),
    ])
    with pytest.raises(TopicSettingsError) as refused:
        _prepare(tmp_path, kafka_bootstrap, unique_name)
    message = str(refused.value)
    assert f"partials topic '{prefix}partials' has cleanup.policy=compact,delete" in message
    assert f"--entity-name {prefix}partials --add-config cleanup.policy=delete" in message
    assert f"dead-letter topic '{prefix}dead-letter' takes records of at most 4000 bytes" in message
    assert f"--entity-name {prefix}dead-letter --add-config max.message.bytes=" in message


PARTIALS_MAX = 40_000  # the partials topic's max.message.bytes: far below the broker's 1 MB
BIG_EVENT = 2_000_000  # a rejected event larger than the dead-letter topic takes: its dead letter is its head


@pytest.mark.slow
def test_records_fit_a_small_partials_topic_and_a_huge_rejected_event_is_dead_lettered_as_its_head(
    tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name, admin, monkeypatch
):
    monkeypatch.setattr(big, "GROUPS", 100_000)
    name = unique_name.replace("-", "_")[-40:]
    prefix = f"{unique_name}."
    admin.create_topics([NewTopic(f"{prefix}partials", 4, 1, topic_configs={
        "max.message.bytes": str(PARTIALS_MAX), "retention.ms": str(6 * DAY_MS), "segment.ms": "3600000"})])
    input_topic = new_topic("in", partitions=1, configs={**PRODUCER_STAMPED, "max.message.bytes": str(3 * BIG_EVENT)})
    config = big.write_config(tmp_path / "queries.yaml", name, input_topic, f"{unique_name}-out")
    window_start = (int(time.time() * 1000) - 5 * big.WINDOW_MS) // big.WINDOW_MS * big.WINDOW_MS
    sent = big.produce(kafka_bootstrap, input_topic, window_start)
    huge = orjson.dumps({"user_id": "u1", "ts": window_start, "g": "x" * BIG_EVENT})
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, max_request_size=3 * BIG_EVENT)
    producer.send(input_topic, key=b"u1", value=huge, timestamp_ms=window_start).get(30)
    producer.close()
    client = redis.Redis.from_url(redis_url)
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, REDIS_URL=redis_url,
               STREAM_DP_GROUP_ID=f"{unique_name}-g", STREAM_DP_INTERNAL_TOPIC_PREFIX=prefix,
               STREAM_DP_CONTRIBUTION_SECRET=big.SECRET)
    pool = big.start_workers(tmp_path, config, env, [free_port()])
    try:
        big.wait_published(client, name, window_start, pool, timeout_s=90)
        entry = decode_entry(RedisReleaseLedger(client).get(name, window_start).payload)
        released = big.released_groups(big.read_topic(kafka_bootstrap, f"{unique_name}-out"))
        assert sorted(g for g, _, _ in released) == sorted(entry.groups[0]) and entry.rows > 3_000

        partials = [m for m in big.read_topic(kafka_bootstrap, f"{prefix}partials") if is_binary(m.value())]
        assert len(partials) > 10 and max(len(m.value()) + len(m.key()) for m in partials) <= PARTIALS_MAX
        assert {read_prefix(m.value(), "")[1]["chunk"][1] for m in partials} == {len(partials)}

        dead = big.read_topic(kafka_bootstrap, f"{prefix}dead-letter")
        (letter,) = reassemble((m.key(), m.value(), m.headers()) for m in dead)  # one record: a bounded copy
        assert letter.value == huge[:DEAD_LETTER_HEAD_BYTES] and letter.size == len(huge) and not letter.whole
        assert letter.headers["digest"] == payload_digest(huge).encode() and letter.headers["reason"] == b"oversize"
        assert letter.source == f"{input_topic}/0/{sent}"
        assert pool.alive(), pool.log_text()
    finally:
        pool.stop()
        big.delete_redis_keys(client, f"{big.LEDGER_PREFIX}:{{{name}}}*", f"{big.LEDGER_PREFIX}:units:{{{name}/*",
                              f"dp:*{name}-users*")
        client.close()


@pytest.mark.services
def test_a_top_k_record_larger_than_another_output_topics_batches_is_published(
    tmp_path, kafka_bootstrap, unique_name, admin
):
    """Two output topics, one sized for a top_k list of long groups, one left at the broker's default: the
    output producer's batches fit both, and the top_k topic's large record goes out alone in its own batch
    rather than being left out as too large for the other topic."""
    from stream_dp.worker.release.entry import StoredRecords
    from stream_dp.worker.release.publish import publish_release

    event_bytes, k = 12_100, 100
    path = tmp_path / "two.yaml"
    base = yaml.safe_load(_config(tmp_path / "one.yaml", unique_name).read_text())
    top = {**base["queries"][0], "name": "top", "max_message_bytes": event_bytes,
           "groups": {"public": [f"p{i}" for i in range(150)]}, "aggregations": {"count": {}, "top_k": {"k": k}}}
    counts = {**base["queries"][0], "name": "counts", "input_topic": f"{unique_name}-in2",
              "output_topic": f"{unique_name}-out2"}
    path.write_text(yaml.safe_dump({**base, "queries": [top, counts]}))
    settings = Settings(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{unique_name}.",
                        STREAM_DP_INTERNAL_RETENTION_MS=str(2 * DAY_MS))
    runtimes = build_runtimes(load_config(path), secret=b"k" * 32, clock_ms=lambda: 0)
    limits = asyncio.run(prepare_topics(settings, runtimes, settings.kafka_client_options()))
    out = f"{unique_name}-out"
    largest = k * (event_bytes + 64) + 64 * 1024
    assert limits.output_batch_bytes < largest - 4096 and largest <= limits.output_record_bytes[out], limits

    big_record = (b'["top_k"]', os.urandom(largest - 4096))  # incompressible: lz4 cannot shrink it under a batch
    records = [(b'["a"]', b'{"n":1}'), big_record, (b'["b"]', b'{"n":2}')]
    too_large: list[int] = []

    async def publish() -> int:
        clients = kafka_clients(settings.aiokafka_options(), rdkafka=rdkafka_options(settings.kafka_client_options()),
                                client_id=unique_name, group_id=unique_name,
                                limits=limits, output_wait_s=settings.output_wait_s)
        try:
            await clients.output_producer.start()
            published, _ = await publish_release(
                clients.output_producer, out, StoredRecords(records), max_batch_bytes=limits.output_batch_bytes,
                max_record_bytes=limits.output_record_bytes[out], on_too_large=too_large.append)
            return published
        finally:
            await clients.stop()

    assert asyncio.run(publish()) == 3 and too_large == []
    from tests.reliability.topics import read_topic

    got = read_topic(kafka_bootstrap, out, max_partition_fetch_bytes=largest + 1024, fetch_max_bytes=largest + 1024)
    assert sorted(len(r.value) for r in got) == sorted(len(v) for _, v in records)


@pytest.mark.services
def test_a_missing_input_topic_is_created_with_the_brokers_clock(tmp_path, kafka_bootstrap, unique_name, admin):
    _prepare(tmp_path, kafka_bootstrap, unique_name)
    state = describe_topics({"bootstrap_servers": kafka_bootstrap}, [f"{unique_name}-in"],
                            ("message.timestamp.type", "min.insync.replicas"))[f"{unique_name}-in"]
    assert state.configs["message.timestamp.type"] == "LogAppendTime"
    assert state.replication_factor == 1 and state.configs["min.insync.replicas"] == "1"


@pytest.mark.services
def test_an_input_topic_stamped_by_its_producers_is_refused_unless_a_query_trusts_them(
    tmp_path, kafka_bootstrap, unique_name, admin
):
    admin.create_topics([NewTopic(f"{unique_name}-in", 1, 1, topic_configs={"message.timestamp.type": "CreateTime"})])
    with pytest.raises(TopicSettingsError) as refused:
        _prepare(tmp_path, kafka_bootstrap, unique_name)
    message = str(refused.value)
    assert f"input topic '{unique_name}-in' has message.timestamp.type=CreateTime" in message
    assert (f"`kafka-configs.sh --bootstrap-server {kafka_bootstrap} --alter --entity-type topics --entity-name "
            f"{unique_name}-in --add-config message.timestamp.type=LogAppendTime`") in message
    assert "trust_producer_timestamps: true on 'q'" in message
    _prepare(tmp_path, kafka_bootstrap, unique_name, {"trust_producer_timestamps": True})  # a backfill: taken


@pytest.mark.services
def test_the_worker_exits_at_start_on_an_input_topic_stamped_by_its_producers(
    tmp_path, kafka_bootstrap, redis_url, unique_name, admin
):
    admin.create_topics([NewTopic(f"{unique_name}-in", 1, 1, topic_configs={"message.timestamp.type": "CreateTime"})])
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, REDIS_URL=redis_url,
               STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{unique_name}.", STREAM_DP_GROUP_ID=f"{unique_name}-g",
               STREAM_DP_CONTRIBUTION_SECRET="test-secret-0123456789abcdef", STREAM_DP_METRICS_PORT=str(free_port()))
    run = subprocess.run([sys.executable, "-m", "stream_dp.cli.main", "run", "--config",
                          str(_config(tmp_path / "q.yaml", unique_name))],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr[-2000:]
    assert f"--entity-name {unique_name}-in --add-config message.timestamp.type=LogAppendTime" in run.stderr
