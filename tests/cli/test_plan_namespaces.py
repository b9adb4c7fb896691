"""``stream-dp plan``'s namespace lines: what all the queries of a namespace charge one unit together.

The expected numbers come from the README's rules ("Privacy"), from the file's settings alone: a window
charges each of its units the query's epsilon (and delta) at its end, so a unit active in every window of
a query of window ``W`` is charged ``H / W`` times in a horizon ``H``; a continual query charges its
``epsilon`` once per period, so ``ceil(H / P)`` times; a rho namespace is charged a Laplace query's
``epsilon^2 / 2``. How long a fully active unit lasts is checked against the in-memory budget store,
charged window by window as a worker charges it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from stream_dp.cli.main import main

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "queries.example.yaml"
HOUR, DAY = 3_600_000, 86_400_000
SENSORS = ("sensor_means", "sensor_covariance", "sensor_median_temp")


def _plan(path: Path, capsys) -> tuple[dict, str]:
    assert main(["plan", str(path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert main(["plan", str(path)]) == 0
    return plan, capsys.readouterr().out


def _horizons(plan: dict, namespace: str) -> dict[str, dict]:
    (summary,) = [n for n in plan["namespaces"] if n["namespace"] == namespace]
    return {h["horizon"]: h for h in summary["horizons"]}


def _sensors_only(tmp_path: Path) -> Path:
    """The example with the devices namespace holding only the three sensor queries (one topic), on 1h windows
    at epsilon 0.5, 1 and 0.5 under a limit of 16 per day."""
    config = yaml.safe_load(EXAMPLE.read_text())
    config["queries"] = [q for q in config["queries"] if q["privacy_unit"]["namespace"] == "users"
                         or q["name"] in SENSORS]
    for query in config["queries"]:
        if query["name"] in SENSORS:
            query.update(window={"size": "1h", "allowed_lateness": "1m"},
                         epsilon={"sensor_means": 0.5, "sensor_covariance": 1.0, "sensor_median_temp": 0.5}[query["name"]])
    config["namespaces"]["devices"]["budgets"] = [{"horizon": "24h", "epsilon": 16.0, "delta": 1.0e-4}]
    path = tmp_path / "sensors.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_example_namespaces_sum_every_query_per_horizon(capsys):
    config = yaml.safe_load(EXAMPLE.read_text())
    queries = {q["name"]: q for q in config["queries"]}
    plan, text = _plan(EXAMPLE, capsys)

    # devices, 1h and 1d: five queries of 30s windows, 120 and 2,880 windows each
    devices = [q for q in queries.values() if q["privacy_unit"]["namespace"] == "devices"]
    assert len(devices) == 5 and all(q["window"]["size"] == "30s" for q in devices)
    per_window = sum(q["epsilon"] for q in devices)  # 1, 2, 0.5, 3 and 1 per window: 7.5
    delta_per_window = sum(q.get("delta", 0.0) for q in devices)  # 1e-6 and 2e-6
    assert per_window == 7.5 and delta_per_window == pytest.approx(3e-6)
    for horizon, windows, limit, delta_limit in (("1h", 120, 16, 1e-4), ("1d", 2880, 48, 4e-4)):
        spends = _horizons(plan, "devices")[horizon]
        assert spends["fully_active_unit_spends"]["epsilon"] == pytest.approx(windows * per_window, rel=1e-6)
        assert spends["fully_active_unit_spends"]["delta"] == pytest.approx(windows * delta_per_window, rel=1e-6)
        assert spends["limit"] == limit and spends["exhausted"] == ["delta", "epsilon"]
        assert spends["times_the_limit"] == pytest.approx(windows * per_window / limit, rel=1e-6)
        # epsilon binds first: the limit lasts limit / 7.5 windows of 30 s
        horizon_ms = HOUR if horizon == "1h" else DAY
        assert spends["fully_active_unit_lasts_ms"] == pytest.approx(horizon_ms * limit / (windows * per_window),
                                                                    rel=1e-6)
        assert windows * delta_per_window > delta_limit  # exhausted too, later
    assert _horizons(plan, "devices")["1d"]["fully_active_unit_lasts_ms"] == pytest.approx(48 / 7.5 * 30_000)

    # users, 1h and 1d: four queries of 30s windows (0.5, 0.5, 2 and 0.5) and the continual pageviews_today,
    # charged 2 once per 1d period: once in any 1h and once in any 1d for a unit active in every window
    users = _horizons(plan, "users")
    assert queries["pageviews_today"]["continual"]["period"] == "1d"
    per_window = [q for q in queries.values() if q["privacy_unit"]["namespace"] == "users" and "continual" not in q]
    assert len(per_window) == 4 and all(q["window"]["size"] == "30s" for q in per_window)
    assert sum(q["epsilon"] for q in per_window) == 3.5 and queries["pageviews_today"]["epsilon"] == 2
    for horizon, windows in (("1h", 120), ("1d", 2880)):
        expected = windows * 3.5 + 2
        assert users[horizon]["fully_active_unit_spends"]["epsilon"] == pytest.approx(expected, rel=1e-6)
        assert users[horizon]["exhausted"] == ["epsilon"]
    assert users["1h"]["fully_active_unit_lasts_ms"] == pytest.approx(HOUR * 10 / 422, rel=1e-6)

    # The text: each query's horizon lines say they count that query alone, and the namespace's lines
    # warn that together its queries exhaust the limits.
    assert "a unit can join 32 of 120 windows" in text  # sensor_means alone: 16 / 0.5 per hour
    assert all("counting this query alone" in line for line in text.splitlines() if "can join" in line)
    namespace_part = text[text.index("\nnamespace users "):]
    assert ("48 (delta 0.0004) per 1d: a unit active in every window of every query of the namespace is charged "
            "21600 epsilon, delta 0.00864 in any 1d" in namespace_part)
    assert ("WARNING: namespace devices together exhausts the delta and epsilon limit per 1d: a unit active in "
            "every window of its queries uses it up in about 3.2m of windows joined at that rate (6 windows of each "
            "30s-window query)" in namespace_part)
    assert namespace_part.count("WARNING: namespace users") == 2


def _windows_joined(path: Path, namespace: str, names: list[str], window_ms: int, windows: int,
                    rho: bool = False) -> dict[str, int]:
    """A unit active in every window of ``names`` (all of window ``window_ms``), charged at each window's
    end, query after query, in the in-memory budget store under the file's limits: the windows it joins.
    A window charges the file's epsilon and delta, or in a rho namespace a Laplace query's epsilon^2 / 2."""
    from stream_dp.budget.memory import MemoryBudgetStore
    from stream_dp.budget.policy import policy_from_config
    from stream_dp.config import load_config

    config = load_config(path)
    queries = {q.name: q for q in config.queries}
    start = 1_800_000_000_000 - 1_800_000_000_000 % DAY
    now = [start]
    store = MemoryBudgetStore(policy_from_config(config), clock_ms=lambda: now[0])
    joined = dict.fromkeys(names, 0)
    for w in range(windows):
        now[0] = end = start + (w + 1) * window_ms
        for name in names:
            q = queries[name]
            cost, delta = (q.epsilon**2 / 2, 0.0) if rho else (q.epsilon, q.delta)
            if not store.charge(namespace, f"{name}/{w}/0", ["unit-1"], cost, end, delta=delta).excluded[0]:
                joined[name] += 1
    return joined


def test_three_queries_that_each_fit_alone_last_a_third_of_the_day_together(tmp_path, capsys):
    """sensor_means, sensor_covariance and sensor_median_temp charge a device 0.5, 1 and 0.5 per hourly window:
    alone, 12, 24 and 12 per day, within 16 or close; together 48, three times it. A device active in every
    window lasts 8 hours, which the budget store shows: it joins 8 of the day's 24 windows of each."""
    path = _sensors_only(tmp_path)
    plan, text = _plan(path, capsys)
    day = _horizons(plan, "devices")["1d"]
    assert day["fully_active_unit_spends"]["epsilon"] == pytest.approx(24 * (0.5 + 1 + 0.5), rel=1e-6)
    assert day["fully_active_unit_spends"]["delta"] == pytest.approx(24 * (1e-6 + 2e-6), rel=1e-6)
    assert day["times_the_limit"] == pytest.approx(3, rel=1e-6)
    lasts = day["fully_active_unit_lasts_ms"]
    joined = _windows_joined(path, "devices", list(SENSORS), HOUR, 24)
    assert joined == dict.fromkeys(SENSORS, 8) and lasts == pytest.approx(8 * HOUR, rel=1e-6)
    assert "uses it up in about 8h of windows joined at that rate (8 windows of each 1h-window query)" in text
    # each query's own line still reads as it should: for that query alone
    means = text[text.index("query sensor_means "):text.index("query sensor_covariance ")]
    assert ("16 (delta 0.0001) per 1d, counting this query alone: a unit can join all 24 windows, and the limit "
            "would afford 32 (a unit active in every window is never excluded by this query alone; it spends 12 "
            "epsilon, delta 2.4e-05 per 1d on it); 2 other queries of namespace devices draw on the same limit"
            in means)


