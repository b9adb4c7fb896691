"""The partials topic must delete a partial before the release ledger forgets its window."""

from __future__ import annotations

import asyncio

import pytest
import yaml
from kafka.admin import KafkaAdminClient, NewTopic
from prometheus_client import CollectorRegistry

from stream_dp.config import Settings, load_config
from stream_dp.worker.app import Worker, WorkerConfigError
from stream_dp.worker.kafka.admin import (
    RETENTION_CONFIGS,
    ensure_topics,
    partials_retention_problem,
    read_topic_config,
)
from stream_dp.worker.store.ledger import MemoryReleaseLedger

DAY_MS = 86_400_000
HOUR_MS = 3_600_000
TTL_S = 8 * 86_400
WANTED = {"cleanup.policy": "delete", "retention.ms": str(7 * DAY_MS), "segment.ms": str(HOUR_MS)}


def _problem(**config: str) -> str | None:
    return partials_retention_problem("sdp.partials", config, ledger_ttl_s=TTL_S, wanted=WANTED, bootstrap="k:9092")


def _config(retention_ms: int, segment_ms: int, policy: str = "delete") -> dict[str, str]:
    return {"cleanup.policy": policy, "retention.ms": str(retention_ms), "segment.ms": str(segment_ms)}


def test_retention_plus_segment_within_the_ledger_ttl_is_accepted():
    assert _problem(**_config(7 * DAY_MS, HOUR_MS)) is None
    assert _problem(**_config(7 * DAY_MS, DAY_MS)) is None  # exactly the TTL
    assert _problem(**_config(HOUR_MS, HOUR_MS, "compact,delete")) is None


def test_a_topic_that_may_outlive_the_ledger_is_refused_with_the_command_that_fixes_it():
    problem = _problem(**_config(7 * DAY_MS, DAY_MS + 1))  # a millisecond longer than the ledger TTL
    assert problem is not None
    assert "'sdp.partials'" in problem and f"{8 * DAY_MS + 1} ms" in problem and f"{TTL_S * 1000} ms" in problem
    assert (
        "kafka-configs.sh --bootstrap-server k:9092 --alter --entity-type topics --entity-name sdp.partials "
        f"--add-config cleanup.policy=delete,retention.ms={7 * DAY_MS},segment.ms={HOUR_MS}"
    ) in problem
    assert "STREAM_DP_LEDGER_TTL_S to at least 691201" in problem


@pytest.mark.parametrize(
    ("config", "said"),
    [
        (_config(-1, HOUR_MS), "retention.ms=-1 (kept forever)"),
        (_config(HOUR_MS, HOUR_MS, "compact"), "cleanup.policy=compact, which never deletes"),
        ({"cleanup.policy": "delete", "segment.ms": str(HOUR_MS)}, "did not report retention.ms"),
    ],
    ids=["infinite", "compacted", "unreadable"],
)
def test_a_topic_that_never_deletes_or_cannot_be_read_is_refused(config, said):
    problem = _problem(**config)
    assert problem is not None and said in problem and "'sdp.partials'" in problem


@pytest.mark.services
def test_the_broker_reports_the_configs_in_force_and_the_worker_refuses_a_bad_topic(
    tmp_path, kafka_bootstrap, unique_name
):
    options = {"bootstrap_servers": kafka_bootstrap}
    created, existing = f"{unique_name}-made", f"{unique_name}.partials"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="stream-dp-tests")
    try:
        # Made by the worker's code: the configs asked for are the ones in force.
        ensure_topics(options, {created: 1}, configs={created: WANTED})
        assert read_topic_config(options, created, RETENTION_CONFIGS) == WANTED
        # Made by someone else, kept forever: the worker refuses to start on it.
        admin.create_topics([NewTopic(existing, 2, 1, topic_configs={"retention.ms": "-1"})])
        in_force = read_topic_config(options, existing, RETENTION_CONFIGS)
        assert in_force["retention.ms"] == "-1" and in_force["cleanup.policy"] == "delete"
        assert int(in_force["segment.ms"]) > 0  # the broker's default, reported although not set on the topic

        config_path = tmp_path / "queries.yaml"
        config_path.write_text(yaml.safe_dump({
            "namespaces": {"users": {"budgets": [{"horizon": "1h", "epsilon": 1.0}]}},
            "queries": [{
                "name": "q", "input_topic": f"{unique_name}-in", "output_topic": f"{unique_name}-out",
                "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
                "window": {"size": "1m"}, "group_by": ["page"], "groups": {"public": ["a"]},
                "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1}, "aggregations": {"count": {}},
                "epsilon": 0.5,
            }],
        }))
        settings = Settings(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{unique_name}.",
                            STREAM_DP_CONTRIBUTION_SECRET="test-secret-0123456789abcdef")
        worker = Worker(load_config(config_path), settings, registry=CollectorRegistry(), ledger=MemoryReleaseLedger(),
                        serve_metrics=False)
        with pytest.raises(WorkerConfigError, match=rf"'{existing}' has retention.ms=-1") as refused:
            asyncio.run(asyncio.wait_for(worker.run(), 60))  # a worker that starts instead runs until stopped
        assert f"--entity-name {existing} --add-config cleanup.policy=delete,retention.ms=" in str(refused.value)
    finally:
        names = [created, existing, f"{unique_name}.alerts", f"{unique_name}.dead-letter", f"{unique_name}-out"]
        present = [n for n in names if n in set(admin.list_topics())]
        if present:
            admin.delete_topics(present)
        admin.close()
