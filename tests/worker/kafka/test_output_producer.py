"""The output producer: its connection settings in librdkafka's names, and the partitions it publishes to."""

import asyncio
import time

import pytest
from confluent_kafka import Producer

from stream_dp.config import Settings
from stream_dp.worker.kafka.output_producer import OutputProducer, OutputPublishFailed, rdkafka_options
from tests.reliability.topics import create_topic, delete_topics


def test_every_connection_setting_reaches_librdkafka_under_its_own_name(monkeypatch, tmp_path):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker-a:9093,broker-b:9093")
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "sasl_ssl")
    monkeypatch.setenv("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("KAFKA_SASL_USERNAME", "svc")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "s3cret-password")
    for name in ("cafile", "certfile", "keyfile"):
        (tmp_path / name).write_text("")
        monkeypatch.setenv(f"KAFKA_SSL_{name.upper()}", str(tmp_path / name))
    monkeypatch.setenv("STREAM_DP_CONTRIBUTION_SECRET", "0123456789abcdef0123")
    options = rdkafka_options(Settings().kafka_client_options())
    assert options == {
        "bootstrap.servers": "broker-a:9093,broker-b:9093", "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "svc", "sasl.password": "s3cret-password",
        "ssl.ca.location": str(tmp_path / "cafile"), "ssl.certificate.location": str(tmp_path / "certfile"),
        "ssl.key.location": str(tmp_path / "keyfile"),
    }
    # librdkafka knows every name (an unknown one raises here; the TLS files are read, so left out)
    Producer({**{k: v for k, v in options.items() if not k.startswith("ssl.")}, "log_level": 0})


def test_a_setting_without_a_librdkafka_name_is_refused_not_dropped():
    with pytest.raises(ValueError, match="no librdkafka name"):
        rdkafka_options({"bootstrap_servers": "b:9092", "sasl_kerberos_service_name": "kafka"})


@pytest.mark.services
def test_partitions_are_read_again_after_a_refused_record_and_after_they_go_stale(kafka_bootstrap, unique_name):
    """A topic deleted and created again with fewer partitions while its partitions were known: the record
    to a partition it lost is refused as a failed publish (the window is held, not the stage stopped), and
    the next read asks the broker again."""
    topic = f"{unique_name}-out"
    create_topic(kafka_bootstrap, topic, 3)

    async def scenario() -> tuple[set[int], set[int], set[int], str]:
        producer = OutputProducer({"bootstrap.servers": kafka_bootstrap}, client_id="test-output",
                                  batch_bytes=64 * 1024, max_record_bytes=64 * 1024, topic_wait_s=40.0)
        await producer.start()
        try:
            first = await producer.partitions_for(topic)
            delete_topics(kafka_bootstrap, [topic])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # a topic is gone from every broker's view a moment later
                try:
                    create_topic(kafka_bootstrap, topic, 1)
                    break
                except Exception:
                    time.sleep(0.5)
            known = await producer.partitions_for(topic)  # within PARTITIONS_FRESH_S: not asked again
            sender = producer.records_to(topic)
            refused = ""
            deadline = time.monotonic() + 30
            while not refused and time.monotonic() < deadline:  # once librdkafka has seen the new metadata
                try:
                    await sender.send(b"k", b"v", max(known))
                    await sender.wait()
                except OutputPublishFailed as exc:
                    refused = str(exc)
                sender = producer.records_to(topic)
            return first, known, await producer.partitions_for(topic), refused
        finally:
            await producer.stop()

    try:
        first, known, again, refused = asyncio.run(scenario())
    finally:
        delete_topics(kafka_bootstrap, [topic])
    assert first == known == {0, 1, 2}
    assert refused, "a record to a partition the topic no longer has was neither refused nor failed"
    assert again == {0}, f"partitions not read again after the refusal: {again}"