def test_a_namespace_within_its_limits_gets_no_warning_and_rho_is_summed(tmp_path, capsys):
    config = yaml.safe_load(EXAMPLE.read_text())
    base = next(q for q in config["queries"] if q["name"] == "pageviews_by_page")
    base.pop("expected")  # its accuracy at such epsilons would be warned of: this test is about the namespace
    base["window"] = {"size": "1m", "allowed_lateness": "10s"}
    queries = []
    for name, epsilon in (("a", 0.02), ("b", 0.04)):
        queries.append({**base, "name": name, "output_topic": f"dp.{name}", "epsilon": epsilon})
    for rho_limit, warned in ((2.0, False), (0.05, True)):
        config = {"namespaces": {"users": {"budgets": [{"horizon": "1h", "rho": rho_limit}]}}, "queries": queries}
        path = tmp_path / "rho.yaml"
        path.write_text(yaml.safe_dump(config))
        plan, text = _plan(path, capsys)
        hour = _horizons(plan, "users")["1h"]
        # Laplace epsilon e is charged e^2 / 2 in rho, per 1m window: 60 windows of each per hour
        rho = 60 * (0.02**2 / 2 + 0.04**2 / 2)
        assert hour["fully_active_unit_spends"]["rho"] == pytest.approx(rho, rel=1e-6)
        assert hour["times_the_limit"] == pytest.approx(rho / rho_limit, rel=1e-6)
        assert ("WARNING" in text) is warned and (hour["exhausted"] == ["rho"]) is warned
        assert f"is charged {rho:.6g} rho in any 1h" in text
        if warned:
            # 0.06 rho per hour against 0.05: about 50 minutes, 50 one-minute windows of each
            assert hour["fully_active_unit_lasts_ms"] == pytest.approx(HOUR * rho_limit / rho, rel=1e-6)
            joined = _windows_joined(path, "users", ["a", "b"], 60_000, 60, rho=True)
            assert math.floor(hour["fully_active_unit_lasts_ms"] / 60_000) == 50 and joined == {"a": 50, "b": 50}



