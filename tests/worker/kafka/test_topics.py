"""Topics planned on purpose: replication from the settings or the cluster, retention per role, record
sizes from the limits in force; existing topics that break an assumption named with their fix."""

from __future__ import annotations

import re

import pytest

from stream_dp.budget import StoreOptions
from stream_dp.config import ConfigError, QueryConfig
from stream_dp.config.loader import parse_config
from stream_dp.worker.assemble.runtimes import build_worker_parts
from stream_dp.worker.kafka.topics import (
    RECORD_HEADROOM,
    TopicSettingsError,
    TopicSpec,
    TopicState,
    output_message_bytes,
    plan_topics,
    query_release_record_bytes,
    record_limit,
    release_record_bytes,
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


def _plan(broker_max: int = 1_048_588, record_bytes: int = 196_608) -> dict[str, TopicSpec]:
    specs = plan_topics(
        partials="p.partials", alerts="p.alerts", dead_letter="p.dead-letter", outputs={"out": record_bytes},
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
    assert output_message_bytes(release_record_bytes(65_536), 1_048_588) is None
    assert "max.message.bytes" not in _plan(record_bytes=release_record_bytes(65_536)).get("output").configs
    needed = output_message_bytes(release_record_bytes(1_000_000), 1_048_588)
    assert needed is not None and int(needed) > 2_000_000
    assert _plan(record_bytes=release_record_bytes(1_000_000))["output"].configs["max.message.bytes"] == needed


def _query(**fields) -> QueryConfig:
    query = {
        "name": "q", "input_topic": "in", "output_topic": "out", "privacy_unit": {"namespace": "users", "field": "u"},
        "timestamp_field": "ts", "window": {"size": "1m"}, "group_by": ["page"],
        "groups": {"public": [f"p{i}" for i in range(1500)]}, "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
        "aggregations": {"count": {}}, "epsilon": 1.0, **fields,
    }
    return parse_config({"namespaces": {"users": {"budgets": [{"horizon": "1h", "epsilon": 10.0}]}},
                         "queries": [query]}).queries[0]


def test_the_largest_release_record_is_a_groups_or_a_top_k_list_of_k_groups():
    """From the records' layout: a group's record holds its values twice (key and body); a top_k record
    lists k groups' values, each as long as an event at most (or a listed public group, if longer)."""
    room = 64 * 1024
    assert query_release_record_bytes(_query()) == 2 * 65_536 + room
    assert query_release_record_bytes(_query(aggregations={"count": {}, "top_k": {"k": 100}})) == (
        100 * (65_536 + 64) + room)
    assert query_release_record_bytes(_query(max_message_bytes=1_000, aggregations={"count": {}, "top_k": {"k": 1}})) == (
        2 * 1_000 + room)
    long_key = "x" * 5_000  # released (noise only) even though no event of 1,000 bytes could name it
    query = _query(max_message_bytes=1_000, groups={"public": [long_key, "a"]},
                   aggregations={"count": {}, "top_k": {"k": 1}})
    assert query_release_record_bytes(query) == 2 * len(f'{{"page":"{long_key}"}}') + room


def _built(query: QueryConfig) -> str:
    config = {"namespaces": {"users": {"budgets": [{"horizon": "1h", "epsilon": 10.0}]}},
              "queries": [query.model_dump(mode="json", exclude_unset=True)]}
    try:
        build_worker_parts(parse_config(config), source="f.yaml", secret=b"k" * 32, store_options=StoreOptions(),
                           clock_ms=lambda: 0).close()
    except ConfigError as exc:
        return str(exc)
    return ""


def test_a_query_whose_top_k_record_no_topic_could_take_is_refused_with_what_to_lower():
    """What check-config and the worker build: a top_k list that could pass the output producer's bound
    would be left out of every window; the message's limits are the largest that build."""
    assert _built(_query(aggregations={"count": {}, "top_k": {"k": 1000}})) == ""  # 65.7 MB fits 64 MiB
    refused = _built(_query(max_message_bytes=100_000, aggregations={"count": {}, "top_k": {"k": 1000}}))
    assert "queries[0] (q): its top_k record lists k=1000 groups" in refused, refused
    k = int(re.search(r"lower top_k.k to at most (\d+)", refused).group(1))
    message_bytes = int(re.search(r"max_message_bytes to at most (\d+)", refused).group(1))
    assert _built(_query(max_message_bytes=100_000, aggregations={"count": {}, "top_k": {"k": k}})) == ""
    assert _built(_query(max_message_bytes=100_000, aggregations={"count": {}, "top_k": {"k": k + 1}})) != ""
    assert _built(_query(max_message_bytes=message_bytes, aggregations={"count": {}, "top_k": {"k": 1000}})) == ""
    assert _built(_query(max_message_bytes=message_bytes + 1, aggregations={"count": {}, "top_k": {"k": 1000}})) != ""


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
    spec = _plan(record_bytes=release_record_bytes(1_000_000))["output"]
    (problem,) = topic_problems(spec, _state(), bootstrap="k:9092")
    assert "release_record_too_large" in problem.text and spec.configs["max.message.bytes"] in problem.text
