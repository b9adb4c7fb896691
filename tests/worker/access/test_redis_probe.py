"""The worker's start check of its Redis rights, on a Redis of its own with ACL users.

The reference is Redis itself: each user gets a rule written here by hand (the printed rule less one
command, a read-only key pattern), and the check must name exactly what Redis refuses that user.
"""

from __future__ import annotations

import logging
import time
import uuid

import pytest
import redis

from stream_dp.worker.access.redis_plan import WORKER_COMMANDS, worker_redis_rule
from stream_dp.worker.access.redis_probe import RedisAccessError, RedisRights, probes, redis_user
from tests.reliability.services import PrivateRedis
from tests.worker._support import free_port
from tests.worker.test_health_endpoints import _get, _stop, _wait, one_query_config, start_worker

ADMIN = ("admin", "probe-admin-pw-51c2")


def test_every_command_of_the_rule_is_tried_on_every_prefix():
    rule = worker_redis_rule("u")
    tried = probes(rule, "t0")
    assert {p.command for p in tried} == set(WORKER_COMMANDS)  # a command added to the rule needs a probe
    assert {p.command for p in probes(rule, "t0", replicas=False)} == set(WORKER_COMMANDS) - {"role", "wait"}
    for pattern in rule.key_patterns:
        keyed = [p for p in tried if p.pattern == pattern]
        base = pattern.rstrip("*") + "{probe-t0}"
        assert keyed and all(any(str(a).startswith(base) for a in p.args) for p in keyed), pattern
        assert all(not str(a).startswith(pattern.rstrip("*")) or str(a).startswith(base)
                   for p in keyed for a in p.args), "a probe touches a key that is not a probe key"
    assert redis_user("redis://dpworker:pw@h:1/0") == "dpworker" and redis_user("redis://h:1") == "default"


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory):
    server = PrivateRedis(tmp_path_factory.mktemp("redis-probe"), admin=ADMIN,
                          acl=f"user default off\nuser {ADMIN[0]} on >{ADMIN[1]} ~* &* +@all\n")
    server.start()
    yield server
    server.stop()


def _user(server: PrivateRedis, tokens: list[str]) -> str:
    """A user with ``tokens`` as its rule; returns its URL."""
    name, password = f"u{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    server.client().execute_command("ACL", "SETUSER", name, "reset", "on", f">{password}", *tokens)
    return server.url(name, password)


def _rights(url: str) -> RedisRights:
    return RedisRights(redis.Redis.from_url(url, socket_timeout=5), url, cluster=False)


def _probe_keys(server: PrivateRedis) -> list[bytes]:
    return [k for k in server.client().scan_iter(count=1000) if b"probe-" in k]


def test_the_printed_rule_passes_and_leaves_no_key_behind(acl_redis):
    url = _user(acl_redis, worker_redis_rule("x").tokens())
    _rights(url).verify()
    assert _probe_keys(acl_redis) == []


def test_a_rule_without_one_command_is_refused_naming_it_on_every_prefix(acl_redis):
    tokens = [t for t in worker_redis_rule("x").tokens() if t != "+hset"]
    with pytest.raises(RedisAccessError) as refused:
        _rights(_user(acl_redis, tokens)).verify()
    message = str(refused.value)
    for pattern in worker_redis_rule("x").key_patterns:
        assert f"HSET on keys {pattern!r}" in message, message
    assert "HGET" not in message and "ACL SETUSER" in message and "+hset" in message, message


def test_role_and_wait_are_needed_only_for_replicas_and_info_only_warns(acl_redis, caplog):
    """A user of ``+@all -@dangerous`` (no ROLE, no INFO) runs a worker that does not wait for replicas."""
    url = _user(acl_redis, ["~dp:*", "~stream-dp:*", "&*", "+@all", "-@dangerous"])
    client = redis.Redis.from_url(url, socket_timeout=5)
    with caplog.at_level(logging.WARNING, logger="stream_dp.worker.access.redis_probe"):
        RedisRights(client, url, cluster=False).verify()
    assert "may not run INFO" in caplog.text and "durability" in caplog.text, caplog.text
    with pytest.raises(RedisAccessError, match="ROLE"):
        RedisRights(client, url, cluster=False, replicas=True).verify()


