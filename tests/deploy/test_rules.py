"""Prometheus alert rules and configs, checked and unit-tested with the real promtool."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from .promql import (
    PROMETHEUS_DIR,
    REPO,
    RULE_TESTS_DIR,
    RULES_DIR,
    alert_rules,
    grouping_labels,
    label_problems,
    metric_catalogue,
)

SEVERITIES = {"info", "warning", "critical"}
# Labels a rule may keep that could never identify a person: the worker's metrics
# carry no unit ids, and grouping only by these keeps it so in alerts.
ALLOWED_ALERT_LABELS = {
    "query", "namespace", "horizon", "threshold", "topic", "kind", "operation", "reason", "outcome", "instance", "job",
}


def _promtool(promtool: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def _rule_test_files() -> list[Path]:
    return sorted(RULE_TESTS_DIR.glob("*.test.yml"))


def test_promtool_checks_the_rules(promtool):
    files = sorted(RULES_DIR.glob("*.yml"))
    assert files, "no rule files in deploy/prometheus/rules"
    result = _promtool(promtool, "check", "rules", *map(str, files))
    assert result.returncode == 0, result.stdout + result.stderr
    found = sum(int(n) for n in re.findall(r"SUCCESS: (\d+) rules found", result.stdout))
    assert found == len(alert_rules())


def test_promtool_unit_tests_of_the_rules_pass(promtool):
    files = _rule_test_files()
    assert files, "no promtool unit tests in deploy/prometheus/tests"
    result = _promtool(promtool, "test", "rules", *map(str, files))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(files)


def test_promtool_unit_tests_fail_when_a_rule_changes(promtool, tmp_path):
    # The unit tests must be able to fail: with one threshold changed they do.
    rules = tmp_path / "rules"
    tests = tmp_path / "tests"
    shutil.copytree(RULES_DIR, rules)
    shutil.copytree(RULE_TESTS_DIR, tests)
    budget = rules / "budget.yml"
    text = budget.read_text()
    assert "> 0.1\n" in text
    budget.write_text(text.replace("> 0.1\n", "> 0.5\n"))
    result = _promtool(promtool, "test", "rules", str(tests / "budget.test.yml"))
    assert result.returncode != 0
    assert "StreamDpBudgetExclusionsHigh" in result.stdout + result.stderr


def test_local_config_is_valid_with_its_rules(promtool):
    result = _promtool(promtool, "check", "config", "prometheus.local.yml", cwd=PROMETHEUS_DIR)
    assert result.returncode == 0, result.stdout + result.stderr
    for rule_file in sorted(RULES_DIR.glob("*.yml")):
        assert f"rules/{rule_file.name}" in result.stdout + result.stderr  # the glob reached every file


def test_compose_config_is_valid_with_the_mounted_rules(promtool, tmp_path):
    # prometheus.yml reads /etc/prometheus/rules (compose mounts the rules there):
    # check it with that directory rewritten to a copy.
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    shutil.copytree(RULES_DIR, tmp_path / "rules")
    config["rule_files"] = [str(tmp_path / "rules" / "*.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = _promtool(promtool, "check", "config", str(tmp_path / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") >= 1 + len(list(RULES_DIR.glob("*.yml")))


def test_compose_mounts_the_config_and_rules_where_prometheus_reads_them():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    prometheus = compose["services"]["prometheus"]
    mounts = {source: target for source, target, *_mode in (volume.split(":") for volume in prometheus["volumes"])}
    config_flag = next(arg for arg in prometheus["command"] if arg.startswith("--config.file="))
    config_path = config_flag.split("=", 1)[1]
    assert mounts["./deploy/prometheus/prometheus.yml"] == config_path
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    (rules_glob,) = config["rule_files"]
    assert mounts["./deploy/prometheus/rules"] == str(Path(rules_glob).parent)
    assert list(RULES_DIR.glob(Path(rules_glob).name))


def test_both_configs_scrape_the_job_the_rules_and_dashboard_name():
    from stream_dp.cli.export import DEFAULT_PORT

    for name, exporter in (("prometheus.yml", "exporter"), ("prometheus.local.yml", "127.0.0.1")):
        config = yaml.safe_load((PROMETHEUS_DIR / name).read_text())
        jobs = {job["job_name"]: job for job in config["scrape_configs"]}
        assert list(jobs) == ["stream-dp", "stream-dp-releases"], name
        # stream-dp export, for the releases dashboard, on its default port
        (targets,) = [c["targets"] for c in jobs["stream-dp-releases"]["static_configs"]]
        assert targets == [f"{exporter}:{DEFAULT_PORT}"], name
    assert any('job="stream-dp"' in rule["expr"] for rule in alert_rules())


def test_every_alert_is_unit_tested_firing_and_not_firing():
    tested_firing: set[str] = set()
    tested_silent: set[str] = set()
    for path in _rule_test_files():
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (tested_firing if check.get("exp_alerts") else tested_silent).add(check["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert names - tested_firing == set(), "alerts never shown firing in deploy/prometheus/tests"
    assert names - tested_silent == set(), "alerts never shown silent in deploy/prometheus/tests"


def test_rules_use_only_metrics_and_labels_the_worker_exposes():
    catalogue = metric_catalogue()
    problems = {rule["alert"]: label_problems(rule["expr"], catalogue) for rule in alert_rules()}
    assert {name: found for name, found in problems.items() if found} == {}


def test_every_alert_says_what_happened_and_what_to_do():
    rules = alert_rules()
    assert len({rule["alert"] for rule in rules}) == len(rules), "alert names must be unique"
    for rule in rules:
        name = rule["alert"]
        assert re.fullmatch(r"StreamDp[A-Z][A-Za-z]+", name), name
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert rule["labels"].get("component"), name
        annotations = rule["annotations"]
        assert set(annotations) >= {"summary", "description"}, name
        assert "\n" not in annotations["summary"].strip(), f"{name}: keep the summary to one line"
        assert len(annotations["description"]) > len(annotations["summary"]), name
        # The description must name something to do or check.
        to_do = r"\b(check|raise|add|lower|fix|read|compare|run)\b"
        assert re.search(to_do, annotations["description"], re.IGNORECASE), name


def test_alert_labels_and_templates_only_use_aggregated_labels():
    for rule in alert_rules():
        expr = rule["expr"]
        grouped = grouping_labels(expr)
        if re.search(r"\b(sum|max|min|avg|count)\b", expr):
            available = grouped
        else:  # a plain selector keeps the series' own labels
            available = {"job", "instance"}
        assert grouped <= ALLOWED_ALERT_LABELS, f"{rule['alert']} groups by {grouped - ALLOWED_ALERT_LABELS}"
        used = set()
        for text in rule["annotations"].values():
            used |= set(re.findall(r"\$labels\.(\w+)", text))
        assert used <= available, f"{rule['alert']} renders {used - available}, which its expression drops"


@pytest.mark.parametrize("rule_file", sorted(p.name for p in RULES_DIR.glob("*.yml")))
def test_each_rule_file_has_a_unit_test_file(rule_file):
    covering = [
        path for path in _rule_test_files()
        if f"../rules/{rule_file}" in yaml.safe_load(path.read_text())["rule_files"]
    ]
    assert covering, f"no deploy/prometheus/tests/*.test.yml loads rules/{rule_file}"


# Labels a metric may carry: configuration names and operational categories, never a unit id,
# a group key or any other value taken from events (README: the trust boundary of /metrics).
CONFIGURATION_LABELS = {"query", "namespace", "horizon", "threshold", "kind", "outcome", "reason", "operation",
                        "topic", "partition", "le"}


def test_no_metric_is_labelled_by_unit_or_group():
    from .promql import metric_catalogue

    catalogue = metric_catalogue()
    assert any(s.family.startswith("stream_dp_") for s in catalogue.values())
    for series in catalogue.values():
        if series.family.startswith("stream_dp_"):
            assert series.labels <= CONFIGURATION_LABELS, (series.name, sorted(series.labels - CONFIGURATION_LABELS))
