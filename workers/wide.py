"""Wide runs: a request that finds the model's other workers idle runs on their cores too.

Each worker serves with ONE narrow session on its own core share (workers/session.py): under
load that is the fastest layout, with no thread fighting another over a core. A request alone
would leave the other cores idle, so a worker also keeps a *wide* session, built from the same
mapped weights and prepacked data file (so it costs little private memory), whose intra-op
threads run on the other workers' cores. Which one a run takes is decided per run from the
pool's `Board` (workers/lanes.py): a worker marks its seat working for the whole of each request
(the data plane: decoding, inference, encoding all use its core) and around each inference
(whatever path asks for it); a run goes wide only while no other seat is working.

The cost to a request that arrives during a wide run is at most the rest of that run: its worker
marks itself working at once, so no new wide run starts, and the one in flight shares its core
only until it ends. The wide session's threads spin within a run (faster hand-offs between its
parallel sections) and stop spinning when the run ends (`session.force_spinning_stop`): a
spinning thread left behind would take the other worker's core from its next request.

Process rule: the plan is made in the worker (post_fork), the session after fork like the narrow
one; the master only makes the board.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from onnxpool.workers.cores import Layout
from onnxpool.workers.lanes import Board

LENT_NICE = 0
"""How much lower than the worker's own the priority of its wide session's pool threads is (nice steps).

Those threads run on other workers' cores. At nice 19 the owner of a lent core would win it back at
once, but a piece of the wide run that its pool thread had started then waits behind every nice-0
thread on that core (the owner's request, nginx, a load generator) at 15/1024 of the core: in one
run under load the p99 at 8 connections went to 384-615 ms against 58-94 ms at nice 0
(docs/BENCHMARKS.md). At the worker's own priority the two share the core until the wide run
ends, which bounds what each costs the other by the rest of that run. Kept as a constant so that
`benchmarks.wide_overlap --lent-nice` can measure it again."""

WideSetting = int | str
"""`[model] wide_threads`: "auto", "off" or a number of threads (config/settings.py)."""


@dataclass(frozen=True)
class WidePlan:
    """A worker's wide session: its intra-op threads and where they run."""

    threads: int
    cores: tuple[int, ...]
    """The cores of the run, this worker's own first; () when unpinned (the kernel places the threads)."""

    @property
    def affinities(self) -> str:
        """onnxruntime's `session.intra_op_thread_affinities`: one core a pool thread ("" unpinned).

        A pool thread is made by the session's constructor with the affinity of the thread that
        makes it, i.e. this pinned worker's own share: without this the wide session's threads
        would all share the worker's core (measured: no faster than one thread). onnxruntime
        numbers logical processors from 1. The calling thread runs the first part itself and
        stays on the worker's own share; the pool's threads (threads - 1) take the next cores.
        """
        return ";".join(str(core + 1) for core in self.cores[1 : self.threads])

    def describe(self) -> str:
        """For the worker's ready line."""
        where = ",".join(map(str, self.cores[: self.threads])) if self.cores else "unpinned"
        return f"{self.threads} threads ({where}) when the other workers are idle"


def model_width(layout: Layout) -> int:
    """The cores the model may use: its workers' shares together, at most the usable CPUs."""
    return min(layout.workers * layout.share_size, layout.cpus)


def wide_threads(layout: Layout, setting: WideSetting) -> int:
    """The threads of a wide run under `setting`; 0 when there is none (off, one worker, no wider than a share)."""
    if setting == "off" or layout.workers < 2:
        return 0
    width = model_width(layout) if setting == "auto" else min(int(setting), model_width(layout))
    return width if width > layout.share_size else 0


def plan_wide(layout: Layout, setting: WideSetting, slot: int) -> WidePlan | None:
    """Slot `slot`'s wide session under `setting` (None: it has none)."""
    threads = wide_threads(layout, setting)
    if not threads:
        return None
    if not layout.pinned:  # within a quota: the threads go where the kernel puts them
        return WidePlan(threads, ())
    own = layout.core_share_for(slot)
    start = layout.cores.index(own[-1]) + 1
    others = [layout.cores[(start + i) % len(layout.cores)] for i in range(len(layout.cores))]
    cores = (*own, *(core for core in others if core not in own))
    return WidePlan(threads, cores)


def describe_setting(layout: Layout, setting: WideSetting) -> str:
    """For the start-up line: what `[model] wide_threads` does with this layout."""
    threads = wide_threads(layout, setting)
    if threads:
        return f"wide runs {threads} threads when the other workers are idle (wide_threads={setting})"
    if setting == "off":
        why = "wide_threads=off"
    else:
        why = "one worker" if layout.workers < 2 else "no wider than a worker's share"
    return f"wide runs off ({why})"


def others_working(working: Sequence[int] | np.ndarray, seat: int) -> int:
    """How many seats other than `seat` are working."""
    return int(np.count_nonzero(working)) - (1 if working[seat] else 0)


def choose_threads(plan: WidePlan | None, working: Sequence[int] | np.ndarray, seat: int) -> int:
    """The threads of the next run of seat `seat`: the plan's while every other seat is idle, else 0 (narrow)."""
    if plan is None or others_working(working, seat):
        return 0
    return plan.threads


class Seat:
    """This worker's seat on its pool's board: marks it working and chooses each run's width."""

    def __init__(self, board: Board, seat: int, plan: WidePlan | None) -> None:
        self.board = board
        self.seat = seat
        self.plan = plan
        # One process writes its seat, but a gthread worker's request threads may do it at once: a
        # read-modify-write that loses an update would leave the seat marked for good (no other
        # worker would run wide again), or clear it while a request still runs.
        self._lock = threading.Lock()
        self._depth = 0
        """Blocks of work in progress here (a request, the inference inside it); the board says only 0 or 1."""
        self._queued = 0
        """Requests in progress here that found others waiting behind them: no wide run meanwhile."""

    def enter(self, queued: bool = False) -> None:
        """One more block of work in progress here (a request, an inference); `queued`: others wait behind it.

        The shared page is written only when the depth goes 0 -> 1 (and 1 -> 0 in `leave`): the
        nested marks of one request (transport, data plane, inference) then cost a lock and an
        integer each, and the line of the board the other workers read changes twice a request.
        """
        with self._lock:
            self._depth += 1
            self._queued += queued
            if self._depth == 1:
                self.board.working[self.seat] = 1

    def leave(self, queued: bool = False) -> None:
        with self._lock:
            self._depth -= 1
            self._queued -= queued
            if self._depth == 0:
                self.board.working[self.seat] = 0

    @contextmanager
    def working(self) -> Iterator[None]:
        """Mark this worker working for the block (nested blocks count once each)."""
        self.enter()
        try:
            yield
        finally:
            self.leave()

    def threads(self) -> int:
        """The threads of a run starting now: the wide session's, or 0 for the narrow one.

        Narrow while a request of this worker found connections waiting in its listen queue: that
        is load, even in the moment the other workers are between two requests and look idle.
        """
        if self._queued:
            return 0
        return choose_threads(self.plan, self.board.working, self.seat)


def thread_ids() -> set[int]:
    """This process's threads (their kernel ids)."""
    return {int(name) for name in os.listdir("/proc/self/task")}


def lower_priority(threads: set[int], steps: int) -> None:
    """`steps` nice steps lower for each of `threads` (at most 19); lowering needs no privilege."""
    for tid in threads:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + steps))
