"""benchmarks/text.py's results: one measurement per target, cell and round; medians, ratios, goals, table.

A cell is (sentences per request, connections). The medians are over rounds, each round
measuring every target once (benchmarks/text.py alternates their order), so the machine's
drift within a run falls on all targets alike and the median drops a disturbed round.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

ONNXPOOL, FASTAPI, INFINITY = "onnxpool", "fastapi-st", "infinity"
# The goals for onnxpool at these connection counts (both request sizes).
GOAL_CONNECTIONS = (4, 8)
GOAL_VS_FASTAPI = 2.0
GOAL_VS_INFINITY = 1.25
GOAL_MEMORY_VS_INFINITY = 1 / 3
MIB = 1024 * 1024


@dataclass(frozen=True)
class Measurement:
    """One target in one cell in one round: the measured window's numbers."""

    target: str
    size: int
    connections: int
    round: int
    sentences_per_s: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int
    rss_bytes: int | None
    pss_bytes: int | None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def cell_summary(rows: list[Measurement]) -> dict[str, Any]:
    """Medians over the rounds of one target in one cell, and every round's values."""
    rss = [float(r.rss_bytes) for r in rows if r.rss_bytes is not None]
    pss = [float(r.pss_bytes) for r in rows if r.pss_bytes is not None]
    answered = [r for r in rows if r.requests > r.errors]
    median_rss, median_pss = _median(rss), _median(pss)
    return {
        "sentences_per_s": _median([r.sentences_per_s for r in rows]),
        # a round in which every request failed has no latency to take a median of
        "p50_ms": _median([r.p50_ms for r in answered]),
        "p99_ms": _median([r.p99_ms for r in answered]),
        "rss_mib": None if median_rss is None else median_rss / MIB,
        "pss_mib": None if median_pss is None else median_pss / MIB,
        "errors": sum(r.errors for r in rows),
        "rounds": [asdict(r) for r in rows],
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarise(measurements: list[Measurement]) -> dict[str, Any]:
    """{"cells": [{size, connections, targets: {name: summary}, ratios, goals}]}."""
    keys = sorted({(m.size, m.connections) for m in measurements})
    cells = []
    for size, connections in keys:
        here = [m for m in measurements if (m.size, m.connections) == (size, connections)]
        targets = {
            name: cell_summary([m for m in here if m.target == name]) for name in dict.fromkeys(m.target for m in here)
        }
        ratios: dict[str, float | None] = {}
        goals: dict[str, bool | None] = {}
        ours = targets.get(ONNXPOOL)
        for other, speed_goal in ((FASTAPI, GOAL_VS_FASTAPI), (INFINITY, GOAL_VS_INFINITY)):
            theirs = targets.get(other)
            if ours is None or theirs is None:
                continue
            ratios[f"throughput_vs_{other}"] = _ratio(ours["sentences_per_s"], theirs["sentences_per_s"])
            ratios[f"p99_vs_{other}"] = _ratio(ours["p99_ms"], theirs["p99_ms"])
            ratios[f"rss_vs_{other}"] = _ratio(ours["rss_mib"], theirs["rss_mib"])
            ratios[f"pss_vs_{other}"] = _ratio(ours["pss_mib"], theirs["pss_mib"])
            if connections in GOAL_CONNECTIONS:
                speed = ratios[f"throughput_vs_{other}"]
                p99 = ratios[f"p99_vs_{other}"]
                goals[f"throughput_vs_{other}"] = None if speed is None else speed >= speed_goal
                goals[f"p99_vs_{other}"] = None if p99 is None else p99 < 1.0
        # Memory both ways: RSS counts the pages a pre-fork master shares with its workers once per
        # process; PSS splits them between their sharers, so it adds up to what the tree really uses.
        for measure in ("rss", "pss"):
            memory = ratios.get(f"{measure}_vs_{INFINITY}")
            if memory is not None:
                goals[f"{measure}_vs_{INFINITY}"] = memory < GOAL_MEMORY_VS_INFINITY
        cells.append({"size": size, "connections": connections, "targets": targets, "ratios": ratios, "goals": goals})
    return {"cells": cells}


def _number(value: float | None, width: int, digits: int = 1) -> str:
    return f"{value:{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


def table(summary: dict[str, Any], targets: list[str]) -> str:
    """A plain-text table: per cell, each target's sentences/s, p99, RSS and PSS, then onnxpool's ratios."""
    head = f"{'sent/req':>8} {'conns':>5}"
    for name in targets:
        head += f" | {name + ' sent/s':>20} {'p99 ms':>8} {'RSS MiB':>8} {'PSS MiB':>8}"
    others = [name for name in (FASTAPI, INFINITY) if name in targets and ONNXPOOL in targets]
    for other in others:
        head += f" | {'x vs ' + other:>16}"
    lines = [head, "-" * len(head)]
    for cell in summary["cells"]:
        line = f"{cell['size']:>8} {cell['connections']:>5}"
        for name in targets:
            result = cell["targets"].get(name, {})
            line += f" | {_number(result.get('sentences_per_s'), 20)} {_number(result.get('p99_ms'), 8)}"
            line += f" {_number(result.get('rss_mib'), 8, 0)} {_number(result.get('pss_mib'), 8, 0)}"
            if result.get("errors"):
                line += f" ({result['errors']} errors)"
        for other in others:
            line += f" | {_number(cell['ratios'].get(f'throughput_vs_{other}'), 16, 2)}"
        lines.append(line)
    return "\n".join(lines)


def goals_text(summary: dict[str, Any]) -> str:
    """The issue's goals, one line per cell that has any: met / NOT met, per goal."""
    lines = []
    for cell in summary["cells"]:
        if not cell["goals"]:
            continue
        marks = ", ".join(
            f"{goal} {'met' if ok else 'NOT met' if ok is not None else 'n/a'}" for goal, ok in cell["goals"].items()
        )
        lines.append(f"{cell['size']} sent/req, {cell['connections']} conns: {marks}")
    return "\n".join(lines)
