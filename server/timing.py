"""Per-request phase timer: queue, decode, infer, encode and the total.

One `RequestTimer` per request feeds both the Prometheus histograms and the
`Server-Timing` header, so the two always agree. It is created by the WSGI
middleware (`server.instrument`) as early as possible and kept in the request's
state (`server.request_state`), because the middleware reads it again after Flask
has torn its request context down. It also carries the request's `X-Request-Start` stamp, parsed
once by the middleware, for admission control to judge the wait at its own
moment. Code inside a request marks its phases with
`server.request_state.phase("decode")`.

With tracing on (`server.tracing`), the same clock readings also make the request's spans: a
traced request's timer keeps each phase's (begin, end) perf_counter pair in `spans`, beside
the sums, and `server.tracing_spans` turns them into child spans after the reply, on the wall
clock read once with `start` (`wall_ns`). So the spans, Server-Timing and the histograms
agree by construction: nothing is timed twice. Untraced, `spans` is None and a phase costs
one test more.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from onnxpool.server.request_start import seconds_since

PHASES = ("queue", "decode", "infer", "encode")

Attributes = dict[str, Any]
"""A span's attributes: str, bool, int, float (or sequences of one of them), as OpenTelemetry takes them."""
Interval = tuple[str, float, float, Attributes | None]
"""A traced block: its name, begin and end (perf_counter seconds) and its attributes."""


class RequestTimer:
    """Accumulated seconds per phase of one request, from a perf_counter start.

    `arrived` is the proxy's `X-Request-Start` stamp (Unix seconds, None without
    one) and `queue` the wait it meant when the middleware first saw the request.
    `wall_ns` is the Unix time (ns) read with `start`, the origin of the spans' times.
    """

    __slots__ = ("_open", "arrived", "attributes", "phases", "queue", "spans", "start", "wall_ns", "wide")

    def __init__(self, queue: float | None = None, arrived: float | None = None, wall_ns: int | None = None) -> None:
        self.start = time.perf_counter()
        self.wall_ns = time.time_ns() if wall_ns is None else wall_ns
        self.queue = queue
        self.arrived = arrived
        self.phases: dict[str, float] = {}
        self._open: set[str] = set()
        self.spans: list[Interval] | None = None
        """Traced requests only (`server.tracing_spans` sets a list): every timed block, as it ended."""
        self.attributes: Attributes | None = None
        """Traced requests only: facts for the request's server span (why it was shed...)."""
        self.wide = 0
        """The threads of this request's widest inference if one ran wide (workers/wide.py), else 0."""

    @classmethod
    def arriving(cls, stamp: float | None) -> RequestTimer:
        """The timer of a request seen now, which the proxy stamped `stamp` (None: no stamp)."""
        now = time.time_ns()
        return cls(seconds_since(stamp, now / 1e9), stamp, now)

    def waited(self, now: float) -> float | None:
        """Seconds since the proxy's stamp as of `now` (Unix time); None if unknown or a wrong clock.

        Not `queue` (the wait until the middleware saw the request): admission judges
        at its own moment, so the v2 `timeout` check, after the body is read and
        decoded, counts that time too.
        """
        return seconds_since(self.arrived, now)

    @contextmanager
    def phase(self, name: str, attributes: Attributes | None = None) -> Iterator[None]:
        """Time the block into `name`; a phase nested in itself is counted once.

        `attributes` go to its span when the request is traced (the inference's batch size...).
        """
        if name in self._open:
            yield
            return
        self._open.add(name)
        begin = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            self.phases[name] = self.phases.get(name, 0.0) + end - begin
            self._open.discard(name)
            if self.spans is not None:
                self.spans.append((name, begin, end, attributes))

    def mark(self, name: str, begin: float, end: float, attributes: Attributes | None = None) -> None:
        """A block timed elsewhere (perf_counter readings), kept as a span of a traced request only.

        The response cache's look-up, timed once for its own Server-Timing field, is one.
        """
        if self.spans is not None:
            self.spans.append((name, begin, end, attributes))

    def step(self, name: str, attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[Attributes]:
        """A block of a task's own (`Runner.span`): a span of a traced request, no phase of the metrics.

        Yields a dict the block may add attributes to (once it knows them: a token count...).
        Untraced, it times nothing and the dict is thrown away.
        """
        if self.spans is None:
            return nullcontext({})
        return self._step(name, dict(attributes or {}))

    @contextmanager
    def _step(self, name: str, attributes: Attributes) -> Iterator[Attributes]:
        begin = time.perf_counter()
        try:
            yield attributes
        finally:
            self.mark(name, begin, time.perf_counter(), attributes)

    def annotate(self, key: str, value: str | bool | int | float) -> None:
        """A fact for the request's server span (traced requests only)."""
        if self.attributes is not None:
            self.attributes[key] = value

    def epoch_ns(self, perf: float) -> int:
        """A perf_counter reading of this request as Unix time in ns (the spans' clock)."""
        return self.wall_ns + round((perf - self.start) * 1e9)

    def breakdown(self) -> dict[str, float]:
        """Seconds per phase in PHASES order (queue first when known), then any others."""
        parts = {"queue": self.queue} if self.queue is not None else {}
        parts.update((name, self.phases[name]) for name in PHASES if name in self.phases)
        parts.update((name, secs) for name, secs in self.phases.items() if name not in parts)
        return parts

    def total(self, now: float | None = None) -> float:
        """Seconds from the proxy's arrival stamp (or our first look at the request) until `now`
        (a perf_counter reading; default: read now)."""
        return (self.queue or 0.0) + (time.perf_counter() if now is None else now) - self.start

    def server_timing(self, total: float | None = None) -> str:
        """`Server-Timing` value, in milliseconds: `queue;dur=1.2, decode;dur=0.4, ..., total;dur=11.6`
        (then `wide;desc="2 threads"` when an inference ran on the model's idle workers' cores too).

        `total`: the request's total as taken when its reply left the app (default: now).
        """
        if total is None:
            total = self.total()
        parts = [f"{name};dur={secs * 1000:.2f}" for name, secs in self.breakdown().items()]
        parts.append(f"total;dur={total * 1000:.2f}")
        if self.wide:  # a metric without a duration: how many threads the inference had
            parts.append(f'wide;desc="{self.wide} threads"')
        return ", ".join(parts)
