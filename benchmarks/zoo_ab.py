"""The several-models host of this checkout against another one's, side by side in one run.

Usage (from the repo root; docs/BENCHMARKS.md has the numbers):
    git worktree add /tmp/onnxpool-old <commit> && make -C /tmp/onnxpool-old install
    .venv/bin/python -m benchmarks.zoo_ab --old /tmp/onnxpool-old [--rounds 5] [--duration 8s] [--json out.json]

Both sides serve config/zoo.toml's models (efficientnet-lite0, iris, and all-MiniLM-L6-v2 when
`make minilm` built it) from this checkout's model files, with the response cache off (every
request computed), each started by its own checkout's venv (`onnxpool serve`):
  1. start to ready: `--starts` starts of each side, alternating, timed from the command until
     `/v2/health/ready` is 200 and every model in `GET /v2/models` is READY;
  2. with both hosts up (an idle worker uses no CPU), in rounds whose order flips (old, new, new,
     old, ...) so that drift falls on both: through the front door at `--concurrency`
     connections, `/predict` with the cat photo (req/s), KServe v1 `/v1/models/iris:predict`
     (req/s) and `/v1/embeddings` (one sentence per request, sentences/s).
The result is each side's median and the new/old ratio of medians (1.00 = no change).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import requests

from benchmarks.alternating import alternating_rounds, old_and_new
from benchmarks.output import emit
from benchmarks.text import workload
from benchmarks.text_sentences import sentences
from onnxpool.measure.httpbench import parse_seconds
from onnxpool.measure.loadgen import LoadGenerator, StepPlan
from onnxpool.measure.paths import CAT_JPEG
from onnxpool.measure.payloads import PreparedRequest, predict_request
from onnxpool.measure.servers import Server, clean_env, free_port, spawn_logged

REPO = Path(__file__).resolve().parents[1]
MINILM = REPO / "models" / "minilm" / "model.onnx"
START_TIMEOUT = 300.0


def zoo_settings(folder: Path, text: bool) -> Path:
    """config/zoo.toml with this checkout's model paths, the cache off (and MiniLM only if built)."""
    source = (REPO / "config" / "zoo.toml").read_text(encoding="utf-8")
    source = source.replace('"../models/', f'"{REPO}/models/')
    if text:  # a few of the sentences are longer than the model takes (a 400 otherwise)
        source = source.replace("[tasks.all-minilm-l6-v2]\n", "[tasks.all-minilm-l6-v2]\ntruncate = true\n")
    else:
        source = source.split("[models.all-minilm-l6-v2]")[0]
    path = folder / "zoo.toml"
    path.write_text(source + "\n[cache]\nenabled = false\n", encoding="utf-8")
    return path


def host_ready(url: str) -> bool:
    try:
        if requests.get(url + "/v2/health/ready", timeout=2).status_code != 200:
            return False
        models = requests.get(url + "/v2/models", timeout=2).json()["models"]
    except (requests.RequestException, ValueError, KeyError):
        return False
    return all(model["state"] == "READY" for model in models)


@contextmanager
def zoo_host(checkout: Path, config: Path, log_dir: Path, name: str) -> Iterator[tuple[Server, float]]:
    """`onnxpool serve --config` from `checkout`'s venv on a free port; (server, seconds to ready)."""
    python = checkout / ".venv" / "bin" / "python"
    if not python.is_file():
        raise SystemExit(f"{checkout} has no .venv (run `make install` there first)")
    port = free_port()
    env = clean_env({"ONNXPOOL_SERVER__BIND": f"127.0.0.1:{port}", "PYTHONUNBUFFERED": "1"})
    log_path = log_dir / f"{name}-{port}.log"
    t0 = time.monotonic()
    process = spawn_logged([str(python), "-m", "onnxpool.cli", "serve", "--config", str(config)], log_path, env)
    server = Server(process=process, port=port, log_path=log_path, bind=f"127.0.0.1:{port}")
    try:
        while not host_ready(server.url):
            if process.poll() is not None or time.monotonic() - t0 > START_TIMEOUT:
                raise SystemExit(f"{name}: not ready ({process.returncode}):\n{server.log()[-3000:]}")
            time.sleep(0.02)
        yield server, time.monotonic() - t0
    finally:
        server.stop(timeout=60)


def start_seconds(checkout: Path, config: Path, log_dir: Path, name: str) -> float:
    with zoo_host(checkout, config, log_dir, name) as (_server, seconds):
        return seconds


def rate(generator: LoadGenerator, args: argparse.Namespace, items: bool = False) -> float:
    """Requests (or items) per second at `args.concurrency` connections, its warm-up drained first."""
    generator.run_step(StepPlan(args.concurrency, warmup=0.0, duration=args.warmup))
    step = generator.run_step(StepPlan(args.concurrency, warmup=1.0, duration=args.duration))
    if step.error_count:
        raise RuntimeError(f"{step.error_count} errors: {step.errors}")
    return step.items_per_second if items else step.throughput


def kserve_request() -> PreparedRequest:
    body = orjson.dumps({"instances": [[5.1, 3.5, 1.4, 0.2]]})
    return PreparedRequest("POST", "/v1/models/iris:predict", body, {"Content-Type": "application/json"}, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True, help="the other checkout (with its own .venv)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--starts", type=int, default=3, help="timed starts of each side (3)")
    parser.add_argument("--duration", type=parse_seconds, default=8.0)
    parser.add_argument("--warmup", type=parse_seconds, default=2.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    sides = {"old": args.old.resolve(), "new": REPO}
    text = MINILM.is_file()
    if not text:
        print("models/minilm not built (make minilm): /v1/embeddings is left out", file=sys.stderr)
    measured: list[tuple[str, dict[str, list[float]]]] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        logs = Path(tmp)
        config = zoo_settings(logs, text)
        starts = alternating_rounds(
            {name: partial(start_seconds, path, config, logs, f"{name}-start") for name, path in sides.items()},
            args.starts,
            "start to ready (s)",
        )
        measured.append(("start_s", starts))
        hosts = {name: stack.enter_context(zoo_host(path, config, logs, name))[0] for name, path in sides.items()}
        print("hosts up; measuring", file=sys.stderr)
        loads: dict[str, Callable[[], Any]] = {
            "predict_req_s": lambda: predict_request(CAT_JPEG, 1),
            "kserve_v1_req_s": kserve_request,
        }
        if text:
            loads["embeddings_sentences_s"] = lambda: workload(sentences(), 1)
        for label, make in loads.items():
            generators = {
                name: stack.enter_context(LoadGenerator(host.url, make(), args.concurrency))
                for name, host in hosts.items()
            }
            items = label.startswith("embeddings")
            measured.append(
                (
                    label,
                    alternating_rounds(
                        {name: partial(rate, gen, args, items) for name, gen in generators.items()}, args.rounds, label
                    ),
                )
            )
    result = old_and_new(measured, rounds=args.rounds, duration_s=args.duration, concurrency=args.concurrency)
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
