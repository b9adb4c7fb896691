"""Processes of the live monitoring test: a private Prometheus server, stream-dp
workers and synthetic producers, all on loopback, all stopped by their owner.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from .promql import RULES_DIR

STOP_TIMEOUT_S = 10


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(condition: Callable[[], Any], *, timeout_s: float, interval_s: float = 0.5, what: str) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def rules_with_short_for(for_duration: str) -> dict[str, str]:
    """The repository's rule files with every ``for:`` replaced by ``for_duration``.

    Only ``for`` changes: names, expressions, labels and annotations are the
    repository's, so a live run exercises the real expressions without waiting
    the minutes the production durations ask for.
    """
    files = {}
    for path in sorted(RULES_DIR.glob("*.yml")):
        rules = yaml.safe_load(path.read_text())
        for group in rules["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = for_duration
        files[path.name] = yaml.safe_dump(rules, sort_keys=False)
    return files


def stop(process: subprocess.Popen) -> None:
    """Terminate one process we started, then kill it if it does not exit in time."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)


class PrometheusServer:
    """A Prometheus server of our own: temp config and storage, loopback port."""

    def __init__(self, binary: str, workdir: Path, *, targets: list[str], rule_files: dict[str, str],
                 interval: str = "1s") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        rules = workdir / "rules"
        rules.mkdir(parents=True)
        for name, text in rule_files.items():
            (rules / name).write_text(text)
        config = {
            "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
            "rule_files": [str(rules / "*.yml")],
            "scrape_configs": [{"job_name": "stream-dp", "static_configs": [{"targets": targets}]}],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log_path = workdir / "prometheus.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self._log, stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout_s: float = 30) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.process.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    return response.status == 200
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_for(ready, timeout_s=timeout_s, interval_s=0.2, what="prometheus to be ready")

    def api(self, path: str, **params: str | float) -> Any:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:  # 400 on a bad query: show Prometheus' reason
            body = json.load(error)
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]

    def query_range(self, expr: str, start: float, end: float, step_s: float = 1.0) -> list[dict[str, Any]]:
        return self.api("query_range", query=expr, start=start, end=end, step=step_s)["result"]

    def firing_alerts(self) -> list[dict[str, str]]:
        return [alert["labels"] for alert in self.api("alerts")["alerts"] if alert["state"] == "firing"]

    def close(self) -> None:
        stop(self.process)
        self._log.close()


def finite_values(result: list[dict[str, Any]]) -> list[float]:
    """Every finite sample of an instant or range query result."""
    values = []
    for series in result:
        samples = series.get("values") or [series["value"]]
        values += [float(v) for _t, v in samples if math.isfinite(float(v))]
    return values


def scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return response.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return None


@contextmanager
def processes() -> Iterator[Callable[..., subprocess.Popen]]:
    """Start ``stream-dp`` subcommands; every one is stopped on exit, last started first."""
    started: list[tuple[subprocess.Popen, Any]] = []

    def start(args: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
        log = open(log_path, "wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "stream_dp.cli.main", *args],
            env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
        )
        started.append((process, log))
        return process

    try:
        yield start
    finally:
        for process, log in reversed(started):
            stop(process)
            log.close()
