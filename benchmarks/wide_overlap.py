"""What a wide run costs the request that arrives while it is in flight (issue 44), in process, no HTTP.

Two worker-like processes, forked and pinned as onnxpool pins them (one core each), each with the
served sessions (`workers.session.build_session`, `build_wide_session`) and one shared `Board`:
  - the *lender* (core 0) runs inferences back to back, each choosing its width as a worker does
    (`Seat.threads`: wide, its pool thread on core 1, while the other seat is idle);
  - the *arrival* (core 1) sleeps a random 0-`--gap` ms, marks itself working, runs one narrow
    inference, and records how long it took.
Measured three ways, alternating in rounds: the arrival alone (lender idle), beside a lender that
never runs wide (`wide_threads = "off"`: main before wide runs, under load), and beside a lender
that chooses. The arrival's extra time beside the choosing lender, over the "off" lender, is what a
wide run in flight costs it: by construction at most the rest of one wide run (the lender sees the
arrival working and its next run is narrow).

    .venv/bin/python -m benchmarks.wide_overlap --model models/efficientnet-lite0/model.onnx
    .venv/bin/python -m benchmarks.wide_overlap --model models/minilm/model.onnx --tokens 256
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from benchmarks.output import emit
from onnxpool.workers.lanes import Board
from onnxpool.workers.wide import LENT_NICE, Seat, WidePlan

if TYPE_CHECKING:
    import onnxruntime as ort

MODES = ("alone", "off", "wide")
CORES = (0, 1)


def _feeds(session: ort.InferenceSession, tokens: int) -> dict[str, np.ndarray]:
    from onnxpool.workers.session import model_info_of, warmup_feeds

    info = model_info_of(session)
    if tokens:  # a text model: every input (ids, mask, token types) [1, tokens]
        return {spec.name: np.ones((1, tokens), dtype=np.int64) for spec in info.inputs}
    feeds = warmup_feeds(info)
    assert feeds is not None
    return feeds


def lender(board: Board, model: Path, tokens: int, wide: bool, nice: int, stop: Connection) -> None:
    """Core 0: inferences back to back, each as wide as the board allows (narrow only, unless `wide`)."""
    from onnxpool.workers.session import build_session, build_wide_session

    os.sched_setaffinity(0, {CORES[0]})
    plan = WidePlan(2, CORES) if wide else None
    seat = Seat(board, 0, plan)
    narrow = build_session(model, 1)
    wide_session = build_wide_session(model, plan, "all", True, nice) if plan is not None else None
    feeds = _feeds(narrow, tokens)
    while not stop.poll():
        with seat.working():
            session = wide_session if wide_session is not None and seat.threads() else narrow
            session.run(None, feeds)


def arrival(board: Board, model: Path, tokens: int, gap_ms: float, runs: int, out: Connection) -> None:
    """Core 1: `runs` narrow inferences at random moments; their times (ms) sent back."""
    from onnxpool.workers.session import build_session

    os.sched_setaffinity(0, {CORES[1]})
    seat = Seat(board, 1, None)
    session = build_session(model, 1)
    feeds = _feeds(session, tokens)
    for _ in range(3):
        session.run(None, feeds)
    out.send("ready")
    out.recv()
    times = []
    rng = random.Random(44)
    for _ in range(runs):
        time.sleep(rng.uniform(0, gap_ms) / 1000)
        with seat.working():
            start = time.perf_counter()
            session.run(None, feeds)
            times.append((time.perf_counter() - start) * 1000)
    out.send(times)


def measure(mode: str, args: argparse.Namespace) -> list[float]:
    """The arrival's times beside a lender in `mode` (none, narrow only, choosing)."""
    context = multiprocessing.get_context("fork")  # the board's shared pages; no onnxruntime in this process
    board = Board()
    mine, theirs = context.Pipe()
    stop_lender, stop_here = context.Pipe()
    helper = None
    if mode != "alone":
        helper = context.Process(
            target=lender, args=(board, args.model, args.tokens, mode == "wide", args.lent_nice, stop_lender)
        )
        helper.start()
    worker = context.Process(target=arrival, args=(board, args.model, args.tokens, args.gap, args.runs, theirs))
    worker.start()
    mine.recv()
    time.sleep(1.0)  # the lender built and running
    mine.send("go")
    times: list[float] = mine.recv()
    worker.join()
    if helper is not None:
        stop_here.send("stop")
        helper.join()
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/efficientnet-lite0/model.onnx"))
    parser.add_argument("--tokens", type=int, default=0, help="a text model: the inputs' length (e.g. 256)")
    parser.add_argument("--runs", type=int, default=300, help="the arrival's inferences per measurement")
    parser.add_argument("--gap", type=float, default=10.0, help="the arrival's random pause, 0 to GAP ms")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lent-nice", type=int, default=LENT_NICE, help="nice steps of the lender's pool threads")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2 or not set(CORES) <= os.sched_getaffinity(0):
        raise SystemExit("needs cores 0 and 1")
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for round_ in range(args.rounds):
        for mode in MODES if round_ % 2 == 0 else tuple(reversed(MODES)):
            got = measure(mode, args)
            times[mode] += got
            print(f"round {round_ + 1}, {mode}: p50 {statistics.median(got):.2f} ms", file=sys.stderr, flush=True)
    result: dict[str, object] = {
        "model": str(args.model),
        "tokens": args.tokens,
        "runs": args.runs,
        "lent_nice": args.lent_nice,
    }
    for mode, values in times.items():
        row = {f"p{q}_ms": round(float(np.percentile(values, q)), 2) for q in (50, 90, 99)}
        result[mode] = {**row, "mean_ms": round(statistics.fmean(values), 2)}
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
