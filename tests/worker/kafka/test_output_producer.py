"""The output producer's connection settings in librdkafka's names."""

import pytest
from confluent_kafka import Producer

from stream_dp.config import Settings
from stream_dp.worker.kafka.output_producer import rdkafka_options


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
