"""Locks of periodic work (the poll cycle): a Redis lock with a short TTL that a heartbeat thread renews
while the work runs, released only by its holder.

Why (issue 23 item 7): the poll cycle's lock was a cache key with a 600 s TTL; SIGKILL of the worker during
a poll left it in Redis and no poll ran for 10 minutes (27 false `ingestion_stale` incidents). Now the TTL
is short (POLL_CYCLE_LOCK_TTL_S, 90 s by default) and the holder's heartbeat renews it every third of the
TTL, so a cycle may run longer than the TTL while its process lives, and a killed process frees the lock
within one TTL. Release and renewal compare the holder's random token in Redis (redis-py's Lock: Lua
scripts run atomically), so a holder whose lock expired never deletes or extends a successor's lock.
"""

from __future__ import annotations

import logging
import threading
import uuid
from types import TracebackType
from typing import Protocol

import redis
from django.conf import settings
from django.core.cache.backends.base import BaseCache
from redis.exceptions import LockError, LockNotOwnedError, RedisError

log = logging.getLogger(__name__)


class TokenLock(Protocol):
    """What HeartbeatLock needs of a lock: redis-py's Lock, or CacheTokenLock."""

    def acquire(self, blocking: bool | None = None) -> bool: ...

    def reacquire(self) -> bool: ...

    def release(self) -> None: ...


class CacheTokenLock:
    """The same contract over Django's cache API, for a cache that is not Redis (the tests' local-memory
    cache, which is one process's anyway): add() takes it, the token is compared before renewing or
    deleting. Not atomic across processes; deployments use Redis (named_lock picks it)."""

    def __init__(self, cache: BaseCache, key: str, ttl_s: float) -> None:
        self.cache, self.key, self.ttl_s = cache, key, ttl_s
        self.token = uuid.uuid4().hex

    def acquire(self, blocking: bool | None = None) -> bool:
        return bool(self.cache.add(self.key, self.token, timeout=self.ttl_s))

    def reacquire(self) -> bool:
        if self.cache.get(self.key) != self.token:
            raise LockNotOwnedError("lock expired or taken")
        return bool(self.cache.touch(self.key, timeout=self.ttl_s))

    def release(self) -> None:
        if self.cache.get(self.key) != self.token:
            raise LockNotOwnedError("lock expired or taken")
        self.cache.delete(self.key)


class HeartbeatLock:
    """A non-blocking Redis lock on `key` held for `ttl_s` at a time and renewed every `renew_every_s`
    (default a third of the TTL) by a daemon thread until `release`; `lost` is set when a renewal found the
    lock no longer ours (it expired: Redis was unreachable for a whole TTL, or was flushed)."""

    def __init__(
        self,
        client: redis.Redis | None,
        key: str,
        ttl_s: float,
        *,
        renew_every_s: float | None = None,
        backend: TokenLock | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"a lock TTL must be positive, got {ttl_s}")
        self.key = key
        self.ttl_s = float(ttl_s)
        self.renew_every_s = float(renew_every_s) if renew_every_s else self.ttl_s / 3.0
        if not 0 < self.renew_every_s < self.ttl_s:
            raise ValueError("the heartbeat must renew the lock before its TTL runs out")
        self._lock: TokenLock
        if backend is not None:
            self._lock = backend
        elif client is not None:
            # thread_local=False: the token lives on the object, so the heartbeat thread renews our lock.
            self._lock = client.lock(key, timeout=self.ttl_s, blocking=False, thread_local=False)
        else:
            raise ValueError("a lock needs a Redis client or a backend")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = threading.Event()
        self.renewals = 0

    def acquire(self) -> bool:
        """Take the lock now (never waits); True when taken, and the heartbeat runs from then on."""
        if not self._lock.acquire(blocking=False):
            return False
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name=f"lock-heartbeat {self.key}", daemon=True)
        self._thread.start()
        return True

    def _beat(self) -> None:
        while not self._stop.wait(self.renew_every_s):
            try:
                self._lock.reacquire()  # TTL back to ttl_s, only if the token in Redis is still ours
                self.renewals += 1
            except LockNotOwnedError:
                self.lost.set()
                log.error("lock %s expired while held (Redis unreachable for a whole TTL?)", self.key)
                return
            except (RedisError, OSError) as exc:  # try again at the next beat; the TTL still covers us
                log.warning("lock %s: renewal failed, retrying: %s", self.key, exc)

    def release(self) -> None:
        """Stop the heartbeat and delete the lock if it is still ours (never a successor's)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            self._lock.release()
        except LockNotOwnedError:
            log.warning("lock %s was no longer ours at release (it expired); left to its holder", self.key)
        except (LockError, RedisError, OSError) as exc:  # it expires within one TTL anyway
            log.warning("lock %s: release failed: %s", self.key, exc)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._thread is not None:
            self.release()


def named_lock(name: str, ttl_s: float) -> HeartbeatLock:
    """A HeartbeatLock in the cache's Redis under the cache's key prefix (so test runs and deployments
    sharing a Redis never meet), read from settings at call time."""
    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache

    cache = caches["default"]  # the backend itself (django.core.cache.cache is a proxy)
    if not isinstance(cache, RedisCache):  # e.g. tests' LocMemCache: the cache API, one process
        return HeartbeatLock(None, name, ttl_s, backend=CacheTokenLock(cache, name, ttl_s))
    location = settings.CACHES["default"]["LOCATION"]
    client = redis.Redis.from_url(str(location), socket_timeout=5.0, socket_connect_timeout=5.0)
    return HeartbeatLock(client, cache.make_key(name), ttl_s)
