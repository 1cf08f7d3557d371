"""The inference log (`[inference_log]`): the switch each worker turns on after fork, and what a request leaves it.

Process rules (docs/ARCHITECTURE.md): the master only plans (`server.inference_log_plan`, once per
generation, with every other setting); each worker makes its own buffer, shipper thread and
connection in post_fork (`open`, from `server.app.open_in_worker`) and sends what is left in
worker_exit (`close`, bounded by half of `[server] graceful_timeout`).

Never in the request's way. On the request's path the data plane only `capture`s: a draw for
`sample`, then one small object of references (the body already read, the reply already made)
kept for this thread. The reply is written and sent first; gunicorn's `post_request` (and the
gRPC handoff after a call) then `settle`s it: it is put into the buffer, or dropped and counted if
it is full, and the shipper's thread makes its events. That runs after the reply left the socket (post_request
uncorks it first, `onnxpool.hooks`), where a WSGI close hook would run while the reply is still
corked and so delay it. Off, a request pays one attribute test.

Only the data plane's paths are logged (a model's operations: its task's routes and v2 infer):
probes, /metrics, /docs and metadata never reach it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from onnxpool.server import request_id
from onnxpool.server.inference_log_events import Exchange
from onnxpool.server.inference_log_plan import InferenceLogPlan
from onnxpool.server.reply import Reply
from onnxpool.server.v2codec import BINARY_HEADER
from onnxpool.tasks.api import JsonDocument

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

    from onnxpool.server.inference_log_ship import Shipper

log = logging.getLogger("onnxpool.inference_log")

CE_ID_ENVIRON = "HTTP_CE_ID"
"""The caller's `Ce-Id` (KServe's logger uses it as the events' id when it is sent)."""
MAX_CE_ID = 256
"""A caller's `Ce-Id` longer than this (or with control characters) is replaced by the request id."""
BINARY_ENVIRON = "HTTP_" + BINARY_HEADER.upper().replace("-", "_")


class InferenceLog:
    """One generation's inference log: planned in the master with the app, started in each worker after fork."""

    def __init__(self, plan: InferenceLogPlan | None, record_metrics: bool) -> None:
        self.plan = plan
        self.record_metrics = record_metrics
        self.shipper: Shipper | None = None
        """The worker's shipper once `open` ran with the log on; None in the master and when off."""
        self._pending = threading.local()

    def open(self) -> None:
        """Worker, post_fork: the buffer and the shipper's thread (a failure is one line: the worker serves on)."""
        plan = self.plan
        if plan is None or self.shipper is not None:
            return
        from onnxpool.server.inference_log_ship import Shipper  # requests' pool is made here, after fork

        model = plan.model
        if self.record_metrics:
            from onnxpool.server import metrics

            metrics.inference_log_opened(model)

            def count(outcome: str, events: int) -> None:
                metrics.observe_inference_log(model, outcome, events)

            def held(size: int) -> None:
                metrics.inference_log_queue(model, size)

            def delivered(seconds: float) -> None:
                metrics.inference_log_delivered(model, seconds)

            shipper = Shipper(plan, count, held, delivered)
        else:
            shipper = Shipper(plan, lambda _outcome, _events: None, lambda _size: None, None)
        try:
            shipper.start()
        except Exception as exc:
            log.error("inference log to %s not started: %s: %s", plan.url or plan.path, type(exc).__name__, exc)
            return
        self.shipper = shipper
        log.info(
            "inference log: %s of %g of the requests to %s (%s), at most %d bytes held",
            plan.mode,
            plan.sample,
            plan.url or plan.path,
            "KServe's CloudEvents" if plan.url else "JSON lines",
            plan.max_bytes,
        )

    def capture(
        self,
        environ: WSGIEnvironment,
        body: bytes | None,
        reply: Reply,
        inputs: Callable[[], JsonDocument | None] | None,
        arrived_ns: int,
        v2: bool = False,
    ) -> None:
        """The data plane, a reply made: keep what `settle` will log of this request (references only)."""
        plan = self.plan
        if plan is None or self.shipper is None:
            return
        self.settle()  # one left unsettled (no post_request ran): logged now rather than lost
        if reply.status != 200 and not plan.failures:
            return
        if plan.sample < 1.0 and random.random() >= plan.sample:
            return
        metadata: dict[str, list[str]] = {}
        for key, name in zip(plan.headers, plan.header_names, strict=True):
            value = environ.get(key)
            if value is not None:
                metadata[name] = [value]
        asked = environ.get(CE_ID_ENVIRON)
        ce_id = asked if asked and len(asked) <= MAX_CE_ID and asked.isprintable() else request_id.current() or ""
        self._pending.exchange = Exchange(
            ce_id=ce_id,
            endpoint=environ.get("PATH_INFO", ""),
            request_time=arrived_ns / 1e9,
            request_type=environ.get("CONTENT_TYPE", ""),
            request_body=body or b"",
            request_header_length=_length(environ.get(BINARY_ENVIRON)),
            metadata=metadata,
            status=reply.status,
            response_time=time.time(),
            response_type=reply.header("Content-Type") or "",
            response_body=reply.body,
            response_header_length=_length(reply.header(BINARY_HEADER)),
            inputs=inputs,
            sides=(plan.requests, plan.responses),
            v2=v2,
        )

    def settle(self) -> None:
        """After the reply has left (post_request, or a gRPC call's end): this thread's exchange into the buffer."""
        exchange: Exchange | None = getattr(self._pending, "exchange", None)
        shipper = self.shipper
        if exchange is None or shipper is None or self.plan is None:
            return
        self._pending.exchange = None
        shipper.put(exchange)  # references only: the shipper's thread makes the events

    def close(self) -> None:
        """Worker, worker_exit: what is held is sent within the plan's close time; the rest is counted dropped."""
        self.settle()
        shipper, self.shipper = self.shipper, None
        if shipper is not None and self.plan is not None:
            shipper.close(self.plan.close_seconds)


def _length(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None
