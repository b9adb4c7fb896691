"""Prometheus' promtool and server are the real ones."""

import json
import subprocess
import urllib.request


def test_promtool_version(promtool):
    out = subprocess.run([promtool, "--version"], capture_output=True, text=True, timeout=30, check=True)
    assert "promtool, version" in (out.stdout + out.stderr)


def test_prometheus_server_answers(prometheus_url):
    with urllib.request.urlopen(f"{prometheus_url}/api/v1/status/buildinfo", timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success"
    assert body["data"]["version"]
