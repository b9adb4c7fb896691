"""Redis URLs: one server (``redis://``, ``rediss://``, ``unix://``) or a Redis Cluster.

A cluster URL names one or more of its nodes; the client learns the rest from
them (``CLUSTER SLOTS``), so listing a few survives any one being down::

    redis+cluster://[user:password@]host:port[,host:port...][/0]
    rediss+cluster://...[?ssl_ca_certs=/ca.pem&ssl_certfile=/c.pem&ssl_keyfile=/k.pem]   (TLS)

A cluster has only database 0. Over TLS the server certificates are verified
(against the system's CAs unless ``ssl_ca_certs`` names a file);
``ssl_certfile`` and ``ssl_keyfile`` give a client certificate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
SINGLE_SCHEMES = ("redis", "rediss", "unix")


@dataclass(frozen=True)
class ClusterURL:
    nodes: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    tls: bool
    tls_options: tuple[tuple[str, str], ...] = ()


def is_cluster_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def check_redis_url(url: str) -> None:
    """Raise ``ValueError`` (without echoing a password) unless ``url`` is a Redis or Redis Cluster URL."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in CLUSTER_SCHEMES:
        parse_cluster_url(url)
    elif scheme not in SINGLE_SCHEMES:
        raise ValueError(
            f"REDIS_URL has scheme {scheme or '(none)'!r}; use redis://host:port/db for one Redis, or "
            "redis+cluster://host:port[,host:port...] for a Redis Cluster (rediss:// and rediss+cluster:// for TLS)"
        )


def parse_cluster_url(url: str) -> ClusterURL:
    """The nodes and credentials of a ``redis+cluster://`` URL; ``ValueError`` naming what is wrong."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in CLUSTER_SCHEMES:
        raise ValueError(f"not a Redis Cluster URL (scheme {scheme!r}); use redis+cluster://host:port[,host:port...]")
    rest, _, query = rest.partition("?")
    tls = scheme.lower() == "rediss+cluster"
    options = parse_qsl(query, keep_blank_values=True)
    for name, value in options:
        if name not in TLS_OPTIONS or not tls or not value:
            raise ValueError(
                f"cluster URL option {name!r} is not one of {', '.join(TLS_OPTIONS)} with a file path, on a "
                "rediss+cluster:// URL; set timeouts with STREAM_DP_REDIS_TIMEOUT_S"
            )
    netloc, _, path = rest.partition("/")
    if path not in ("", "0"):
        raise ValueError(f"a Redis Cluster has only database 0, the URL asks for /{path}; drop it or use /0")
    username = password = None
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user, sep, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if sep else None
    nodes = []
    for part in netloc.split(","):
        host, sep, port = part.strip().rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"cluster node {part.strip()!r} is not host:port; list nodes as "
                "redis+cluster://host:port[,host:port...]"
            )
        nodes.append((host, int(port)))
    return ClusterURL(tuple(nodes), username, password, tls, tuple(options))


def client_from_url(url: str, *, timeout_s: float, own_retries: bool = True, **kwargs: Any) -> Any:
    """A bytes client for ``url``: ``redis.Redis``, or ``redis.cluster.RedisCluster`` for a cluster URL.

    ``own_retries=False`` turns redis-py's retries of connection errors off, for
    callers that retry themselves (the budget store); a cluster client still
    follows MOVED/ASK redirections on its own.
    """
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    options: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s, **kwargs}
    if not own_retries:
        options["retry"] = Retry(NoBackoff(), 0)
    if not is_cluster_url(url):
        return redis.Redis.from_url(url, **options)
    from redis.cluster import ClusterNode, RedisCluster

    parsed = parse_cluster_url(url)
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in parsed.nodes],
        username=parsed.username,
        password=parsed.password,
        ssl=parsed.tls,
        **dict(parsed.tls_options),
        **options,
    )
