"""A Redis restarted under a running client is noticed at the first connection to it, before any command runs.

A private ``redis-server`` is killed and started again on the same port without its data: the next
command of a client built with ``ServerWatch`` fails (redis-py's own reconnect-and-retry would otherwise
run it on the empty server, and a budget charge would find every unit's budget whole), the listener
hears of it, and every further connection fails too until the watch ``accept``s the server.
A restart that kept its data is told apart by the store markers, not here.
"""

from __future__ import annotations

import shutil

import pytest
import redis

from stream_dp.budget.redis_restarts import ServerRestarted, ServerWatch
from stream_dp.budget.redis_url import client_from_url
from tests.reliability.services import PrivateRedis

pytestmark = pytest.mark.services


def _restart_empty(server: PrivateRedis) -> None:
    server.stop(crash=True)
    for path in server.directory.iterdir():
        if path.name != "redis.log":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    server.start()


@pytest.fixture
def server(tmp_path):
    made = PrivateRedis(tmp_path / "redis")
    made.start()
    yield made
    made.stop()


@pytest.mark.parametrize("own_retries", [True, False])  # the ledger's client retries, the budget store's does not
def test_a_restarted_redis_fails_the_next_command_until_accepted(server, own_retries):
    watch = ServerWatch()
    heard = []
    watch.listen(lambda: heard.append(1))
    client = client_from_url(server.url(), timeout_s=2, own_retries=own_retries,
                             connection_class=watch.connection_class(server.url()))
    client.set("charged", b"1")
    assert client.get("charged") == b"1" and not heard

    _restart_empty(server)
    for _ in range(3):  # however often it is tried, and whatever redis-py retries on its own
        with pytest.raises(redis.ConnectionError):
            client.set("charged", b"again")
    assert heard, "the listener (the store guard) was not told"
    assert redis.Redis.from_url(server.url()).get("charged") is None, "a command ran on the restarted server"

    watch.accept()  # the guard found the store markers it expects
    client.set("charged", b"after")
    assert client.get("charged") == b"after"
    client.close()


def test_a_server_met_first_at_a_new_address_is_not_a_restart(server, tmp_path):
    other = PrivateRedis(tmp_path / "other")
    other.start()
    try:
        watch = ServerWatch()
        for made in (server, other):  # one after the other, as a failover's promoted replica is met
            client = client_from_url(made.url(), timeout_s=2, connection_class=watch.connection_class(made.url()))
            assert client.ping()
            client.close()
    finally:
        other.stop()


def test_the_error_names_the_restart():
    assert issubclass(ServerRestarted, redis.ConnectionError)


def test_a_cluster_url_gets_no_connection_class_redis_py_would_refuse():
    """redis-py's cluster client builds its node clients itself and refuses a connection class: a worker on
    a cluster URL must start (a master back empty is then caught by the store markers' periodic check)."""
    watch = ServerWatch()
    assert watch.client_options("redis+cluster://127.0.0.1:7300,127.0.0.1:7301") == {}
    client = client_from_url("redis+cluster://127.0.0.1:7300", timeout_s=2,
                             **watch.client_options("redis+cluster://127.0.0.1:7300"))
    client.close()
    assert "connection_class" in watch.client_options("redis://127.0.0.1:6379/0")
