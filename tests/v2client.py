"""A small Open Inference Protocol v2 binary-tensor client, and a bounded load loop.

Used by the deployment, reload and pool tests. Bodies are encoded and replies
decoded by the server's own client codec (`onnxpool.server.v2codec`); this
module adds the HTTP checks around it. Every reply is checked end to end:
status 200, the body as long as Content-Length says, every binary output
exactly as large as its JSON header declares; a reply that fails any check is
counted, never silently accepted.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import requests

from onnxpool.server.v2codec import BINARY_HEADER, decode_infer_response, encode_infer_request, parse_header_length
from onnxpool.tasks.errors import OnnxpoolError


@dataclass(frozen=True)
class InferCall:
    """A ready-to-send binary infer request."""

    path: str
    body: bytes
    headers: dict[str, str]
    output: str


def binary_infer(model: str, array: np.ndarray, input_name: str = "input", output_name: str = "logits") -> InferCall:
    """A v2 infer request carrying `array` as FP32 binary tensor data and asking for a binary output."""
    encoded = encode_infer_request(
        {input_name: np.asarray(array, dtype=np.float32)}, {input_name}, binary_output=True, outputs=[output_name]
    )
    return InferCall(path=f"/v2/models/{model}/infer", body=encoded.body, headers=encoded.headers, output=output_name)


class BadReply(Exception):
    """A reply that is not a complete, well-formed 200 infer response."""


def decode_reply(response: requests.Response) -> dict[str, np.ndarray]:
    """All outputs of a 200 infer reply (JSON or binary), by name; BadReply if anything is off."""
    if response.status_code != 200:
        raise BadReply(f"HTTP {response.status_code}: {response.content[:200]!r}")
    body = response.content
    declared = response.headers.get("Content-Length")
    if declared is not None and int(declared) != len(body):
        raise BadReply(f"truncated: Content-Length {declared}, got {len(body)} bytes")
    try:
        return decode_infer_response(body, parse_header_length(response.headers.get(BINARY_HEADER)))
    except OnnxpoolError as exc:  # the codec speaks server errors (400); to a client it is a bad reply
        raise BadReply(exc.message) from None


def parse_binary_reply(response: requests.Response, output: str) -> np.ndarray:
    """The named output of a binary infer reply; BadReply if anything is off."""
    outputs = decode_reply(response)
    if BINARY_HEADER not in response.headers:
        raise BadReply(f"no {BINARY_HEADER}: not a binary reply")
    if output not in outputs:
        raise BadReply(f"no output {output!r} in {sorted(outputs)}")
    return outputs[output]


@dataclass
class LoadStats:
    """What a load run saw: counts, failure messages, and (finish time, first output value) per success."""

    sent: int = 0
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    marks: list[tuple[float, float]] = field(default_factory=list)
    seconds: float = 0.0
    stale: int = 0
    """Requests sent again because nginx closed their reused keep-alive connection as they were sent
    (`LoadRunner(retry_stale=True)`): never read by the server, so not lost."""

    @property
    def failed(self) -> int:
        return len(self.failures)

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0


class LoadRunner:
    """`clients` threads sending `call` to `base_url` until stopped, `max_requests` or `max_seconds`.

    Each thread keeps one HTTP connection (requests.Session). Always bounded:
    a forgotten runner ends by itself after max_seconds.
    """

    def __init__(
        self,
        base_url: str,
        call: InferCall,
        clients: int = 3,
        max_requests: int = 5000,
        max_seconds: float = 60.0,
        timeout: float = 30.0,
        retry_stale: bool = False,
    ) -> None:
        self.retry_stale = retry_stale
        """Send a request again, once, on a new connection when its reused keep-alive connection was
        closed as it was sent: nginx (before 1.27.4) closes idle keep-alive connections at once when it
        reloads or stops, and a request already on its way is then never read. Browsers and Go's client
        retry so; python-requests does not. Counted in `stats.stale`, never as a success of its own."""
        self.url = base_url + call.path
        self.call = call
        self.clients = clients
        self.max_requests = max_requests
        self.max_seconds = max_seconds
        self.timeout = timeout
        self.stats = LoadStats()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._started = 0.0

    def start(self) -> LoadRunner:
        self._started = time.monotonic()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.clients)]
        for thread in self._threads:
            thread.start()
        return self

    def run(self) -> LoadStats:
        """Start, wait until max_requests or max_seconds is reached, return the stats."""
        self.start()
        for thread in self._threads:
            thread.join(self.max_seconds + self.timeout + 5)
        return self.stop()

    def wait_for(self, successes: int, timeout: float = 30.0) -> None:
        """Block until at least `successes` requests succeeded (or raise TimeoutError)."""
        deadline = time.monotonic() + timeout
        while self.stats.ok < successes:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {self.stats.ok} of {successes} requests succeeded; {self.stats.failures[:3]}")
            time.sleep(0.02)

    def stop(self) -> LoadStats:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout + 5)
        self.stats.seconds = time.monotonic() - self._started
        return self.stats

    def _take_ticket(self) -> bool:
        with self._lock:
            over = time.monotonic() - self._started > self.max_seconds
            if self._stop.is_set() or over or self.stats.sent >= self.max_requests:
                return False
            self.stats.sent += 1
            return True

    def _client(self) -> None:
        with requests.Session() as session:
            while self._take_ticket():
                try:
                    try:
                        response = session.post(
                            self.url, data=self.call.body, headers=self.call.headers, timeout=self.timeout
                        )
                    except requests.ConnectionError as exc:
                        if not (self.retry_stale and closed_as_sent(exc)):
                            raise
                        with self._lock:
                            self.stats.stale += 1
                        session.close()  # the next request opens a new connection
                        response = session.post(
                            self.url, data=self.call.body, headers=self.call.headers, timeout=self.timeout
                        )
                    value = float(parse_binary_reply(response, self.call.output).flat[0])
                except (requests.RequestException, BadReply, ValueError, KeyError) as exc:
                    with self._lock:
                        self.stats.failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                with self._lock:
                    self.stats.ok += 1
                    self.stats.marks.append((time.monotonic(), value))


def closed_as_sent(exc: requests.ConnectionError) -> bool:
    """The connection was closed before any reply: reset or closed by the peer as the request went out
    ("Connection aborted"), not refused, not timed out, not cut in the middle of a reply."""
    return "Connection aborted" in str(exc) and ("RemoteDisconnected" in str(exc) or "reset by peer" in str(exc))
