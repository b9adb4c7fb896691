import pytest
from pydantic import ValidationError

from stream_dp.config import Settings, settings_env_names


def test_reads_environment_and_hides_secrets(monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker:9092")
    monkeypatch.setenv("REDIS_URL", "redis://worker:hunter2hunter2@redis:6379/0")
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "sasl_ssl")
    monkeypatch.setenv("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("KAFKA_SASL_USERNAME", "svc")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "s3cret-password")
    monkeypatch.setenv("STREAM_DP_CONTRIBUTION_SECRET", "0123456789abcdef0123")
    settings = Settings()
    assert settings.kafka_bootstrap_servers == "broker:9092"
    assert settings.kafka_security_protocol == "SASL_SSL"
    options = settings.kafka_client_options()
    assert options["sasl_plain_password"] == "s3cret-password"
    assert options["security_protocol"] == "SASL_SSL"
    shown = repr(settings) + str(settings)
    for secret in ("hunter2hunter2", "s3cret-password", "0123456789abcdef0123"):
        assert secret not in shown


def test_short_secret_and_unknown_protocol_are_refused(monkeypatch):
    monkeypatch.setenv("STREAM_DP_CONTRIBUTION_SECRET", "short")
    with pytest.raises(ValidationError, match="shorter than 16"):
        Settings()
    monkeypatch.delenv("STREAM_DP_CONTRIBUTION_SECRET")
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "TLS")
    with pytest.raises(ValidationError, match="use one of"):
        Settings()


def test_env_names_listed():
    names = settings_env_names()
    assert {"KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL", "STREAM_DP_METRICS_PORT", "STREAM_DP_CONTRIBUTION_SECRET"} <= names


def test_input_retention_sets_the_budget_stores_delay(monkeypatch):
    settings = Settings()
    assert settings.input_retention_ms == 7 * 86_400_000
    assert settings.budget_store_options().max_delay_ms == 7 * 86_400_000 + 3_600_000
    monkeypatch.setenv("STREAM_DP_INPUT_RETENTION_MS", str(2 * 86_400_000))
    assert Settings().budget_store_options().max_delay_ms == 2 * 86_400_000 + 3_600_000


def test_input_retention_under_an_hour_is_refused(monkeypatch):
    monkeypatch.setenv("STREAM_DP_INPUT_RETENTION_MS", "600000")
    with pytest.raises(ValidationError, match="STREAM_DP_INPUT_RETENTION_MS=600000 is under an hour.*retention.ms"):
        Settings()


def test_release_ledger_must_outlive_what_can_be_replayed(monkeypatch):
    monkeypatch.setenv("STREAM_DP_LEDGER_TTL_S", str(7 * 86_400))
    with pytest.raises(ValidationError, match="STREAM_DP_LEDGER_TTL_S=604800 .* at least 609301"):
        Settings()
    monkeypatch.setenv("STREAM_DP_INPUT_RETENTION_MS", str(3 * 86_400_000))
    assert Settings().ledger_ttl_s == 7 * 86_400


DAY, HOUR = 86_400_000, 3_600_000


def test_default_partials_retention_and_segments_fit_in_the_ledger_ttl(monkeypatch):
    settings = Settings()
    assert settings.partials_topic_configs() == {
        "cleanup.policy": "delete", "retention.ms": str(7 * DAY), "segment.ms": str(HOUR),
    }
    monkeypatch.setenv("STREAM_DP_INPUT_RETENTION_MS", str(HOUR))
    monkeypatch.setenv("STREAM_DP_LEDGER_TTL_S", "8200")  # under two days: half the TTL
    settings = Settings()
    assert settings.partials_topic_retention_ms == 4_100_000 and settings.partials_segment_ms == 1_025_000
    assert settings.partials_topic_retention_ms + settings.partials_segment_ms <= 8_200_000


def test_a_partials_retention_setting_longer_than_the_ledger_ttl_is_refused(monkeypatch):
    monkeypatch.setenv("STREAM_DP_PARTIALS_RETENTION_MS", str(8 * DAY))
    with pytest.raises(ValidationError, match=r"STREAM_DP_PARTIALS_RETENTION_MS=691200000 .* at most 687600000"):
        Settings()
    monkeypatch.setenv("STREAM_DP_PARTIALS_RETENTION_MS", "600000")
    with pytest.raises(ValidationError, match="STREAM_DP_PARTIALS_RETENTION_MS=600000 is under an hour"):
        Settings()
    monkeypatch.setenv("STREAM_DP_PARTIALS_RETENTION_MS", str(8 * DAY - 2 * HOUR))
    assert Settings().partials_topic_configs()["retention.ms"] == str(8 * DAY - 2 * HOUR)


def test_a_cluster_url_waits_for_one_replica_by_default(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis+cluster://svc:pw@redis-0:6379,redis-1:6379")
    wait = Settings().replica_wait()
    assert wait is not None and (wait.replicas, wait.timeout_ms) == (1, 500)
    monkeypatch.setenv("STREAM_DP_REDIS_WAIT_REPLICAS", "0")
    assert Settings().replica_wait() is None
    monkeypatch.setenv("REDIS_URL", "redis://redis:6379/0")
    monkeypatch.delenv("STREAM_DP_REDIS_WAIT_REPLICAS")
    assert Settings().replica_wait() is None  # one Redis: no replicas to wait for unless asked


def test_bad_cluster_urls_and_wait_settings_are_refused(monkeypatch):
    for url, match in [
        ("redis+cluster://redis-0:6379/3", "only database 0"),
        ("redis+cluster://redis-0", "not host:port"),
        ("memcached://cache:11211", "use redis://"),
    ]:
        monkeypatch.setenv("REDIS_URL", url)
        with pytest.raises(ValidationError, match=match):
            Settings()
    monkeypatch.setenv("REDIS_URL", "redis+cluster://redis-0:6379")
    monkeypatch.setenv("STREAM_DP_REDIS_WAIT_TIMEOUT_MS", "1500")
    with pytest.raises(ValidationError, match="over half of STREAM_DP_REDIS_TIMEOUT_S"):
        Settings()


def test_noise_sampler_defaults_to_exact_and_refuses_unknown_names(monkeypatch):
    assert Settings().noise_sampler == "exact"
    monkeypatch.setenv("STREAM_DP_NOISE_SAMPLER", " OpenDP ")
    assert Settings().noise_sampler == "opendp"
    monkeypatch.setenv("STREAM_DP_NOISE_SAMPLER", "numpy")
    with pytest.raises(ValidationError, match="use 'exact' .* or 'opendp'"):
        Settings()
