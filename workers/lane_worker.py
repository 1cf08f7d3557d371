"""The sync worker that takes its next request from the lane with the best claim (workers/lanes.py),
and runs the calls another transport hands to its main thread (workers/handoff.py).

gunicorn's own sync worker, with several listeners, accepts from every ready one in turn: the
caller with the most connections waiting gets the most workers. This one accepts ONE connection
per round, from the lane `lanes.choose` names, marks on the pool's board which lane it serves
while it serves it, and may keep itself free for `hold` seconds for a caller below its share.
The master sets `LANES_ATTRIBUTE` on the worker before it forks (launch/hooks.py); without it
(callers not told apart) and without a handoff (no gRPC) this is gunicorn's sync worker, unchanged.

With a handoff (`HANDOFF_ATTRIBUTE`, set in the worker by post_worker_init once its wake-up pipe
exists) the handed-off calls are served by the same loop: with lanes, a call counts as waiting on
its caller's lane and the fair choice takes it like a connection; without, the loop takes turns
(one handed-off call, then one HTTP connection if one is waiting), so neither transport starves
the other. On the way out it drains the handoff (its calls in flight finish, as the HTTP request
in progress did).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
from collections.abc import Iterator
from typing import Any

from gunicorn import util
from gunicorn.workers.sync import SyncWorker

from onnxpool.workers.handoff import Handoff
from onnxpool.workers.lanes import IDLE, Board, Choice, LanePlan, choose, clock

LANES_ATTRIBUTE = "onnxpool_lanes"
"""(Board, seat, LanePlan), set by the master in pre_fork."""
HANDOFF_ATTRIBUTE = "onnxpool_handoff"
"""The worker's `Handoff`, set in the worker by post_worker_init (gRPC on)."""
_RETRY = (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK)


@contextlib.contextmanager
def _on_board(board: Board, seat: int, lane: int) -> Iterator[None]:
    """This worker serves `lane` meanwhile (the other workers' fair choice reads it)."""
    board.serving[seat] = lane
    board.taken[lane] = clock()
    try:
        yield
    finally:
        board.serving[seat] = IDLE
        board.answered[lane] = clock()


class LaneWorker(SyncWorker):  # type: ignore[misc]  # gunicorn has no types
    """gunicorn's sync worker, choosing between callers' lanes by fair share."""

    def run(self) -> None:
        lanes: tuple[Board, int, LanePlan] | None = getattr(self, LANES_ATTRIBUTE, None)
        handoff: Handoff | None = getattr(self, HANDOFF_ATTRIBUTE, None)
        if lanes is not None and len(self.sockets) < 2:
            lanes = None
        if lanes is None and handoff is None:
            super().run()
            return
        for listener in self.sockets:
            listener.setblocking(0)
        lane_of = {listener: lane for lane, listener in enumerate(self.sockets)}
        timeout = self.timeout or 0.5
        try:
            while self.alive:
                self.notify()
                if lanes is not None:  # connections and handed-off calls alike, by fair share
                    ready = self._ready(0.0 if handoff is not None and handoff.pending else timeout)
                    waiting = {lane_of[listener] for listener in ready if listener in lane_of}
                    if handoff is not None:
                        waiting |= handoff.lanes_waiting()
                    if waiting:
                        self._serve_one(*lanes, waiting, handoff)
                else:  # a handed-off call, then one look at the listeners without waiting: in turn
                    ran = handoff is not None and handoff.run_one()
                    ready = self._ready(0.0 if ran else timeout)
                    if ready:
                        self._accept_one(ready)
                if not self.is_parent_alive():
                    return
        finally:
            if handoff is not None:
                handoff.drain(self.notify, float(self.cfg.graceful_timeout))

    def _ready(self, timeout: float) -> list[Any]:
        """The listeners with a connection waiting, after at most `timeout` s (woken early by the pipe)."""
        try:
            ready, _, _ = select.select(self.wait_fds, [], [], timeout)
        except InterruptedError:
            return []
        if self.PIPE[0] in ready:
            try:  # every wake-up byte at once (a handoff writes one per call; signals write too)
                os.read(self.PIPE[0], 4096)
            except BlockingIOError:
                pass
            ready.remove(self.PIPE[0])
        return ready

    def _accept_one(self, ready: list[Any]) -> None:
        """No lanes: serve one connection from the first listener that still has one."""
        for listener in ready:
            try:
                self.accept(listener)
            except OSError as exc:
                if exc.errno not in _RETRY:
                    raise
                continue  # another worker took it
            return

    def _serve_one(
        self, board: Board, seat: int, plan: LanePlan, waiting: set[int], handoff: Handoff | None = None
    ) -> None:
        """Serve one connection or handed-off call from the fairest of the `waiting` lanes (or none, if they
        emptied)."""
        lanes = len(self.sockets)
        while waiting and self.alive:
            now = clock()
            choice = choose(plan, waiting, board.busy(lanes, seat), board.answered, board.taken, now)
            if choice.lane is None:
                waiting |= self._wait_for_owed(choice, now)
                if handoff is not None:  # a call handed off meanwhile woke the wait
                    waiting |= handoff.lanes_waiting()
                continue
            if handoff is not None and choice.lane in handoff.lanes_waiting():
                with _on_board(board, seat, choice.lane):
                    handoff.run_one(choice.lane)
                return
            try:
                client, address = self.sockets[choice.lane].accept()
            except OSError as exc:
                if exc.errno not in _RETRY:
                    raise
                waiting.discard(choice.lane)  # another worker took it
                continue
            with _on_board(board, seat, choice.lane):
                client.setblocking(1)
                util.close_on_exec(client)
                self.handle(self.sockets[choice.lane], client, address)
            return

    def _wait_for_owed(self, choice: Choice, now: float) -> set[int]:
        """Up to `choice.until`, for a connection on a lane owed a worker; the lanes that got one."""
        self.notify()
        watched: list[Any] = [self.sockets[lane] for lane in choice.owed]
        try:
            ready, _, _ = select.select([*watched, self.PIPE[0]], [], [], max(0.0, choice.until - now))
        except InterruptedError:
            return set()
        if self.PIPE[0] in ready:
            os.read(self.PIPE[0], 1)
        return {lane for lane in choice.owed if self.sockets[lane] in ready}