def test_a_window_that_does_not_divide_the_horizon_is_counted_alike_by_the_query_and_the_namespace(tmp_path, capsys):
    """7-minute windows end 9 times in some hour (e.g. in (6.5, 66.5] minutes): ceil(60 / 7) charges, both
    in the query's own line and in its one-query namespace's."""
    config = {"namespaces": {"users": {"budgets": [{"horizon": "1h", "epsilon": 10.0}]}},
              "queries": [{"name": "q7", "input_topic": "in", "output_topic": "out",
                           "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
                           "window": {"size": "7m"}, "group_by": ["page"], "groups": {"public": ["a"]},
                           "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
                           "aggregations": {"count": {}}, "epsilon": 0.1}]}
    path = tmp_path / "q7.yaml"
    path.write_text(yaml.safe_dump(config))
    plan, _ = _plan(path, capsys)
    ends = max(sum(1 for k in range(1, 20) if start < 7 * k <= start + 60) for start in range(0, 7 * 60))
    assert ends == math.ceil(60 / 7) == 9
    (query,) = plan["queries"]
    (own,) = query["horizons"]
    assert own["windows_in_horizon"] == ends
    assert own["fully_active_unit_spends"]["epsilon"] == pytest.approx(0.1 * ends)
    namespace = _horizons(plan, "users")["1h"]
    assert namespace["fully_active_unit_spends"]["epsilon"] == pytest.approx(own["fully_active_unit_spends"]["epsilon"])
