"""``stream-dp acls --check``: which ACLs on the broker lie beyond the plan, and which of them break it."""

from __future__ import annotations

import shlex
from pathlib import Path

from stream_dp.config import Settings, load_config
from stream_dp.worker.access.audit import Binding, audit, remove_command, report
from stream_dp.worker.access.kafka_plan import GROUP, TOPIC, Principals, kafka_acls, worker_groups, worker_topics

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "queries.example.yaml"


def planned():
    config = load_config(EXAMPLE)
    settings = Settings(STREAM_DP_GROUP_ID="grp", STREAM_DP_INTERNAL_TOPIC_PREFIX="int.")
    inputs = sorted({q.input_topic for q in config.queries})
    acls = kafka_acls(config, settings, Principals("User:w", "User:a", dict.fromkeys(inputs, "User:p")))
    roles = {**{(TOPIC, t): r for t, r in worker_topics(config, settings).items()},
             **{(GROUP, g): ["worker group"] for g in worker_groups(settings)}}
    return config, acls, roles


def as_bindings(acls):
    return [Binding(a.principal, "*", a.resource_type, a.resource_name, a.pattern_type, a.operation, "Allow")
            for a in acls]


def test_the_plan_alone_is_clean_and_unrelated_acls_are_not_listed():
    _, acls, roles = planned()
    elsewhere = Binding("User:x", "*", "Topic", "someone-elses-topic", "literal", "Read", "Allow")
    assert audit([*as_bindings(acls), elsewhere], acls, roles, worker="User:w") == []


def test_stale_wildcard_and_prefixed_grants_on_sensitive_topics_fail_the_check():
    config, acls, roles = planned()
    first_input = config.queries[0].input_topic
    stale = [
        Binding("User:old-analyst", "*", "Topic", "int.partials", "literal", "Read", "Allow"),
        Binding("User:*", "*", "Topic", "*", "literal", "Read", "Allow"),
        Binding("User:tester", "*", "Topic", "int.", "prefixed", "All", "Allow"),
        Binding("User:a", "*", "Topic", first_input, "literal", "Read", "Allow"),  # the analyst, on raw events
    ]
    findings = audit([*as_bindings(acls), *stale], acls, roles, worker="User:w")
    assert {f.binding for f in findings} == set(stale) and all(f.fatal for f in findings)
    wildcard = next(f for f in findings if f.binding.principal == "User:*")
    assert any("'int.partials' (partials)" in r for r in wildcard.reaches)


def test_beyond_the_plan_but_harmless_is_listed_not_fatal():
    config, acls, roles = planned()
    output = config.queries[0].output_topic
    extra = [
        Binding("User:bi", "*", "Topic", output, "literal", "Read", "Allow"),  # another reader of releases
        Binding("User:w", "*", "Topic", "int.partials", "literal", "Delete", "Allow"),  # the worker, beyond its needs
        Binding("User:p", "*", "Topic", "int.partials", "literal", "Read", "Deny"),  # a DENY the plan does not hold
        Binding("User:w", "10.0.0.1", "Topic", "int.partials", "literal", "Read", "Allow"),  # from one host only
        Binding("User:x", "*", "Group", "grp", "literal", "Read", "Allow"),  # may join the worker's group
    ]
    findings = audit([*as_bindings(acls), *extra], acls, roles, worker="User:w")
    assert {f.binding for f in findings} == set(extra) and not any(f.fatal for f in findings)


def test_the_remove_command_names_exactly_the_binding():
    binding = Binding("User:tester", "*", "Topic", "int.", "prefixed", "All", "Allow")
    words = shlex.split(remove_command(binding, "b:9092"))
    assert words[words.index("--remove") + 1] == "--force"
    for flag, value in (("--allow-principal", "User:tester"), ("--allow-host", "*"), ("--operation", "All"),
                        ("--topic", "int."), ("--resource-pattern-type", "prefixed")):
        assert words[words.index(flag) + 1] == value
    deny = shlex.split(remove_command(Binding("User:p", "*", "Group", "grp", "literal", "Read", "Deny"), "b:9092"))
    assert "--deny-principal" in deny and "--group" in deny
    _, acls, roles = planned()
    text = report(audit([binding, *as_bindings(acls)], acls, roles, worker="User:w"), "b:9092")
    assert "DANGER Allow User:tester" in text and remove_command(binding, "b:9092") in text
