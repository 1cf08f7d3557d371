"""Step 2, the target: which recipe, and which CPUs' int8 kernels judge the candidates.

onnxruntime (MLAS) picks its u8 x s8 kernel by the CPU it runs on, and they do not compute the
same numbers:

- AVX2 without VNNI (`avx2`): `vpmaddubsw` adds each PAIR of u8 x s8 products into a
  SATURATING int16. With 8-bit weights (|w| <= 127) a pair reaches 2 x 255 x 127 = 64770 and is
  clipped to 32767; with `reduce_range` (7-bit weights, |w| <= 63) it stays below 32130, so the
  sums are exact. onnxruntime's quantization documentation recommends reduce_range (or U8U8)
  there for this reason.
- AVX512-VNNI / AVX-VNNI (`avx512-vnni`): `vpdpbusd` sums into int32: exact with 8-bit weights.
- arm64: sdot/udot or widening multiplies: exact.

So a model made with 8-bit weights and judged on VNNI is a different model on an AVX2 server.
Targets:

| target | recipe | judged with |
|---|---|---|
| `portable` (default) | U8S8, per-channel, reduce_range (8-bit depthwise) | AVX2 AND VNNI (arm64 when it runs) |
| `avx2` | U8S8, per-channel, reduce_range (8-bit depthwise) | AVX2 kernels |
| `avx512-vnni` | U8S8, per-channel, 8-bit weights | VNNI kernels |
| `host` | as the host needs (reduce_range only on x86 without VNNI) | this host's kernels |

"8-bit depthwise": with reduce_range, depthwise convolutions keep 8-bit weights (and the int32
bias at their scale): onnxruntime's depthwise u8 x s8 kernels widen to 16 bits and sum in int32,
not in vpmaddubsw's int16 pairs, so they are exact on AVX2 too (EfficientNet-Lite0: logits
identical natively and under qemu Haswell; mean KL 0.027 -> 0.012). `--no-depthwise-8bit` turns
it off.

Measured on EfficientNet-Lite0, 148 held-out photos, 3 float layers (models/efficientnet-lite0-int8/
MODEL_CARD.md): 8-bit weights agree with FP32's top-1 on 0.973 judged with VNNI kernels and on
0.899 when the same file runs on (emulated) AVX2 kernels; with reduce_range the two kernels give
bit-identical logits. U8U8 (exact on AVX2 too) ran at 0.23x FP32's speed on the VNNI host (no
VNNI kernel for it), so no target uses it.

A family of kernels is judged natively when this host uses it, otherwise under qemu's user-mode
emulator (`qemu-x86_64 -cpu Haswell`: onnxruntime then takes exactly its AVX2 kernels; checked
bit for bit against Skylake-Client). qemu's TCG has no AVX512, so VNNI kernels can only be
judged on a CPU that has them: elsewhere that family is reported as *not evaluated*.
"""

from __future__ import annotations

import platform
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from onnxpool.quantize.errors import QuantizeError
from onnxpool.workers.cpu_fit import has_vnni, is_x86

CalibMethod = Literal["MinMax", "MinMaxMean", "Entropy", "Percentile"]
CALIB_METHODS: tuple[CalibMethod, ...] = ("MinMax", "MinMaxMean", "Entropy", "Percentile")
# MinMaxMean: each tensor's range is the MEAN over calibration batches of the batch's min and
# max (onnxruntime's MinMax calibrator with moving_average), not the extreme of all images, so
# one outlier photo does not widen a range for all; a few values are clipped instead.
MINMAX_BATCH = 16  # images per calibration batch for the MinMax methods (MinMaxMean averages over these)

TargetName = Literal["portable", "avx2", "avx512-vnni", "host"]
TARGETS: tuple[TargetName, ...] = ("portable", "avx2", "avx512-vnni", "host")


def ort_method(method: CalibMethod) -> str:
    """onnxruntime's CalibrationMethod name for one of ours."""
    return "MinMax" if method == "MinMaxMean" else method


@dataclass(frozen=True)
class Recipe:
    """Everything besides the images that decides the INT8 model."""

    target: str = "host"
    calibrate_method: CalibMethod = "MinMax"
    reduce_range: bool = False
    per_channel: bool = True
    quant_format: str = "QDQ"
    activation_type: str = "QUInt8"
    weight_type: str = "QInt8"
    percentile: float = 99.999
    depthwise_8bit: bool = False
    """With reduce_range: 8-bit weights in depthwise convolutions (7-bit elsewhere). onnxruntime's
    depthwise u8 x s8 kernels widen to 16 bits and sum in int32 (no vpmaddubsw pairs), so they are
    exact on AVX2 too; EfficientNet-Lite0: mean KL 0.027 -> 0.014, identical logits under qemu Haswell."""
    num_bins: int = 2048
    num_quantized_bins: int = 256
    excluded: tuple[str, ...] = ()

    def with_excluded(self, nodes: Sequence[str]) -> Recipe:
        return replace(self, excluded=tuple(nodes))


