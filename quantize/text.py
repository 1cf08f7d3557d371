"""`onnxpool quantize` for text-embedding models: dynamic INT8, judged by cosine per CPU target.

A text encoder's activations change with every input (length, vocabulary), so its INT8 is
dynamic: weights are quantized once (per output channel), each MatMul's input is quantized
at run time from its own range (onnxruntime's `quantize_dynamic`, MatMulInteger), and the
embedding tables (Gather) are stored as 8-bit rows. No
calibration images; what decides the model is the target (`targets.choose_recipe`: 7-bit
weights for `portable`/`avx2`, because MatMulInteger's u8 x s8 kernel without VNNI adds
pairs of products into saturating int16, as for images) and which MatMuls stay float.

Judged by the served task itself (`onnxpool.local.load_task`: the settings' text-embedding
task, built through the registry, its own tokenizer, length-sorted sub-batches, pooling and
normalisation, run by `TextEmbedding.run` on each candidate's session): per sentence the cosine of
the INT8 embedding to the FP32 one, and retrieval (each sentence a query against all the
others: how many of FP32's 10 nearest are INT8's 10 nearest). The budget is the mean cosine.
Each kernel family of the target is judged natively or under qemu (`emulate`), exactly as
image models are. The search: nothing float first; if that misses, every weight MatMul is
tried float alone, and the most helpful are added one at a time until the budget is met.

Measured on all-MiniLM-L6-v2, 240 varied sentences, per-channel 7-bit weights, MatMuls only
(docs/BENCHMARKS.md): mean cosine 0.990 with every weight MatMul in INT8, 0.993 with the first
layer's FFN output in float (0.992 with the embedding tables in 8 bits too); per-tensor
weights 0.839.
"""

from __future__ import annotations

import json
import platform
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from onnxpool.config.loader import ConfigError, LoadedSettings
from onnxpool.local import LocalRequest, SessionRunner, load_task, open_session
from onnxpool.measure.progress import Progress, bar
from onnxpool.quantize.calibrate import stamp_recipe
from onnxpool.quantize.emulate import emulated_outputs, save_arrays
from onnxpool.quantize.errors import QuantizeError
from onnxpool.quantize.report import cpu_description, versions, write_outputs
from onnxpool.quantize.speed import compare_speed
from onnxpool.quantize.targets import HOST, Judge, Recipe, choose_recipe, find_qemu, plan_judges
from onnxpool.tasks.api import Feeds, Outputs, Runner
from onnxpool.tasks.errors import OnnxpoolError
from onnxpool.tasks.text.embedding import TextEmbedding
from onnxpool.workers.cpu_fit import cpu_flags

RETRIEVAL_K = 10
SPEED_BATCH = 8  # sentences per timed run: the task's default sub-batch


@dataclass(frozen=True)
class TextQuantizeOptions:
    model: Path
    output: Path
    settings: LoadedSettings
    """The served settings ([model] task = text-embedding), with `[task] truncate = true`: every
    sentence is judged, cut to the model's limit as the server cuts it."""
    eval: Path
    """Held-out sentences: the final numbers."""
    search: Path | None = None
    """Sentences the search chooses on (default: the --eval ones, then not held out)."""
    min_cosine: float = 0.99
    max_float: int = 12
    exclude: tuple[str, ...] = ()
    speed_seconds: float = 3.0
    speed_rounds: int = 3
    config_file: str | None = None
    target: str = "portable"


@dataclass(frozen=True)
class Similarity:
    """INT8 embeddings vs FP32 embeddings of the same sentences."""

    n: int
    mean_cosine: float
    min_cosine: float
    p01_cosine: float
    retrieval_top10_overlap: float
    """Mean over sentences of |FP32's 10 nearest others & INT8's 10 nearest others| / 10."""


