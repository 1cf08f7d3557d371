"""Lanes: one listening socket per caller beside the pool's, and the fair choice between them.

nginx sends each known caller's requests to that caller's lane (config/callers.py); requests from
no known caller, probes and scrapes use lane 0, the pool's own socket. A free worker looks at which
lanes have connections waiting in the kernel's queue and accepts from the one furthest below its
share of the workers (`choose`). The excess of a flooding caller waits in its own queue, where it
costs nothing, and never in front of another caller's requests.

The share is work-conserving: the workers are divided among the *active* callers only (one with a
request in service, waiting, or answered within the last `hold` seconds), by weight; a caller alone
has them all. `hold` covers the moment between a closed-loop caller's reply and its next request:
a worker that would otherwise take one more request of a caller already at its share waits that
long for a caller below its share that was just answered. Without it, a caller on one connection
would find every worker busy with the flood each time it came back.

The workers of one pool share a `Board` (anonymous shared memory made by the master before it
forks): which lane each worker is serving, when each lane was last answered, and whether each
worker is working on a request (`working`, whatever its transport or lane: workers/wide.py lends a
lone request the idle workers' cores by it). Every field has one writer at a time (a worker its
seat; a lane's time is the latest of its writers'), so no lock.
"""

from __future__ import annotations

import ctypes
import mmap
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

MAX_SEATS = 256
"""Workers of one pool alive at once (a HUP briefly runs two generations)."""
MAX_LANES = 65
"""Lane 0 and up to 64 callers' lanes ([callers] lanes <= 64)."""
IDLE = -1


class Board:
    """Which lane each worker serves, when each lane was last answered, who is working (shared by a pool's workers)."""

    def __init__(self) -> None:
        seats = ctypes.sizeof(ctypes.c_int64) * MAX_SEATS
        times = ctypes.sizeof(ctypes.c_double) * MAX_LANES
        # MAP_SHARED | MAP_ANONYMOUS: the same pages in the master and every worker it forks.
        self._memory = mmap.mmap(-1, 2 * seats + 2 * times)
        self.serving = (ctypes.c_int64 * MAX_SEATS).from_buffer(self._memory)
        self.answered = (ctypes.c_double * MAX_LANES).from_buffer(self._memory, seats)
        self.taken = (ctypes.c_double * MAX_LANES).from_buffer(self._memory, seats + times)
        # 1 while a seat's worker has work in progress (its Seat counts the nesting), 0 idle. A numpy view, so
        # that counting the working seats on every inference is one vectorised pass, not 256 reads.
        self.working = np.frombuffer(self._memory, dtype=np.int64, count=MAX_SEATS, offset=seats + 2 * times)
        for seat in range(MAX_SEATS):
            self.serving[seat] = IDLE

    def busy(self, lanes: int, but: int) -> list[int]:
        """Workers serving each lane 0..lanes-1, not counting seat `but` (the asking worker)."""
        counts = [0] * lanes
        for seat in range(MAX_SEATS):
            lane = self.serving[seat]
            if lane != IDLE and seat != but and lane < lanes:
                counts[lane] += 1
        return counts


class Seats:
    """The master's record of which worker holds which seat of the board."""

    def __init__(self, board: Board) -> None:
        self.board = board
        self._holders: dict[int, int] = {}

    def acquire(self, worker_id: int) -> int:
        taken = set(self._holders.values())
        seat = next(seat for seat in range(MAX_SEATS) if seat not in taken)
        self._holders[worker_id] = seat
        self.board.serving[seat] = IDLE
        self.board.working[seat] = 0
        return seat

    def release(self, worker_id: int) -> None:
        """A worker exited (or was killed): it serves no lane and works on nothing any more."""
        seat = self._holders.pop(worker_id, None)
        if seat is not None:
            self.board.serving[seat] = IDLE
            self.board.working[seat] = 0


class Times(Protocol):
    """A lane's times: a list in tests, the board's shared array in workers."""

    def __getitem__(self, lane: int, /) -> float: ...


@dataclass(frozen=True)
class LanePlan:
    """What a worker needs to choose: lane weights (index = lane), the pool's workers, the hold."""

    weights: tuple[int, ...]
    workers: int
    hold: float
    """Seconds (config: [callers] hold_ms)."""


@dataclass(frozen=True)
class Choice:
    """Accept from `lane`, or (lane None) wait until `until` for one of `owed`."""

    lane: int | None
    owed: tuple[int, ...] = ()
    until: float = 0.0


def choose(
    plan: LanePlan,
    ready: Collection[int],
    busy: Sequence[int],
    answered: Times,
    taken: Times,
    now: float,
) -> Choice:
    """The lane a free worker accepts from, among `ready` (non-empty), by fair share of the workers.

    busy[l]: other workers serving lane l; answered[l]/taken[l]: when lane l was last answered /
    accepted from (the same clock as `now`). Ties go to the lane accepted from longest ago.
    """
    weights = plan.weights
    recent = {lane for lane in range(len(weights)) if now - answered[lane] < plan.hold}
    active = [lane for lane in range(len(weights)) if busy[lane] or lane in ready or lane in recent]
    total = sum(weights[lane] for lane in active)

    def share(lane: int) -> float:
        return plan.workers * weights[lane] / total

    best = min(ready, key=lambda lane: (busy[lane] / weights[lane], taken[lane]))
    if busy[best] < share(best):  # below its share: it may have one more worker
        return Choice(best)
    owed = tuple(lane for lane in sorted(recent) if lane not in ready and busy[lane] < share(lane))
    if not owed:
        return Choice(best)
    return Choice(None, owed, max(answered[lane] for lane in owed) + plan.hold)


def clock() -> float:
    """The board's clock: monotonic and the same in every process of the machine."""
    return time.monotonic()
