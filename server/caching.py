"""The response cache in the HTTP layer: the key of a request, hit or compute, the reply headers.

`onnxpool.cache.store` is the storage (self-contained, no onnxpool imports);
this module decides what a request's key is and wraps a route's computation:

    return context().cache.serve("classify", {"top_k": k}, images, compute)

Process rules (docs/RESPONSE_CACHE.md): the master builds a `ReplyCache` with
the app of each generation (the model file's digest and the settings'
fingerprint are computed there, once, never per request) and has already made
the local store's files (`prepare`, `onnxpool.hooks`). Each worker calls
`ReplyCache.open()` in post_fork: LMDB environments and Redis sockets must not
cross fork() (two processes would share one file lock state / one socket), so
the master never opens one. Until then, and when `[cache] enabled = false`,
`serve` just computes.

A request is looked up once (`look_up`, kept in the WSGI environ): the image
endpoints' hits are answered before Flask by `server.hit_path`, and on a miss
the route's `serve` finds the lookup already made.

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flask import Response, request

from onnxpool import __version__
from onnxpool.cache import store as rc
from onnxpool.config.settings import CacheSettings, Settings
from onnxpool.server import jsonfast

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

log = logging.getLogger("onnxpool.cache")

HEADER = "X-Cache"
LOOKUP_KEY = "onnxpool.cache_lookup"
Payload = rc.BytesLike | Sequence[rc.BytesLike]


def store_settings(section: CacheSettings) -> rc.CacheSettings:
    """The `[cache]` section as the storage module's settings."""
    # Same field names; the storage module's other fields (key prefix, busy timeout) keep their defaults.
    return rc.CacheSettings(**section.model_dump())


def settings_fingerprint(settings: Settings, labels: Sequence[str] | None) -> str:
    """A digest of everything besides the model file and the request that shapes a reply.

    The model section without its path (the file's digest stands for it) and warm-up count,
    the limits (a hit must not answer what a lower limit would now refuse), the labels'
    text and the onnxpool version (a release may change the reply format).
    """
    document = {
        "onnxpool": __version__,
        "model": settings.model.model_dump(mode="json", exclude={"path", "labels", "warmup_runs"}),
        "limits": settings.limits.model_dump(mode="json"),
        "labels": list(labels) if labels is not None else None,
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Lookup:
    """One request's look into the cache: what it asked, its key, the stored reply if any."""

    endpoint: str
    params: dict[str, rc.ParamValue]
    control: rc.CacheControl
    key: rc.CacheKey | None
    """None for no-store: nothing hashed, nothing looked up or stored."""
    reply: rc.CachedReply | None
    """The hit's reply; None on a miss."""
    seconds: float
    """Time to hash the key and look it up (Server-Timing `cache;dur`)."""


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
        self.settings = store_settings(section)
        self.folder = folder
        self.model_digest = model_digest
        self.fingerprint = fingerprint
        self.record_metrics = record_metrics
        self.server_timing = server_timing
        self.cache: rc.ResponseCache | None = None

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
            cache = rc.open_cache(self.settings, self.folder or Path(), on_event=hook)
        except Exception as exc:
            log.error("response cache (%s) not opened, serving without it: %s", self.settings.backend_name, exc)
            return
        self.cache = cache
        if cache is not None and not self.settings.url:
            self._publish_bytes(cache.bytes_used())

    def _publish_bytes(self, used: int | None) -> None:
        if self.cache is not None and self.record_metrics and used is not None:
            from onnxpool.server import metrics  # loaded by open() already

            metrics.cache_bytes(self.cache.backend, used)

    def look_up(
        self, environ: WSGIEnvironment, endpoint: str, params: Mapping[str, rc.ParamValue], payload: Payload
    ) -> Lookup | None:
        """The request's key and stored reply (None when the cache is not open in this process).

        Kept in the WSGI environ: the hit path (server.hit_path) looks up before Flask
        and on a miss the route asks again; the key is hashed and the miss counted once.
        """
        cache = self.cache
        if cache is None:
            return None
        kept: Lookup | None = environ.get(LOOKUP_KEY)
        if kept is not None and kept.endpoint == endpoint and kept.params == params:
            return kept
        start = time.perf_counter()
        # Straight from the WSGI environ: the server has already joined repeated header lines
        # with commas (RFC 9110 5.3), and `request.headers.getlist` walks the whole environ.
        control = rc.parse_cache_control(environ.get("HTTP_CACHE_CONTROL"), environ.get("HTTP_PRAGMA"))
        key: rc.CacheKey | None = None
        reply: rc.CachedReply | None = None
        if control.read or control.write:  # not no-store: hash the key (no-cache still stores)
            key = rc.cache_key(
                model_digest=self.model_digest,
                settings_fingerprint=self.fingerprint,
                endpoint=endpoint,
                params=params,
                payload=payload,
            )
            reply = cache.lookup(key, control)
        looked = Lookup(endpoint, dict(params), control, key, reply, time.perf_counter() - start)
        environ[LOOKUP_KEY] = looked
        return looked

    def serve(
        self,
        endpoint: str,
        params: Mapping[str, rc.ParamValue],
        payload: Payload,
        compute: Callable[[], Response],
        replay: Sequence[str] = (),
    ) -> Response:
        """The stored reply for this request, or `compute()`'s reply (stored when it is a 200).

        `params` are the endpoint's effective parameters (defaults applied); `replay` names
        the reply headers that are part of the result and are stored with the body.
        """
        looked = self.look_up(request.environ, endpoint, params, payload)
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
            reply = rc.CachedReply(response.get_data(), response.content_type or "", headers)
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
