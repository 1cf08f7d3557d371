"""PNG plots of bench results: throughput and p99 latency against concurrency.

matplotlib is an optional extra (`pip install 'onnxpool[bench]'`): it is imported
only when a plot is asked for, with a clear message when it is missing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a display
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(
            "--plot needs matplotlib: pip install 'onnxpool[bench]' (or pip install matplotlib)"
        ) from None
    return plt


def plot_series(path: Path, series: Mapping[str, Sequence[Mapping[str, Any]]], title: str = "") -> None:
    """One line per named series: throughput (left) and p99 ms (right) vs concurrency."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in series.items():
        conc = [r["concurrency"] for r in rows]
        left.plot(conc, [r["items_per_s"] for r in rows], marker="o", label=name)
        right.plot(conc, [r["p99_ms"] for r in rows], marker="o", label=name)
    left.set(xlabel="concurrency (connections)", ylabel="throughput (items/s)", title="throughput")
    right.set(xlabel="concurrency (connections)", ylabel="p99 latency (ms)", title="p99 latency")
    for axis in (left, right):
        axis.grid(True, alpha=0.3)
        axis.set_ylim(bottom=0)
        axis.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
