"""A worker's inference log on its way out: a byte-bounded buffer, ONE shipper thread, and the sink.

Made by `server.inference_log.InferenceLog.open` in each worker after fork, never in the master:
the thread, its lock and the HTTP connection must not cross fork (a thread alive at fork leaves
its locks half-owned in every child).

- `Buffer`: what the requests leave behind, in arrival order, held to `max_bytes` (their bodies'
  bytes and a little more: what their events will take). `put` never waits: a request that does
  not fit is refused at once and its events counted as dropped, so a sink that is down or slow
  costs memory up to the bound and no request a moment (KServe's logger held one goroutine per
  event instead: kserve #6167).
- `Shipper`: the thread that empties it, and makes the events: what a request left (its body and
  reply, references) becomes KServe's CloudEvents or a file's record here, not in the worker's
  request thread. For a CloudEvents sink each event is one POST (binary content mode has no
  batches), all of them over one kept-alive urllib3 connection, taken from the buffer as a batch;
  a refused (5xx) or unreachable sink is retried with doubling back-off, then the event is counted
  as failed. For files, what a `flush_seconds` window gathered is written in one `write`.
- `close`: the worker is leaving (TERM, a HUP's replacement, max_requests): the thread sends what
  is held for at most the plan's close time; what is still held then is counted as dropped.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

import urllib3

from onnxpool.server.inference_log_events import Event, Exchange, cloudevents, record_document
from onnxpool.server.inference_log_plan import InferenceLogPlan
from onnxpool.tasks import jsonfast

if TYPE_CHECKING:
    from onnxpool.server.inference_log_parquet import ParquetFile

log = logging.getLogger("onnxpool.inference_log")

Count = Callable[[str, int], None]
"""(outcome, events): sent, dropped or failed."""
Held = Callable[[int], None]
"""The buffer's bytes, after each change the shipper makes."""
Delivered = Callable[[float], None]
"""Seconds from an event's enqueueing to the sink taking it."""

BACKOFF_FIRST, BACKOFF_MOST = 0.1, 5.0
ITEM_OVERHEAD = 1024
"""Bytes a request's events take besides its two bodies (attributes, metadata, the objects)."""
EAGER_SHARE = 2
"""Files: the shipper wakes before `flush_seconds` once the buffer is 1/EAGER_SHARE full."""


@dataclass(slots=True)
class Item:
    """One request in the buffer: what it left (rendered by the shipper), when it was put, its bytes."""

    exchange: Exchange
    put_at: float
    size: int
    events: int
    """What it counts as: a CloudEvent per side logged, or one file record."""
    released: bool = False
    """Its bytes are back in the buffer's bound (the shipper finished it)."""


class Buffer:
    """Byte-bounded FIFO between the requests and the shipper (see the module doc).

    The bound covers what the shipper has taken and not yet finished too (`release`): a sink that
    takes 2 s per POST must not let a second `max_bytes` pile up behind the batch in its hands.
    """

    def __init__(self, max_bytes: int, eager: bool) -> None:
        self.max_bytes = max_bytes
        self._eager = eager
        self._items: deque[Item] = deque()
        self._bytes = 0
        """Every byte held: queued, and taken but not yet released."""
        self._queued = 0
        self._ready = threading.Condition(threading.Lock())
        self.closing = False

    @property
    def held(self) -> int:
        return self._bytes

    def put(self, item: Item) -> bool:
        """Keep `item` if it fits (never waits); False: it did not, and is dropped."""
        with self._ready:
            if self.closing or self._bytes + item.size > self.max_bytes:
                return False
            before = self._queued
            self._items.append(item)
            self._bytes += item.size
            self._queued += item.size
            # Wake the shipper only when it may be waiting (it takes everything queued once awake): HTTP at
            # the first event, files as the queue crosses its share.
            threshold = self.max_bytes // EAGER_SHARE
            if (self._eager and not before) or (not self._eager and before < threshold <= self._queued):
                self._ready.notify()
        return True

    def take(self, wait: float) -> list[Item]:
        """Everything queued, after waiting at most `wait` s for the first item (files: the whole window);
        its bytes stay held until `release`d."""
        with self._ready:
            if self._eager:
                if not self._items and not self.closing:
                    self._ready.wait(wait)
            elif not self.closing and self._queued * EAGER_SHARE < self.max_bytes:
                self._ready.wait(wait)
            items = list(self._items)
            self._items.clear()
            self._queued = 0
        return items

    def release(self, size: int) -> None:
        """The shipper is done with `size` bytes it took (sent, written or failed): room for new events."""
        with self._ready:
            self._bytes -= size

    def close(self) -> None:
        with self._ready:
            self.closing = True
            self._ready.notify_all()


