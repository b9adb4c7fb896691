"""The CI subset of the seeded fault runs (the full set: ``tests/reliability/run_faults.py``).

Runs that together inject every kind of fault (``Fault.kind``, checked by ``test_catalogue``) -- a
worker killed at every stage (with a Gaussian query on two horizons, one over selected groups and a
top-k one), Redis killed, shut down, cut off
and restarted without its data, a Redis Cluster master failed over, the broker killed, stopped, stopped
between ledger claim and publish, out of disk and cut off, rebalances on 12 partitions (a worker added,
one removed) and with a worker removed and rejoining, every worker killed, poison records on the
partials topic, the output topic deleted, a worker clock ten minutes ahead, every leader role killed in
a 3-broker cluster -- each checked against the model for every invariant of ``checks`` and
``state_checks``. A run whose fault was not really injected, whose expected effect is not in the
evidence, or in which a worker exited that the fault did not stop, fails.

The full suite (``STREAM_DP_FULL_TESTS=1``) also runs every seeded run of
``full_catalogue``. The runs are independent: under pytest-xdist they run side
by side, but those that stop the module's private broker share one worker
process (one xdist group), and so do those on the private 3-broker cluster
and those on the broker whose disk fills up.
"""

from __future__ import annotations


import pytest

from tests.reliability.catalogue import ci_catalogue, full_catalogue
from tests.reliability.harness import FaultRun
from tests.reliability.report import describe
from tests.reliability.services import PrivateKafka, PrivateKafkaCluster, SmallDiskKafka

pytestmark = [pytest.mark.slow, pytest.mark.services]


@pytest.fixture(scope="module")
def private_kafka(tmp_path_factory):
    """A broker of the module's own, for the runs that stop it (the shared one is never touched)."""
    kafka = PrivateKafka(tmp_path_factory.mktemp("kafka"), worker_proxy=True)
    kafka.start()
    yield kafka
    kafka.stop(crash=True)  # its data is thrown away: no controlled shutdown to wait for


@pytest.fixture(scope="module")
def small_disk_kafka(tmp_path_factory):
    """A broker of the module's own on a small filesystem, for the runs that fill it up."""
    directory = tmp_path_factory.mktemp("kafka-small-disk")
    if not SmallDiskKafka.can_mount(directory):
        pytest.skip("a full broker disk needs a tmpfs of its own: run as root (or with CAP_SYS_ADMIN)")
    kafka = SmallDiskKafka(directory, worker_proxy=True)
    try:
        kafka.start()
        yield kafka
    finally:
        kafka.remove()


@pytest.fixture(scope="module")
def private_cluster(tmp_path_factory):
    """Three brokers of the module's own, for the runs that kill one."""
    cluster = PrivateKafkaCluster(tmp_path_factory.mktemp("kafka-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        # Its data is thrown away: a controlled shutdown of the last node waits 30 s for a quorum already gone.
        cluster.stop(crash=True)


def _marks(planned) -> list:
    """One xdist group per private broker: its runs stop it, so they run one after the other."""
    if planned.needs_cluster:
        return [pytest.mark.xdist_group("kafka-cluster")]
    if planned.needs_small_disk:
        return [pytest.mark.xdist_group("kafka-small-disk")]
    if planned.needs_private_broker:
        return [pytest.mark.xdist_group("private-kafka")]
    return []


def _cases():
    for planned in ci_catalogue():
        yield pytest.param(planned, id=planned.kind.replace(" ", "-"), marks=_marks(planned))
    for planned in full_catalogue():
        yield pytest.param(planned, id=f"full-{planned.kind.replace(' ', '-')}-seed{planned.seed}",
                           marks=[pytest.mark.full, *_marks(planned)])


@pytest.mark.parametrize("planned", list(_cases()))
def test_fault_run_keeps_every_invariant(planned, tmp_path, kafka_bootstrap, request):
    kafka = (request.getfixturevalue("private_cluster") if planned.needs_cluster
             else request.getfixturevalue("small_disk_kafka") if planned.needs_small_disk
             else request.getfixturevalue("private_kafka") if planned.needs_private_broker else None)
    result = FaultRun(planned.fault, planned.seed, tmp_path, bootstrap=kafka.bootstrap if kafka else kafka_bootstrap,
                      kafka=kafka, completion_timeout_s=90, **planned.options()).run()
    assert result.error is None, describe(result)
    assert result.injected, describe(result)  # the fault really happened
    if not result.expected_exits:  # a fault that stops the workers leaves windows unreleased on purpose
        assert result.report.stats.get("windows released", 0) >= 6, describe(result)
        assert not result.unexpected_exits, describe(result)
    assert not result.report.violations, describe(result)
