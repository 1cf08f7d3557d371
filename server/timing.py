"""Per-request phase timer: queue, decode, infer, encode and the total.

One `RequestTimer` per request feeds both the Prometheus histograms and the
`Server-Timing` header, so the two always agree. It is created by the WSGI
middleware (`server.instrument`) as early as possible and kept in the request's
state (`server.request_state`), because the middleware reads it again after Flask
has torn its request context down. It also carries the request's `X-Request-Start` stamp, parsed
once by the middleware, for admission control to judge the wait at its own
moment. Code inside a request marks its phases with
`server.request_state.phase("decode")`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from onnxpool.server.request_start import seconds_since

PHASES = ("queue", "decode", "infer", "encode")


class RequestTimer:
    """Accumulated seconds per phase of one request, from a perf_counter start.

    `arrived` is the proxy's `X-Request-Start` stamp (Unix seconds, None without
    one) and `queue` the wait it meant when the middleware first saw the request.
    """

    __slots__ = ("_open", "arrived", "phases", "queue", "start")

    def __init__(self, queue: float | None = None, arrived: float | None = None) -> None:
        self.start = time.perf_counter()
        self.queue = queue
        self.arrived = arrived
        self.phases: dict[str, float] = {}
        self._open: set[str] = set()

    @classmethod
    def arriving(cls, stamp: float | None) -> RequestTimer:
        """The timer of a request seen now, which the proxy stamped `stamp` (None: no stamp)."""
        return cls(seconds_since(stamp, time.time()), stamp)

    def waited(self, now: float) -> float | None:
        """Seconds since the proxy's stamp as of `now` (Unix time); None if unknown or a wrong clock.

        Not `queue` (the wait until the middleware saw the request): admission judges
        at its own moment, so the v2 `timeout` check, after the body is read and
        decoded, counts that time too.
        """
        return seconds_since(self.arrived, now)

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

    def server_timing(self, total: float | None = None) -> str:
        """`Server-Timing` value, in milliseconds: `queue;dur=1.2, decode;dur=0.4, ..., total;dur=11.6`.

        `total`: the request's total as taken when its reply left the app (default: now).
        """
        if total is None:
            total = self.total()
        parts = [f"{name};dur={secs * 1000:.2f}" for name, secs in self.breakdown().items()]
        parts.append(f"total;dur={total * 1000:.2f}")
        return ", ".join(parts)
