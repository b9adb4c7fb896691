"""Credentials and secrets: Redis with an ACL user, Kafka over SASL, and what must never leak.

* The worker runs against a Redis whose default user is off, as an ACL user
  allowed only the ``dp:`` and ``stream-dp:`` keys; with a wrong password it
  releases nothing (fail closed).
* The worker runs against a private broker over ``SASL_PLAINTEXT``/PLAIN.
* Neither the contribution secret nor a password appears in the logs or on
  ``/metrics``; no unit id is a metric label; every output record matches
  the release schema and holds no unit id.
"""

from __future__ import annotations

import time

import pytest

from stream_dp.budget import RedisBudgetStore
from stream_dp.budget import policy_from_config
from stream_dp.config import load_config
from tests.reliability.checks import CheckReport, check_metrics_text, check_release_records
from tests.reliability.scenario import EPSILON, SECRET, Scenario
from tests.reliability.services import PrivateKafka, PrivateRedis
from tests.reliability.topics import read_topic

pytestmark = [pytest.mark.slow, pytest.mark.services]

REDIS_PASSWORD = "redis-worker-pw-6f1c0e9a"
ADMIN = ("admin", "redis-admin-pw-51a2b7")
ACL = (
    "user default off\n"
    f"user {ADMIN[0]} on >{ADMIN[1]} ~* &* +@all\n"
    # The worker's whole key footprint: budget keys (dp:) and the release ledger (stream-dp:).
    f"user dpworker on >{REDIS_PASSWORD} ~dp:* ~stream-dp:* &* +@all -@dangerous +info\n"
)
KAFKA_PASSWORD = "kafka-worker-pw-93d7e1"


def _units(n: int) -> list[str]:
    return [f"secure-unit-{i:03d}" for i in range(n)]


def _assert_nothing_leaks(s: Scenario, units: list[str], secrets: list[str]) -> CheckReport:
    report = CheckReport()
    metrics = s.worker.scrape()
    assert metrics is not None, "the worker's /metrics did not answer"
    check_metrics_text([metrics], set(units), secrets, report)
    check_release_records((r.value for r in read_topic(s.bootstrap, s.output_topic)), set(units), report)
    log = s.worker.log_text()
    for secret in secrets:
        if secret in log:
            report.fail("secret in log", f"a secret appears in {s.worker.log_path}")
    assert not report.violations, report.violations
    assert report.stats.get("release records validated", 0) >= 2, report.stats
    return report


@pytest.fixture
def acl_redis(tmp_path):
    server = PrivateRedis(tmp_path / "redis-acl", acl=ACL, admin=ADMIN)
    server.start()
    yield server
    server.stop()


def test_worker_uses_a_redis_acl_user_and_leaks_no_secret(tmp_path, kafka_bootstrap, acl_redis):
    s = Scenario(tmp_path, kafka_bootstrap, redis_server=acl_redis, redis_credentials=f"dpworker:{REDIS_PASSWORD}@")
    try:
        units = _units(30)
        s.produce([s.event(u, 0, value=3.0) for u in units] + s.closers(0))
        s.start_worker()
        assert s.wait_released(0, 60), f"window 0 was not released; see {s.worker.log_path}"
        store = RedisBudgetStore(acl_redis.client(), policy_from_config(load_config(s.config_path)))
        for unit in units:
            (hour,) = store.spend(f"{s.name}-units", unit, s.window_start(1))
            assert hour.spent == pytest.approx(EPSILON, abs=1e-5), (unit, hour)
        keys = {k.decode() for k in acl_redis.client().scan_iter(count=1000)}
        assert keys and all(k.startswith(("dp:", "stream-dp:")) for k in keys), sorted(keys)[:10]
        _assert_nothing_leaks(s, units, [SECRET, REDIS_PASSWORD, ADMIN[1]])
    finally:
        s.close()


def test_wrong_redis_password_releases_nothing(tmp_path, kafka_bootstrap, acl_redis):
    wrong = "not-the-password-0b7a"
    s = Scenario(tmp_path, kafka_bootstrap, redis_server=acl_redis, redis_credentials=f"dpworker:{wrong}@")
    try:
        s.produce([s.event(u, 0) for u in _units(10)] + s.closers(0))
        s.start_worker()
        # Refused at its first call, the store check: nothing is charged (or even sent) until it passes.
        def held() -> bool:
            return (s.metric("stream_dp_store_checks_total", outcome="unanswered") >= 2
                    and s.metric("stream_dp_budget_failures_total", kind="store_unverified") >= 1
                    and s.metric("stream_dp_pending_charges") >= 1)

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not held():
            time.sleep(0.5)
        assert held(), "the store check was not refused, or the window is not held"
        assert s.worker.alive, f"the worker died; see {s.worker.log_path}"
        assert not read_topic(s.bootstrap, s.output_topic), "something was released without a budget charge"
        assert not read_topic(s.bootstrap, f"{s.prefix}partials") or all(
            b'"type":"partial"' not in r.value for r in read_topic(s.bootstrap, f"{s.prefix}partials")
        ), "a partial was published without a budget charge"
        log = s.worker.log_text()
        assert wrong not in log and REDIS_PASSWORD not in log and SECRET not in log
    finally:
        s.close()


@pytest.fixture(scope="module")
def sasl_kafka(tmp_path_factory):
    broker = PrivateKafka(tmp_path_factory.mktemp("kafka-sasl"), sasl_users={"dpworker": KAFKA_PASSWORD})
    broker.start()
    yield broker
    broker.stop()


def _sasl_env(broker: PrivateKafka, password: str) -> dict[str, str]:
    return {"KAFKA_BOOTSTRAP_SERVERS": broker.sasl_bootstrap, "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "KAFKA_SASL_MECHANISM": "PLAIN", "KAFKA_SASL_USERNAME": "dpworker", "KAFKA_SASL_PASSWORD": password}


def test_worker_runs_over_sasl_plaintext(tmp_path, sasl_kafka):
    s = Scenario(tmp_path, sasl_kafka.bootstrap, worker_env=_sasl_env(sasl_kafka, KAFKA_PASSWORD))
    try:
        units = _units(20)
        s.produce([s.event(u, 0) for u in units] + s.closers(0))
        s.start_worker()
        assert s.wait_released(0, 60), f"window 0 was not released over SASL; see {s.worker.log_path}"
        _assert_nothing_leaks(s, units, [SECRET, KAFKA_PASSWORD])
    finally:
        s.close()


def test_wrong_sasl_password_fails_without_leaking_it(tmp_path, sasl_kafka):
    wrong = "wrong-kafka-pw-77c1d2"
    s = Scenario(tmp_path, sasl_kafka.bootstrap, worker_env=_sasl_env(sasl_kafka, wrong))
    try:
        s.produce([s.event(u, 0) for u in _units(5)] + s.closers(0))
        s.worker.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and s.worker.alive:
            time.sleep(0.5)
        assert not read_topic(s.bootstrap, s.output_topic), "released with a wrong Kafka password"
        log = s.worker.log_text()
        assert wrong not in log and SECRET not in log, f"a secret appears in {s.worker.log_path}"
        assert not s.worker.alive, "the worker neither connected nor gave up within 60 s"
    finally:
        s.close()
