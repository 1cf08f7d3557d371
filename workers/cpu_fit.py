"""Does this CPU run an INT8 model the way it was judged? The recipe in the model vs the CPU's flags.

`onnxpool quantize` writes its recipe into the model (ONNX `metadata_props`, keys `onnxpool.*`),
so it travels with every copy of the file. The master reads those keys through the preflight
subprocess (`ModelInfo.metadata`: onnxruntime is never imported in the gunicorn master) and the
CPU's flags from /proc/cpuinfo, and `check_fit` says whether they agree.

Why it matters: on x86, onnxruntime multiplies u8 activations by s8 weights with VNNI
(`vpdpbusd`, exact int32 sums) when the CPU has it, and otherwise with `vpmaddubsw`, which adds
each PAIR of products into a SATURATING int16. With 8-bit weights two products can exceed
32767 and are clipped; with 7-bit weights (`reduce_range`) they cannot. A U8S8 model made
without reduce_range was judged on VNNI and gives other (worse) answers on an AVX2-only CPU.

This module imports neither onnxruntime nor onnx: the master uses it.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

METADATA_PREFIX = "onnxpool."
# Read CPU flags from this file instead of /proc/cpuinfo: to check a model against another
# machine's /proc/cpuinfo, and for tests (a CPU without VNNI on a machine with it).
CPUINFO_ENV = "ONNXPOOL_CPUINFO"
X86 = ("x86_64", "amd64", "i386", "i686")
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def parse_cpu_flags(cpuinfo_text: str) -> frozenset[str]:
    """Flags of the first processor in a /proc/cpuinfo dump (x86 `flags`, arm `Features`)."""
    for line in cpuinfo_text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpuinfo_path() -> Path:
    return Path(os.environ.get(CPUINFO_ENV) or "/proc/cpuinfo")


def cpu_flags(cpuinfo: Path | None = None) -> frozenset[str]:
    try:
        return parse_cpu_flags((cpuinfo or cpuinfo_path()).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return frozenset()


def has_vnni(flags: frozenset[str]) -> bool:
    """An int8 dot-product instruction: AVX512-VNNI, AVX-VNNI or AMX-INT8."""
    return bool(flags & VNNI_FLAGS)


def is_x86(machine: str | None = None) -> bool:
    return (machine or platform.machine()).lower() in X86


@dataclass(frozen=True)
class ModelRecipe:
    """The `onnxpool.*` metadata of a model made by `onnxpool quantize`."""

    target: str
    reduce_range: bool
    activation_type: str
    weight_type: str
    version: str

    def to_metadata(self) -> dict[str, str]:
        return {
            f"{METADATA_PREFIX}target": self.target,
            f"{METADATA_PREFIX}reduce_range": "true" if self.reduce_range else "false",
            f"{METADATA_PREFIX}activation_type": self.activation_type,
            f"{METADATA_PREFIX}weight_type": self.weight_type,
            f"{METADATA_PREFIX}version": self.version,
        }

    @classmethod
    def from_metadata(cls, metadata: dict[str, str]) -> ModelRecipe | None:
        """None for a model without onnxpool's keys (a float model, or INT8 made elsewhere)."""
        get = metadata.get
        target = get(f"{METADATA_PREFIX}target")
        if target is None:
            return None
        return cls(
            target=target,
            reduce_range=get(f"{METADATA_PREFIX}reduce_range", "false") == "true",
            activation_type=get(f"{METADATA_PREFIX}activation_type", ""),
            weight_type=get(f"{METADATA_PREFIX}weight_type", ""),
            version=get(f"{METADATA_PREFIX}version", ""),
        )

    @property
    def needs_vnni(self) -> bool:
        """u8 x s8 with full 8-bit weights: exact only with VNNI (the pairwise int16 sums saturate without)."""
        return self.activation_type == "QUInt8" and self.weight_type == "QInt8" and not self.reduce_range


@dataclass(frozen=True)
class CpuFit:
    """The verdict for one model on one CPU: `label` is what the metric and the metadata show."""

    label: str
    """"ok", "no-vnni" (made for VNNI, this CPU lacks it) or "not-onnxpool" (no recipe in the model)."""
    message: str | None = None
    """One line (what, why, what to do) when the CPU does not fit; None when it does."""

    @property
    def ok(self) -> bool:
        return self.message is None


def made_for_this_cpu(recipe: ModelRecipe | None, flags: frozenset[str], machine: str | None = None) -> str | None:
    """Why a build made for one CPU family is the one for this CPU (`[model] cpu_variants`), or None.

    `avx512-vnni` builds (8-bit weights) need a VNNI instruction; `avx2` builds are the AVX2
    kernels' own (x86 with AVX2 and no VNNI). `portable` and `host` builds are no family's:
    they are what `path` is for.
    """
    if recipe is None or not is_x86(machine):
        return None
    if recipe.target == "avx512-vnni" and has_vnni(flags):
        return f"made for avx512-vnni and this CPU has {', '.join(sorted(flags & VNNI_FLAGS))}"
    if recipe.target == "avx2" and "avx2" in flags and not has_vnni(flags):
        return "made for avx2 and this CPU has AVX2 without VNNI"
    return None


def check_fit(recipe: ModelRecipe | None, flags: frozenset[str], machine: str | None = None) -> CpuFit:
    if recipe is None:
        return CpuFit("not-onnxpool")
    if recipe.needs_vnni and is_x86(machine) and not has_vnni(flags):
        return CpuFit(
            "no-vnni",
            f"the INT8 model was made for CPUs with VNNI (onnxpool target {recipe.target!r}: u8 x s8 with "
            "8-bit weights, reduce_range off) and this CPU has no VNNI (avx512_vnni/avx_vnni): onnxruntime "
            "adds its products in saturating 16-bit integers here, so answers differ from the ones it was "
            "judged on; re-make it with `onnxpool quantize --target portable` (or avx2), or serve the FP32 "
            'model; [model] cpu_mismatch = "refuse" refuses to start instead',
        )
    return CpuFit("ok")


def describe(metadata: dict[str, str], flags: frozenset[str]) -> dict[str, object] | None:
    """The model's quantization recipe and its fit with this CPU, for `/v2/models/<name>`; None
    for a model without onnxpool's recipe."""
    recipe = ModelRecipe.from_metadata(metadata)
    if recipe is None:
        return None
    fit = check_fit(recipe, flags)
    return {
        "target": recipe.target,
        "reduce_range": recipe.reduce_range,
        "activation_type": recipe.activation_type,
        "weight_type": recipe.weight_type,
        "made_with_onnxpool": recipe.version,
        "cpu_fit": fit.label,
        **({"cpu_warning": fit.message} if fit.message else {}),
    }
