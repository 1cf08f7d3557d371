"""Step 6, speed on the host: FP32 and INT8 with `measure.limit`'s pinned processes, alternating rounds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from onnxpool.measure.progress import Progress


def compare_speed(
    models: dict[str, Path],
    seconds: float,
    rounds: int,
    progress: Progress | None = None,
    feeds: Path | None = None,
    batch: int = 1,
) -> dict[str, Any]:
    """`measure.limit` on each model: one pinned single-threaded process, rounds alternating the order.

    `feeds`: an .npz of `batch` items to run (default: one random item of the model's shape)."""
    from onnxpool.measure.limit import LimitPlan, measure_alternating, median_ratio
    from onnxpool.workers.cores import plan_layout, usable_cores

    layout = plan_layout(usable_cores(), 1, 1)
    plans = {
        name: LimitPlan(path, layout, batch=batch, duration=seconds, warmup=min(1.0, seconds), feeds=feeds)
        for name, path in models.items()
    }

    def step(r: int, name: str) -> None:
        if progress is not None:
            progress.status(f"speed: round {r + 1}/{rounds}, {name}", force=True)

    results = measure_alternating(plans, rounds, step)
    names = list(models)
    return {
        "layout": f"{layout.workers}x{layout.threads}",
        "seconds_per_round": seconds,
        "rounds": rounds,
        "items_per_s": {n: [round(r.items_per_second, 2) for r in results[n]] for n in names},
        "p50_ms": {n: [round(r.percentile(50) * 1000, 3) for r in results[n]] for n in names},
        "speedup": {n: median_ratio(results, n, names[0]) for n in names[1:]},
        "measured_with": "onnxpool.measure.limit (spawned process, pinned, alternating rounds)",
    }
