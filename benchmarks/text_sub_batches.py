"""In-process: one padded batch vs length-sorted sub-batches, on the real text model.

Takes `--batch` mixed-length sentences from `benchmarks.text_sentences` (a seeded sample),
tokenizes them once, then alternates rounds of: the whole request as one padded batch, and
the same request sorted by length in sub-batches of each `--sizes` value (through
`onnxpool.tasks.text.pipeline.embed_batch`, i.e. what a worker would run), on one
onnxruntime session with `--threads` intra-op threads. Prints sentences/s per layout
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

from benchmarks.minilm_check import MINILM
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

    import onnxruntime as ort

    from onnxpool.tasks.text.options import TextEmbeddingOptions, resolve
    from onnxpool.tasks.text.pipeline import embed_batch
    from onnxpool.tasks.text.tokenizing import configure_threads

    configure_threads(args.threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(args.model / "model.onnx"), options, providers=["CPUExecutionProvider"])
    task = resolve(TextEmbeddingOptions(truncate=True), args.model, tuple(i.name for i in session.get_inputs()))
    texts = random.Random(args.seed).sample(sentences(), args.batch)
    encoded = task.tokenizer.encode(texts, truncate=True)
    print(
        f"{len(texts)} sentences, {int(encoded.lengths.min())} to {int(encoded.lengths.max())} tokens "
        f"(median {int(np.median(encoded.lengths))}); {args.threads} thread(s)"
    )

    def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(session.run(["last_hidden_state"], feeds)[0])

    layouts: list[int | None] = [None, *args.sizes]
    reference = embed_batch(encoded, run, task.pooling, batch_size=None)  # also the warm-up
    rates: dict[int | None, list[float]] = {layout: [] for layout in layouts}
    for _ in range(args.rounds):
        for layout in layouts:
            start = time.perf_counter()
            vectors = embed_batch(encoded, run, task.pooling, batch_size=layout)
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