def read_sentences(path: Path) -> list[str]:
    """A JSON array of strings (any string: empty, spaces, newlines) or a text file, one per line."""
    if not path.is_file():
        raise QuantizeError(f"sentences file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise QuantizeError(f"{path} is not JSON: {exc}") from None
        if not isinstance(data, list) or not all(isinstance(s, str) for s in data):
            raise QuantizeError(f"{path} must hold a JSON array of strings")
        found = data
    else:
        found = text.splitlines()
    if len(found) < RETRIEVAL_K + 1:
        raise QuantizeError(f"{path} has {len(found)} sentences; at least {RETRIEVAL_K + 1} are needed")
    return found


def compare_embeddings(ref: np.ndarray, test: np.ndarray, k: int = RETRIEVAL_K) -> Similarity:
    ref64, test64 = ref.astype(np.float64), test.astype(np.float64)
    ref64 /= np.maximum(np.linalg.norm(ref64, axis=1, keepdims=True), 1e-12)
    test64 /= np.maximum(np.linalg.norm(test64, axis=1, keepdims=True), 1e-12)
    cosines = np.sum(ref64 * test64, axis=1)
    overlap = 0.0
    if len(ref) > k:
        sims_ref, sims_test = ref64 @ ref64.T, test64 @ test64.T
        np.fill_diagonal(sims_ref, -np.inf)  # a sentence is not its own neighbour
        np.fill_diagonal(sims_test, -np.inf)
        near_ref = np.argsort(-sims_ref, axis=1, kind="stable")[:, :k]
        near_test = np.argsort(-sims_test, axis=1, kind="stable")[:, :k]
        overlap = float(
            np.mean([len(set(a.tolist()) & set(b.tolist())) / k for a, b in zip(near_ref, near_test, strict=True)])
        )
    return Similarity(
        n=len(ref),
        mean_cosine=float(cosines.mean()),
        min_cosine=float(cosines.min()),
        p01_cosine=float(np.percentile(cosines, 1)),
        retrieval_top10_overlap=overlap,
    )


def weight_matmuls(model_path: Path) -> list[str]:
    """MatMul nodes with a constant weight, in graph order: what dynamic INT8 quantizes."""
    import onnx

    model = onnx.load(str(model_path))
    constants = {i.name for i in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and any(i in constants for i in n.input)]


def quantize_dynamic_with(model: Path, out: Path, recipe: Recipe, version: str) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        model_input=str(model),
        model_output=str(out),
        # Gather: the token-embedding table (MiniLM: 47 of its 90 MB) as 8-bit rows, dequantized on
        # look-up (no integer kernel, so no CPU dependence): the file and each worker 35 MB smaller
        # for a mean cosine 0.0006 lower.
        op_types_to_quantize=["MatMul", "Gather"],
        per_channel=recipe.per_channel,
        reduce_range=recipe.reduce_range,
        weight_type=getattr(QuantType, recipe.weight_type),
        nodes_to_exclude=list(recipe.excluded),
    )
    return stamp_recipe(out, recipe, version)


