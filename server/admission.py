"""Admission control: shed a request that waited too long, before it costs an inference.

Under overload, requests queue in the kernel's listen backlog (sync workers) or
in nginx. Answering one that already waited longer than anyone will wait for is
wasted work that delays the requests behind it; a fast `503` + `Retry-After`
lets the client (or nginx's next upstream) try elsewhere, and keeps the latency
of the accepted requests bounded.

How long a request waited comes from `X-Request-Start` (nginx, or a client
stamping its send time; see `server.request_start`), parsed once by the WSGI
middleware into the request's timer (`server.timing`). The budget is the smaller
of `[limits] max_queue_ms` and the client's own deadline:
- header `X-Request-Timeout: <seconds>` (decimal, e.g. `0.25`), checked here
  before the body is read;
- the v2 `timeout` request parameter (microseconds, as in Triton), which lives
  in the JSON body, so v2 infer checks it after decoding and before inference
  (`check_infer_timeout`).
Without `X-Request-Start` the wait is unknown and nothing is shed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

from flask import Flask
from werkzeug.wrappers import Request

from onnxpool.server import gates, timing
from onnxpool.server.gates import Gate
from onnxpool.server.request_state import RequestState
from onnxpool.tasks.errors import BadRequest, Unavailable

TIMEOUT_HEADER = "X-Request-Timeout"
RETRY_AFTER_SECONDS = 1
# Probes and scrapes are never shed: an overloaded server is still alive and ready.
EXEMPT_PREFIXES = ("/v2/health/", "/metrics", "/openapi.json")


def _header_deadline(raw: str) -> float:
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise BadRequest(f"{TIMEOUT_HEADER} must be a positive number of seconds, got {raw!r}")
    return seconds


def _shed_if_waited(timer: timing.RequestTimer, budget: float, reason: str) -> None:
    waited = timer.waited(time.time())
    if waited is not None and waited > budget:
        timer.annotate("onnxpool.shed", reason)  # on the request's server span, when traced
        raise Unavailable(
            f"request shed: it waited {waited * 1000:.0f} ms for a worker, more than {reason} "
            f"({budget * 1000:.0f} ms); retry later",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )


def gate(max_queue_ms: int) -> Gate:
    """The check (server.gates): 503 at once if the request already waited past its budget."""
    limit = max_queue_ms / 1000 if max_queue_ms > 0 else None

    def check_wait(req: Request) -> None:
        if req.path.startswith(EXEMPT_PREFIXES):
            return
        timer = RequestState.of(req.environ).timer
        raw_deadline = req.headers.get(TIMEOUT_HEADER)
        if raw_deadline is not None:
            deadline = _header_deadline(raw_deadline)
            if limit is None or deadline < limit:
                _shed_if_waited(timer, deadline, f"the client's {TIMEOUT_HEADER}")
                return
        if limit is not None:
            _shed_if_waited(timer, limit, "[limits] max_queue_ms")

    return check_wait


def check_infer_timeout(parameters: Mapping[str, object], timer: timing.RequestTimer) -> None:
    """v2 infer, after decoding: honour the v2 `timeout` parameter (microseconds)."""
    timeout = parameters.get("timeout")
    if timeout is None:
        return
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
        raise BadRequest(f"parameters.timeout must be a positive integer (microseconds), got {timeout!r}")
    _shed_if_waited(timer, timeout / 1e6, "the request's timeout parameter")


def install(app: Flask, max_queue_ms: int) -> None:
    """Add the check to the app's gates; it runs after the body-size and auth checks."""
    gates.add(app, gate(max_queue_ms))
