"""Text embeddings over HTTP, in one run: onnxpool vs FastAPI + sentence-transformers vs infinity-emb.

The comparison issue 24 asks for, on all-MiniLM-L6-v2 (models/minilm, `make minilm`):
  - onnxpool: `onnxpool serve --config minilm`, its default worker layout, response cache
    off (the load repeats its payloads);
  - fastapi-st, (a): FastAPI + sentence-transformers under `uvicorn --workers 2` in its best
    settings (one torch thread per worker, Nagle's delay worked around);
  - infinity, (b): infinity-emb 0.0.78 serving the same ONNX with its optimum engine
    (benchmarks/infinity.py makes its venv and model folder).
`--start-all` starts the three and stops exactly what it started (`--start-onnxpool`,
`--start-fastapi`, `--start-infinity` one each; `--target NAME=URL` adds a running server,
measured without memory).

Before measuring, every target embeds the sentences of benchmarks.text_sentences that fit
the model (232 of 240) and must agree with sentence-transformers' saved vectors
(models/minilm/reference-sentence-transformers.npz, `make minilm-check`): cosine >=
--min-cosine and the same norm, or the run stops. A server that pools differently (CLS
instead of mean) or does not normalise fails here, so every measured server does the same
work. Only sentences under the model's 256 tokens are checked and sent: the three treat a
longer input differently (sentence-transformers cuts it at 256, infinity at the 512 of
config.json's max_position_embeddings, onnxpool answers 400 unless [task] truncate), so
the same long input would be different work on each.

The load (onnxpool.measure.loadgen): closed-loop, C keep-alive connections each sending its
next request as soon as the last is answered, the same request bytes to every target
(a seeded sample of sentences; 1 per request cycles through them, connections starting at
different ones; 32 per request sends them together; base64 vectors, as OpenAI's client
asks). Per measurement: a warm-up step that ends with all its requests answered (drained,
so nothing from it runs into the window), then the measured step: a lead-in of load, then
the window; only requests completed inside the window count. Memory: the RSS (and PSS) of
the server's whole process tree, sampled every 0.25 s during the measured step, its peak.

Rounds: each round measures every cell (request size x connections) on every target, the
targets' order reversed every other round; the report is the median over rounds
(this machine drifts 10-25 % within minutes: benchmarks/alternating.py).

    make bench-text        # = the command in docs/BENCHMARKS.md, "Text embeddings"
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import requests

from benchmarks import REPO
from benchmarks.text_report import FASTAPI, INFINITY, ONNXPOOL, Measurement, goals_text, summarise, table
from benchmarks.text_targets import (
    EMBEDDINGS,
    MODEL_NAME,
    fastapi_server,
    infinity_server,
    onnxpool_server,
    sampling_memory,
)
from onnxpool.measure.cycle import RequestCycle
from onnxpool.measure.loadgen import LoadGenerator, StepPlan
from onnxpool.measure.payloads import PreparedRequest
from onnxpool.measure.servers import Server

REFERENCE = REPO / "models" / "minilm" / "reference-sentence-transformers.npz"
STARTERS = {ONNXPOOL: onnxpool_server, FASTAPI: fastapi_server, INFINITY: infinity_server}


@dataclass
class Target:
    """A server to measure: its embeddings URL and, when started here, its process (for memory)."""

    name: str
    url: str
    server: Server | None = None


def request_body(texts: list[str], model: str = MODEL_NAME) -> bytes:
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


def vector_agreement(got: np.ndarray, expected: np.ndarray) -> tuple[float, float]:
    """(the lowest cosine of matching rows, the largest relative difference of their norms)."""
    if got.shape != expected.shape:
        raise ValueError(f"vectors of shape {got.shape}, expected {expected.shape}")
    got_norms, expected_norms = np.linalg.norm(got, axis=1), np.linalg.norm(expected, axis=1)
    cosines = (got * expected).sum(axis=1) / np.maximum(got_norms * expected_norms, 1e-12)
    return float(cosines.min()), float(np.max(np.abs(got_norms - expected_norms) / np.maximum(expected_norms, 1e-12)))


@dataclass(frozen=True)
class Reference:
    """sentence-transformers' vectors of the sentences that fit the model uncut."""

    texts: list[str]
    vectors: np.ndarray