Done = Callable[[Item], None]
"""Called by a sink as it finishes each item (its bytes are released)."""


class Sink(Protocol):
    def deliver(self, items: list[Item], abort: threading.Event, done: Done) -> tuple[int, int]:
        """Send or write `items` in order, `done(item)` after each: (sent, failed); on `abort` the rest fail."""

    def close(self) -> None: ...


class HttpSink:
    """A CloudEvents HTTP sink: one POST per event (binary mode), one kept-alive connection, retries.

    urllib3's pool directly (requests' own transport): a session's per-call work (proxy and netrc look-ups in
    the environment, cookie jars, hooks) is CPU the worker's request thread would wait for under the GIL.
    """

    def __init__(self, plan: InferenceLogPlan, delivered: Delivered | None) -> None:
        self.plan = plan
        self.delivered = delivered
        # One connection (one thread sends), kept alive; no urllib3 retries: ours back off and can be cut short.
        self.pool = urllib3.connectionpool.connection_from_url(plan.url, maxsize=1, block=False)
        self.path = urllib3.util.parse_url(plan.url).request_uri
        self.timeout = urllib3.Timeout(total=plan.timeout_seconds)
        self.backoff = 0.0
        """The pause before the next attempt while the sink keeps failing (0: it answered last time)."""
        self.closing = False
        """The worker is leaving: a sink already failing is not waited for again (the rest is counted)."""

    def deliver(self, items: list[Item], abort: threading.Event, done: Done) -> tuple[int, int]:
        sent = failed = 0
        for item in items:
            try:
                events = cloudevents(self.plan, item.exchange, time.time())
            except Exception as exc:  # a bug of ours must not stop the others
                log.error("inference log: request %s not logged: %s: %s", item.exchange.ce_id, type(exc).__name__, exc)
                failed += item.events
                done(item)
                continue
            for event in events:
                if not abort.is_set() and self._send(event, abort):
                    sent += 1
                    if self.delivered is not None:
                        self.delivered(time.monotonic() - item.put_at)
                else:
                    failed += 1
            done(item)
        return sent, failed

    def _send(self, event: Event, abort: threading.Event) -> bool:
        for _attempt in range(self.plan.retries + 1):
            if self.backoff and self.closing:
                return False  # failing as the worker leaves: its exit is not held for back-offs
            if self.backoff and abort.wait(self.backoff):
                return False
            try:
                reply = self.pool.urlopen(
                    "POST", self.path, body=event.body, headers=event.headers, retries=False,
                    timeout=self.timeout, assert_same_host=False,
                )  # fmt: skip
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                self._failed(type(exc).__name__)
                continue
            status = reply.status
            if status < 300:
                self.backoff = 0.0
                return True
            if status < 500 and status not in (408, 429):
                self.backoff = 0.0  # the sink answers, and refuses this event: another try would be refused too
                log.warning("inference log: %s refused an event: HTTP %d", self.plan.url, status)
                return False
            self._failed(f"HTTP {status}")
        return False

    def _failed(self, why: str) -> None:
        if not self.backoff:
            log.warning(
                "inference log: %s failed (%s); retrying with back-off, dropping what does not fit",
                self.plan.url,
                why,
            )
        self.backoff = min(BACKOFF_MOST, max(BACKOFF_FIRST, self.backoff * 2))

    def close(self) -> None:
        self.pool.close()


