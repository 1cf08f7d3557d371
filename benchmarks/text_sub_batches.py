"""In-process: one padded batch vs length-sorted sub-batches, on the real text model.

Takes `--batch` mixed-length sentences from `benchmarks.text_sentences` (a seeded sample) as
one request, then alternates rounds of: the request as one padded batch (`[task] sub_batch = 0`),
and the same request sorted by length in sub-batches of each `--sizes` value (`sub_batch`, no
`sub_batch_tokens` cap), each the served text-embedding task (config/minilm.toml, built through
the registry, `TextEmbedding.run`: what a worker runs, tokenizing included), on one onnxruntime
session with `--threads` intra-op threads. Prints sentences/s per layout
(median over rounds) and checks that every layout gives the same vectors.

    .venv/bin/python -m benchmarks.text_sub_batches --batch 32 --sizes 4 8 16 --rounds 5

Needs `make minilm`. A measurement, not a test: the machine's load moves the numbers.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.minilm_check import MINILM, served_task
from benchmarks.text_sentences import sentences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=MINILM)
    parser.add_argument("--batch", type=int, default=32, help="sentences per request")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16], help="sub-batch sizes to try")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if not (args.model / "model.onnx").is_file():
        print(f"{args.model}/model.onnx is missing: run `make minilm` first", file=sys.stderr)
        return 1

    from onnxpool.local import LocalRequest, settings_for
    from onnxpool.tasks.registry import build_task
    from onnxpool.tasks.text.embedding import TextEmbedding

    local = served_task(args.model, args.threads)
    layouts: list[int | None] = [None, *args.sizes]
    tasks: dict[int | None, TextEmbedding] = {}
    for layout in layouts:  # the served task per layout, all on the one session (no token cap)
        loaded = settings_for(
            "minilm",
            args.model / "model.onnx",
            {"task.truncate": True, "task.sub_batch": layout or 0, "task.sub_batch_tokens": 0},
        )
        task = build_task(loaded, local.task.model)
        assert isinstance(task, TextEmbedding)
        tasks[layout] = task
    texts = random.Random(args.seed).sample(sentences(), args.batch)
    reference_task = tasks[None]
    request = reference_task.read(
        LocalRequest.json({"input": texts, "model": reference_task.served.name}, route="/v1/embeddings")
    )
    lengths = reference_task.encode(texts, None).lengths
    print(
        f"{len(texts)} sentences, {int(lengths.min())} to {int(lengths.max())} tokens "
        f"(median {int(np.median(lengths))}); {args.threads} thread(s)"
    )
    reference = reference_task.run(request, local.runner).vectors  # also the warm-up
    rates: dict[int | None, list[float]] = {layout: [] for layout in layouts}
    for _ in range(args.rounds):
        for layout in layouts:
            start = time.perf_counter()
            vectors = tasks[layout].run(request, local.runner).vectors
            rates[layout].append(len(texts) / (time.perf_counter() - start))
            if not np.allclose(vectors, reference, atol=1e-5):
                print(f"layout {layout} gave different vectors", file=sys.stderr)
                return 1
    base = statistics.median(rates[None])
    for layout in layouts:
        rate = statistics.median(rates[layout])
        name = "one padded batch" if layout is None else f"sorted, sub-batches of {layout}"
        print(f"{name:>28}: {rate:7.1f} sentences/s  (x{rate / base:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
