"""The real Redis server answers."""

import redis


def test_redis_set_get_and_lua(redis_url, unique_name):
    client = redis.Redis.from_url(redis_url)
    try:
        key = f"{unique_name}:k"
        assert client.set(key, b"value", ex=60)
        assert client.get(key) == b"value"
        # The budget store relies on server-side Lua scripts.
        assert client.eval("return redis.call('INCRBY', KEYS[1], ARGV[1])", 1, f"{key}:n", 5) == 5
        client.delete(key, f"{key}:n")
    finally:
        client.close()
