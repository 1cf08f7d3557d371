"""Two or more servers measured next to each other: /predict req/s in rounds whose order flips.

This machine drifts by 10-15 % within minutes, so the one-run benchmarks (cache, int8)
never measure one side and then the other: each round measures every side, and every
other round in the reverse order (A B, B A, ...), so drift falls on both sides alike.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from onnxpool.measure.httpbench import BenchOptions, run_bench
from onnxpool.measure.paths import CAT_JPEG
from onnxpool.measure.progress import Progress
from onnxpool.measure.servers import Server


def predict_rate(
    server: Server, args: argparse.Namespace, *, model: str | None = None, repeat_fraction: float | None = None
) -> float:
    """Requests/s of /predict with the cat photo at `args.concurrency` for `args.warmup` + `args.duration`.

    `repeat_fraction`: that share of the requests repeats earlier images (bench.repeats; each
    call a fresh set); None sends the one photo with `Cache-Control: no-store`, so it is computed.
    """
    options = BenchOptions(
        url=server.url,
        mode="predict",
        concurrency=(args.concurrency,),
        warmup=args.warmup,
        duration=args.duration,
        image=CAT_JPEG,
        repeat_fraction=repeat_fraction,
        model=model if model is not None else BenchOptions.model,  # the default: the demo model's name
    )
    step = run_bench(options, Progress(enabled=False)).steps[0]
    if step.error_count:
        raise RuntimeError(f"{step.error_count} errors: {step.errors}")
    return step.throughput


def alternating_rounds(sides: Mapping[str, Callable[[], float]], rounds: int, label: str) -> dict[str, list[float]]:
    """Each side's rate per round, the order reversed every other round; progress on stderr."""
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for round_ in range(rounds):
        order = list(sides) if round_ % 2 == 0 else list(reversed(list(sides)))
        for name in order:
            rates[name].append(sides[name]())
            print(f"  {label}, round {round_ + 1}, {name}: {rates[name][-1]:.1f} req/s", file=sys.stderr)
    return rates


T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131)
"""Student's t, two-sided 95 %, for 1..15 degrees of freedom (past them 2.0, a little wide)."""


@dataclass(frozen=True)
class PairedRatio:
    """new/old from rounds measured side by side: the geometric mean of each round's ratio and its 95 % interval.

    Two sides of one round are measured seconds apart, so the machine's drift (10-25 % within
    minutes) cancels within a round but not between rounds: the per-round ratio is the sample,
    not each side's median (which mixes rounds measured in different minutes).
    """

    ratio: float
    low: float
    high: float
    rounds: int

    def describe(self) -> str:
        return f"{self.ratio:.3f}x (95 % {self.low:.3f}-{self.high:.3f}, {self.rounds} rounds)"


def paired_ratio(new: Sequence[float], old: Sequence[float]) -> PairedRatio:
    """new[i]/old[i] over the rounds, combined in log space (a ratio's natural scale)."""
    logs = [math.log(n / o) for n, o in zip(new, old, strict=True) if n > 0 and o > 0]
    if not logs:
        raise ValueError("no round with both sides measured")
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return PairedRatio(math.exp(mean), math.nan, math.nan, len(logs))
    t = T_975[len(logs) - 2] if len(logs) - 1 <= len(T_975) else 2.0
    half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return PairedRatio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs))


def old_and_new(measured: Sequence[tuple[str, Mapping[str, list[float]]]], **head: Any) -> dict[str, Any]:
    """Each measure's rounds, each side's median, the new/old ratio of medians (1.00 = no change) and the paired one."""
    result: dict[str, Any] = dict(head)
    for label, values in measured:
        medians = {name: statistics.median(v) for name, v in values.items()}
        paired = paired_ratio(values["new"], values["old"])
        result[label] = {
            "per_round": {name: [round(x, 3) for x in v] for name, v in values.items()},
            "median": {name: round(m, 3) for name, m in medians.items()},
            "new_over_old": round(medians["new"] / medians["old"], 3),
            "paired": {"ratio": round(paired.ratio, 4), "ci95": [round(paired.low, 4), round(paired.high, 4)]},
        }
    return result
