"""Redis and Redis Cluster URLs: parsed without a server, refused with what to write instead."""

import pytest

from stream_dp.budget.redis_url import check_redis_url, client_from_url, is_cluster_url, parse_cluster_url


def test_a_cluster_url_lists_nodes_credentials_and_tls_files() -> None:
    parsed = parse_cluster_url(
        "rediss+cluster://svc:p%40ss@redis-0.redis:6380,10.0.0.7:6380,[::1]:6381/0"
        "?ssl_ca_certs=/etc/ca.pem&ssl_certfile=/etc/c.pem&ssl_keyfile=/etc/k.pem"
    )
    assert parsed.nodes == (("redis-0.redis", 6380), ("10.0.0.7", 6380), ("::1", 6381))
    assert (parsed.username, parsed.password, parsed.tls) == ("svc", "p@ss", True)
    assert dict(parsed.tls_options) == {"ssl_ca_certs": "/etc/ca.pem", "ssl_certfile": "/etc/c.pem",
                                        "ssl_keyfile": "/etc/k.pem"}
    assert is_cluster_url("REDIS+CLUSTER://a:1") and not is_cluster_url("redis://a:1/0")


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("redis+cluster://a:1/2", "only database 0"),
        ("redis+cluster://a:1,b", "'b' is not host:port"),
        ("redis+cluster://a:99999", "not host:port"),
        ("redis+cluster://a:1?ssl_ca_certs=/ca.pem", "on a rediss\\+cluster:// URL"),
        ("rediss+cluster://a:1?socket_timeout=3", "'socket_timeout' is not one of"),
        ("http://a:1", "use redis://host:port/db"),
        ("a:1", "scheme '\\(none\\)'"),
    ],
)
def test_bad_urls_say_what_to_write(url: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_redis_url(url)


def test_a_bad_url_never_echoes_its_password() -> None:
    with pytest.raises(ValueError) as error:
        check_redis_url("redis+cluster://svc:hunter2hunter2@a:1/5")
    assert "hunter2hunter2" not in str(error.value)


def test_a_cluster_client_gets_the_nodes_credentials_and_tls_files(monkeypatch: pytest.MonkeyPatch) -> None:
    import redis.cluster

    seen: dict = {}

    def fake_cluster(**kwargs: object) -> str:
        seen.update(kwargs)
        return "client"

    monkeypatch.setattr(redis.cluster, "RedisCluster", fake_cluster)
    url = "rediss+cluster://svc:pw@a:6380,b:6380?ssl_ca_certs=/etc/ca.pem"
    assert client_from_url(url, timeout_s=1.5, own_retries=False) == "client"
    assert [(n.host, n.port) for n in seen["startup_nodes"]] == [("a", 6380), ("b", 6380)]
    assert (seen["username"], seen["password"], seen["ssl"], seen["ssl_ca_certs"]) == ("svc", "pw", True, "/etc/ca.pem")
    assert seen["socket_timeout"] == seen["socket_connect_timeout"] == 1.5


def test_a_cluster_client_answers(redis_cluster_url: str) -> None:
    client = client_from_url(redis_cluster_url, timeout_s=1.0)
    try:
        assert client.ping()
    finally:
        client.close()
