"""Text embeddings over HTTP: a closed-loop load generator for OpenAI-compatible /v1/embeddings.

A skeleton for the comparison issue 24 asks for, measured once the endpoint exists:
  - onnxpool: `onnxpool serve --config minilm` (the lead's route, POST /v1/embeddings);
  - the ordinary baseline: FastAPI + sentence-transformers under `uvicorn --workers 2`
    (`benchmarks/baselines/st_fastapi.py`; `--start-baseline` starts and stops it here);
  - infinity-emb serving the same ONNX: `infinity_emb v2 --model-id models/minilm
    --engine optimum --port 7997` (not installed by the project; point a --target at it).
Every target gets the same request bytes: `--batch` sentences sampled (seeded) from
`benchmarks.text_sentences`. Before measuring, each target's vectors are compared with
sentence-transformers' saved ones (models/minilm/reference-sentence-transformers.npz,
written by `make minilm-check`) when present, so every server is shown to do the same work.

The load is closed-loop: `--concurrency` client threads, each sending its next request as
soon as the previous answer is in, for `--duration` seconds after a warm-up. Reports
requests/s, sentences/s and latency percentiles per target.

    .venv/bin/python -m benchmarks.text --start-baseline --target onnxpool=http://127.0.0.1:8000/v1/embeddings
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import orjson
import requests

from benchmarks import REPO
from benchmarks.text_sentences import sentences

REFERENCE = REPO / "models" / "minilm" / "reference-sentence-transformers.npz"


@dataclass
class LoadResult:
    """What one closed-loop run measured."""

    seconds: float
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    inputs_per_request: int = 1

    @property
    def requests_per_second(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds > 0 else 0.0

    @property
    def inputs_per_second(self) -> float:
        return self.requests_per_second * self.inputs_per_request

    def percentile(self, q: float) -> float:
        """Latency percentile q (0-100) in seconds; 0 without answers."""
        if not self.latencies:
            return 0.0
        return float(np.percentile(np.asarray(self.latencies), q))


def closed_loop(
    url: str, body: bytes, *, concurrency: int, duration: float, warmup: float = 1.0, inputs_per_request: int = 1
) -> LoadResult:
    """`concurrency` threads POST `body` back to back; answers in the `duration` after `warmup` count.

    A non-200 answer or a connection error counts as an error (its time is not a latency).
    Only requests sent and answered inside the window count, so `duration` must be many
    latencies long (a 3 s request in an 8 s window mostly falls off its edges).
    """
    lock = threading.Lock()
    latencies: list[float] = []
    errors = [0]
    start = time.perf_counter()
    measure_from, stop_at = start + warmup, start + warmup + duration

    def client() -> None:
        with requests.Session() as session:
            while (now := time.perf_counter()) < stop_at:
                try:
                    reply = session.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=60)
                    ok = reply.status_code == 200
                except requests.RequestException:
                    ok = False
                done = time.perf_counter()
                if now >= measure_from and done <= stop_at:
                    with lock:
                        if ok:
                            latencies.append(done - now)
                        else:
                            errors[0] += 1

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return LoadResult(seconds=duration, latencies=latencies, errors=errors[0], inputs_per_request=inputs_per_request)


def request_body(texts: list[str], model: str) -> bytes:
    return orjson.dumps({"model": model, "input": texts, "encoding_format": "base64"})


def decode_vectors(raw: bytes) -> np.ndarray:
    """An OpenAI embeddings response (float or base64) -> [N, D] float32, in index order."""
    data = sorted(orjson.loads(raw)["data"], key=lambda item: item["index"])
    rows = [
        np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        if isinstance(item["embedding"], str)
        else np.asarray(item["embedding"], dtype=np.float32)
        for item in data
    ]
    return np.stack(rows)


def check_target(url: str, texts: list[str], model: str) -> str:
    """One request: the target answers, and (with the saved reference) gives sentence-transformers' vectors."""
    reply = requests.post(url, data=request_body(texts, model), timeout=120)
    reply.raise_for_status()
    vectors = decode_vectors(reply.content)
    if not REFERENCE.is_file():
        return f"{len(vectors)} vectors of {vectors.shape[1]} (no reference saved: make minilm-check)"
    saved = np.load(REFERENCE)
    index = {text: i for i, text in enumerate(saved["texts"].tolist())}
    expected = saved["vectors"][[index[t] for t in texts]]
    cosines = (vectors * expected).sum(axis=1) / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(expected, axis=1))
    return f"cosine vs sentence-transformers: min {cosines.min():.6f}"


@contextmanager
def baseline_server(port: int, workers: int = 2) -> Iterator[str]:
    """FastAPI + sentence-transformers under `uvicorn --workers N`; yields its URL, stops what it started."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-m", "uvicorn", "benchmarks.baselines.st_fastapi:app"]
    argv += ["--workers", str(workers), "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(argv, cwd=REPO, env=env)
    url = f"http://127.0.0.1:{port}/v1/embeddings"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the baseline exited with {process.returncode}")
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                time.sleep(0.5)
        else:
            raise RuntimeError("the baseline did not answer within 180 s")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def report(name: str, result: LoadResult) -> str:
    return (
        f"{name:>12}: {result.requests_per_second:7.2f} req/s  {result.inputs_per_second:8.1f} sentences/s  "
        f"p50 {result.percentile(50) * 1000:7.1f} ms  p99 {result.percentile(99) * 1000:7.1f} ms  "
        f"errors {result.errors}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", action="append", default=[], help="NAME=URL of a /v1/embeddings endpoint")
    parser.add_argument("--start-baseline", action="store_true", help="start FastAPI + sentence-transformers")
    parser.add_argument("--baseline-port", type=int, default=8011)
    parser.add_argument("--model", default="all-minilm-l6-v2", help="the request's `model`")
    parser.add_argument("--batch", type=int, default=32, help="sentences per request")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    targets = dict(item.split("=", 1) for item in args.target)
    texts = random.Random(args.seed).sample(sentences(), args.batch)
    body = request_body(texts, args.model)

    def measure_all(all_targets: dict[str, str]) -> None:
        for name, url in all_targets.items():
            print(f"{name}: {check_target(url, texts, args.model)}")
        for concurrency in args.concurrency:
            print(f"--- {len(texts)} sentences per request, concurrency {concurrency}, {args.duration:.0f} s each")
            # one target after the other, so each has the machine to itself
            for name, url in all_targets.items():
                result = closed_loop(
                    url, body, concurrency=concurrency, duration=args.duration, inputs_per_request=len(texts)
                )
                print(report(name, result))

    if args.start_baseline:
        with baseline_server(args.baseline_port) as url:
            measure_all({**targets, "baseline": url})
    elif targets:
        measure_all(targets)
    else:
        parser.error("give at least one --target NAME=URL, or --start-baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
