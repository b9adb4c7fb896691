"""Fixtures of the budget-store tests: both backends, a settable clock, a private Redis."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from stream_dp.budget import BudgetPolicy, MemoryBudgetStore, RedisBudgetStore, StoreOptions
from stream_dp.budget.redis_nodes import ReplicaWait
from stream_dp.budget.redis_url import client_from_url
from stream_dp.metrics.budget import BudgetMetrics

from .cluster_support import PrivateCluster
from .support import HOUR_MS, Clock, StoreFactory, standard_policy

IN_CI = os.environ.get("CI", "").lower() == "true"


@pytest.fixture
def clock() -> Clock:
    # A recent, hour-aligned time, so that test windows fall on bucket boundaries.
    return Clock((int(time.time() * 1000) // HOUR_MS) * HOUR_MS)


def _delete_prefix(client: Any, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)


CLUSTER_WAIT = ReplicaWait(replicas=1, timeout_ms=2000)
"""The cluster suite waits for one replica per charge, as a clustered worker does by default."""


@pytest.fixture(params=["memory", "redis", "redis-cluster"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_store(backend: str, request: pytest.FixtureRequest, unique_name: str, clock: Clock) -> Iterator[StoreFactory]:
    """Factory of stores of the parametrised backend, on the test clock."""
    client: Any = None
    if backend == "redis":
        client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    elif backend == "redis-cluster":
        client = client_from_url(request.getfixturevalue("redis_cluster_url"), timeout_s=5.0)

    def make(
        policy: BudgetPolicy | None = None,
        options: StoreOptions | None = None,
        metrics: BudgetMetrics | None = None,
        **redis_kwargs: object,
    ) -> MemoryBudgetStore | RedisBudgetStore:
        policy = policy or standard_policy()
        store: MemoryBudgetStore | RedisBudgetStore
        if backend == "memory":
            store = MemoryBudgetStore(policy, options, metrics=metrics, clock_ms=clock)
        else:
            assert client is not None
            if backend == "redis-cluster":
                redis_kwargs = {"wait": CLUSTER_WAIT, **redis_kwargs}
            store = RedisBudgetStore(
                client, policy, options, key_prefix=f"{unique_name}:", metrics=metrics, clock_ms=clock, **redis_kwargs
            )
        return store

    yield make
    if client is not None:
        _delete_prefix(client, f"{unique_name}:")
        client.close()


@pytest.fixture
def redis_client(redis_url: str, unique_name: str) -> Iterator[redis.Redis]:
    """A bytes client on the shared test Redis; keys under ``unique_name:`` are deleted afterwards."""
    client = redis.Redis.from_url(redis_url)
    yield client
    _delete_prefix(client, f"{unique_name}:")
    client.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A private ``redis-server`` child process that can be stopped and restarted.

    It persists with AOF (``appendfsync always``) in its own directory, as a
    budget store's Redis must, so a restart keeps every acknowledged charge.
    """

    def __init__(self, binary: str, directory: Path) -> None:
        self.binary = binary
        self.directory = directory
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.directory),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--maxmemory-policy",
                "noeviction",
                "--lazyfree-lazy-expire",
                "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=0.5)
        try:
            while True:
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.BusyLoadingError):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"redis-server on port {self.port} did not start") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        message = "redis-server is not on PATH (install Debian's redis-server package)"
        if IN_CI:
            pytest.fail(f"{message} (CI=true: a missing service is a failure, not a skip)")
        pytest.skip(message)
    server = RedisServer(binary, tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def private_cluster(tmp_path: Path) -> Iterator[PrivateCluster]:
    """A Redis Cluster of this test's own (3 masters + 3 replicas, random ports), for killing or resharding it."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        message = "redis-server and redis-cli are not on PATH (install Debian's redis-server package)"
        if IN_CI:
            pytest.fail(f"{message} (CI=true: a missing service is a failure, not a skip)")
        pytest.skip(message)
    cluster = PrivateCluster(tmp_path)
    cluster.start()
    yield cluster
    cluster.stop()