def load_reference(path: Path = REFERENCE) -> Reference:
    if not path.is_file():
        raise SystemExit(f"no reference vectors at {path}: run `make minilm-check` first")
    saved = np.load(path)
    limit = int(orjson.loads((path.parent / "sentence_bert_config.json").read_bytes())["max_seq_length"])
    # `lengths` are sentence-transformers' token counts after its cut: at the limit means cut
    fits = saved["lengths"] < limit
    texts = [text for text, ok in zip(saved["texts"].tolist(), fits, strict=True) if ok]
    return Reference(texts, saved["vectors"][fits])


def check_target(url: str, reference: Reference, min_cosine: float, chunk: int = 32) -> str:
    """Every reference sentence through `url` (requests of `chunk`) against sentence-transformers' vectors.

    Raises SystemExit when a vector disagrees: the run would compare different work.
    """
    texts = reference.texts
    parts = []
    for start in range(0, len(texts), chunk):
        body = request_body(texts[start : start + chunk])
        reply = requests.post(url, data=body, headers={"Content-Type": "application/json"}, timeout=300)
        if reply.status_code != 200:
            raise SystemExit(f"{url} answered {reply.status_code}: {reply.text[:300]}")
        parts.append(decode_vectors(reply.content))
    cosine, norm_error = vector_agreement(np.concatenate(parts), reference.vectors)
    verdict = (
        f"{len(texts)} sentences, min cosine vs sentence-transformers {cosine:.6f}, max norm error {norm_error:.1e}"
    )
    if cosine < min_cosine or norm_error > 1e-3:
        raise SystemExit(f"{url}: vectors differ from sentence-transformers' ({verdict})")
    return verdict


def workload(texts: list[str], size: int) -> RequestCycle:
    """`texts` in requests of `size` sentences: the same sentences whatever the size."""
    bodies = [request_body(texts[i : i + size]) for i in range(0, len(texts), size)]
    headers = {"Content-Type": "application/json"}
    return RequestCycle(tuple(PreparedRequest("POST", EMBEDDINGS, body, headers, items=size) for body in bodies))


def measure_once(
    target: Target, generator: LoadGenerator, connections: int, args: argparse.Namespace, size: int, round_: int
) -> Measurement:
    """A drained warm-up, then a lead-in and the window, the server's memory sampled meanwhile."""
    # run_step returns only when every connection has its last reply: the warm-up's
    # requests are all answered before the measured step starts (none is left running).
    generator.run_step(StepPlan(connections, warmup=0.0, duration=args.warmup))
    # The lead-in: the window opens on a server in its steady state, with requests part-
    # served, which count when they complete inside it, as the requests cut off when it
    # closes do not. Opening it on an idle server would credit no work done before the
    # window but still lose the work cut off at its end: about half a service time per
    # busy worker, which would bias against the slowest server.
    memory = sampling_memory(target.server.pid) if target.server is not None else contextlib.nullcontext(None)
    with memory as peak:
        step = generator.run_step(StepPlan(connections, warmup=args.lead_in, duration=args.duration))
    answered = step.latencies.size > 0
    return Measurement(
        target=target.name,
        size=size,
        connections=connections,
        round=round_,
        sentences_per_s=step.items_per_second,
        p50_ms=step.percentile(50) * 1000 if answered else 0.0,
        p99_ms=step.percentile(99) * 1000 if answered else 0.0,
        requests=step.requests,
        errors=step.error_count,
        rss_bytes=peak.rss if peak is not None else None,
        pss_bytes=peak.pss if peak is not None else None,
    )


