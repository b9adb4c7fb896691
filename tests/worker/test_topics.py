"""Topics planned on purpose: replication from the settings or the cluster, retention per role, record
sizes from the limits in force; existing topics that break an assumption named with their fix."""

from __future__ import annotations

import pytest

from stream_dp.worker.topics import (
    RECORD_HEADROOM,
    TopicSettingsError,
    TopicSpec,
    TopicState,
    output_message_bytes,
    plan_topics,
    record_limit,
    replication,
    topic_problems,
)

DAY_MS = 86_400_000
PARTIALS = {"cleanup.policy": "delete", "retention.ms": str(7 * DAY_MS), "segment.ms": "3600000"}


@pytest.mark.parametrize(("brokers", "expected"), [(1, (1, 1)), (2, (2, 1)), (3, (3, 2)), (7, (3, 2))])
def test_replication_defaults_to_what_the_cluster_allows(brokers, expected):
    assert replication(None, None, brokers) == expected


def test_replication_settings_are_taken_or_refused_with_the_fix():
    assert replication(2, 2, 3) == (2, 2)
    with pytest.raises(TopicSettingsError, match="STREAM_DP_TOPIC_REPLICATION_FACTOR=3 but the cluster has 2"):
        replication(3, None, 2)
    with pytest.raises(TopicSettingsError, match="MIN_INSYNC_REPLICAS=3 is more than the replication factor 2"):
        replication(2, 3, 3)
    with pytest.raises(TopicSettingsError, match="no brokers"):
        replication(None, None, 0)


def _plan(broker_max: int = 1_048_588, event_bytes: int = 65_536) -> dict[str, TopicSpec]:
    specs = plan_topics(
        partials="p.partials", alerts="p.alerts", dead_letter="p.dead-letter", outputs={"out": event_bytes},
        partials_partitions=4, output_partitions=3, replication_factor=3, min_insync=2, partials_configs=PARTIALS,
        internal_retention_ms=2 * DAY_MS, output_retention_ms=-1, broker_max=broker_max,
    )
    return {s.role: s for s in specs}


def test_every_topic_is_planned_with_explicit_settings():
    plan = _plan()
    assert {role: (s.name, s.partitions, s.replication_factor) for role, s in plan.items()} == {
        "partials": ("p.partials", 4, 3), "alerts": ("p.alerts", 1, 3), "dead-letter": ("p.dead-letter", 1, 3),
        "output": ("out", 3, 3),
    }
    assert plan["partials"].configs == {"min.insync.replicas": "2", **PARTIALS}
    for role in ("alerts", "dead-letter"):
        assert plan[role].configs == {"min.insync.replicas": "2", "cleanup.policy": "delete", "retention.ms": str(2 * DAY_MS)}
    assert plan["output"].configs == {"min.insync.replicas": "2", "cleanup.policy": "delete", "retention.ms": "-1"}


def test_an_output_topic_gets_max_message_bytes_only_when_the_broker_default_is_too_small():
    assert output_message_bytes(65_536, 1_048_588) is None
    assert "max.message.bytes" not in _plan().get("output").configs
    needed = output_message_bytes(1_000_000, 1_048_588)
    assert needed is not None and int(needed) > 2_000_000
    assert _plan(event_bytes=1_000_000)["output"].configs["max.message.bytes"] == needed


def test_record_limits_follow_the_smallest_limit_in_force():
    assert record_limit(1_048_588, None, 4 << 20) == 1_048_588 - RECORD_HEADROOM
    assert record_limit(1_048_588, 100_000, 4 << 20) == 100_000 - RECORD_HEADROOM
    assert record_limit(500_000, 2_000_000, 4 << 20) == 500_000 - RECORD_HEADROOM
    assert record_limit(500_000, 2_000_000, 4 << 20, topic_decides=True) == 2_000_000 - RECORD_HEADROOM
    assert record_limit(10 << 20, 10 << 20, 4 << 20) == (4 << 20) - RECORD_HEADROOM
    # a broker that does not say (no DescribeConfigs on the cluster): the topic's limit, else Kafka's default
    assert record_limit(None, 200_000, 4 << 20) == 200_000 - RECORD_HEADROOM
    assert record_limit(None, None, 4 << 20) == 1_048_588 - RECORD_HEADROOM
    assert record_limit(None, None, 4 << 20, topic_decides=True) == 1_048_588 - RECORD_HEADROOM


def _state(replicas: int = 3, **configs: str) -> TopicState:
    base = {"min.insync.replicas": "2", "cleanup.policy": "delete", "retention.ms": str(2 * DAY_MS),
            "max.message.bytes": "1048588"}
    return TopicState(replicas, {**base, **{k.replace("_", "."): v for k, v in configs.items()}})


def _problems(role: str, state: TopicState) -> list:
    return topic_problems(_plan()[role], state, bootstrap="k:9092")


def test_a_topic_as_planned_has_no_problem():
    for role in ("alerts", "dead-letter"):
        assert _problems(role, _state()) == []
    assert _problems("output", _state(retention_ms="-1")) == []


@pytest.mark.parametrize(
    ("role", "state", "said", "fix", "fatal"),
    [
        ("alerts", _state(1, min_insync_replicas="1"), "1 replica(s) per partition, fewer than the 3",
         "kafka-reassign-partitions.sh", False),
        ("output", _state(3, min_insync_replicas="4"), "min.insync.replicas=4 but 3 replica(s)",
         "--entity-name out --add-config min.insync.replicas=3", True),
        ("dead-letter", _state(min_insync_replicas="1"), "min.insync.replicas=1, fewer than the 2 wanted",
         "--add-config min.insync.replicas=2", False),
        ("output", _state(cleanup_policy="compact"), "compaction keeps only the latest record per group key",
         "--add-config cleanup.policy=delete", False),
        ("partials", _state(cleanup_policy="compact,delete", **{"retention.ms": PARTIALS["retention.ms"]}),
         "every chunk of a window's partials", "--entity-name p.partials --add-config cleanup.policy=delete", True),
        ("alerts", _state(retention_ms="-1"), "retention.ms=-1, longer than STREAM_DP_INTERNAL_RETENTION_MS",
         f"--add-config retention.ms={2 * DAY_MS}", False),
        ("dead-letter", _state(retention_ms=str(3 * DAY_MS)), "longer than STREAM_DP_INTERNAL_RETENTION_MS",
         f"--entity-name p.dead-letter --add-config retention.ms={2 * DAY_MS}", False),
    ],
    ids=["few-replicas", "in-sync-above-replicas", "few-in-sync", "output-compacted", "partials-compacted",
         "alerts-forever", "dead-letters-longer"],
)
def test_existing_topics_that_break_an_assumption_are_named_with_their_fix(role, state, said, fix, fatal):
    (problem,) = _problems(role, state)
    assert said in problem.text and fix in problem.text
    assert problem.fatal is fatal


def test_an_output_topic_too_small_for_its_records_is_named():
    spec = _plan(event_bytes=1_000_000)["output"]
    (problem,) = topic_problems(spec, _state(), bootstrap="k:9092")
    assert "release_record_too_large" in problem.text and spec.configs["max.message.bytes"] in problem.text