@dataclass(frozen=True)
class Kernels:
    """One family of onnxruntime int8 kernels a candidate can be judged with."""

    name: str
    description: str
    qemu_cpu: str | None
    """The `qemu-x86_64 -cpu` model under which onnxruntime takes these kernels; None: not emulable."""

    def native(self, flags: frozenset[str], machine: str) -> bool:
        """Does onnxruntime take exactly these kernels on this host?"""
        if self.name == "arm64":
            return machine.lower() in ("aarch64", "arm64")
        if not is_x86(machine):
            return False
        if self.name == "avx512-vnni":
            return "avx512_vnni" in flags
        if self.name == "avx2":  # AVX512 without VNNI takes AVX512BW kernels: not these
            return {"avx2", "fma"} <= flags and "avx512f" not in flags and not has_vnni(flags)
        return True  # "host"


AVX2 = Kernels("avx2", "AVX2 without VNNI (vpmaddubsw: saturating int16 pairs)", "Haswell")
VNNI = Kernels("avx512-vnni", "AVX512-VNNI (vpdpbusd: exact int32 sums)", None)
ARM64 = Kernels("arm64", "arm64 (exact int32 sums)", None)
HOST = Kernels("host", "this host's kernels", None)

JUDGED_WITH: dict[str, tuple[Kernels, ...]] = {
    "portable": (AVX2, VNNI, ARM64),
    "avx2": (AVX2,),
    "avx512-vnni": (VNNI,),
    "host": (HOST,),
}


def host_reduce_range(flags: frozenset[str], machine: str | None = None) -> bool:
    """7-bit weights only on x86 without VNNI (u8 x s8 via vpmaddubsw saturates int16 there)."""
    return is_x86(machine) and not has_vnni(flags)


def choose_recipe(
    target: str, flags: frozenset[str], method: CalibMethod = "MinMax", machine: str | None = None
) -> Recipe:
    """The documented recipe of `target` (module docstring); `flags` matter for `host` only."""
    if target in ("portable", "avx2"):
        return Recipe(target=target, calibrate_method=method, reduce_range=True, depthwise_8bit=True)
    if target == "avx512-vnni":
        return Recipe(target=target, calibrate_method=method, reduce_range=False)
    if target == "host":
        reduce = host_reduce_range(flags, machine)
        return Recipe(target=target, calibrate_method=method, reduce_range=reduce, depthwise_8bit=reduce)
    raise QuantizeError(f"unknown --target {target!r}; choose one of: {', '.join(TARGETS)}")


@dataclass(frozen=True)
class Judge:
    """How one kernel family of the target is judged here: natively, under qemu, or not at all."""

    kernels: Kernels
    how: Literal["native", "qemu", "not evaluated"]
    command: tuple[str, ...] = ()
    """Prefix that runs a Python process on these kernels (qemu-x86_64 -cpu MODEL), () when native."""
    reason: str = ""

    @property
    def evaluated(self) -> bool:
        return self.how != "not evaluated"

    def describe(self) -> str:
        if self.how == "qemu":
            return f"{self.kernels.name} (emulated: {' '.join(self.command)})"
        if self.how == "native":
            return f"{self.kernels.name} (native)"
        return f"{self.kernels.name}: not evaluated ({self.reason})"


def find_qemu() -> str | None:
    return shutil.which("qemu-x86_64") or shutil.which("qemu-x86_64-static")


def plan_judges(
    target: str,
    flags: frozenset[str],
    machine: str | None = None,
    qemu: str | None = None,
) -> tuple[Judge, ...]:
    """For each kernel family of `target`: native, qemu, or not evaluated (with the reason).

    QuantizeError when an x86 family needs qemu and qemu-x86_64 is not installed: the operator
    asked for a target that this host can judge only under emulation.
    """
    if target not in JUDGED_WITH:
        raise QuantizeError(f"unknown --target {target!r}; choose one of: {', '.join(TARGETS)}")
    arch = machine or platform.machine()
    judges = []
    for kernels in JUDGED_WITH[target]:
        if kernels.native(flags, arch):
            judges.append(Judge(kernels, "native"))
        elif kernels.qemu_cpu is not None and is_x86(arch):
            if qemu is None:
                raise QuantizeError(
                    f"--target {target} is judged with {kernels.description} kernels, which this CPU does "
                    f"not use: that needs qemu's user-mode emulator, and qemu-x86_64 is not installed "
                    f"(apt-get install qemu-user), or choose --target host"
                )
            judges.append(Judge(kernels, "qemu", (qemu, "-cpu", kernels.qemu_cpu)))
        else:
            why = (
                "qemu cannot emulate AVX512; judge it on a CPU with AVX512-VNNI"
                if kernels is VNNI
                else f"this {arch} host cannot run {kernels.name} kernels"
            )
            judges.append(Judge(kernels, "not evaluated", reason=why))
    return tuple(judges)
