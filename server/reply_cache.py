"""The response cache in the HTTP layer: the key of a request, hit or compute, the reply headers.

`onnxpool.cache` is the storage and its policy (key, codec, Cache-Control, LMDB, Redis;
nothing of HTTP servers); this module binds it to requests and replies:

    return context().cache.serve(state, task.name, lambda: task.canonical(inputs), compute)

It knows no route and no task: a caller names its namespace (the task, or `v2-infer`) and
hands over the canonical bytes of the request.

Process rules (docs/RESPONSE_CACHE.md): the master builds a `ReplyCache` with
the app of each generation (the model file's digest and the settings'
fingerprint are computed there, once, never per request) and has already made
the local store's files (`prepare`, `onnxpool.hooks`). Each worker calls
`ReplyCache.open()` in post_fork: LMDB environments and Redis sockets must not
cross fork() (two processes would share one file lock state / one socket), so
the master never opens one. Until then, and when `[cache] enabled = false`,
`serve` just computes.

A request is looked up once (`look_up`, kept in the request's state): task routes' hits
are answered before Flask by `server.front`, and on a miss the route's `serve` finds the
look-up already made.

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

from flask import Response

from onnxpool import __version__
from onnxpool.cache.codec import CachedReply
from onnxpool.cache.control import parse_cache_control
from onnxpool.cache.key import BytesLike, CacheKey, ParamValue, cache_key
from onnxpool.cache.policy import Lookup, ResponseCache, open_cache
from onnxpool.config.settings import CacheSettings, Settings
from onnxpool.server.request_state import HIT, MISS, RequestState
from onnxpool.tasks import jsonfast

log = logging.getLogger("onnxpool.cache")

HEADER = "X-Cache"
Payload = BytesLike | Sequence[BytesLike]


def settings_fingerprint(settings: Settings, task_fingerprint: str) -> str:
    """A digest of everything besides the model file and the request that shapes a reply.

    The model section without its path (the file's digest stands for it) and warm-up count,
    the limits (a hit must not answer what a lower limit would now refuse), the `[task]`
    table, what the task read at start (`Task.fingerprint`: its labels' text...) and the
    onnxpool version (a release may change the reply format).
    """
    document = {
        "onnxpool": __version__,
        "model": settings.model.model_dump(mode="json", exclude={"path", "labels", "warmup_runs"}),
        "limits": settings.limits.model_dump(mode="json"),
        "task": settings.task,
        "task_files": task_fingerprint,
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

    def look_up(
        self, state: RequestState, namespace: str, payload: Callable[[], Payload], params: Mapping[str, ParamValue]
    ) -> Lookup | None:
        """The request's key and stored reply (None when the cache is not open in this process).

        Kept in the request's state: `server.front` looks up before Flask and on a miss the
        route asks again; the key is hashed and the miss counted once. `payload` is called
        only when a key is needed (not for no-store, not with the cache closed).
        """
        cache = self.cache
        if cache is None:
            return None
        kept: Lookup | None = state.lookup
        if kept is not None and kept.endpoint == namespace and kept.params == params:
            return kept
        start = time.perf_counter()
        control = parse_cache_control(state.cache_control, state.pragma)
        key: CacheKey | None = None
        reply: CachedReply | None = None
        if control.read or control.write:  # not no-store: hash the key (no-cache still stores)
            key = cache_key(
                model_digest=self.model_digest,
                settings_fingerprint=self.fingerprint,
                endpoint=namespace,
                params=params,
                payload=payload(),
            )
            reply = cache.lookup(key, control)
        looked = Lookup(namespace, dict(params), control, key, reply, time.perf_counter() - start)
        state.lookup = looked
        state.cache = HIT if reply is not None else MISS
        return looked

    def serve(
        self,
        state: RequestState,
        namespace: str,
        payload: Callable[[], Payload],
        compute: Callable[[], Response],
        params: Mapping[str, ParamValue] | None = None,
        replay: Sequence[str] = (),
    ) -> Response:
        """The stored reply for this request, or `compute()`'s reply (stored when it is a 200).

        `params` are parameters kept readable in the key (most callers fold them into the
        payload); `replay` names the reply headers that are part of the result and are
        stored with the body.
        """
        looked = self.look_up(state, namespace, payload, params or {})
        if looked is None or self.cache is None:
            return compute()
        hit = looked.reply
        if hit is not None:
            response = Response(hit.body, status=200, headers=list(hit.headers), content_type=hit.content_type)
            response.headers.extend(self.outcome_headers(looked))
            return response
        response = compute()
        if looked.key is not None and looked.control.write and response.status_code == 200:
            headers = tuple((name, response.headers[name]) for name in replay if name in response.headers)
            reply = CachedReply(response.get_data(), response.content_type or "", headers)
            stored = self.cache.store_reply(looked.key, response.status_code, reply, looked.control)
            if stored is not None:
                self._publish_bytes(stored.bytes_used)
        response.headers.extend(self.outcome_headers(looked))
        return response

    def hit_reply(self, looked: Lookup) -> tuple[list[tuple[str, str]], bytes] | None:
        """A hit as WSGI reply headers and body, exactly as `serve` would send it through Flask."""
        hit = looked.reply
        if hit is None:
            return None
        headers = [*hit.headers, ("Content-Type", hit.content_type), ("Content-Length", str(len(hit.body)))]
        return headers + self.outcome_headers(looked), hit.body

    def outcome_headers(self, looked: Lookup) -> list[tuple[str, str]]:
        """`X-Cache: HIT|MISS` and, when Server-Timing is on, the cache's part of the time."""
        outcome = "hit" if looked.reply is not None else "miss"
        headers = [(HEADER, outcome.upper())]
        if self.server_timing:
            headers.append(("Server-Timing", f"cache;dur={looked.seconds * 1000:.3f};desc={outcome}"))
        return headers


def insert_v2_id(response: Response, request_id: str, header_name: str) -> Response:
    """Put a v2 request's echoed `id` into a reply encoded without one (hit or computed alike).

    The v2 encoder writes `"id"` as the last member of the reply's JSON document, so this
    gives the bytes it would have written with the id (tests/test_cache_http.py checks it).
    `header_name` is the binary extension's header-length reply header, adjusted here.
    """
    body = response.get_data()
    raw_length = response.headers.get(header_name)
    length = int(raw_length) if raw_length is not None else len(body)
    member = b',"id":' + jsonfast.dumps(request_id)
    response.set_data(body[: length - 1] + member + body[length - 1 :])
    if raw_length is not None:
        response.headers[header_name] = str(length + len(member))
    return response
