"""A light closed-loop HTTP load generator: C connections, each sending its next request when the last returns.

Why it is shaped this way: on a 2-core box the client shares the CPU with the
server, so it must cost little per request. The connections are spread over
several processes (`conns_per_process` each, one thread per connection; the
threads block in socket calls, which release the GIL), each connection is a
persistent keep-alive connection (`bench.rawhttp`: one sendall of request bytes
prepared once, one parse of the reply). gunicorn's sync workers close the
connection after every reply; the next request then reconnects.

The processes are started once (spawn: a clean interpreter, nothing inherited)
and reused for every concurrency step. All of them read the same clock
(CLOCK_MONOTONIC is system-wide on Linux), so a step is one shared schedule:
warm-up until t0, then the measured window [t0, t_end]. A request counts when
it completes inside the window.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import multiprocessing as mp
import multiprocessing.sharedctypes
import queue
import resource
import threading
import time
import urllib.parse
from array import array
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnxpool.measure.cycle import RequestCycle
from onnxpool.measure.payloads import PreparedRequest
from onnxpool.measure.rawhttp import RawConnection, wire_bytes
from onnxpool.measure.repeats import RepeatWorkload

Workload = PreparedRequest | RepeatWorkload | RequestCycle
"""One request sent again and again, a stream of requests with repeats (`bench.repeats`), or a cycle of requests."""

# Exceptions after which a reused keep-alive connection is retried once on a
# fresh one: the server may close an idle connection between two requests.
STALE_CONNECTION = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


@dataclass(frozen=True)
class StepPlan:
    """One concurrency step: `warmup` seconds, then `duration` seconds or `requests` requests."""

    concurrency: int
    warmup: float
    duration: float | None = None
    requests: int | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if (self.duration is None) == (self.requests is None):
            raise ValueError("give exactly one of duration or requests")


@dataclass
class StepResult:
    """What one step measured (latencies in seconds)."""

    concurrency: int
    seconds: float
    latencies: np.ndarray
    errors: dict[str, int] = field(default_factory=dict)
    items_per_request: int = 1
    client_cpu_seconds: float = 0.0

    @property
    def requests(self) -> int:
        return int(self.latencies.size) + sum(self.errors.values())

    @property
    def ok(self) -> int:
        return int(self.latencies.size)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def throughput(self) -> float:
        """Successful requests per second."""
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    @property
    def items_per_second(self) -> float:
        return self.throughput * self.items_per_request

    def percentile(self, q: float) -> float:
        """Latency percentile in seconds (NaN when nothing succeeded)."""
        return float(np.percentile(self.latencies, q)) if self.latencies.size else float("nan")

    @property
    def max_latency(self) -> float:
        return float(self.latencies.max()) if self.latencies.size else float("nan")

    @property
    def client_cpu_per_request(self) -> float:
        """Load-generator CPU seconds spent per request (all its processes)."""
        return self.client_cpu_seconds / self.requests if self.requests else float("nan")

    @property
    def client_cpu_cores(self) -> float:
        """Load-generator CPU use as a number of cores busy over the window."""
        return self.client_cpu_seconds / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """Plain numbers for CSV/JSON (latencies in milliseconds)."""
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "errors": self.error_count,
            "seconds": round(self.seconds, 3),
            "throughput_rps": round(self.throughput, 2),
            "items_per_s": round(self.items_per_second, 2),
            "p50_ms": round(self.percentile(50) * 1000, 2),
            "p90_ms": round(self.percentile(90) * 1000, 2),
            "p99_ms": round(self.percentile(99) * 1000, 2),
            "max_ms": round(self.max_latency * 1000, 2),
            "client_cpu_ms_per_req": round(self.client_cpu_per_request * 1000, 3),
            "client_cpu_cores": round(self.client_cpu_cores, 3),
            "error_kinds": dict(self.errors),
        }


def _cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class _Command:
    """What the parent tells a worker process for one step."""

    connections: tuple[int, ...]
    t0: float
    t_end: float | None
    requests_per_connection: tuple[int, ...] | None


@dataclass
class _ConnectionResult:
    latencies: array[float] = field(default_factory=lambda: array("d"))
    errors: Counter[str] = field(default_factory=Counter)


def _drive(
    host: str,
    port: int,
    request: Workload,
    command: _Command,
    slot: int,
    counter: Any,
    timeout: float,
    out: _ConnectionResult,
) -> None:
    """One connection's closed loop (runs in its own thread inside a worker process)."""
    conn = RawConnection(host, port, timeout)
    wanted = command.requests_per_connection[slot] if command.requests_per_connection else None
    index = command.connections[slot]
    wires = _wires(request, host, port, index, f"{command.t0:.6f}")
    done = 0
    try:
        while True:
            now = time.monotonic()
            if command.t_end is not None and now >= command.t_end:
                return
            if wanted is not None and done >= wanted:
                return
            wire = next(wires)
            start = time.monotonic()
            outcome: int | str
            try:
                reused = conn.sock is not None
                try:
                    outcome = conn.exchange(wire)
                except STALE_CONNECTION:
                    if not reused:
                        raise
                    conn.close()
                    outcome = conn.exchange(wire)
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                outcome = type(exc).__name__
            end = time.monotonic()
            if end < command.t0 or (command.t_end is not None and end > command.t_end):
                if isinstance(outcome, str):
                    time.sleep(0.01)  # e.g. connection refused during warm-up: do not spin
                continue
            done += 1
            counter[index] += 1  # only this thread writes this slot
            if isinstance(outcome, int) and outcome < 400:
                out.latencies.append(end - start)
            else:
                out.errors[str(outcome)] += 1
                if isinstance(outcome, str):
                    time.sleep(0.01)
    finally:
        conn.close()


