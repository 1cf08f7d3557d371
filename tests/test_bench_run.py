"""Short REAL runs: `onnxpool bench` against a gunicorn server, `limit` and `tune` on the demo model."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from onnxpool.cli import main
from onnxpool.measure.limit import LimitPlan, measure_limit
from onnxpool.measure.paths import DEMO_MODEL
from onnxpool.measure.servers import Server
from onnxpool.workers.cores import plan_layout, usable_cores
from tests.harness import REPO

pytestmark = pytest.mark.slow


def test_bench_sweeps_and_writes_json_and_plot(server: Server, tmp_path: Path, capsys) -> None:
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    argv = ["bench", server.url, "--concurrency", "1,3", "--duration", "1s", "--warmup", "0.3s"]
    code = main([*argv, "--output", str(out), "--plot", str(png)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(out.read_text())
    assert [s["concurrency"] for s in report["steps"]] == [1, 3]
    for step in report["steps"]:
        assert step["requests"] > 0 and step["errors"] == 0
        assert 0 < step["p50_ms"] <= step["p90_ms"] <= step["p99_ms"] <= step["max_ms"]
        assert step["client_cpu_ms_per_req"] > 0
    assert report["meta"]["mode"] == "v2-binary"
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "p99 ms" in captured.out and "load generator:" in captured.out
    assert "concurrency 3" in captured.err  # progress lines


def test_bench_json_mode_by_request_count(server: Server, tmp_path: Path, capsys) -> None:
    out = tmp_path / "r.csv"
    code = main(["bench", server.url, "--mode", "v2-json", "--concurrency", "2", "--requests", "6", "--warmup", "0.2s"])
    assert code == 0
    assert main(["bench", server.url, "--concurrency", "2", "--requests", "6", "--output", str(out), "--quiet"]) == 0
    header, row = out.read_text().splitlines()
    values = dict(zip(header.split(","), row.split(","), strict=True))
    assert values["requests"] == "6" and values["errors"] == "0"


def test_bench_counts_http_errors(server: Server, capsys) -> None:
    """A model name the server does not serve: every request is a 404, counted, exit code 1."""
    from onnxpool.measure.httpbench import BenchOptions, run_bench
    from onnxpool.measure.payloads import PreparedRequest

    request = PreparedRequest("POST", "/v2/models/nope/infer", b"{}", {"Content-Type": "application/json"})
    options = BenchOptions(url=server.url, mode="v2-json", concurrency=(2,), warmup=0.1, duration=2.0)
    step = run_bench(options, request=request).steps[0]
    assert step.ok == 0 and step.errors.get("404", 0) == step.requests > 0


def test_limit_measures_pinned_processes() -> None:
    layout = plan_layout(usable_cores(), 1, 1)
    result = measure_limit(LimitPlan(DEMO_MODEL, layout, duration=0.5, warmup=0.2))
    assert result.calls > 0 and result.items_per_second > 0
    assert result.summary()["layout"] == "1x1"


def test_tune_tiny_budget_writes_winner(tmp_path: Path, capsys) -> None:
    target = tmp_path / "onnxpool.toml"
    target.write_text((REPO / "config" / "onnxpool.toml").read_text())
    code = main(["tune", "--budget", "5s", "--batches", "1", "--top", "2", "--write", str(target)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "recommended: workers =" in captured.out
    assert "MB private/worker" in captured.out and "MB PSS/worker" in captured.out
    first = next(line for line in captured.out.splitlines() if line.strip().startswith("1 "))
    assert "nan" not in first  # the confirmed winner's memory was read from its workers
    n = len(usable_cores())
    if n > 1:
        assert "budget reached" in captured.out  # 5 s cannot hold two HTTP confirmations
    server = tomllib.loads(target.read_text())["server"]
    assert server["workers"] * server["threads_per_worker"] == n
    assert "# onnxpool tune: " in target.read_text()
    assert " MB private, " in target.read_text()  # the winner's note in the file
    assert "100%" in captured.err