class Embedder:
    """Embeddings of a fixed set of sentences computed by the served task (`TextEmbedding.run`), on any kernels.

    The sentences go to the task as requests of at most `[task] max_batch` each, read by its own
    `read`, as a client's would be. Under qemu the model runs in separate emulated processes over
    every sub-batch at once, so the task runs twice: once natively, recording the feeds it asks
    for, then over the emulated outputs of those feeds, replayed in order.
    """

    def __init__(self, task: TextEmbedding, sentences: Sequence[str], threads: int) -> None:
        self.task, self.threads = task, threads
        step = task.settings.max_batch
        texts = list(sentences)
        try:
            self.requests = [
                task.read(LocalRequest.json({"input": texts[i : i + step], "model": task.served.name}, task.routes[0]))
                for i in range(0, len(texts), step)
            ]
        except OnnxpoolError as exc:
            raise QuantizeError(f"the text task refuses the sentences: {exc.message}") from None
        self.output = task.settings.output
        self.recorded: list[dict[str, np.ndarray]] | None = None

    def _embed(self, runner: Runner) -> np.ndarray:
        return np.concatenate([self.task.run(request, runner).vectors for request in self.requests])

    def native(self, model: Path) -> np.ndarray:
        recorder = RecordingRunner(SessionRunner(open_session(model, self.threads)))
        vectors = self._embed(recorder)
        self.recorded = self.recorded or recorder.feeds  # the same sentences always ask for the same feeds
        return vectors

    def emulated(self, judge: Judge, model: Path, status: Callable[[str], None] | None) -> np.ndarray:
        if self.recorded is None:
            self.native(model)
        assert self.recorded is not None
        outputs = emulated_outputs(
            judge.command,
            model,
            self.recorded,
            self.threads,
            status,
            f"{judge.kernels.name} (qemu)",
            "sub-batches",
            self.output,
        )
        replay = ReplayRunner(self.recorded, outputs)
        vectors = self._embed(replay)
        replay.finished()
        return vectors

    def speed_feeds(self, path: Path) -> Path:
        """SPEED_BATCH sentences of median length, padded as the task pads them, saved for `measure.limit`."""
        encoded = self.task.encode([text for request in self.requests for text in request.texts], None)
        order = np.argsort(encoded.lengths, kind="stable")
        middle = max(0, len(order) // 2 - SPEED_BATCH // 2)
        save_arrays(path, encoded.select(order[middle : middle + SPEED_BATCH]).feeds())
        return path


class RecordingRunner:
    """A runner that runs another and keeps every run's feeds, in order."""

    def __init__(self, runner: SessionRunner) -> None:
        self.runner = runner
        self.feeds: list[dict[str, np.ndarray]] = []

    def infer(self, feeds: Feeds, output_names: Sequence[str] | None = None) -> Outputs:
        self.feeds.append({name: np.array(value) for name, value in feeds.items()})
        return self.runner.infer(feeds, output_names)

    def phase(self, name: str) -> AbstractContextManager[None]:
        return nullcontext()

    def span(self, name: str, attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[dict[str, Any]]:
        return nullcontext({})  # untraced


class ReplayRunner:
    """A runner that answers the recorded feeds, in their order, with outputs computed elsewhere."""

    def __init__(self, recorded: Sequence[Feeds], outputs: Sequence[np.ndarray]) -> None:
        self.recorded, self.outputs, self.done = recorded, outputs, 0

    def infer(self, feeds: Feeds, output_names: Sequence[str] | None = None) -> Outputs:
        expected = self.recorded[self.done] if self.done < len(self.recorded) else None
        if (
            expected is None
            or output_names is None
            or len(output_names) != 1
            or expected.keys() != feeds.keys()
            or any(not np.array_equal(expected[name], value) for name, value in feeds.items())
        ):
            raise QuantizeError(f"replaying the emulated outputs: run {self.done + 1} asked for other feeds")
        self.done += 1
        return {output_names[0]: self.outputs[self.done - 1]}

    def phase(self, name: str) -> AbstractContextManager[None]:
        return nullcontext()

    def span(self, name: str, attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[dict[str, Any]]:
        return nullcontext({})  # untraced

    def finished(self) -> None:
        if self.done != len(self.outputs):
            raise QuantizeError(f"replaying the emulated outputs: {self.done} of {len(self.outputs)} runs used")


def run_quantize_text(opts: TextQuantizeOptions, progress: Progress) -> dict[str, Any]:
    """The whole command for a text-embedding model; QuantizeError for what the operator can fix."""
    from onnxpool import __version__
    from onnxpool.workers.cores import usable_cores

    if not opts.model.is_file():
        raise QuantizeError(f"model file {opts.model} does not exist")
    if not opts.output.parent.is_dir():
        raise QuantizeError(f"output folder {opts.output.parent} does not exist")
    flags = cpu_flags()
    recipe = replace(choose_recipe(opts.target, flags), quant_format="dynamic", depthwise_8bit=False)
    judges = plan_judges(opts.target, flags, qemu=find_qemu())
    evaluated = [j for j in judges if j.evaluated]
    search_judges = sorted(evaluated, key=lambda j: j.how != "native") or [Judge(HOST, "native")]
    held_out = read_sentences(opts.eval)
    searched = read_sentences(opts.search) if opts.search is not None else held_out
    threads = len(usable_cores())
    _check_onnx(opts.model)
    try:
        task = load_task(opts.settings, opts.model, threads=threads).task
    except ConfigError as exc:  # TaskConfigError too: the one line the server would print
        raise QuantizeError(str(exc)) from None
    if not isinstance(task, TextEmbedding):
        raise QuantizeError(f"[model] task is {task.name}; quantize judges text-embedding models by cosine")
    search_set = Embedder(task, searched, threads)
    eval_set = Embedder(task, held_out, threads) if opts.search is not None else search_set
    candidates = weight_matmuls(opts.model)
    unknown = [n for n in opts.exclude if n not in candidates]
    if unknown:
        raise QuantizeError(f"--exclude {unknown[0]!r}: no MatMul with a constant weight of that name")
    with tempfile.TemporaryDirectory(prefix="onnxpool-quantize-") as tmp:
        work = Path(tmp)
        progress.status("FP32 reference embeddings", force=True)
        ref = search_set.native(opts.model)
        eval_ref = ref if eval_set is search_set else eval_set.native(opts.model)
        trials: list[dict[str, Any]] = []

        def candidate(excluded: Sequence[str]) -> Path:
            nodes = (*opts.exclude, *excluded)
            progress.status(f"candidate {len(trials) + 1}: {len(nodes)} float MatMuls", force=True)
            return quantize_dynamic_with(opts.model, work / "candidate.onnx", recipe.with_excluded(nodes), __version__)

        def judge(j: Judge, model: Path, on: Embedder, reference: np.ndarray) -> Similarity:
            vectors = on.emulated(j, model, progress.status) if j.how == "qemu" else on.native(model)
            return compare_embeddings(reference, vectors)

        def trial(excluded: Sequence[str]) -> dict[str, Similarity]:
            """The candidate on the search sentences: natively first; the other judges only if it met the budget."""
            model = candidate(excluded)
            results: dict[str, Similarity] = {}
            for j in search_judges:
                sim = results[j.kernels.name] = judge(j, model, search_set, ref)
                progress.done(
                    f"candidate {len(trials) + 1}: {len(excluded) + len(opts.exclude)} float MatMuls, "
                    f"{j.describe()}: mean cosine {sim.mean_cosine:.4f} (min {sim.min_cosine:.4f}), "
                    f"top-{RETRIEVAL_K} overlap {sim.retrieval_top10_overlap:.3f}"
                )
                if sim.mean_cosine < opts.min_cosine:
                    break
            trials.append({"excluded": list(excluded), **{k: asdict(v) for k, v in results.items()}})
            return results

        def met(results: dict[str, Similarity]) -> bool:
            return all(
                j.kernels.name in results and results[j.kernels.name].mean_cosine >= opts.min_cosine
                for j in search_judges
            )

        chosen: list[str] = []
        results = trial(chosen)
        ranked: list[str] | None = None
        while not met(results):
            if ranked is None:  # each weight MatMul float alone, natively: the most helpful first
                searchable = [c for c in candidates if c not in opts.exclude]
                gains: list[tuple[float, int, str]] = []
                for k, node in enumerate(searchable):
                    progress.status(f"ranking: {bar(k / len(searchable))} {k}/{len(searchable)} MatMuls float alone")
                    model = candidate([node])
                    gains.append((-judge(search_judges[0], model, search_set, ref).mean_cosine, k, node))
                ranked = [node for _, _, node in sorted(gains)]
                progress.done(f"ranked {len(ranked)} MatMuls by the mean cosine each reaches alone in float")
            if len(chosen) >= min(opts.max_float, len(ranked)):
                worst = min(results.values(), key=lambda sim: sim.mean_cosine)
                raise QuantizeError(
                    f"no candidate met --min-cosine {opts.min_cosine} with up to {opts.max_float} float MatMuls on "
                    f"{', '.join(j.kernels.name for j in search_judges)} kernels; the last, with {len(chosen)} float, "
                    f"reached a mean cosine of {worst.mean_cosine:.4f}; nothing written"
                )
            chosen.append(ranked[len(chosen)])
            results = trial(chosen)
        final_recipe = recipe.with_excluded((*opts.exclude, *chosen))
        final = quantize_dynamic_with(opts.model, work / "final.onnx", final_recipe, __version__)
        if eval_set is search_set:
            final_sims = results
        else:  # the final numbers on the held-out sentences, every evaluated family
            final_sims = {j.kernels.name: judge(j, final, eval_set, eval_ref) for j in search_judges}
            for name, sim in final_sims.items():
                progress.done(
                    f"held out, {name}: mean cosine {sim.mean_cosine:.4f} (min {sim.min_cosine:.4f}), "
                    f"top-{RETRIEVAL_K} overlap {sim.retrieval_top10_overlap:.3f}"
                )
        speed = None
        if opts.speed_seconds > 0 and opts.speed_rounds > 0:
            feeds = eval_set.speed_feeds(work / "speed.npz")
            speed = compare_speed(
                {"fp32": opts.model, "int8": final}, opts.speed_seconds, opts.speed_rounds, progress, feeds, SPEED_BATCH
            )
            progress.done(f"speed ({speed['layout']}, pinned): INT8 {speed['speedup']['int8']:.2f}x FP32")
        report: dict[str, Any] = {
            "model": str(opts.model),
            "output": str(opts.output),
            "kind": "text-embedding",
            "versions": versions(),
            "python": platform.python_version(),
            "cpu": cpu_description(flags, threads),
            "config_file": opts.config_file,
            "target": opts.target,
            "recipe": {
                **asdict(final_recipe),
                "quantization": "dynamic: weights per output channel once, each MatMul input at run time "
                "(onnxruntime quantize_dynamic, MatMulInteger)",
                "reduce_range_reason": (
                    "7-bit weights: u8 x s8 pairs cannot saturate int16 on AVX2 kernels (vpmaddubsw)"
                    if final_recipe.reduce_range
                    else "8-bit weights: exact on VNNI/arm64 kernels only"
                ),
            },
            "targets": {
                j.kernels.name: {
                    "kernels": j.kernels.description,
                    "judged": j.how,
                    "command": " ".join(j.command) or None,
                    "reason": j.reason or None,
                    "similarity": asdict(final_sims[j.kernels.name]) if j.kernels.name in final_sims else None,
                }
                for j in judges
            },
            "float_layers": [*opts.exclude, *chosen],
            "budget": {"min_mean_cosine": opts.min_cosine, "met_on": [j.describe() for j in search_judges]},
            "sentences": {
                "eval": {"file": str(opts.eval), "n": len(held_out)},
                "search": None if opts.search is None else {"file": str(opts.search), "n": len(searched)},
                "judged_on": "eval (held out)" if opts.search is not None else "eval (also searched on: not held out)",
                "as_served": f"by the served task: tokenized with the model folder's tokenizer, cut to "
                f"{task.tokenizer.max_length} tokens, sub-batches of {task.settings.sub_batch} "
                f"(<= {task.settings.sub_batch_tokens} padded tokens), pooling {task.spec.mode.value}, "
                f"normalize {task.spec.normalize}",
            },
            "reference": "the FP32 model run natively on this host",
            "search": {"candidates": len(candidates), "trials": trials},
            "speed": speed,
            "sizes_bytes": {"fp32": opts.model.stat().st_size, "int8": final.stat().st_size},
        }
        write_outputs(opts.output, final, report)
    return report


def _check_onnx(model: Path) -> None:
    """A one-line error for a file that is not an ONNX model (before onnxruntime's long one)."""
    import onnx

    try:
        onnx.load(str(model), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError and others for a file that is not a model
        raise QuantizeError(f"model file {model} is not an ONNX model: {str(exc).splitlines()[0]}") from None