def _wires(request: Workload, host: str, port: int, connection: int, step: str) -> Iterator[bytes]:
    if isinstance(request, PreparedRequest):
        return itertools.repeat(wire_bytes(request, host, port))
    if isinstance(request, RequestCycle):
        return request.wires(host, port, connection)
    return request.wires(host, port, connection, step)


def _worker_main(url: str, request: Workload, counter: Any, commands: Any, results: Any, timeout: float) -> None:
    """A load-generator process: runs one step per command until it gets None."""
    parsed = urllib.parse.urlsplit(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    while True:
        command: _Command | None = commands.get()
        if command is None:
            return
        outs = [_ConnectionResult() for _ in command.connections]
        threads = [
            threading.Thread(
                target=_drive, args=(host, port, request, command, slot, counter, timeout, outs[slot]), daemon=True
            )
            for slot in range(len(command.connections))
        ]
        for thread in threads:
            thread.start()
        time.sleep(max(0.0, command.t0 - time.monotonic()))
        cpu_start = _cpu_seconds(resource.RUSAGE_SELF)
        for thread in threads:
            thread.join()
        cpu = _cpu_seconds(resource.RUSAGE_SELF) - cpu_start
        latencies = array("d")
        errors: Counter[str] = Counter()
        for out in outs:
            latencies.extend(out.latencies)
            errors.update(out.errors)
        results.put((latencies.tobytes(), dict(errors), cpu, time.monotonic()))


Status = Callable[[str], None]


class LoadGenerator:
    """A pool of load-generator processes for one URL and one prepared request.

    `with LoadGenerator(url, request, max_concurrency=8) as gen: gen.run_step(StepPlan(...))`.
    """

    def __init__(
        self,
        url: str,
        request: Workload,
        max_concurrency: int,
        *,
        conns_per_process: int = 2,
        timeout: float = 60.0,
    ) -> None:
        if conns_per_process < 1:
            raise ValueError(f"conns_per_process must be >= 1, got {conns_per_process}")
        self.url = url
        self.request = request
        self.max_concurrency = max_concurrency
        self.processes_count = -(-max_concurrency // conns_per_process)
        self._ctx = mp.get_context("spawn")
        self._counter = multiprocessing.sharedctypes.RawArray("q", max_concurrency)
        self._results: Any = self._ctx.Queue()
        self._commands: list[Any] = []
        self._processes: list[Any] = []
        self._timeout = timeout

    def __enter__(self) -> LoadGenerator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        for _ in range(self.processes_count):
            commands = self._ctx.Queue()
            process = self._ctx.Process(
                target=_worker_main,
                args=(self.url, self.request, self._counter, commands, self._results, self._timeout),
                daemon=True,
            )
            process.start()
            self._commands.append(commands)
            self._processes.append(process)

    def close(self) -> None:
        """Stop our worker processes (each by its own handle; they finish their step first)."""
        for commands in self._commands:
            with contextlib.suppress(Exception):
                commands.put(None)
        for process in self._processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)
        self._processes.clear()
        self._commands.clear()

    def run_step(self, plan: StepPlan, status: Status | None = None) -> StepResult:
        """Run one step on all processes; `status` gets a one-line progress text about once a second."""
        if plan.concurrency > self.max_concurrency:
            raise ValueError(f"concurrency {plan.concurrency} exceeds this generator's {self.max_concurrency}")
        for i in range(plan.concurrency):
            self._counter[i] = 0
        per_process = [tuple(range(p, plan.concurrency, self.processes_count)) for p in range(self.processes_count)]
        busy = [(p, conns) for p, conns in enumerate(per_process) if conns]
        t0 = time.monotonic() + 0.05 + plan.warmup
        t_end = t0 + plan.duration if plan.duration is not None else None
        parent_cpu = _cpu_seconds(resource.RUSAGE_SELF)
        for p, conns in busy:
            shares = None
            if plan.requests is not None:
                shares = tuple(
                    plan.requests // plan.concurrency + (1 if c < plan.requests % plan.concurrency else 0)
                    for c in conns
                )
            self._commands[p].put(_Command(conns, t0, t_end, shares))
        replies = self._collect(len(busy), plan, t0, t_end, status)
        latencies = np.concatenate([np.frombuffer(r[0], dtype=np.float64) for r in replies])
        errors: Counter[str] = Counter()
        for r in replies:
            errors.update(r[1])
        cpu = sum(r[2] for r in replies) + _cpu_seconds(resource.RUSAGE_SELF) - parent_cpu
        end = t_end if t_end is not None else max(r[3] for r in replies)
        return StepResult(plan.concurrency, end - t0, latencies, dict(errors), self.request.items, cpu)

    def _collect(
        self, expected: int, plan: StepPlan, t0: float, t_end: float | None, status: Status | None
    ) -> list[tuple[bytes, dict[str, int], float, float]]:
        replies: list[tuple[bytes, dict[str, int], float, float]] = []
        while len(replies) < expected:
            try:
                replies.append(self._results.get(timeout=1.0))
            except queue.Empty:
                if not all(p.is_alive() for p in self._processes):
                    raise RuntimeError("a load-generator process died") from None
            if status is not None and len(replies) < expected:
                status(self._status_text(plan, t0, t_end))
        return replies

    def _status_text(self, plan: StepPlan, t0: float, t_end: float | None) -> str:
        now = time.monotonic()
        done = sum(self._counter[i] for i in range(plan.concurrency))
        if now < t0:
            return f"concurrency {plan.concurrency}: warming up ({t0 - now:.0f}s left)"
        elapsed = now - t0
        rate = done / elapsed if elapsed > 0 else 0.0
        goal = f"{elapsed:.0f}/{t_end - t0:.0f}s" if t_end is not None else f"{done}/{plan.requests} requests"
        return f"concurrency {plan.concurrency}: {goal}, {done} requests, {rate:.1f} req/s"


def total_cpu_seconds() -> float:
    """CPU seconds of this process plus its waited-for children (the whole load generator, after close())."""
    return _cpu_seconds(resource.RUSAGE_SELF) + _cpu_seconds(resource.RUSAGE_CHILDREN)
