"""Shared fixtures: the real Kafka broker, Redis and Prometheus.

Each service is found in this order:

1. an address in the environment (``KAFKA_BOOTSTRAP_SERVERS``, ``REDIS_URL``,
   ``REDIS_CLUSTER_URL``, ``PROMTOOL``/``PROMETHEUS``), as set by
   ``deploy/test.sh`` which starts the local services;
2. a testcontainers container, when a Docker engine answers (not for the cluster);
3. otherwise the test is skipped -- except under ``CI=true``, where a missing
   service fails the test, so a CI run can never pass by skipping.

The default suite and the full one
----------------------------------

``bash deploy/test.sh`` runs every kind of test -- unit, property, end to end on
the real services, the neighbouring-stream audit, a share of the fault runs,
the deploy files -- in about half an hour on two cores (pytest's own time).
``STREAM_DP_FULL_TESTS=1 bash deploy/test.sh`` runs the full suite, which adds:

* the audit over 2,000 windows per stream instead of 800
  (``tests/audit/test_neighbouring_streams.py``; ``STREAM_DP_AUDIT_WINDOWS``
  sets any other number);
* the audit's negative controls at twice their sample sizes, with the
  costliest ones (``FULL_ONLY`` in ``tests/audit/test_negative_controls.py``);
* a few runs whose case another default test covers, each marked ``full`` with
  the reason beside it (a million-group window from one partition, the
  hierarchy's non-zero counts, one local-DP law);
* every seeded fault run of ``tests/reliability/catalogue.py`` (``full_catalogue``,
  59 runs, about half an hour more), beside the default share that injects
  every kind of fault at least once (``ci_catalogue``).

Tests only the full suite runs are marked ``full``; the default suite reports
them as skipped, naming the flag (``tests/suite.py`` reads it).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator

import pytest

from tests import scheduling
from tests.suite import FULL, FULL_TESTS_ENV

IN_CI = os.environ.get("CI", "").lower() == "true"


@pytest.hookimpl(trylast=True)  # the plan names the tests left after every other plugin chose
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason=f"a long run of the full suite: set {FULL_TESTS_ENV}=1 to run it")
    for item in items:
        if item.get_closest_marker("full") and not FULL:
            item.add_marker(skip)
    scheduling.write_plan(config, items)


# pytest-xdist's hooks (``deploy/test.sh`` runs the suite in several processes; tests/scheduling.py)
@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    scheduling.configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    return scheduling.make_scheduler(config, log)


def _missing(service: str, how: str) -> None:
    message = f"{service} is not available: {how}"
    if IN_CI:
        pytest.fail(f"{message} (CI=true: a missing service is a failure, not a skip)")
    pytest.skip(message)


def _docker_available() -> bool:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://") and not os.path.exists(host.removeprefix("unix://")):
        # No engine to ask: docker's client would leave its failed connection to the garbage
        # collector, and a later test would fail on the ResourceWarning.
        return False
    try:
        import docker  # testcontainers depends on it

        client = docker.from_env(timeout=3)
    except Exception:
        return False
    try:
        client.ping()
        return True
    except Exception:
        return False
    finally:
        client.close()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of a real Apache Kafka broker."""
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        yield env
        return
    if _docker_available():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as kafka:
            yield kafka.get_bootstrap_server()
        return
    _missing("Kafka", "set KAFKA_BOOTSTRAP_SERVERS, run `bash deploy/test.sh`, or start Docker")


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """``redis://`` URL of a real Redis server."""
    env = os.environ.get("REDIS_URL")
    if env:
        yield env
        return
    if _docker_available():
        from testcontainers.redis import RedisContainer

        with RedisContainer() as container:
            host = container.get_container_host_ip()
            port = container.get_exposed_port(6379)
            yield f"redis://{host}:{port}/0"
        return
    _missing("Redis", "set REDIS_URL, run `bash deploy/test.sh`, or start Docker")


@pytest.fixture(scope="session")
def redis_cluster_url() -> str:
    """``redis+cluster://`` URL of a real Redis Cluster (``REDIS_CLUSTER_URL``, started by ``deploy/test.sh``)."""
    url = os.environ.get("REDIS_CLUSTER_URL")
    if not url:
        _missing("Redis Cluster", "set REDIS_CLUSTER_URL or run `bash deploy/test.sh` (deploy/services.sh start redis-cluster)")
    return url


@pytest.fixture(scope="session")
def prometheus_url() -> str:
    """Base URL of a running Prometheus server (``PROMETHEUS_URL``)."""
    url = os.environ.get("PROMETHEUS_URL")
    if not url:
        _missing("Prometheus server", "set PROMETHEUS_URL or run `bash deploy/test.sh`")
    return url.rstrip("/")


@pytest.fixture(scope="session")
def promtool() -> str:
    """Path of Prometheus' ``promtool`` binary."""
    path = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if not path:
        _missing("promtool", "install Debian's `prometheus` package or run `bash deploy/test.sh`")
    return path


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    """Path of the ``prometheus`` server binary."""
    path = os.environ.get("PROMETHEUS") or shutil.which("prometheus")
    if not path:
        _missing("prometheus", "install Debian's `prometheus` package or run `bash deploy/test.sh`")
    return path


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> str:
    """A name no other test uses: for topics, consumer groups, key prefixes."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40]
    return f"t-{base}-{uuid.uuid4().hex[:8]}"


#: How users are told to create input topics: the broker stamps every record, so no producer sets the
#: window clock (docs/privacy/clock.md).
INPUT_TOPIC_CONFIGS = {"message.timestamp.type": "LogAppendTime"}
#: A topic whose producers stamp its records, for backfills a query trusts (``trust_producer_timestamps``).
PRODUCER_STAMPED = {"message.timestamp.type": "CreateTime"}


@pytest.fixture
def new_topic(kafka_bootstrap: str, unique_name: str):
    """Factory creating fresh topics on the real broker, as input topics are to be created (``configs``
    added to ``INPUT_TOPIC_CONFIGS``, or replacing them); deletes them afterwards."""
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="stream-dp-tests")
    created: list[str] = []

    def create(suffix: str = "", partitions: int = 1, configs: dict[str, str] | None = None) -> str:
        name = f"{unique_name}{'-' + suffix if suffix else ''}"
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs={**INPUT_TOPIC_CONFIGS, **(configs or {})})])
        created.append(name)
        return name

    yield create
    if created:
        try:
            admin.delete_topics(created)
        except Exception:  # deleting is housekeeping; a failure must not mask the test result
            pass
    admin.close()
