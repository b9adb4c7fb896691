"""Queries reading one input topic must agree on what its events are: partitioner, unit field, local_dp, and
whether its producers' record timestamps are trusted.

Each refused combination is one a worker would run with at least one query dead-lettering the topic's
events (or counting randomized reports as true values); the last test shows the per-event checks that
make them so.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import yaml

from stream_dp.config import ConfigError, parse_config

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "queries.example.yaml"


def _two(first: dict | None = None, second: dict | None = None, *, same_topic: bool = True) -> dict:
    """The example's namespaces and two copies of its browsers_local query without local_dp (count by browser
    on events.browsers, devices), changed by ``first`` and ``second``."""
    config = yaml.safe_load(EXAMPLE.read_text())
    base = next(q for q in config["queries"] if q["name"] == "browsers_local")
    del base["local_dp"]
    queries = []
    for name, changes in (("a", first), ("b", second)):
        query = copy.deepcopy(base)
        query.update(name=name, output_topic=f"dp.{name}", **(changes or {}))
        queries.append(query)
    if not same_topic:
        queries[1]["input_topic"] = "events.other"
    return {"namespaces": config["namespaces"], "queries": queries}


def _error(config: dict) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(config, "queries.yaml")
    return str(info.value).splitlines()


LOCAL = {"local_dp": {"field": "browser", "mechanism": "krr", "epsilon": 2.0}, "epsilon": 2.0}


def test_queries_of_one_topic_with_the_same_settings_are_accepted():
    parse_config(_two(), "queries.yaml")
    parse_config(_two(LOCAL, LOCAL), "queries.yaml")
    # one unit field read by two namespaces: the key is its id for both
    parse_config(_two(None, {"privacy_unit": {"namespace": "users", "field": "device_id"}}), "queries.yaml")
    # differing settings on two topics
    parse_config(_two({"partitioner": "crc32"}, {"privacy_unit": {"namespace": "devices", "field": "serial"}},
                      same_topic=False), "queries.yaml")
    parse_config(_two(LOCAL, None, same_topic=False), "queries.yaml")


def test_two_partitioners_on_one_topic_are_refused():
    (line,) = _error(_two(None, {"partitioner": "crc32"}))
    assert line == (
        "queries.yaml: queries: queries 'a' and 'b' both read input_topic 'events.browsers' with partitioner "
        "murmur2 and crc32: each event must be on the partition its query's partitioner gives its key, so one of "
        "them dead-letters most events as wrong_partition; set the partitioner the topic's producers use (murmur2 "
        "for Kafka's Java client and kafka-python, crc32 for librdkafka's default) on both")


@pytest.mark.parametrize("trusting_first", [True, False])
def test_one_query_trusting_producer_timestamps_and_one_not_on_one_topic_are_refused(trusting_first):
    trusting = {"trust_producer_timestamps": True}
    (line,) = _error(_two(trusting, None) if trusting_first else _two(None, trusting))
    trusted, other = ("a", "b") if trusting_first else ("b", "a")
    assert line == (
        f"queries.yaml: queries: queries 'a' and 'b' both read input_topic 'events.browsers', and only {trusted!r} "
        "has trust_producer_timestamps: true: a topic's records close the windows of every query reading it by one "
        "clock, and the worker checks the topic's message.timestamp.type once for all of them; set "
        "trust_producer_timestamps alike on both (true only for a backfill whose producers stamp records with their "
        f"events' times, see docs/privacy/clock.md), or give {other!r} a topic of its own")
    parse_config(_two(trusting, trusting), "queries.yaml")
    parse_config(_two(trusting, None, same_topic=False), "queries.yaml")


@pytest.mark.parametrize("namespace", ["devices", "users"])
def test_two_unit_fields_on_one_topic_are_refused_whatever_the_namespaces(namespace):
    (line,) = _error(_two(None, {"privacy_unit": {"namespace": namespace, "field": "serial"}}))
    assert line.startswith("queries.yaml: queries: queries 'a' and 'b' both read input_topic 'events.browsers' with "
                           "privacy_unit.field 'device_id' and 'serial': "), line
    assert "dead-letters events as wrong_key; use one privacy_unit.field for every query of the topic" in line


@pytest.mark.parametrize("local_first", [True, False])
def test_a_local_dp_query_and_a_central_one_on_one_topic_are_refused(local_first):
    config = _two(LOCAL, None) if local_first else _two(None, LOCAL)
    local, central = ("a", "b") if local_first else ("b", "a")
    (line,) = _error(config)
    assert line.startswith("queries.yaml: queries: queries 'a' and 'b' both read input_topic 'events.browsers', and "
                           f"only '{local}' has local_dp (on 'browser'): a topic carries either randomized reports, "
                           f"which '{central}' would count as true values"), line
    assert f"read '{central}' from a topic of its own, or give both the same local_dp" in line


@pytest.mark.parametrize("other", [
    {"local_dp": {"field": "browser", "mechanism": "krr", "epsilon": 1.0}, "epsilon": 1.0},
    {"local_dp": {"field": "browser", "mechanism": "oue", "epsilon": 2.0}},
    {"local_dp": {"field": "agent", "mechanism": "krr", "epsilon": 2.0}, "group_by": ["agent"]},
    # the same values in another order: another domain hash in the reports' tag
    {**LOCAL, "groups": {"public": ["firefox", "chrome", "safari", "edge", "other"]}},
])
def test_local_dp_queries_of_other_settings_on_one_topic_are_refused(other):
    config = _two(LOCAL, other)
    assert config["queries"][0]["groups"] != config["queries"][1]["groups"] or "groups" not in other
    (line,) = _error(config)
    assert line.startswith("queries.yaml: queries: queries 'a' and 'b' both read input_topic 'events.browsers' with "
                           "other local_dp settings ({field: browser, mechanism: krr, epsilon: 2.0} over 5 values "
                           "and {field: "), line
    assert "give both the same local_dp and groups.public, or each a topic of its own" in line


def test_every_problem_is_its_own_line_naming_the_topics_first_query():
    config = _two(None, {"partitioner": "crc32", "privacy_unit": {"namespace": "devices", "field": "serial"}})
    third = copy.deepcopy(config["queries"][0])
    third.update(name="c", output_topic="dp.c", **LOCAL)
    config["queries"].append(third)
    lines = _error(config)
    assert [line.split(" both read ")[0] for line in lines] == [
        "queries.yaml: queries: queries 'a' and 'b'"] * 2 + ["queries.yaml: queries: queries 'a' and 'c'"]


def test_check_config_refuses_a_topic_its_queries_disagree_on(tmp_path, capsys):
    from stream_dp.cli.main import main

    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(_two(None, {"partitioner": "crc32"})))
    assert main(["check-config", str(path)]) == 1
    assert "both read input_topic 'events.browsers' with partitioner murmur2 and crc32" in capsys.readouterr().err


def test_the_refused_settings_break_events_in_the_per_event_checks():
    """What the worker checks per event (``stream_dp.windows.placement``): an event keyed by its unit and
    on the partition murmur2 gives it is on another partition by crc32 for most units (11 in 12 expected
    over 12 partitions), and an event keyed by one field's id has the wrong key for a query reading another."""
    from stream_dp.windows.partitioning import expected_partitions
    from stream_dp.windows.placement import key_differs

    units = np.array([f"device-{i}".encode() for i in range(2_000)], dtype="S")
    moved = np.mean(expected_partitions(units, 12, "murmur2") != expected_partitions(units, 12, "crc32"))
    assert 0.85 < moved < 0.98, moved  # binomial sd 0.006 around 11/12
    keys = [f"device-{i}".encode() for i in range(3)]  # keyed by device_id
    serials = np.array([f"serial-{i}".encode() for i in range(3)], dtype="S")
    assert not key_differs(keys, units[:3]).any() and key_differs(keys, serials).all()
