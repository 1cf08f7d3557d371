"""The shared store: one Redis for several hosts (the client is imported only when configured)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from onnxpool.cache.backend import Stored
from onnxpool.cache.key import CacheKey
from onnxpool.config.settings import CacheSettings

if TYPE_CHECKING:  # the redis client is only needed (and imported) when a redis:// url is configured
    import redis

REDIS_KEY_PREFIX: Final = "onnxpool:rc1:"
"""Keys in Redis: this prefix and the key's hex digest (rc1: the reply framing's version)."""


class RedisStore:
    """Redis shared by several hosts: same keys, under `key_prefix`; TTL by SET PX.

    The client does no retries and has short socket timeouts, so a call fails fast;
    ResponseCache's circuit breaker then skips Redis for a cooldown. redis-py's pool
    also resets itself after fork, but open this in the worker anyway.
    """

    name = "redis"
    remote = True

    def __init__(self, settings: CacheSettings, key_prefix: str = REDIS_KEY_PREFIX) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.prefix = key_prefix.encode()
        self.client: redis.Redis = redis.Redis.from_url(
            settings.url,
            socket_connect_timeout=settings.redis_connect_timeout_seconds,
            socket_timeout=settings.redis_timeout_seconds,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
            decode_responses=False,
        )

    def _k(self, key: CacheKey) -> bytes:
        return self.prefix + key.hex().encode()

    def get(self, key: CacheKey) -> bytes | None:
        value = self.client.get(self._k(key))
        if value is None:
            return None
        if not isinstance(value, bytes):
            raise TypeError(f"redis returned {type(value).__name__}")
        return value

    def put(self, key: CacheKey, value: bytes, ttl_seconds: float) -> Stored | None:
        self.client.set(self._k(key), value, px=max(1, int(ttl_seconds * 1000)))
        return Stored()

    def bytes_used(self) -> int | None:
        return None  # Redis bounds itself (maxmemory); INFO is too slow for a scrape per worker

    def close(self) -> None:
        self.client.close()
