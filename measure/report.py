"""Bench results as a text table, CSV or JSON (no I/O beyond writing the file asked for)."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from onnxpool.measure.loadgen import StepResult

COLUMNS = (
    ("concurrency", "conc", "{}"),
    ("throughput_rps", "req/s", "{:.1f}"),
    ("items_per_s", "items/s", "{:.1f}"),
    ("p50_ms", "p50 ms", "{:.1f}"),
    ("p90_ms", "p90 ms", "{:.1f}"),
    ("p99_ms", "p99 ms", "{:.1f}"),
    ("max_ms", "max ms", "{:.1f}"),
    ("requests", "requests", "{}"),
    ("errors", "errors", "{}"),
    ("client_cpu_ms_per_req", "client cpu ms/req", "{:.2f}"),
    ("client_cpu_cores", "client cores", "{:.2f}"),
)


def _cell(fmt: str, value: Any) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return fmt.format(value)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str, str]] = COLUMNS) -> str:
    """A right-aligned plain-text table of `rows` (dicts keyed by the column keys)."""
    header = [title for _, title, _ in columns]
    body = [[_cell(fmt, row.get(key, float("nan"))) for key, _, fmt in columns] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    return "\n".join(lines)


def step_rows(results: Sequence[StepResult]) -> list[dict[str, Any]]:
    return [r.summary() for r in results]


def to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """CSV with one row per step; `error_kinds` as `status=count;...`."""
    out = io.StringIO()
    keys = [k for k in rows[0] if k != "error_kinds"] + ["error_kinds"] if rows else []
    writer = csv.DictWriter(out, fieldnames=keys, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        flat = dict(row)
        kinds = flat.get("error_kinds") or {}
        flat["error_kinds"] = ";".join(f"{k}={v}" for k, v in sorted(kinds.items()))
        writer.writerow(flat)
    return out.getvalue()


def write_output(path: Path, rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> None:
    """Write `.csv` (rows only) or `.json` ({"meta": ..., "steps": rows}) by the file's suffix."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        path.write_text(to_csv(rows))
    elif suffix == ".json":
        path.write_text(json.dumps({"meta": dict(meta), "steps": list(rows)}, indent=2, allow_nan=False, default=str))
    else:
        raise ValueError(f"--output must end in .csv or .json, got {path.name!r}")
