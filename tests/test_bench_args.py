"""Argument handling of `onnxpool bench|limit|tune` (no server needed)."""

from __future__ import annotations

import pytest

from onnxpool.cli import build_parser, main
from onnxpool.measure.httpbench import parse_seconds, parse_steps, unique_steps


@pytest.mark.parametrize(
    ("text", "seconds"), [("10", 10.0), ("10s", 10.0), ("1.5s", 1.5), ("500ms", 0.5), ("2m", 120.0), (" 3S ", 3.0)]
)
def test_parse_seconds(text: str, seconds: float) -> None:
    assert parse_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "abc", "0", "-1s", "10h", "nan"])
def test_parse_seconds_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_seconds(text)


def test_parse_steps() -> None:
    assert parse_steps("1,2, 4,8") == (1, 2, 4, 8)
    assert unique_steps(parse_steps("4,1,4")) == (4, 1)
    for bad in ("", "0", "1,,2", "1,-2", "two", "1.5"):
        with pytest.raises(ValueError):
            parse_steps(bad)


def test_bench_defaults() -> None:
    args = build_parser().parse_args(["bench", "http://127.0.0.1:8000"])
    assert args.mode == "v2-binary"
    assert args.concurrency == (1, 2, 4, 8)
    assert args.duration is None and args.requests is None
    assert args.warmup == 2.0 and args.batch == 1


def test_bench_options_parse() -> None:
    args = build_parser().parse_args(
        ["bench", "http://h:1", "--mode", "predict", "--concurrency", "2,4", "--duration", "3s", "--output", "r.csv"]
    )
    assert (args.mode, args.concurrency, args.duration, args.output.name) == ("predict", (2, 4), 3.0, "r.csv")


@pytest.mark.parametrize(
    "argv",
    [
        ["bench"],
        ["bench", "http://h:1", "--mode", "grpc"],
        ["bench", "http://h:1", "--concurrency", "0"],
        ["bench", "http://h:1", "--duration", "1s", "--requests", "10"],
        ["bench", "http://h:1", "--requests", "0"],
        ["bench", "http://h:1", "--output", "results.txt"],
        ["bench", "http://h:1", "--plot", "plot.jpg"],
        ["bench", "http://h:1", "--batch", "-1"],
        ["limit", "--pipeline", "video"],
        ["limit", "--workers", "0"],
        ["tune", "--budget", "soon"],
        ["tune", "--top", "0"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_bench_missing_image_is_one_line_error(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "http://127.0.0.1:9", "--mode", "predict", "--image", str(tmp_path / "none.jpg")])
    assert code == 2
    assert "is not a file" in capsys.readouterr().err


def test_bench_unreachable_server_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    from onnxpool.measure.servers import free_port

    code = main(["bench", f"http://127.0.0.1:{free_port()}", "--duration", "1s", "--quiet"])
    assert code == 2
    assert capsys.readouterr().err.startswith("onnxpool: error:")


def test_tune_write_needs_existing_file(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--write", str(tmp_path / "missing.toml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_limit_missing_model(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["limit", str(tmp_path / "nope.onnx")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_installed_limit_finds_the_image_pipeline(tmp_path) -> None:
    """Outside a checkout (no `server/` folder on sys.path) the pipeline is found by its installed name."""
    import subprocess
    import sys

    code = "from onnxpool.measure.limit import image_pipeline_available as f; assert f()"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
