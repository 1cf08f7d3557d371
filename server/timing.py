"""Per-request phase timer: queue, decode, infer, encode and the total.

One `RequestTimer` per request feeds both the Prometheus histograms and the
`Server-Timing` header, so the two always agree. It is created by the WSGI
middleware (`server.instrument`) as early as possible and kept in the WSGI
environ, because the middleware reads it again after Flask has torn its request
context down. Code inside a request marks its phases with:

    with phase("decode"):
        ...

Outside a request (or with no timer) `phase` does nothing, so library code
may use it freely.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from flask import has_request_context, request

ENVIRON_KEY = "onnxpool.timer"
PHASES = ("queue", "decode", "infer", "encode")


class RequestTimer:
    """Accumulated seconds per phase of one request, from a perf_counter start."""

    __slots__ = ("_open", "phases", "queue", "start")

    def __init__(self, queue: float | None = None) -> None:
        self.start = time.perf_counter()
        self.queue = queue
        self.phases: dict[str, float] = {}
        self._open: set[str] = set()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block into `name`; a phase nested in itself is counted once."""
        if name in self._open:
            yield
            return
        self._open.add(name)
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - begin
            self._open.discard(name)

    def breakdown(self) -> dict[str, float]:
        """Seconds per phase in PHASES order (queue first when known), then any others."""
        parts = {"queue": self.queue} if self.queue is not None else {}
        parts.update((name, self.phases[name]) for name in PHASES if name in self.phases)
        parts.update((name, secs) for name, secs in self.phases.items() if name not in parts)
        return parts

    def total(self) -> float:
        """Seconds from the proxy's arrival stamp (or our first look at the request) until now."""
        return (self.queue or 0.0) + time.perf_counter() - self.start

    def server_timing(self) -> str:
        """`Server-Timing` value, in milliseconds: `queue;dur=1.2, decode;dur=0.4, ..., total;dur=11.6`."""
        parts = [f"{name};dur={secs * 1000:.2f}" for name, secs in self.breakdown().items()]
        parts.append(f"total;dur={self.total() * 1000:.2f}")
        return ", ".join(parts)


def current() -> RequestTimer | None:
    """The timer of the request being served, if any."""
    if not has_request_context():
        return None
    timer: RequestTimer | None = request.environ.get(ENVIRON_KEY)
    return timer


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as phase `name` of the current request (no-op outside one)."""
    timer = current()
    if timer is None:
        yield
        return
    with timer.phase(name):
        yield
