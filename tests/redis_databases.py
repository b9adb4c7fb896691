"""Tests that leave many Redis keys behind keep them out of the database the rest of the suite shares.

The end-to-end privacy audit writes about 50k keys per stream (charges, spend
and ledger entries). In database 0 every other test's clean-up -- a SCAN for
its own prefix, which walks the whole keyspace -- then took seconds instead of
milliseconds: over 250 s of teardowns in one run of the suite. The audit uses
database ``AUDIT_DB`` of the same server instead, and deletes its keys when it
stops.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis

AUDIT_DB = 1


def with_database(url: str, db: int) -> str:
    """``url`` (``redis://`` or ``rediss://``, any database) pointed at database ``db`` of the same server."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError(f"REDIS_URL {url!r}: a redis:// or rediss:// URL is needed to choose a database")
    return urlunsplit(parts._replace(path=f"/{db}"))


def delete_matching(client: redis.Redis, *patterns: str) -> int:
    """Delete the keys matching any of ``patterns`` in ``client``'s database; how many there were."""
    deleted = 0
    for pattern in patterns:
        keys = list(client.scan_iter(match=pattern, count=10_000))
        for i in range(0, len(keys), 1_000):
            client.delete(*keys[i:i + 1_000])
        deleted += len(keys)
    return deleted


def delete_keys(url: str, pattern: str) -> int:
    """``delete_matching`` on a client of ``url``'s database, closed after."""
    client = redis.Redis.from_url(url)
    try:
        return delete_matching(client, pattern)
    finally:
        client.close()
