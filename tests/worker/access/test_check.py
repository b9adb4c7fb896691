"""The worker's start check against what a broker could answer (the broker itself: test_acls_on_a_secured_broker)."""

from __future__ import annotations

from pathlib import Path

from stream_dp.config import Settings, load_config
from stream_dp.worker.access.check import fix_hint, judge, worker_needs
from stream_dp.worker.kafka.acl_admin import DENIED, MISSING, UNKNOWN, Rights, kafka_operation_name

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "queries.example.yaml"


def needs():
    return worker_needs(load_config(EXAMPLE), Settings(STREAM_DP_GROUP_ID="grp", STREAM_DP_INTERNAL_TOPIC_PREFIX="int."))


def granted_all(needed):
    topics = {n.name: Rights("ok", n.operations) for n in needed if n.resource_type == "Topic"}
    groups = {n.name: Rights("ok", n.operations) for n in needed if n.resource_type == "Group"}
    return topics, groups


def test_everything_granted_passes_and_logs_each_resource():
    needed = needs()
    topics, groups = granted_all(needed)
    missing, warnings, found, absent = judge(needed, topics, groups, principal="User:w")
    assert (missing, warnings, absent) == ([], [], [])
    assert len(found) == len(topics) + len(groups)
    assert not any("beyond" in line for line in found)


def test_one_operation_missing_is_named_with_its_resource():
    needed = needs()
    topics, groups = granted_all(needed)
    topics["int.partials"] = Rights("ok", topics["int.partials"].operations - {"Write"})
    groups["grp-release"] = Rights(DENIED)
    missing, _, _, _ = judge(needed, topics, groups, principal="User:w")
    assert "User:w may not Write Topic 'int.partials' (partials topic)" in missing
    assert "User:w may not Describe, Read Group 'grp-release' (consumer group of the partials topic (release stage))" \
        in missing
    assert len(missing) == 2


def test_more_than_needed_is_logged_not_refused_and_missing_topics_are_checked_later():
    needed = needs()
    topics, groups = granted_all(needed)
    topics["int.alerts"] = Rights("ok", topics["int.alerts"].operations | {"Read", "Delete"})
    topics["int.dead-letter"] = Rights(MISSING)
    groups["grp"] = Rights(MISSING)
    topics["int.partials"] = Rights(UNKNOWN, detail="the broker did not report its authorized operations")
    missing, warnings, found, absent = judge(needed, topics, groups, principal="User:w")
    assert missing == [] and absent == ["int.dead-letter"]
    assert any("int.alerts" in line and "beyond what it needs: Delete, Read" in line for line in found)
    assert warnings == ["cannot check User:w's rights on Topic 'int.partials' (partials topic): the broker did not "
                        "report its authorized operations"]


def test_the_fix_names_the_command_and_kafka_names_operations_as_kafka_acls_does():
    hint = fix_hint("User:w", "q.yaml", "b:9092")
    assert "`stream-dp acls --config q.yaml --worker-principal User:w --apply`" in hint
    assert kafka_operation_name("DESCRIBE_CONFIGS") == "DescribeConfigs" and kafka_operation_name("READ") == "Read"


def test_what_the_worker_checks_is_what_the_plan_grants_it_whatever_its_group_is_called():
    from stream_dp.worker.access.kafka_plan import Principals, kafka_acls

    config = load_config(EXAMPLE)
    settings = Settings(STREAM_DP_GROUP_ID="analyst-workers")  # would clash with the default analyst prefix
    needed = {(n.resource_type, n.name, op) for n in worker_needs(config, settings) for op in n.operations}
    inputs = {q.input_topic for q in config.queries}
    plan = kafka_acls(config, settings, Principals("User:w", "User:a", dict.fromkeys(inputs, "User:p")),
                      analyst_group_prefix="bi-")
    assert needed == {(a.resource_type, a.resource_name, a.operation) for a in plan if a.principal == "User:w"}
