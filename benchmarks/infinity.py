"""infinity-emb, the second reference for benchmarks/text.py: its own venv, its model folder, its server.

    .venv/bin/python -m benchmarks.infinity setup     # once: .bench/infinity/ (git-ignored)

Why a venv of its own: infinity-emb 0.0.78 pins numpy<2 and old click/typer/uvicorn, which
onnxpool's venv must not be bent to. Why these steps:
  - torch is installed first, pinned (the local 2.13.0 wheel): optimum depends on torch, and
    pip must never pick a torch version itself;
  - infinity optimises the ONNX graph at start (optimum's ORTOptimizer, level 99: the
    onnxruntime.transformers fusions) unless it finds a `*_optimized.onnx` in its cache. With
    optimum 2 (the one that imports with torch 2.13: optimum 1's exporter needs a torch.onnx
    function 2.13 no longer has) that step fails on a keyword optimum 2 dropped
    (`optimize_with_onnxruntime_only`) and infinity serves the unoptimised graph. So the
    setup runs the same optimisation with optimum 2's API into infinity's cache
    (HUGGINGFACE_HUB_CACHE=.bench/infinity/hf-cache), where infinity finds and serves it;
  - torchvision is removed if anything pulled it in: with it, importing transformers fails
    with `operator torchvision::nms does not exist` (a torchvision built for another torch);
  - the model folder holds only model.onnx plus the tokenizer and config files: infinity's
    optimum engine picks the ONNX file it finds in the folder, and serves it from
    `--model-id .` started inside that folder (no hub access: HF_HUB_OFFLINE=1);
  - `--pooling-method mean`: infinity's `auto` picks CLS pooling for this model, which
    sentence-transformers does not use (benchmarks/text.py's vector check catches that).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks import REPO

ROOT = REPO / ".bench" / "infinity"
VENV = ROOT / "venv"
MODEL_DIR = ROOT / "model"
SOURCE_MODEL = REPO / "models" / "minilm"
INFINITY = "infinity-emb[optimum,server]==0.0.78"
TORCH = "torch==2.13.0"
# optimum 2 moved its ONNX Runtime part out and dropped OptimizationConfig's
# `optimize_with_onnxruntime_only`: infinity 0.0.78 then logs "Optimization failed" and
# serves the unoptimised graph, which is not infinity's recommended (default) setup.
HF_CACHE = ROOT / "hf-cache"
# Where infinity 0.0.78 (transformer/utils_optimum.py) looks for an optimised graph of
# `--model-id .` on the CPU before optimising one itself.
OPTIMIZED_DIR = HF_CACHE / "infinity_onnx" / "CPUExecutionProvider" / "."
# infinity's own optimisation (utils_optimum.optimize_model on the CPU) in optimum 2's
# API: the same level and flags, less the keyword optimum 2 no longer takes (whose value
# infinity passed, False, was optimum 1's default).
OPTIMIZE = """
import sys
from optimum.onnxruntime import ORTModelForFeatureExtraction, ORTOptimizer
from optimum.onnxruntime.configuration import OptimizationConfig
model = ORTModelForFeatureExtraction.from_pretrained(sys.argv[1], file_name="model.onnx")
config = OptimizationConfig(optimization_level=99, optimize_for_gpu=False, fp16=False)
ORTOptimizer.from_pretrained(model).optimize(optimization_config=config, save_dir=sys.argv[2], one_external_file=True)
"""
# What the optimum engine reads besides model.onnx (the tokenizer, the architecture's config).
MODEL_FILES = ("model.onnx", "config.json", "tokenizer.json")


def python() -> Path:
    return VENV / "bin" / "python"


def executable() -> Path:
    return VENV / "bin" / "infinity_emb"


def pip(*args: str) -> None:
    subprocess.run([str(python()), "-m", "pip", "install", "--quiet", *args], check=True)


def setup_venv() -> None:
    """The venv with infinity-emb and its optimum (onnxruntime) engine, made anew when its pins change."""
    pins = f"{TORCH}\nnumpy<2\n"
    stamp = VENV / "onnxpool-pins.txt"
    if stamp.is_file() and stamp.read_text() == pins:
        return
    # From scratch: pip keeps what an older resolution left (optimum-onnx after optimum 2).
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip("--upgrade", "pip")
    constraints = ROOT / "constraints.txt"
    constraints.write_text(pins)
    pip(TORCH)
    pip("-c", str(constraints), INFINITY)
    subprocess.run([str(python()), "-m", "pip", "uninstall", "--yes", "--quiet", "torchvision"], check=False)
    subprocess.run([str(python()), "-c", "import infinity_emb.infinity_server, optimum.onnxruntime"], check=True)
    stamp.write_text(pins)


def setup_model() -> None:
    """.bench/infinity/model: a copy of the exported ONNX and the files infinity needs, nothing else."""
    missing = [name for name in MODEL_FILES if not (SOURCE_MODEL / name).is_file()]
    if missing:
        raise SystemExit(f"{SOURCE_MODEL} lacks {', '.join(missing)}: run `make minilm` first")
    if MODEL_DIR.exists():
        shutil.rmtree(MODEL_DIR)  # infinity may have written its optimised copies there
    MODEL_DIR.mkdir(parents=True)
    for name in MODEL_FILES:
        shutil.copy2(SOURCE_MODEL / name, MODEL_DIR / name)
    shutil.rmtree(OPTIMIZED_DIR, ignore_errors=True)
    OPTIMIZED_DIR.mkdir(parents=True)
    subprocess.run([str(python()), "-c", OPTIMIZE, str(MODEL_DIR), str(OPTIMIZED_DIR)], check=True, env=server_env())
    if not list(OPTIMIZED_DIR.glob("*_optimized.onnx")):
        raise SystemExit(f"no *_optimized.onnx in {OPTIMIZED_DIR}: infinity would optimise (and fail) at start")


def server_argv(port: int, batch_size: int = 32) -> list[str]:
    """infinity's recommended CPU serving of the folder: the optimum engine on the CPU, mean pooling."""
    return [
        str(executable()),
        "v2",
        "--model-id",
        ".",
        "--engine",
        "optimum",
        "--device",
        "cpu",
        "--pooling-method",
        "mean",
        "--batch-size",
        str(batch_size),
        "--served-model-name",
        "all-minilm-l6-v2",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--url-prefix",
        "/v1",
        # no line per request on stdout (as the other two servers run, access logs off)
        "--log-level",
        "warning",
    ]


def server_env() -> dict[str, str]:
    """Offline, no telemetry (infinity reports usage unless told not to)."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_CACHE": str(HF_CACHE),
        # what infinity reads: huggingface_hub's legacy constant, set from this name only
        "HUGGINGFACE_HUB_CACHE": str(HF_CACHE),
        "DO_NOT_TRACK": "1",
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
    }


def ready() -> str | None:
    """None when the venv and model folder exist, else what to run."""
    if not executable().exists() or not list(OPTIMIZED_DIR.glob("*_optimized.onnx")):
        return "run `.venv/bin/python -m benchmarks.infinity setup` first"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="set up infinity-emb for benchmarks/text.py")
    parser.add_argument("command", choices=["setup", "model"], help="setup: venv and model folder; model: folder only")
    args = parser.parse_args(argv)
    ROOT.mkdir(parents=True, exist_ok=True)
    if args.command == "setup":
        setup_venv()
    setup_model()
    print(f"infinity-emb ready: {executable()} serving {MODEL_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
