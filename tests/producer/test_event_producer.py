"""EventProducer on the real broker: its docstring example runs as written, nothing is sent when one event is
wrong, keys are placed by the query's partitioner, local-DP events leave only as reports, and input topics
are created, or refused, as the worker would."""

from __future__ import annotations

import doctest
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml

from stream_dp.config import Settings, parse_config
from stream_dp.dp.local import REPORT_TAG_FIELD
from stream_dp.producer import EventError, EventProducer
from stream_dp.windows.decoding import EventDecoder
from stream_dp.windows.partitioning import expected_partitions
from stream_dp.worker.assemble.runtimes import build_runtimes

pytestmark = pytest.mark.services

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "queries.example.yaml"
SECRET = b"a producer secret of 32 bytes!!!"


def _document(prefix: str) -> dict:
    """The example query file with every topic renamed under ``prefix``."""
    document = yaml.safe_load(EXAMPLE.read_text())
    for query in document["queries"]:
        query["input_topic"] = f"{prefix}-{query['input_topic']}"
        query["output_topic"] = f"{prefix}-{query['output_topic']}"
    return document


def _read(bootstrap: str, topic: str, expected: int) -> list:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                             enable_auto_commit=False)
    try:
        messages: list = []
        deadline = time.monotonic() + 30
        while len(messages) < expected and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                messages += batch
        return messages
    finally:
        consumer.close()


def _end_offsets(bootstrap: str, topic: str) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        return sum(consumer.end_offsets(partitions).values())
    finally:
        consumer.close()


def test_the_docstring_example_runs_as_written(tmp_path, monkeypatch, kafka_bootstrap, unique_name):
    """The example of ``EventProducer``, unchanged, in a copy of the repository's query file whose topics
    carry this test's name (so that it never writes to a shared ``events.pageviews``)."""
    from kafka.admin import KafkaAdminClient

    (tmp_path / "deploy").mkdir()
    document = _document(unique_name)
    (tmp_path / "deploy" / "queries.example.yaml").write_text(yaml.safe_dump(document))
    topic = next(q["input_topic"] for q in document["queries"] if q["name"] == "pageviews_by_page")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", kafka_bootstrap)
    (example,) = [test for test in doctest.DocTestFinder().find(EventProducer, "EventProducer", globs={})
                  if test.examples]
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="stream-dp-tests")
    try:
        result = runner.run(example)
        assert result.attempted >= 8
        assert result.failed == 0, "the docstring example failed (doctest's report is above)"
        messages = _read(kafka_bootstrap, topic, 2)
        assert sorted(m.key for m in messages) == [b"42", b"u1"]  # the refused events sent nothing
    finally:
        admin.delete_topics([topic])
        admin.close()


def test_nothing_is_sent_when_one_event_is_wrong(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=2)
    query = parse_config(_document("unused")).query("pageviews_by_page")
    now = time.time()
    with EventProducer(query, Settings(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap), topic=topic) as producer:
        good = [{"user_id": f"u{i}", "ts": now, "page": "/", "value": 1.0} for i in range(10)]
        with pytest.raises(EventError, match="event 10 .*field 'user_id' is missing"):
            producer.send([*good, {"ts": now, "page": "/", "value": 1.0}])
        assert _end_offsets(kafka_bootstrap, topic) == 0
        assert producer.send(good) == 10
    assert _end_offsets(kafka_bootstrap, topic) == 10


