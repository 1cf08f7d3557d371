"""Load for the pod tests (tests/test_k8s_pod.py, deploy/container/ci_image.py): real HTTP
clients on their own connections, standard library only.

- `closed_loop`: N connections, each sending its next request when the last one
  answered (one TCP connection per request, `Connection: close`, as a sync
  worker behind nginx sees it), for a bounded time.
- `SlowClients`: connections that send a request's headers and then its body at
  one byte per second (the attack a buffering proxy is for).
- `watch`: a check (a probe) run every period, in a thread, until stopped.

Every wait is bounded: socket timeouts, and threads joined with a timeout.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

Request = tuple[str, str, bytes, dict[str, str]]  # method, path, body, headers
Check = Callable[[], tuple[bool, str]]  # a probe: (passed, what it saw)


@dataclass
class Outcome:
    """One request: its status (0 = no answer), seconds, Retry-After, and what failed."""

    status: int
    seconds: float
    retry_after: str | None = None
    error: str = ""
    connected: bool = True  # False: refused before a byte was sent (not lost, never accepted)


def read_reply(sock: socket.socket) -> tuple[int, dict[str, str]]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} bytes of the reply head")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {len(rest)} of {length} body bytes")
        rest += chunk
    return status, headers


def send(host: str, port: int, request: Request, timeout: float = 30.0) -> Outcome:
    """One request on a new connection; never raises."""
    method, path, body, headers = request
    t0 = time.monotonic()
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        return Outcome(0, time.monotonic() - t0, error=f"connect: {exc}", connected=False)
    with sock:
        try:
            head = f"{method} {path} HTTP/1.1\r\nHost: pod\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
            head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            sock.sendall(head.encode("latin-1") + b"\r\n" + body)
            status, reply = read_reply(sock)
        except (OSError, ValueError, IndexError) as exc:
            return Outcome(0, time.monotonic() - t0, error=f"{exc.__class__.__name__}: {exc}")
    return Outcome(status, time.monotonic() - t0, reply.get("retry-after"))


def closed_loop(
    host: str, port: int, request: Request, connections: int, seconds: float, stop: threading.Event | None = None
) -> list[Outcome]:
    """`connections` clients back to back for `seconds` (or until `stop` is set)."""
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    halt = stop or threading.Event()

    def client() -> None:
        while time.monotonic() < deadline and not halt.is_set():
            outcome = send(host, port, request)
            with lock:
                outcomes.append(outcome)
            if not outcome.connected:
                time.sleep(0.05)  # refused: the server is gone or going; do not spin

    threads = [threading.Thread(target=client, daemon=True) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 60)
    return outcomes


@dataclass
class SlowClients:
    """`count` connections sending `request`'s body one byte a second, in threads."""

    host: str
    port: int
    request: Request
    count: int
    stop: threading.Event = field(default_factory=threading.Event)
    bytes_sent: list[int] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)  # connections the server closed on them
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> SlowClients:
        self.bytes_sent = [0] * self.count
        for index in range(self.count):
            thread = threading.Thread(target=self._trickle, args=(index,), daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def _trickle(self, index: int) -> None:
        method, path, body, headers = self.request
        try:
            with socket.create_connection((self.host, self.port), timeout=10) as sock:
                head = f"{method} {path} HTTP/1.1\r\nHost: pod\r\nContent-Length: {len(body)}\r\n"
                head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                sock.sendall(head.encode("latin-1") + b"\r\n")
                for offset in range(len(body) - 1):  # never the last byte: the request stays open
                    if self.stop.wait(1.0):
                        return
                    sock.sendall(body[offset : offset + 1])
                    self.bytes_sent[index] += 1
        except OSError as exc:
            self.cut.append(f"client {index}: {exc.__class__.__name__}: {exc}")

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(15)


@dataclass
class Watch:
    """A check run every `period` seconds in a thread: (seconds since start, passed, detail)."""

    check: Check
    period: float
    results: list[tuple[float, bool, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def __enter__(self) -> Watch:
        t0 = time.monotonic()

        def loop() -> None:
            while not self.stop.is_set():
                ok, detail = self.check()
                self.results.append((time.monotonic() - t0, ok, detail))
                self.stop.wait(self.period)

        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(30)

    @property
    def failures(self) -> list[tuple[float, bool, str]]:
        return [r for r in self.results if not r[1]]


def http_check(host: str, port: int, path: str, timeout: float) -> Check:
    """A kubelet-like httpGet probe: 200 within `timeout` seconds."""

    def check() -> tuple[bool, str]:
        outcome = send(host, port, ("GET", path, b"", {}), timeout=timeout)
        return outcome.status == 200, f"{path}: HTTP {outcome.status} {outcome.error} {outcome.seconds:.2f} s"

    return check


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def multipart(field_name: str, filename: str, data: bytes, content_type: str) -> tuple[bytes, str]:
    boundary = "onnxpoolpodtest"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field_name}"; filename="{filename}"\r\n'
        f"Content-Type: {content_type}\r\n\r\n"
    ).encode()
    return head + data + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


@dataclass
class Overload:
    """A closed loop past the shedding limit, sorted: served (seconds), shed, other replies, probe failures."""

    served: list[float]
    shed: list[Outcome]
    other: list[Outcome]
    failures: list[tuple[float, bool, str]]
    p99: float
    bound: float
    """What the served p99 must stay under: the queue limit, plus the request's own service and a few
    more (nginx, the load generator and the shed replies share this quota-limited box), plus slack."""

    @property
    def ok(self) -> bool:
        return (
            bool(self.shed)
            and all(o.retry_after == "1" for o in self.shed)
            and not self.other
            and not self.failures
            and self.p99 <= self.bound
        )


def overload(outcomes: list[Outcome], watches: list[Watch], max_queue: float, service: float) -> Overload:
    served = [o.seconds for o in outcomes if o.status == 200]
    return Overload(
        served=served,
        shed=[o for o in outcomes if o.status == 503],
        other=[o for o in outcomes if o.status not in (200, 503)],
        failures=[r for w in watches for r in w.failures],
        p99=percentile(served, 0.99),
        bound=max_queue + 10 * service + 0.25,
    )
