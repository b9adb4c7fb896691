"""Each topic has one role: a query's input, a query's output, or an internal topic of the worker."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stream_dp.config import Settings
from stream_dp.config.topic_roles import (
    INTERNAL_TOPIC_ROLES,
    deployment_problem,
    internal_topics,
    topic_role_clashes,
)


def query(name: str, input_topic: str, output_topic: str) -> SimpleNamespace:
    return SimpleNamespace(name=name, input_topic=input_topic, output_topic=output_topic)


@pytest.mark.parametrize("prefix", ["stream-dp.", "team-b-"])
@pytest.mark.parametrize("role", INTERNAL_TOPIC_ROLES)
@pytest.mark.parametrize("field", ["input_topic", "output_topic"])
def test_a_query_topic_named_like_an_internal_topic_clashes(prefix, role, field):
    topics = {"input_topic": "events", "output_topic": "releases", field: f"{prefix}{role}"}
    (clash,) = topic_role_clashes([query("q", **topics)], prefix)
    assert (clash.index, clash.query, clash.field) == (0, "q", field)
    assert f"internal {role} topic" in clash.message and f"rename the {field}" in clash.message
    assert ("producers Write" if field == "input_topic" else "analysts Read") in clash.message


def test_names_under_another_prefix_or_merely_alike_do_not_clash():
    queries = [query("q", "atk.partials", "stream-dp.partials-x"), query("r", "events", "stream-dp.partial")]
    assert topic_role_clashes(queries, "stream-dp.") == []
    assert [c.field for c in topic_role_clashes(queries, "atk.")] == ["input_topic"]


def test_the_internal_topics_are_every_topic_the_worker_names_from_its_prefix():
    settings = Settings(STREAM_DP_INTERNAL_TOPIC_PREFIX="p.")
    assert set(internal_topics("p.")) == {settings.partials_topic, settings.alerts_topic, settings.dead_letter_topic}


def test_a_query_reading_another_querys_output_is_a_chain():
    queries = [query("first", "events", "releases.first"), query("second", "releases.first", "releases.second")]
    (clash,) = topic_role_clashes(queries, None)
    assert (clash.query, clash.field) == ("second", "input_topic")
    assert "where query 'first' writes its releases" in clash.message and "forge releases" in clash.message
    assert topic_role_clashes([query("a", "x", "y"), query("b", "x", "z")], None) == []


def test_a_group_id_of_its_own_needs_a_prefix_of_its_own():
    assert deployment_problem("stream-dp", "stream-dp.") is None
    assert deployment_problem("team-b", "team-b.") is None
    assert deployment_problem("stream-dp", "other.") is None
    problem = deployment_problem("team-b", "stream-dp.")
    assert problem is not None and "STREAM_DP_INTERNAL_TOPIC_PREFIX='team-b.'" in problem