def run(targets: list[Target], texts: list[str], args: argparse.Namespace) -> list[Measurement]:
    """Every round: every cell, every target (order reversed every other round)."""
    measurements: list[Measurement] = []
    with contextlib.ExitStack() as stack:
        generators = {
            (target.name, size): stack.enter_context(
                LoadGenerator(target.url, workload(texts, size), max(args.connections), conns_per_process=4)
            )
            for target in targets
            for size in args.sizes
        }
        for round_ in range(args.rounds):
            order = targets if round_ % 2 == 0 else targets[::-1]
            for size in args.sizes:
                for connections in args.connections:
                    for target in order:
                        m = measure_once(target, generators[target.name, size], connections, args, size, round_)
                        measurements.append(m)
                        print(
                            f"  round {round_ + 1}/{args.rounds}, {size} sent/req, {connections} conns, "
                            f"{target.name}: {m.sentences_per_s:.1f} sent/s, p99 {m.p99_ms:.1f} ms"
                            + (f", RSS {m.rss_bytes / 2**20:.0f} MiB" if m.rss_bytes else "")
                            + (f", {m.errors} errors" if m.errors else ""),
                            file=sys.stderr,
                            flush=True,
                        )
    return measurements


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--target", action="append", default=[], help="NAME=URL of a running /v1/embeddings")
    parser.add_argument("--start-all", action="store_true", help="start onnxpool, fastapi-st and infinity")
    parser.add_argument("--start-onnxpool", action="store_true")
    parser.add_argument("--start-fastapi", action="store_true", help="FastAPI + sentence-transformers (a)")
    parser.add_argument("--start-infinity", action="store_true", help="infinity-emb (b): benchmarks/infinity.py")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 32], help="sentences per request")
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds measured per target and cell")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of drained warm-up before each")
    parser.add_argument("--lead-in", type=float, default=2.0, help="seconds of load just before each window")
    parser.add_argument("--seed", type=int, default=1, help="which sentences are sampled")
    parser.add_argument("--min-cosine", type=float, default=0.999)
    parser.add_argument("--startup", type=float, default=300.0, help="seconds a server may take to start")
    parser.add_argument("--log-dir", type=Path, help="server logs (default: a fresh temporary folder)")
    parser.add_argument("--json", type=Path, help="write the per-round results and medians here")
    args = parser.parse_args(argv)
    if max(args.sizes) % min(args.sizes) or any(max(args.sizes) % s for s in args.sizes):
        parser.error("every --sizes value must divide the largest (the sentences are the same at every size)")
    if args.start_all:
        args.start_onnxpool = args.start_fastapi = args.start_infinity = True
    if not (args.target or args.start_onnxpool or args.start_fastapi or args.start_infinity):
        parser.error("give --start-all, a --start-* or --target NAME=URL")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="onnxpool-text-bench-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    starts = ((ONNXPOOL, args.start_onnxpool), (FASTAPI, args.start_fastapi), (INFINITY, args.start_infinity))
    wanted = [name for name, on in starts if on]
    targets = [Target(*item.split("=", 1)) for item in args.target]
    cells = len(args.sizes) * len(args.connections) * (len(wanted) + len(targets))
    each = args.warmup + args.lead_in + args.duration
    estimate = args.rounds * cells * each
    print(f"{args.rounds} rounds x {cells} target-cells x {each:.0f} s: ~{estimate / 60:.0f} min of load, "
          f"plus start-up; server logs in {log_dir}", file=sys.stderr)  # fmt: skip
    reference = load_reference()
    with contextlib.ExitStack() as stack:
        for name in wanted:
            started = time.monotonic()
            server = STARTERS[name](log_dir, args.startup)
            stack.callback(server.stop)
            targets.append(Target(name, server.url + EMBEDDINGS, server))
            print(
                f"{name}: up in {time.monotonic() - started:.0f} s at {server.url} (pid {server.pid})", file=sys.stderr
            )
        for target in targets:
            print(f"{target.name}: {check_target(target.url, reference, args.min_cosine)}", file=sys.stderr)
        texts = random.Random(args.seed).sample(reference.texts, max(args.sizes))
        began = time.monotonic()
        measurements = run(targets, texts, args)
        took = time.monotonic() - began
    summary = summarise(measurements)
    names = [t.name for t in targets]
    print(table(summary, names))
    if goals := goals_text(summary):
        print("goals (issue 24):\n" + goals)
    print(f"measured in {took / 60:.1f} min", file=sys.stderr)
    if args.json:
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        document = {"settings": settings, "measured_seconds": round(took, 1), "targets": names, **summary}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
