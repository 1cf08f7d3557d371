"""Step 4, accuracy: INT8 logits vs FP32 logits (agreement, top-5 overlap, KL, labelled accuracy)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from onnxpool.measure.progress import Progress, bar
from onnxpool.quantize.images import FloatArray
from onnxpool.tasks.image.settings import PreprocessSettings


def run_logits(session: Any, images: FloatArray, progress: Progress | None = None, what: str = "") -> FloatArray:
    name = session.get_inputs()[0].name
    outs = []
    for start in range(0, len(images), 32):
        if progress is not None:
            progress.status(f"{what}: {bar(start / len(images))} {start}/{len(images)} images")
        outs.append(np.asarray(session.run(None, {name: images[start : start + 32]})[0], dtype=np.float32))
    return np.concatenate(outs).reshape(len(images), -1)


@dataclass(frozen=True)
class Accuracy:
    """INT8 vs FP32 on one image set."""

    n: int
    top1_agreement: float
    top5_overlap: float
    mean_kl: float
    max_kl: float
    decisive_margin: float
    decisive_n: int
    decisive_agreement: float
    top1_in_fp32_top2: float
    fp32_top1_accuracy: float | None = None
    int8_top1_accuracy: float | None = None
    fp32_top5_accuracy: float | None = None
    int8_top5_accuracy: float | None = None
    labelled: int = 0

    def disagreement(self, gate: str) -> float:
        return 1.0 - (self.decisive_agreement if gate == "decisive" else self.top1_agreement)


def compare_logits(
    ref: FloatArray, test: FloatArray, labels: Sequence[int] | None = None, decisive_margin: float = 0.1
) -> Accuracy:
    """Top-1 agreement, top-5 overlap, KL(softmax FP32 || softmax INT8); agreement on the images
    where FP32 is decisive (top-1 minus top-2 probability >= margin); with labels (-1 =
    unknown) top-1/top-5 accuracy of both."""
    k = min(5, ref.shape[1])
    r1, t1 = ref.argmax(axis=1), test.argmax(axis=1)
    r5 = np.argsort(-ref, axis=1, kind="stable")[:, :k]
    t5 = np.argsort(-test, axis=1, kind="stable")[:, :k]
    overlap = np.array([len(set(a.tolist()) & set(b.tolist())) / k for a, b in zip(r5, t5, strict=True)])

    def log_softmax(x: FloatArray) -> npt.NDArray[np.float64]:
        z = x.astype(np.float64)
        z -= z.max(axis=1, keepdims=True)
        result: npt.NDArray[np.float64] = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return result

    lp, lq = log_softmax(ref), log_softmax(test)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=1)
    probs = np.sort(np.exp(lp), axis=1)
    decisive = (probs[:, -1] - probs[:, -2]) >= decisive_margin if ref.shape[1] > 1 else np.ones(len(ref), bool)
    agree = r1 == t1
    extra: dict[str, Any] = {}
    if labels is not None:
        lab = np.asarray(labels, dtype=np.int64)
        known = lab >= 0
        if known.any():
            extra = {
                "fp32_top1_accuracy": float((r1[known] == lab[known]).mean()),
                "int8_top1_accuracy": float((t1[known] == lab[known]).mean()),
                "fp32_top5_accuracy": float((r5[known] == lab[known, None]).any(axis=1).mean()),
                "int8_top5_accuracy": float((t5[known] == lab[known, None]).any(axis=1).mean()),
                "labelled": int(known.sum()),
            }
    return Accuracy(
        n=len(ref),
        top1_agreement=float(agree.mean()),
        top5_overlap=float(overlap.mean()),
        mean_kl=float(kl.mean()),
        max_kl=float(kl.max()),
        decisive_margin=decisive_margin,
        decisive_n=int(decisive.sum()),
        decisive_agreement=float(agree[decisive].mean()) if decisive.any() else 1.0,
        top1_in_fp32_top2=float((t1[:, None] == r5[:, :2]).any(axis=1).mean()),
        **extra,
    )


def grey_level_noise(images: FloatArray, spec: PreprocessSettings, levels: float = 0.5, seed: int = 0) -> FloatArray:
    """`images` plus uniform +-`levels` grey levels of noise, in the model's normalised units.

    FP32 on these vs FP32 on the originals is the noise floor of the agreement numbers: on
    near-ties FP32 flips its own top-1 under noise far below what a JPEG re-encode adds.
    """
    step = np.asarray(spec.scale, np.float64) / np.asarray(spec.std, np.float64)
    step = step[:, None, None] if spec.layout != "NHWC" else step
    noise = np.random.default_rng(seed).uniform(-levels, levels, images.shape) * step
    noisy: FloatArray = (images + noise).astype(np.float32)
    return noisy