@pytest.mark.parametrize("partitioner", ["murmur2", "crc32"])
def test_each_event_is_keyed_by_its_unit_on_the_partition_the_worker_expects(kafka_bootstrap, new_topic, partitioner):
    topic = new_topic(partitions=5)
    document = _document("unused")
    document["queries"] = [q for q in document["queries"] if q["name"] == "pageviews_by_page"]
    document["queries"][0]["partitioner"] = partitioner
    query = parse_config(document).query("pageviews_by_page")
    units = [f"user-{i}" for i in range(60)] + [7, 123456789]
    now = time.time()
    with EventProducer(query, Settings(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap), topic=topic) as producer:
        producer.send([{"user_id": unit, "ts": now, "page": "/docs", "value": 2.0} for unit in units])
    messages = _read(kafka_bootstrap, topic, len(units))
    assert len(messages) == len(units)
    keys = np.array([m.key for m in messages], dtype="S")
    assert sorted(m.key for m in messages) == sorted(str(u).encode() for u in units)
    # the worker's own placement rule (stream_dp.windows.partitioning), which it checks on every event
    assert [m.partition for m in messages] == expected_partitions(keys, 5, partitioner).tolist()


def test_a_local_dp_query_sends_one_report_per_unit_and_window_and_never_a_true_value(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=2)
    document = _document("unused")
    query = parse_config(document).query("browsers_local")
    now = time.time()
    events = [{"device_id": f"d{i % 20}", "ts": now, "browser": "safari", "secret_copy": "safari"} for i in range(60)]
    with EventProducer(query, Settings(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap), topic=topic,
                       local_dp_secret=SECRET) as producer:
        assert producer.send(events) == 20  # one per device in this window
    messages = _read(kafka_bootstrap, topic, 20)
    sent = [orjson.loads(m.value) for m in messages]
    assert all(set(event) == {"device_id", "ts", "browser", REPORT_TAG_FIELD} for event in sent)
    assert len({event["device_id"] for event in sent}) == 20
    # the worker of the query takes them as reports of its randomizer
    document["queries"] = [q for q in document["queries"] if q["name"] == "browsers_local"]
    (runtime,) = build_runtimes(parse_config(document), secret=b"a test secret of enough bytes", clock_ms=lambda: 0)
    _decoded, problems = EventDecoder(runtime.engine.schema).decode([m.value for m in messages],
                                                                     now_ms=int(time.time() * 1000))
    assert problems == []


def test_a_local_dp_query_without_the_producers_secret_is_refused_with_the_fix(monkeypatch):
    monkeypatch.delenv("STREAM_DP_LOCAL_DP_SECRET", raising=False)
    query = parse_config(_document("unused")).query("browsers_local")
    with pytest.raises(ValueError, match="head -c 32 /dev/urandom.*pass local_dp_secret="):
        EventProducer(query, Settings(KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1"))


def test_ensure_topics_creates_a_log_append_time_topic_and_refuses_a_create_time_one(kafka_bootstrap, new_topic,
                                                                                      unique_name):
    from kafka.admin import KafkaAdminClient

    from stream_dp.worker.kafka.admin import read_topic_config

    query = parse_config(_document("unused")).query("pageviews_by_page")
    settings = Settings(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap)
    missing = f"{unique_name}-created"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="stream-dp-tests")
    try:
        EventProducer(query, settings, topic=missing).ensure_topics()
        configs = read_topic_config(settings.kafka_client_options(), missing,
                                    ("message.timestamp.type", "min.insync.replicas"))
        # replicated as the worker plans it: one broker here, so one replica, one in sync
        assert configs == {"message.timestamp.type": "LogAppendTime", "min.insync.replicas": "1"}
    finally:
        admin.delete_topics([missing])
        admin.close()
    stamped = new_topic("stamped", configs={"message.timestamp.type": "CreateTime"})
    with pytest.raises(ValueError, match="CreateTime.*fix it with .*message.timestamp.type=LogAppendTime"):
        EventProducer(query, settings, topic=stamped).ensure_topics()


def test_ensure_topics_plans_replicas_as_the_worker_does_and_names_the_fix(kafka_bootstrap, unique_name):
    query = parse_config(_document("unused")).query("pageviews_by_page")
    settings = Settings(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, STREAM_DP_TOPIC_REPLICATION_FACTOR=3)
    with pytest.raises(ValueError, match="STREAM_DP_TOPIC_REPLICATION_FACTOR=3 but the cluster has 1 broker"):
        EventProducer(query, settings, topic=f"{unique_name}-never").ensure_topics()