def test_a_read_only_prefix_is_refused_naming_its_writes(acl_redis):
    tokens = [("%R~" + t[1:]) if t == "~stream-dp:ledger:*" else t for t in worker_redis_rule("x").tokens()]
    with pytest.raises(RedisAccessError) as refused:
        _rights(_user(acl_redis, tokens)).verify()
    message = str(refused.value)
    assert "SET on keys 'stream-dp:ledger:*'" in message and "HSET on keys 'stream-dp:ledger:*'" in message, message
    assert "GET on keys" not in message and "'dp:*'" not in message, message


def test_a_redis_that_does_not_answer_is_not_a_refusal(tmp_path, caplog):
    server = PrivateRedis(tmp_path / "down")  # never started
    rights = _rights(server.url())
    with caplog.at_level(logging.WARNING, logger="stream_dp.worker.access.redis_probe"):
        rights.verify_at_start()
    assert "checked when Redis answers" in caplog.text
    with pytest.raises(redis.exceptions.ConnectionError):
        rights.verify()


@pytest.mark.slow
def test_a_worker_whose_redis_user_lacks_a_command_stops_at_start_naming_it(acl_redis, tmp_path, kafka_bootstrap,
                                                                           new_topic, unique_name):
    url = _user(acl_redis, [t for t in worker_redis_rule("x").tokens() if t != "+hset"])
    log_path = tmp_path / "worker.log"
    worker = start_worker(one_query_config(tmp_path, new_topic, unique_name, partitions=1), kafka_bootstrap,
                          unique_name, url, free_port(), log_path, STREAM_DP_REDIS_TIMEOUT_S="0.5")
    try:
        assert worker.wait(timeout=90) == 1
    finally:
        if worker.poll() is None:
            _stop(worker)
    text = log_path.read_text(errors="replace")
    assert "may not run: HSET on keys 'dp:*'" in text and "stream-dp acls --config" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


def _not_ready_saying(port: int, text: str, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    detail = ""
    while text not in detail and time.monotonic() < deadline:
        status, detail = _get(port, "/readyz")
        assert status in (0, 503), (status, detail)
        time.sleep(0.25)
    return detail


@pytest.mark.slow
def test_a_redis_that_comes_up_refusing_keeps_the_worker_not_ready(tmp_path, kafka_bootstrap, new_topic,
                                                                   unique_name):
    """Redis down at start: the worker starts; once Redis answers with a rule less HSET, /readyz says which."""
    name, password = "dpworker", uuid.uuid4().hex
    short = " ".join(t for t in worker_redis_rule(name).tokens() if t != "+hset")
    server = PrivateRedis(tmp_path / "redis", admin=ADMIN,
                          acl=f"user default off\nuser {ADMIN[0]} on >{ADMIN[1]} ~* &* +@all\n"
                              f"user {name} on >{password} {short}\n")
    port = free_port()
    worker = start_worker(one_query_config(tmp_path, new_topic, unique_name, partitions=1), kafka_bootstrap,
                          unique_name, server.url(name, password), port, tmp_path / "worker.log",
                          STREAM_DP_REDIS_TIMEOUT_S="0.5")
    try:
        assert "Redis cannot be used" in _not_ready_saying(port, "Redis cannot be used")
        server.start()
        detail = _not_ready_saying(port, "HSET")  # at the first ping after Redis came up
        assert "may not run: HSET on keys 'dp:*'" in detail, detail
        assert worker.poll() is None  # not ready, not dead: the operator fixes the rule
        server.client().execute_command("ACL", "SETUSER", name, "+hset")
        assert _wait(port, "/readyz", 200).startswith("ok")
    finally:
        _stop(worker)
        server.stop()
