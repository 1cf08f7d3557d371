"""Calls from other threads, run one at a time by the worker's own (main) thread.

A pool worker runs one request at a time on its core share: gunicorn's sync worker does it by
construction, serving one connection after another in its main thread. A second transport
(gRPC, whose server runs its calls on threads of its own) must not run the model beside it:
two inferences on one pinned core would each take twice as long, and the worker would be
"busy" twice while its neighbour idles. So a gRPC call does not run in its thread: it is
handed to the worker's main loop (`Handoff.submit`), which runs it between two HTTP
connections, and the calling thread waits for the result. While the main thread runs a
handed-off call, the worker accepts no HTTP connection, so the kernel gives those to a free
worker, as for any busy one.

The main loop is gunicorn's own select() on its listeners and its wake-up pipe
(`workers/lane_worker.py`); `submit` writes a byte to that pipe, so a waiting worker wakes
at once. A call carries its caller's lane (workers/lanes.py): where callers are told apart, the
worker chooses between its lanes' waiting HTTP connections and its waiting calls by the same fair
share (`lanes_waiting`, `run_one(lane)`). On the way out (SIGTERM, a HUP's replacement) the loop stops taking HTTP, and
`drain` keeps running handed-off calls until the transport says its calls in flight are done:
a gRPC call already received finishes, as a REST request in progress does.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

Call = Callable[[], Any]


class Transport(Protocol):
    """What the worker stops on its way out: another server whose calls come through the handoff."""

    def stop(self) -> threading.Event:
        """Take no new calls; the event is set once the calls in flight have been answered."""


class Handoff:
    """A queue of calls for the main thread, and the pipe that wakes it (see the module doc)."""

    def __init__(self, wake_fd: int) -> None:
        self._wake_fd = wake_fd
        self._calls: collections.deque[tuple[int, Call, Future[Any]]] = collections.deque()
        self.transports: list[Transport] = []

    @property
    def pending(self) -> bool:
        return bool(self._calls)

    def lanes_waiting(self) -> set[int]:
        """The lanes of the calls waiting (a snapshot: producers only ever add)."""
        return {lane for lane, _, _ in tuple(self._calls)}

    def submit(self, call: Call, lane: int = 0) -> Any:
        """From another thread: run `call` in the main thread, wait, and return what it returned (or raise)."""
        future: Future[Any] = Future()
        self._calls.append((lane, call, future))  # deque.append is atomic: no lock between producers
        try:
            os.write(self._wake_fd, b".")
        except BlockingIOError:  # the pipe is full of wake-ups already: the loop is awake
            pass
        return future.result()

    def run_one(self, lane: int | None = None) -> bool:
        """In the main thread: run the oldest waiting call (of `lane`, if given); False when there was none."""
        try:
            if lane is None:
                _, call, future = self._calls.popleft()
            else:  # only the main thread removes calls, so the one found is still there
                found = next(item for item in tuple(self._calls) if item[0] == lane)
                self._calls.remove(found)
                _, call, future = found
        except (IndexError, StopIteration):
            return False
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(call())
            except BaseException as exc:  # handed back to the calling thread, which answers with it
                future.set_exception(exc)
        return True

    def drain(self, notify: Callable[[], None], limit: float) -> None:
        """In the main thread, on the way out: stop the transports and run their calls until they are done."""
        done = [transport.stop() for transport in self.transports]
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            notify()
            if self.run_one():
                continue
            if all(event.is_set() for event in done):
                return
            time.sleep(0.005)  # a call received may still be on its way to the queue
        while self.run_one():  # past the limit: what is queued gets its answer all the same
            pass
