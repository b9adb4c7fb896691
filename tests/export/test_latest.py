"""LatestReleases: each query's newest window, bounded by the query file; the series a scrape renders."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stream_dp.config import parse_config
from stream_dp.export import ExportMetrics, LatestReleases, QueryBounds
from stream_dp.export.latest import NOT_A_RELEASE, OLDER_WINDOW, OUTSIDE_GROUPS, SHOWN, UNKNOWN_QUERY

RECORDS = Path(__file__).resolve().parents[1] / "cli" / "release_records.jsonl"


def _record(query: str, start_ms: int, group: str, count: float, **extra) -> dict:
    return {"query": query, "window": {"start_ms": start_ms, "end_ms": start_ms + 1000}, "group": {"page": group},
            "count": count, "sum": None, "mean": None, "ci95": {"count": 3.0, "sum": None, "mean": None},
            "privacy": {"epsilon": 0.5}, **extra}


def _series(latest: LatestReleases) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry()
    ExportMetrics(registry, latest)
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if sample.name.startswith("stream_dp_release_"):
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _groups(latest: LatestReleases, query: str) -> set[str]:
    return {dict(labels)["group"] for (name, labels) in _series(latest)
            if name == "stream_dp_release_value" and dict(labels)["query"] == query}


def test_a_newer_window_replaces_the_groups_and_an_older_one_is_ignored():
    latest = LatestReleases({"q": QueryBounds(None, 10)})
    assert latest.add_all([_record("q", 1000, "a", 5), _record("q", 1000, "b", 7)]) == {SHOWN: 2}
    assert _groups(latest, "q") == {"a", "b"}
    assert latest.add(_record("q", 2000, "b", 9)) == SHOWN
    assert _groups(latest, "q") == {"b"}  # a was not released in the newer window: its series went away
    assert latest.add(_record("q", 1000, "a", 5)) == OLDER_WINDOW
    series = _series(latest)
    assert series[("stream_dp_release_value", (("group", "b"), ("query", "q"), ("statistic", "count")))] == 9
    assert series[("stream_dp_release_window_end_seconds", (("query", "q"),))] == 3.0


def test_selected_groups_are_capped_at_max_groups_keeping_the_largest_noisy_counts():
    latest = LatestReleases({"q": QueryBounds(None, 2)})
    latest.add_all([_record("q", 0, g, c) for g, c in [("a", 3), ("b", 30), ("c", 10), ("d", 1)]])
    assert _groups(latest, "q") == {"b", "c"}
    assert _series(latest)[("stream_dp_release_groups", (("query", "q"),))] == 2


def test_public_groups_are_those_of_the_query_file_and_their_hierarchy_levels():
    config = parse_config({
        "namespaces": {"users": {"budgets": [{"horizon": "1h", "epsilon": 10.0}]}},
        "queries": [{"name": "places", "input_topic": "i", "output_topic": "o",
                     "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
                     "window": {"size": "30s"}, "group_by": ["country", "city"], "hierarchy": {"split": [1, 1]},
                     "groups": {"public": [["FR", "Paris"], ["DE", "Berlin"]]},
                     "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
                     "aggregations": {"count": {}}, "epsilon": 1.0}],
    })
    bounds = QueryBounds.of(config.query("places"), max_groups=1)
    assert bounds.public == {"FR", "DE", "FR,Paris", "DE,Berlin"}
    latest = LatestReleases({"places": bounds})
    paris = {**_record("places", 0, "", 4), "group": {"country": "FR", "city": "Paris"}}
    lyon = {**_record("places", 0, "", 4), "group": {"country": "FR", "city": "Lyon"}}
    france = {**_record("places", 0, "", 4), "group": {"country": "FR"}, "level": 0}
    assert [latest.add(r) for r in (paris, lyon, france)] == [SHOWN, OUTSIDE_GROUPS, SHOWN]
    assert _groups(latest, "places") == {"FR,Paris", "FR"}  # public: all listed, max_groups does not apply


@pytest.mark.parametrize("record", [None, [], {"query": "q"}, {"query": "q", "window": {"start_ms": "x"}},
                                    {"query": "q", "window": {"start_ms": 0, "end_ms": 1}, "group": "a"}])
def test_what_is_not_a_release_record_is_counted_and_left_out(record):
    latest = LatestReleases({"q": QueryBounds(None, 5)})
    assert latest.add(record) == NOT_A_RELEASE
    assert latest.samples() == []


def test_a_query_not_in_the_file_has_no_series():
    latest = LatestReleases({"q": QueryBounds(None, 5)})
    assert latest.add(_record("other", 0, "a", 1)) == UNKNOWN_QUERY
    assert latest.samples() == []


def test_a_top_k_list_of_a_new_window_replaces_the_ranks_and_states_the_windows_epsilon():
    latest = LatestReleases({"q": QueryBounds(None, 5)})
    top = {"query": "q", "kind": "top_k", "window": {"start_ms": 0, "end_ms": 1000}, "k": 2,
           "top": [{"rank": 1, "group": {"page": "b"}}, {"rank": 2, "group": {"page": "a"}}],
           "privacy": {"epsilon": 0.25, "window_epsilon": 0.5}}
    latest.add_all([top, _record("q", 0, "a", 1), _record("q", 0, "b", 2)])
    series = _series(latest)
    ranks = {dict(labels)["group"]: v for (name, labels), v in series.items() if name == "stream_dp_release_top_k_rank"}
    assert ranks == {"b": 1, "a": 2}
    assert series[("stream_dp_release_epsilon", (("query", "q"),))] == 0.5
    latest.add({**top, "window": {"start_ms": 1000, "end_ms": 2000}, "top": [{"rank": 1, "group": {"page": "a"}}]})
    ranks = {dict(labels)["group"]: v for (name, labels), v in _series(latest).items()
             if name == "stream_dp_release_top_k_rank"}
    assert ranks == {"a": 1}


def test_every_kind_of_record_the_worker_publishes_gives_its_series():
    """tests/cli/release_records.jsonl holds records of every option, as real workers published them."""
    records = [orjson.loads(line) for line in RECORDS.read_text().splitlines()]
    latest = LatestReleases({r["query"]: QueryBounds(None, 50) for r in records})
    assert latest.add_all(records) == {SHOWN: len(records)}
    names = {name for name, _labels in _series(latest)}
    assert names >= {
        "stream_dp_release_value", "stream_dp_release_value_ci95", "stream_dp_release_running_total",
        "stream_dp_release_running_total_ci95", "stream_dp_release_top_k_rank", "stream_dp_release_quantile",
        "stream_dp_release_vector_mean", "stream_dp_release_vector_mean_ci95", "stream_dp_release_covariance",
        "stream_dp_release_sample_aggregate", "stream_dp_release_local_dp_reports",
        "stream_dp_release_window_end_seconds", "stream_dp_release_epsilon", "stream_dp_release_as_if_empty",
    }
    by_query = {r["query"]: r for r in records if r.get("kind") is None}
    series = _series(latest)
    for query, record in by_query.items():
        group = ",".join(str(v) for v in record["group"].values())
        name = "stream_dp_release_running_total" if "continual" in record else "stream_dp_release_value"
        for statistic in ("count", "sum", "mean"):
            key = (name, tuple(sorted({"query": query, "group": group, "statistic": statistic}.items())))
            assert series.get(key) == (None if record[statistic] is None else float(record[statistic])), (query, statistic)


def test_selected_groups_go_once_no_newer_window_came_within_their_expiry():
    now = [10_000]
    latest = LatestReleases({"q": QueryBounds(None, 5, expire_ms=4_000)}, clock_ms=lambda: now[0])
    latest.add_all([_record("q", 1000, "a", 5), {"query": "q", "kind": "top_k", "window": {"start_ms": 1000,
                    "end_ms": 2000}, "top": [{"rank": 1, "group": {"page": "a"}}], "privacy": {"epsilon": 1.0}}])
    now[0] = 6_000  # 4 s after the window's end: still the latest release
    assert _groups(latest, "q") == {"a"}
    now[0] = 6_001  # a window passed in which selection released nothing
    series = _series(latest)
    assert {name for name, _labels in series} == {
        "stream_dp_release_window_end_seconds", "stream_dp_release_epsilon", "stream_dp_release_as_if_empty",
        "stream_dp_release_groups"}
    assert series[("stream_dp_release_groups", (("query", "q"),))] == 0


def test_the_expiry_of_selected_groups_follows_the_query_file():
    config = parse_config({
        "namespaces": {"users": {"budgets": [{"horizon": "1h", "epsilon": 10.0, "delta": 1e-3}]}},
        "queries": [{"name": "chosen", "input_topic": "i", "output_topic": "o",
                     "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
                     "window": {"size": "30s", "allowed_lateness": "10s"}, "release_timeout": "1m",
                     "group_by": ["page"], "groups": {"select": {"delta": 1e-6}},
                     "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
                     "aggregations": {"count": {}}, "epsilon": 1.0}],
    })
    assert QueryBounds.of(config.query("chosen"), 3) == QueryBounds(None, 3, expire_ms=2 * 30_000 + 10_000 + 60_000)