class FileSink:
    """Files in `path`, a file per worker at a time (no two processes append to one file), rotated: JSON
    lines, or Parquet (`server.inference_log_parquet`, imported here, in this thread, at the first write)."""

    def __init__(self, plan: InferenceLogPlan, delivered: Delivered | None) -> None:
        self.plan = plan
        self.delivered = delivered
        self.folder = Path(plan.path)
        self._file: IO[bytes] | None = None
        self._parquet: ParquetFile | None = None
        self._path: Path | None = None
        self._opened_at = 0.0
        self._written = 0
        self._serial = 0

    def _rotate(self) -> None:
        """Close the current file if it is full or old, and open a new one if none is open."""
        now = time.monotonic()
        if self._path is not None and (
            self._written >= self.plan.rotate_bytes or now - self._opened_at >= self.plan.rotate_seconds
        ):
            self.close()
        if self._path is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._serial += 1
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            suffix = "parquet" if self.plan.format == "parquet" else "jsonl"
            path = self.folder / f"{self.plan.model}-{stamp}-{os.getpid()}-{self._serial}.{suffix}"
            if self.plan.format == "parquet":
                from onnxpool.server.inference_log_parquet import ParquetFile

                self._parquet = ParquetFile(path)
            else:
                self._file = open(path, "ab")
            self._path, self._opened_at, self._written = path, now, 0

    def deliver(self, items: list[Item], abort: threading.Event, done: Done) -> tuple[int, int]:
        try:
            return self._write(items)
        finally:
            for item in items:
                done(item)

    def _write(self, items: list[Item]) -> tuple[int, int]:
        if not items:
            return 0, 0
        documents, failed = [], 0
        for item in items:
            try:
                documents.append(record_document(self.plan, item.exchange))
            except Exception as exc:  # a task's `logged` may raise anything: that record only is lost
                log.error("inference log: request %s not logged: %s: %s", item.exchange.ce_id, type(exc).__name__, exc)
                failed += 1
        try:
            self._rotate()
            if self._parquet is not None:
                self._parquet.write(documents)
                assert self._path is not None
                self._written = self._path.stat().st_size
            elif self._file is not None:
                data = b"".join(jsonfast.dumps(document) + b"\n" for document in documents)
                self._file.write(data)
                self._file.flush()
                self._written += len(data)
        except Exception as exc:  # a full disk, a folder gone: these records are lost, counted
            log.warning("inference log: cannot write to %s: %s: %s", self.folder, type(exc).__name__, exc)
            return 0, len(items)
        if self.delivered is not None:
            now = time.monotonic()
            for item in items:
                self.delivered(now - item.put_at)
        return len(documents), failed

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._parquet is not None:
            self._parquet.close()
        self._file = self._parquet = self._path = None


class Shipper:
    """The worker's one thread that empties the buffer into the sink (see the module doc)."""

    def __init__(self, plan: InferenceLogPlan, count: Count, held: Held, delivered: Delivered | None) -> None:
        self.plan = plan
        self.sink: Sink = HttpSink(plan, delivered) if plan.url else FileSink(plan, delivered)
        self.buffer = Buffer(plan.max_bytes, eager=bool(plan.url))
        self.count = count
        self.held = held
        self.abort = threading.Event()
        self._in_hand = 0
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="onnxpool-inference-log", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def put(self, exchange: Exchange) -> None:
        """From a request's thread after its reply: keep what it left, or count its events dropped.

        Only references are kept (its body and reply, already made); the events are made in this
        shipper's thread, so the worker's next request does not wait for them.
        """
        events = sum(exchange.sides) if self.plan.url else 1
        size = len(exchange.request_body) + len(exchange.response_body) + ITEM_OVERHEAD
        if self.buffer.put(Item(exchange, time.monotonic(), size, events)):
            self.held(self.buffer.held)
        else:
            self.count("dropped", events)

    def _done(self, item: Item) -> None:
        if not item.released:
            item.released = True
            self.buffer.release(item.size)
            self.held(self.buffer.held)

    def _run(self) -> None:
        buffer = self.buffer
        wait = 1.0 if self.plan.url else self.plan.flush_seconds
        while True:
            items = buffer.take(wait)
            self.held(buffer.held)
            if not items:
                if buffer.closing:
                    break
                continue
            with self._lock:
                self._in_hand = sum(item.events for item in items)
            try:
                sent, failed = self.sink.deliver(items, self.abort, self._done)
            except Exception as exc:  # a bug must not end the thread: the buffer would fill for good
                log.error("inference log: %s: %s", type(exc).__name__, exc)
                sent, failed = 0, sum(item.events for item in items)
            for item in items:
                self._done(item)  # those the sink did not finish (a bug): released all the same
            with self._lock:
                if self._in_hand:  # not already counted by a close that gave up on them
                    self._in_hand = 0
                    if sent:
                        self.count("sent", sent)
                    if failed:
                        self.count("failed", failed)

    def close(self, timeout: float) -> None:
        """Send what is held, at most `timeout` s; count what is left as dropped (see the module doc)."""
        if isinstance(self.sink, HttpSink):
            self.sink.closing = True
        self.buffer.close()
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.abort.set()  # a POST in progress ends with its own timeout; no new one starts
            with self._lock:
                left, self._in_hand = self._in_hand, 0
            left += sum(item.events for item in self.buffer.take(0))
            if left:
                self.count("dropped", left)
                log.warning("inference log: %d events not sent before the worker left (dropped, counted)", left)
            self.held(0)
        else:
            self.sink.close()
