"""The ACL plan of each role, read against the topics and groups the worker's own code uses."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from stream_dp.config import Settings, load_config
from stream_dp.worker.access.kafka_plan import (
    AclPlanError,
    Principals,
    kafka_acls,
    producer_principals,
)
from stream_dp.worker.access.render import kafka_acls_commands, plan_json
from stream_dp.worker.access.redis_plan import worker_redis_rule
from stream_dp.worker.kafka.clients import kafka_clients, release_group_id

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "queries.example.yaml"


@pytest.fixture
def config():
    return load_config(EXAMPLE)


def settings(**env) -> Settings:
    return Settings(STREAM_DP_GROUP_ID="grp", STREAM_DP_INTERNAL_TOPIC_PREFIX="int.", **env)


def plan(config, **kwargs):
    inputs = sorted({q.input_topic for q in config.queries})
    return kafka_acls(config, settings(), Principals("User:w", "User:a", dict.fromkeys(inputs, "User:p")), **kwargs)


def granted(acls, principal):
    return {(a.resource_type, a.resource_name, a.operation) for a in acls if a.principal == principal}


def test_the_worker_reads_inputs_writes_outputs_and_owns_the_internal_topics(config):
    acls = plan(config)
    worker = granted(acls, "User:w")
    inputs = {q.input_topic for q in config.queries}
    outputs = {q.output_topic for q in config.queries}
    for topic in inputs:
        assert {("Topic", topic, op) for op in ("Read", "Describe", "DescribeConfigs")} <= worker
        assert ("Topic", topic, "Write") not in worker
    for topic in outputs:
        assert ("Topic", topic, "Write") in worker and ("Topic", topic, "Read") not in worker
    assert {("Topic", "int.partials", "Read"), ("Topic", "int.partials", "Write")} <= worker
    assert ("Topic", "int.alerts", "Write") in worker and ("Topic", "int.alerts", "Read") not in worker
    assert ("Topic", "int.dead-letter", "Write") in worker and ("Topic", "int.dead-letter", "Read") not in worker
    assert {("Group", "grp", "Read"), ("Group", "grp-release", "Read")} <= worker
    assert ("Cluster", "kafka-cluster", "DescribeConfigs") in worker
    # nothing the worker never does: no deletes, alters, transactional ids or cluster-wide writes
    assert {op for _, _, op in worker} == {"Read", "Write", "Create", "Describe", "DescribeConfigs"}
    assert {kind for kind, _, _ in worker} == {"Topic", "Group", "Cluster"}


def test_the_worker_groups_are_the_ones_its_clients_join():
    from stream_dp.worker.kafka.topic_setup import TopicLimits

    async def groups() -> tuple[str, str]:  # built, never started: nothing connects
        clients = kafka_clients({"bootstrap_servers": "127.0.0.1:1"}, rdkafka={"bootstrap.servers": "127.0.0.1:1"},
                                client_id="c", group_id="grp",
                                limits=TopicLimits(1, 100_000, 100_000, 100_000), output_wait_s=1.0)
        try:
            return clients.ingest_consumer._group_id, clients.release_consumer._group_id
        finally:
            await clients.stop()

    assert asyncio.run(groups()) == ("grp", release_group_id("grp")) == ("grp", "grp-release")


def test_producers_write_inputs_only_and_analysts_read_outputs_only(config):
    acls = plan(config)
    inputs = {q.input_topic for q in config.queries}
    outputs = {q.output_topic for q in config.queries}
    assert granted(acls, "User:p") == {("Topic", t, op) for t in inputs for op in ("Write", "Describe")}
    analyst = granted(acls, "User:a")
    assert {(k, n, op) for k, n, op in analyst if k == "Topic"} == {("Topic", t, op) for t in outputs
                                                                     for op in ("Read", "Describe")}
    assert {a.pattern_type for a in acls if a.principal == "User:a" and a.resource_type == "Group"} == {"prefixed"}


def test_an_analyst_prefix_covering_the_worker_group_is_refused(config):
    with pytest.raises(AclPlanError, match="covers the worker's group 'grp'"):
        plan(config, analyst_group_prefix="gr")
    with pytest.raises(AclPlanError, match="empty"):
        plan(config, analyst_group_prefix="")


def test_one_principal_for_two_roles_and_a_bad_principal_are_refused(config):
    inputs = sorted({q.input_topic for q in config.queries})
    with pytest.raises(AclPlanError, match="both the worker and"):
        kafka_acls(config, settings(), Principals("User:w", "User:w", dict.fromkeys(inputs, "User:p")))
    with pytest.raises(AclPlanError, match="User:NAME"):
        kafka_acls(config, settings(), Principals("worker", "User:a", dict.fromkeys(inputs, "User:p")))


def test_producer_principals_per_topic():
    assert producer_principals(["a", "b"], ["User:all", "b=User:bee"], "User:d") == {"a": "User:all", "b": "User:bee"}
    assert producer_principals(["a"], [], "User:d") == {"a": "User:d"}
    with pytest.raises(AclPlanError, match="no query reads"):
        producer_principals(["a"], ["c=User:x"], "User:d")


def test_kafka_acls_commands_group_operations_per_resource(config):
    acls = plan(config)
    commands = kafka_acls_commands(acls, "b:9092")
    assert ("kafka-acls.sh --bootstrap-server b:9092 --command-config admin.properties --add --allow-principal "
            "User:w --operation Describe --operation Read --group grp-release") in commands
    assert any(c.endswith("--group analyst- --resource-pattern-type prefixed") for c in commands)
    assert any(c.endswith("--operation DescribeConfigs --cluster") for c in commands)
    # every binding appears in exactly one command
    assert sum(c.count("--operation") for c in commands) == len(acls)
    document = plan_json(acls, worker_redis_rule("u"))
    assert len(document["kafka"]) == len(acls) and document["redis"]["user"] == "u"


def test_a_topic_one_query_writes_and_another_reads_is_refused(config):
    """A chain (built past the file's validation, which refuses it too) would give the second query's producers
    Write on the first's releases and the first's analysts Read on the second's raw events."""
    first, second = config.queries[0], config.queries[1]
    chained = config.model_copy(update={"queries": [first, second.model_copy(update={"input_topic": first.output_topic})]})
    inputs = sorted({q.input_topic for q in chained.queries})
    with pytest.raises(AclPlanError, match=f"input_topic '{first.output_topic}' is where query '{first.name}' writes"):
        kafka_acls(chained, settings(), Principals("User:w", "User:a", dict.fromkeys(inputs, "User:p")))


@pytest.mark.parametrize("role", ["partials", "alerts", "dead-letter"])
@pytest.mark.parametrize("field", ["input_topic", "output_topic"])
def test_a_query_topic_named_like_an_internal_topic_is_refused(config, role, field):
    first = config.queries[0]
    doctored = config.model_copy(update={"queries": [first.model_copy(update={field: f"int.{role}"}),
                                                     *config.queries[1:]]})
    inputs = sorted({q.input_topic for q in doctored.queries})
    with pytest.raises(AclPlanError, match=f"{field} 'int.{role}' is the worker's internal {role} topic"):
        kafka_acls(doctored, settings(), Principals("User:w", "User:a", dict.fromkeys(inputs, "User:p")))


@pytest.mark.parametrize("principal, said", [
    ("User:*", "wildcard"), ("User:a*", "wildcard"), ("Group:x", "type 'Group'"), ("user:stream-dp", "type 'user'"),
    ("User:a b", "whitespace or a comma"), ("User:x,User:y", "whitespace or a comma"), ("User: a", "whitespace"),
])
def test_wildcard_and_malformed_principals_are_refused_for_every_role(config, principal, said):
    inputs = sorted({q.input_topic for q in config.queries})
    for principals in (Principals(principal, "User:a", dict.fromkeys(inputs, "User:p")),
                       Principals("User:w", principal, dict.fromkeys(inputs, "User:p")),
                       Principals("User:w", "User:a", dict.fromkeys(inputs, principal))):
        with pytest.raises(AclPlanError, match=said):
            kafka_acls(config, settings(), principals)
    with pytest.raises(AclPlanError, match=said):
        producer_principals(inputs, [f"{inputs[0]}={principal}"], "User:d")


def test_other_principal_types_only_with_the_flag(config):
    inputs = sorted({q.input_topic for q in config.queries})
    acls = kafka_acls(config, settings(), Principals("Service:w", "User:a", dict.fromkeys(inputs, "User:p")),
                      custom_types=True)
    assert ("Topic", "int.partials", "Read") in granted(acls, "Service:w")
    with pytest.raises(AclPlanError, match="wildcard"):  # never a wildcard, whatever the flag
        kafka_acls(config, settings(), Principals("Service:*", "User:a", dict.fromkeys(inputs, "User:p")),
                   custom_types=True)


def test_a_producer_principal_given_twice_for_one_topic_is_refused():
    with pytest.raises(AclPlanError, match="names topic 'a' twice"):
        producer_principals(["a", "b"], ["a=User:one", "a=User:two"], "User:d")
    with pytest.raises(AclPlanError, match="two principals for every input topic"):
        producer_principals(["a", "b"], ["User:one", "User:two"], "User:d")


def test_the_summary_names_each_topics_own_producer(config):
    from stream_dp.worker.access.render import plan_text

    inputs = sorted({q.input_topic for q in config.queries})
    producers = {topic: f"User:p{i}" for i, topic in enumerate(inputs)}
    text = plan_text(kafka_acls(config, settings(), Principals("User:w", "User:a", producers)), worker_redis_rule("u"),
                     "b:9092")
    summary = [line for line in text.splitlines() if line.startswith("#")]
    for topic, principal in producers.items():
        header = summary.index(f"# producer ({principal}):")
        assert summary[header + 1].startswith(f"#   Topic {topic}: "), summary
