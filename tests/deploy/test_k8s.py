"""The Kubernetes manifests: valid against the API schemas, and consistent with the worker they deploy.

Schema validity comes from kubernetes-validate (the OpenAPI schemas of the
Kubernetes release, strict: unknown fields are errors). Consistency is
checked against the worker's own code: every setting is one the worker
reads, the settings and secrets build a valid ``Settings``, the query file
builds the worker's runtimes, and the probes and the PodMonitor reach the
port the worker serves them on.
"""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from stream_dp.config import Settings, load_config
from stream_dp.metrics.http import make_app
from stream_dp.worker.assemble.runtimes import build_worker_parts

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30.0"  # the oldest release still widely run that these manifests target


def _documents() -> dict[str, dict]:
    return {path.name: yaml.safe_load(path.read_text()) for path in sorted(K8S.glob("*.yaml"))}


def _resources() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in _documents().values() if doc.get("kind") != "Kustomization"}


# The PodMonitor is a Prometheus Operator custom resource, with no schema here: checked against the Deployment below.
CORE = sorted(p.name for p in K8S.glob("*.yaml") if p.name not in ("kustomization.yaml", "podmonitor.yaml"))


@pytest.mark.parametrize("name", CORE)
def test_each_core_manifest_is_valid_against_the_kubernetes_schemas(name):
    kubernetes_validate.validate(_documents()[name], KUBERNETES_VERSION, strict=True)


def test_a_schema_violation_is_caught():
    deployment = _resources()["Deployment"]
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["paht"] = "/healthz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_the_kustomization_lists_every_manifest():
    listed = set(_documents()["kustomization.yaml"]["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def _environment() -> dict[str, str]:
    resources = _resources()
    env = {k: v for k, v in resources["ConfigMap"]["data"].items() if k != "queries.yaml"}
    env.update(resources["Secret"]["stringData"])
    return env


def test_every_setting_is_one_the_worker_reads_and_they_build_valid_settings():
    known = {field.alias for field in Settings.model_fields.values()}
    env = _environment()
    assert set(env) <= known, f"settings the worker does not read: {sorted(set(env) - known)}"
    settings = Settings.model_validate(env)
    assert settings.metrics_host == "0.0.0.0"  # probes and scrapes come from outside the pod


def test_the_query_file_is_the_example_and_builds_the_workers_runtimes():
    queries = _resources()["ConfigMap"]["data"]["queries.yaml"]
    example = (K8S.parent / "queries.example.yaml").read_text()
    assert queries == example, "deploy/k8s/configmap.yaml must carry deploy/queries.example.yaml unchanged"
    settings = Settings.model_validate(_environment())
    parts = build_worker_parts(load_config(K8S.parent / "queries.example.yaml"), source="configmap",
                               secret=b"0" * 32, store_options=settings.budget_store_options(), clock_ms=lambda: 0)
    assert parts.runtimes


def test_probes_and_the_pod_monitor_reach_the_endpoints_the_worker_serves():
    resources = _resources()
    pod = resources["Deployment"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == Settings.model_validate(_environment()).metrics_port
    served = set()

    def start_response(status, _headers):
        served.add(status)

    from prometheus_client import CollectorRegistry

    from stream_dp.metrics.health import Health

    app = make_app(CollectorRegistry(), Health())
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        get = container[probe]["httpGet"]
        assert get["port"] in ports
        served.clear()
        app({"PATH_INFO": get["path"], "REQUEST_METHOD": "GET"}, start_response)
        assert served and not served & {"404 Not Found"}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    monitor = resources["PodMonitor"]["spec"]
    labels = pod["metadata"]["labels"]
    assert monitor["selector"]["matchLabels"].items() <= labels.items()
    assert {e["port"] for e in monitor["podMetricsEndpoints"]} <= set(ports)
    assert resources["Deployment"]["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_the_acls_job_grants_the_principal_the_workers_log_in_as_from_their_query_file():
    job, deployment = _resources()["Job"], _resources()["Deployment"]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["acls", "--config", "/etc/stream-dp/queries.yaml"] and "--apply" in args
    worker_args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert worker_args[worker_args.index("--config") + 1] == args[2]
    username = _resources()["Secret"]["stringData"]["KAFKA_SASL_USERNAME"]
    assert args[args.index("--worker-principal") + 1] == f"User:{username}"
    from stream_dp.cli.main import build_parser

    parsed = build_parser().parse_args(args)
    assert parsed.apply and parsed.analyst_principal != parsed.worker_principal
