"""The response cache in the HTTP layer: the key of a request, its look-up, the one hit renderer, the store.

`onnxpool.cache` is the storage and its policy (key, codec, Cache-Control, LMDB, Redis;
nothing of HTTP servers); this module binds it to the data plane's requests and replies
(`server.dataplane`, the one path of every request that runs the model):

    looked = cache.look_up(state, namespace, payload)    # None: the cache is not open here
    reply = cache.replay(looked) if looked.reply else ...  # a hit, rendered here and only here
    cache.store(looked, reply, replay_headers)            # a computed 200

It knows no route and no task: a caller names its namespace (the task, or `v2-infer`) and
hands over the canonical bytes of the request.

Process rules (docs/RESPONSE_CACHE.md): the master builds a `ReplyCache` with
the app of each generation (the model file's digest and the settings'
fingerprint are computed there, once, never per request) and has already made
the local store's files (`prepare`, `onnxpool.hooks`). Each worker calls
`ReplyCache.open()` in post_fork: LMDB environments and Redis sockets must not
cross fork() (two processes would share one file lock state / one socket), so
the master never opens one. Until then, and when `[cache] enabled = false`,
`look_up` answers None and the data plane just computes.

Replies carry `X-Cache: HIT|MISS` and `Server-Timing: cache;dur=<lookup ms>;desc=hit|miss`
(a second Server-Timing field next to the middleware's; HTTP joins them). A hit
replays the stored body byte for byte; the middleware adds a fresh X-Request-ID.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from onnxpool import __version__
from onnxpool.cache.codec import CachedReply
from onnxpool.cache.control import parse_cache_control
from onnxpool.cache.key import BytesLike, CacheKey, cache_key
from onnxpool.cache.policy import Lookup, ResponseCache, open_cache
from onnxpool.config.settings import CacheSettings, Settings
from onnxpool.server.reply import Reply
from onnxpool.server.request_state import HIT, MISS, RequestState

log = logging.getLogger("onnxpool.cache")

HEADER = "X-Cache"
Payload = BytesLike | Sequence[BytesLike]


def settings_fingerprint(settings: Settings, task_identity: Mapping[str, str]) -> str:
    """A digest of everything besides the model file and the request that shapes a reply.

    The model section without its path (the file's digest stands for it) and warm-up count,
    the limits (a hit must not answer what a lower limit would now refuse), the `[task]`
    table, the task's code, the files its table names and what it read at start
    (`onnxpool.tasks.identity.task_identity`) and the onnxpool version (a release may change
    the reply format).
    """
    document = {
        "onnxpool": __version__,
        "model": settings.model.model_dump(mode="json", exclude={"path", "warmup_runs"}),
        "limits": settings.limits.model_dump(mode="json"),
        "task": settings.task,
        "task_identity": dict(task_identity),
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class ReplyCache:
    """One generation's cache: built in the master with the app, opened in each worker after fork."""

    def __init__(
        self,
        section: CacheSettings,
        *,
        folder: Path | None,
        model_digest: str,
        fingerprint: str,
        record_metrics: bool,
        server_timing: bool,
    ) -> None:
        self.settings = section
        self.folder = folder
        self.model_digest = model_digest
        self.fingerprint = fingerprint
        self.record_metrics = record_metrics
        self.server_timing = server_timing
        self.cache: ResponseCache | None = None

    @property
    def wanted(self) -> bool:
        return self.settings.enabled and (self.folder is not None or bool(self.settings.url))

    @property
    def active(self) -> bool:
        """Opened in this worker: `serve` looks requests up."""
        return self.cache is not None

    def open(self) -> None:
        """In a worker, after fork: open its own connection(s). A failure is logged; the worker serves uncached."""
        if not self.wanted:
            return
        # Imported here, not at the top: this module is imported with server.context (even by
        # `onnxpool config`), and prometheus_client must not load before the master exports
        # its metrics folder (onnxpool.hooks).
        from onnxpool.server import metrics

        hook = metrics.observe_cache_event if self.record_metrics else None
        try:
            cache = open_cache(self.settings, self.folder or Path(), on_event=hook)
        except Exception as exc:
            log.error("response cache (%s) not opened, serving without it: %s", self.settings.backend_name, exc)
            return
        self.cache = cache
        if cache is not None and hook is not None:
            metrics.cache_opened(cache.backend)
        if cache is not None and not self.settings.url:
            self._publish_bytes(cache.bytes_used())

    def _publish_bytes(self, used: int | None) -> None:
        if self.cache is not None and self.record_metrics and used is not None:
            from onnxpool.server import metrics  # loaded by open() already

            metrics.cache_bytes(self.cache.backend, used)

    def look_up(self, state: RequestState, namespace: str, payload: Callable[[], Payload]) -> Lookup | None:
        """The request's key and stored reply (None when the cache is not open in this process).

        `payload` is called only when a key is needed (not for no-store, not with the cache
        closed). Records the outcome (hit or miss) in the request's state, for the metrics.
        """
        cache = self.cache
        if cache is None:
            return None
        start = time.perf_counter()
        control = parse_cache_control(state.cache_control, state.pragma)
        key: CacheKey | None = None
        reply: CachedReply | None = None
        if control.read or control.write:  # not no-store: hash the key (no-cache still stores)
            key = cache_key(
                model_digest=self.model_digest,
                settings_fingerprint=self.fingerprint,
                endpoint=namespace,
                params={},
                payload=payload(),
            )
            reply = cache.lookup(key, control)
        end = time.perf_counter()  # one reading: Server-Timing's `cache` field and the trace's span
        looked = Lookup(namespace, {}, control, key, reply, end - start)
        state.cache = HIT if reply is not None else MISS
        state.timer.mark("cache", start, end, {"onnxpool.cache": state.cache})
        return looked

    @staticmethod
    def replay(hit: CachedReply) -> Reply:
        """A stored reply as it is sent again: the one place a hit is rendered."""
        return Reply(200, [*hit.headers, ("Content-Type", hit.content_type)], hit.body)

    def store(self, looked: Lookup, reply: Reply, replay_headers: Sequence[str] = ()) -> None:
        """Keep a computed 200 (and the reply headers named in `replay_headers`) for the next asker."""
        if self.cache is None or looked.key is None or not looked.control.write or reply.status != 200:
            return
        headers = tuple((name, value) for name, value in reply.headers if name in replay_headers)
        cached = CachedReply(reply.body, reply.header("Content-Type") or "", headers)
        stored = self.cache.store_reply(looked.key, reply.status, cached, looked.control)
        if stored is not None:
            self._publish_bytes(stored.bytes_used)

    def outcome_headers(self, looked: Lookup) -> list[tuple[str, str]]:
        """`X-Cache: HIT|MISS` and, when Server-Timing is on, the cache's part of the time."""
        outcome = "hit" if looked.reply is not None else "miss"
        headers = [(HEADER, outcome.upper())]
        if self.server_timing:
            headers.append(("Server-Timing", f"cache;dur={looked.seconds * 1000:.3f};desc={outcome}"))
        return headers
