"""Connection settings from the environment (never from the query file).

Secrets are ``SecretStr`` so that they never print in logs, reprs or errors.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from stream_dp.budget.redis_nodes import ReplicaWait
from stream_dp.budget.redis_url import check_redis_url, is_cluster_url
from stream_dp.budget.store import DEFAULT_INPUT_RETENTION_MS, StoreOptions
from stream_dp.config.topic_roles import DEFAULT_GROUP_ID, DEFAULT_INTERNAL_TOPIC_PREFIX
from stream_dp.dp.vectorised_noise import NOISE_SAMPLERS

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
LEDGER_CLOCK_MARGIN_MS = HOUR_MS
"""How far apart the workers' clocks may be before the release age rule could let through a window
whose ledger entry expired (``Settings.release_age_limit_ms``)."""


class Settings(BaseSettings):
    """Worker settings; each field is read from the environment variable named in ``alias``."""

    model_config = SettingsConfigDict(populate_by_name=True, extra="ignore")

    kafka_bootstrap_servers: str = Field("127.0.0.1:9092", alias="KAFKA_BOOTSTRAP_SERVERS")
    kafka_security_protocol: str = Field("PLAINTEXT", alias="KAFKA_SECURITY_PROTOCOL")
    kafka_sasl_mechanism: str | None = Field(None, alias="KAFKA_SASL_MECHANISM")
    kafka_sasl_username: str | None = Field(None, alias="KAFKA_SASL_USERNAME")
    kafka_sasl_password: SecretStr | None = Field(None, alias="KAFKA_SASL_PASSWORD")
    kafka_ssl_cafile: str | None = Field(None, alias="KAFKA_SSL_CAFILE")
    kafka_ssl_certfile: str | None = Field(None, alias="KAFKA_SSL_CERTFILE")
    kafka_ssl_keyfile: str | None = Field(None, alias="KAFKA_SSL_KEYFILE")
    redis_url: SecretStr = Field(SecretStr("redis://127.0.0.1:6379/0"), alias="REDIS_URL")
    """One Redis (``redis://``, ``rediss://``, ``unix://``) or a Redis Cluster (``redis+cluster://host:port,...``)."""
    redis_timeout_s: float = Field(2.0, alias="STREAM_DP_REDIS_TIMEOUT_S", gt=0)
    redis_retries: int = Field(3, alias="STREAM_DP_REDIS_RETRIES", ge=0)
    redis_wait_replicas: int | None = Field(None, alias="STREAM_DP_REDIS_WAIT_REPLICAS", ge=0, le=16)
    """Replicas that must acknowledge a charge and a stored release before it is used (``WAIT``); unset: 1 on a
    Redis Cluster, 0 on one Redis. A failover loses what no replica acknowledged (docs/operations/redis.md)."""
    redis_wait_timeout_ms: int = Field(500, alias="STREAM_DP_REDIS_WAIT_TIMEOUT_MS", gt=0)
    """How long a charge waits for those replicas; then it fails closed and is retried."""
    output_wait_s: float = Field(40.0, alias="STREAM_DP_OUTPUT_WAIT_S", gt=0)
    """How long a window's publish waits for a broker to answer for its output topic (or for the topic to
    exist); then the window is held and tried again, with the records the ledger stored."""
    metrics_host: str = Field("127.0.0.1", alias="STREAM_DP_METRICS_HOST")
    metrics_port: int = Field(9108, alias="STREAM_DP_METRICS_PORT", ge=0, le=65535)
    """Serves ``/metrics``, ``/healthz`` (liveness) and ``/readyz`` (readiness)."""
    health_stall_s: float = Field(60.0, alias="STREAM_DP_HEALTH_STALL_S", gt=0)
    """``/healthz`` fails once the worker's event loop has not run for this long."""
    heap_trim_s: float = Field(30.0, alias="STREAM_DP_HEAP_TRIM_S", ge=0)
    """How often the worker hands the C heap's free pages back to the system (glibc's ``malloc_trim``); 0: never."""
    group_id: str = Field(DEFAULT_GROUP_ID, alias="STREAM_DP_GROUP_ID", min_length=1)
    internal_topic_prefix: str = Field(DEFAULT_INTERNAL_TOPIC_PREFIX, alias="STREAM_DP_INTERNAL_TOPIC_PREFIX")
    """One per deployment: a group id other than the default with the default prefix is refused by the worker
    and ``stream-dp acls`` (``config.topic_roles.deployment_problem``)."""
    contribution_secret: SecretStr | None = Field(None, alias="STREAM_DP_CONTRIBUTION_SECRET")
    partials_partitions: int = Field(4, alias="STREAM_DP_PARTIALS_PARTITIONS", ge=1, le=1000)
    output_partitions: int = Field(3, alias="STREAM_DP_OUTPUT_PARTITIONS", ge=1, le=1000)
    input_retention_ms: int = Field(DEFAULT_INPUT_RETENTION_MS, alias="STREAM_DP_INPUT_RETENTION_MS")
    ledger_ttl_s: int = Field(8 * 86_400, alias="STREAM_DP_LEDGER_TTL_S", ge=3_600)
    """Lifetime of a release-ledger entry. It must outlive every window a replay can still charge
    (input retention + an hour + the store's lead, see ``_ledger_outlives_replays``): the default is
    the default retention plus a day."""
    partials_retention_ms: int | None = Field(None, alias="STREAM_DP_PARTIALS_RETENTION_MS")
    """``retention.ms`` of the partials topic the worker creates (see ``partials_topic_configs``)."""
    topic_replication_factor: int | None = Field(None, alias="STREAM_DP_TOPIC_REPLICATION_FACTOR", ge=1, le=32)
    """Replicas per partition of the topics the worker creates; by default min(3, brokers)."""
    topic_min_insync_replicas: int | None = Field(None, alias="STREAM_DP_TOPIC_MIN_INSYNC_REPLICAS", ge=1, le=32)
    """``min.insync.replicas`` of the topics the worker creates; by default one fewer than the replicas (at least 1)."""
    internal_retention_ms: int = Field(DEFAULT_INPUT_RETENTION_MS, alias="STREAM_DP_INTERNAL_RETENTION_MS")
    """``retention.ms`` of the alerts and dead-letter topics the worker creates (they hold unit ids and events)."""
    output_retention_ms: int = Field(DEFAULT_INPUT_RETENTION_MS, alias="STREAM_DP_OUTPUT_RETENTION_MS")
    # "exact": discrete Laplace drawn vectorised by stream_dp.dp.vectorised_noise (the same laws as
    # OpenDP's measurements, ~100x faster); "opendp": every draw through OpenDP's FFI.
    noise_sampler: str = Field("exact", alias="STREAM_DP_NOISE_SAMPLER")
    # How long the group waits for a silent consumer before giving its partitions away: raise it
    # where workers share starved CPUs (a worker that misses it is rebalanced out mid-window).
    consumer_session_timeout_ms: int = Field(10_000, alias="STREAM_DP_CONSUMER_SESSION_TIMEOUT_MS",
                                             ge=6_000, le=300_000)
    """``retention.ms`` of the output topics the worker creates; -1 keeps releases forever."""

    @field_validator("redis_url")
    @classmethod
    def _redis_or_cluster_url(cls, value: SecretStr) -> SecretStr:
        check_redis_url(value.get_secret_value())
        return value

    @model_validator(mode="after")
    def _wait_within_the_socket_timeout(self) -> Settings:
        # WAIT blocks the connection: a socket timeout shorter than it would turn every slow
        # acknowledgement into a dropped connection.
        if self.replica_wait() is not None and self.redis_wait_timeout_ms > self.redis_timeout_s * 1000 / 2:
            raise ValueError(
                f"STREAM_DP_REDIS_WAIT_TIMEOUT_MS={self.redis_wait_timeout_ms} is over half of "
                f"STREAM_DP_REDIS_TIMEOUT_S={self.redis_timeout_s}; a charge's WAIT must end well before its socket "
                "times out: lower the first or raise the second"
            )
        return self

    def replica_wait(self) -> ReplicaWait | None:
        """What charges and stored releases wait for (None: no WAIT)."""
        replicas = self.redis_wait_replicas
        if replicas is None:
            replicas = 1 if is_cluster_url(self.redis_url.get_secret_value()) else 0
        return ReplicaWait(replicas, self.redis_wait_timeout_ms) if replicas else None

    @field_validator("partials_retention_ms")
    @classmethod
    def _partials_kept_an_hour_or_more(cls, value: int | None) -> int | None:
        # Partials wait in the topic while their release is held (e.g. Redis down); an hour is the floor.
        if value is not None and value < HOUR_MS:
            raise ValueError(
                f"STREAM_DP_PARTIALS_RETENTION_MS={value} is under an hour; partials must wait in their topic "
                "while a release is held: set it to at least 3600000, or unset it for the default"
            )
        return value

    @field_validator("internal_retention_ms")
    @classmethod
    def _internal_kept_an_hour_at_least(cls, value: int) -> int:
        if value < HOUR_MS:
            raise ValueError(
                f"STREAM_DP_INTERNAL_RETENTION_MS={value}; alerts and dead letters must stay long enough to be read "
                "(and are never kept forever: they hold unit ids): set it to at least 3600000"
            )
        return value

    @field_validator("output_retention_ms")
    @classmethod
    def _output_kept_an_hour_or_forever(cls, value: int) -> int:
        if value != -1 and value < HOUR_MS:
            raise ValueError(
                f"STREAM_DP_OUTPUT_RETENTION_MS={value}; consumers need time to read releases: set it to at least "
                "3600000, or -1 to keep them forever"
            )
        return value

    @field_validator("input_retention_ms")
    @classmethod
    def _retention_of_an_hour_or_more(cls, value: int) -> int:
        # Below an hour the store would refuse windows that close late in normal running.
        if value < HOUR_MS:
            raise ValueError(
                f"STREAM_DP_INPUT_RETENTION_MS={value} is under an hour; set it to the input topics' retention.ms "
                f"(Kafka's default is {DEFAULT_INPUT_RETENTION_MS}) and keep that at least 3600000"
            )
        return value

    @model_validator(mode="after")
    def _ledger_outlives_replays(self) -> Settings:
        """A replay can charge a window up to ``record_ttl_ms`` after it was first charged and released.

        If the release ledger had forgotten that window by then, the replay
        would draw and publish fresh noise for it: a second release the budget
        never paid for (the charge is replayed from its record, not repeated).
        """
        needed_s = -(-self.budget_store_options().record_ttl_ms // 1000)
        if self.ledger_ttl_s < needed_s:
            raise ValueError(
                f"STREAM_DP_LEDGER_TTL_S={self.ledger_ttl_s} is shorter than the oldest window a replay can charge "
                f"(STREAM_DP_INPUT_RETENTION_MS={self.input_retention_ms} plus 1 h 15 min); set it to at least "
                f"{needed_s} or lower the input retention"
            )
        return self

    @model_validator(mode="after")
    def _partials_gone_before_the_ledger_forgets(self) -> Settings:
        """Kafka may keep a record for retention.ms + segment.ms (it deletes whole segments)."""
        kept_ms = self.partials_topic_retention_ms + self.partials_segment_ms
        if kept_ms > self.ledger_ttl_s * 1000:
            ttl_ms = self.ledger_ttl_s * 1000
            longest = ttl_ms - HOUR_MS if ttl_ms - HOUR_MS >= 4 * HOUR_MS else ttl_ms * 4 // 5
            raise ValueError(
                f"STREAM_DP_PARTIALS_RETENTION_MS={self.partials_topic_retention_ms} plus the partials topic's "
                f"segment.ms ({self.partials_segment_ms}) is longer than the release ledger keeps its entries "
                f"(STREAM_DP_LEDGER_TTL_S={self.ledger_ttl_s}); set it to at most {longest} or raise the ledger TTL"
            )
        return self

    @property
    def partials_topic_retention_ms(self) -> int:
        """``STREAM_DP_PARTIALS_RETENTION_MS``; by default the ledger TTL less a day (half the TTL if longer)."""
        if self.partials_retention_ms is not None:
            return self.partials_retention_ms
        ttl_ms = self.ledger_ttl_s * 1000
        return max(ttl_ms - DAY_MS, ttl_ms // 2)

    @property
    def partials_segment_ms(self) -> int:
        """Kafka deletes whole segments once their newest record is past retention: short ones keep it close."""
        return min(HOUR_MS, self.partials_topic_retention_ms // 4)

    def partials_topic_configs(self) -> dict[str, str]:
        """Topic configs of the partials topic: its records are gone before the release ledger forgets a window."""
        return {
            "cleanup.policy": "delete",
            "retention.ms": str(self.partials_topic_retention_ms),
            "segment.ms": str(self.partials_segment_ms),
        }

    @property
    def release_age_limit_ms(self) -> int:
        """The release stage draws no noise for a window older than this (see ``stream_dp.worker.release.stage``).

        The ledger TTL less a margin for clock skew between workers: older
        than that, the window's ledger entry may have expired, so whether it
        was released can no longer be known.
        """
        return self.ledger_ttl_s * 1000 - LEDGER_CLOCK_MARGIN_MS

    def budget_store_options(self) -> StoreOptions:
        """The budget store's options: it accepts charges as late as a backlog the input topics hold."""
        return StoreOptions.for_input_retention(self.input_retention_ms)

    @field_validator("noise_sampler")
    @classmethod
    def _known_sampler(cls, value: str) -> str:
        if value.strip().lower() not in NOISE_SAMPLERS:
            raise ValueError(
                f"STREAM_DP_NOISE_SAMPLER={value!r}; use 'exact' (vectorised, the default) or 'opendp' "
                "(OpenDP's FFI for every draw); both draw the same distributions"
            )
        return value.strip().lower()

    @field_validator("kafka_security_protocol")
    @classmethod
    def _known_protocol(cls, value: str) -> str:
        allowed = {"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"}
        if value.upper() not in allowed:
            raise ValueError(f"KAFKA_SECURITY_PROTOCOL={value!r}; use one of {sorted(allowed)}")
        return value.upper()

    @field_validator("contribution_secret")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 16:
            raise ValueError(
                "STREAM_DP_CONTRIBUTION_SECRET is shorter than 16 characters; "
                "generate one with `python -c 'import secrets; print(secrets.token_hex(32))'`"
            )
        return value

    def kafka_client_options(self) -> dict[str, Any]:
        """Security options passed through to the Kafka clients (kafka-python / aiokafka names)."""
        options: dict[str, Any] = {
            "bootstrap_servers": self.kafka_bootstrap_servers,
            "security_protocol": self.kafka_security_protocol,
        }
        if self.kafka_sasl_mechanism:
            options["sasl_mechanism"] = self.kafka_sasl_mechanism
            options["sasl_plain_username"] = self.kafka_sasl_username
            if self.kafka_sasl_password is not None:
                options["sasl_plain_password"] = self.kafka_sasl_password.get_secret_value()
        for name in ("cafile", "certfile", "keyfile"):
            value = getattr(self, f"kafka_ssl_{name}")
            if value:
                options[f"ssl_{name}"] = value
        return options

    def aiokafka_options(self) -> dict[str, Any]:
        """The same options in aiokafka's terms (an SSL context instead of file names)."""
        options = self.kafka_client_options()
        files = {name: options.pop(f"ssl_{name}") for name in ("cafile", "certfile", "keyfile") if f"ssl_{name}" in options}
        if files or self.kafka_security_protocol in {"SSL", "SASL_SSL"}:
            from aiokafka.helpers import create_ssl_context

            options["ssl_context"] = create_ssl_context(**files)
        return options

    @property
    def partials_topic(self) -> str:
        return f"{self.internal_topic_prefix}partials"

    @property
    def alerts_topic(self) -> str:
        return f"{self.internal_topic_prefix}alerts"

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.internal_topic_prefix}dead-letter"


def settings_env_names() -> set[str]:
    """Every environment variable ``Settings`` reads (used to check deployment files)."""
    return {field.alias for field in Settings.model_fields.values() if field.alias}
