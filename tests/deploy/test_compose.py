"""docker-compose.yml cannot run here (no Docker engine): check that it is wired right."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from stream_dp.config import Settings, load_config, settings_env_names

REPO = Path(__file__).resolve().parents[2]


def _compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_services_present():
    assert {"kafka", "redis", "prometheus", "grafana", "worker", "exporter", "producer"} <= set(_compose()["services"])


def test_the_exporter_reads_the_workers_query_file_and_serves_where_prometheus_scrapes():
    exporter = _compose()["services"]["exporter"]
    worker = _compose()["services"]["worker"]
    assert exporter["volumes"] == worker["volumes"]
    command = exporter["command"]
    assert command[0] == "export" and command[command.index("--config") + 1] == worker["command"][-1]
    port = command[command.index("--port") + 1]
    assert exporter["expose"] == [port]
    prometheus = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    targets = [t for job in prometheus["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert f"exporter:{port}" in targets


def test_every_referenced_file_exists():
    compose = _compose()
    for name, service in compose["services"].items():
        build = service.get("build")
        if build:
            assert (REPO / build["context"] / build["dockerfile"]).is_file(), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (REPO / source).exists(), f"{name} mounts {source}, which does not exist"


def test_worker_environment_names_are_the_ones_the_code_reads():
    compose = _compose()
    known = settings_env_names()
    for name in ("worker", "producer"):
        env = compose["services"][name]["environment"]
        unknown = set(env) - known
        assert not unknown, f"{name} sets {unknown}, which Settings does not read"
    env = compose["services"]["worker"]["environment"]
    settings = Settings.model_validate(env)
    assert settings.kafka_bootstrap_servers.split(":")[0] in compose["services"]
    assert re.match(r"redis://redis:6379/", settings.redis_url.get_secret_value())


def test_prometheus_scrapes_the_worker_metrics_port():
    compose = _compose()
    port = compose["services"]["worker"]["environment"]["STREAM_DP_METRICS_PORT"]
    assert compose["services"]["worker"]["expose"] == [port]
    prometheus = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    targets = [t for job in prometheus["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert f"worker:{port}" in targets
    assert str(Settings().metrics_port) == port  # the default equals what compose uses


def test_grafana_datasource_points_at_the_prometheus_service():
    datasource = yaml.safe_load((REPO / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"


def test_mounted_query_file_is_valid_and_producer_topic_matches():
    compose = _compose()
    config = load_config(REPO / "deploy/queries.example.yaml")
    command = compose["services"]["producer"]["command"]
    topic = command[command.index("--topic") + 1]
    assert topic in {q.input_topic for q in config.queries}


def test_the_acls_step_plans_for_the_workers_settings_and_query_file():
    compose = _compose()
    acls, worker = compose["services"]["acls"], compose["services"]["worker"]
    assert acls["profiles"] == ["secured"], "applying ACLs fails on the demo broker, which has no authorizer"
    assert set(acls["environment"]) <= settings_env_names()
    assert acls["environment"]["STREAM_DP_GROUP_ID"] == worker["environment"]["STREAM_DP_GROUP_ID"]
    assert acls["volumes"] == worker["volumes"] and "--apply" in acls["command"]
