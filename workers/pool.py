"""The master's view of the worker pool: the validated generation, the core layout, the slots.

A *generation* is what one config load validated: the settings, the model (its
inputs/outputs and the private copy workers load) and the core layout. The
master makes one at start and one per HUP; a worker forked after that serves
exactly that generation, and a generation that fails validation never replaces
the running one. No HTTP here (docs/ARCHITECTURE.md): the layer above
(`onnxpool.hooks`) adds the app built from the same settings.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from onnxpool.config.callers import CallerBook
from onnxpool.config.loader import LoadedSettings
from onnxpool.config.settings import Settings
from onnxpool.workers.cores import Layout, SlotTable, cpu_allowance, plan_layout
from onnxpool.workers.cpu_fit import CpuFit, ModelRecipe, check_fit, cpu_flags, made_for_this_cpu
from onnxpool.workers.lanes import Board, Seats
from onnxpool.workers.model_info import ModelInfo
from onnxpool.workers.preflight import ModelError, preflight, probe_model
from onnxpool.workers.run_folder import RunFolder

log = logging.getLogger("onnxpool.workers")


@dataclass(frozen=True)
class Generation:
    """Settings, model and layout of one validated config load."""

    loaded: LoadedSettings
    model: ModelInfo
    model_file: Path
    """The file new workers load: the validated copy whose weights they map (run_folder, `served_form`)."""
    layout: Layout
    model_digest: str
    """Digest of the model file's bytes, computed once here (the response cache keys on it)."""
    cpu_fit: CpuFit = field(default_factory=lambda: CpuFit("not-onnxpool"))
    """The INT8 recipe inside the model vs this CPU's flags (workers/cpu_fit.py)."""
    model_choice: str = ""
    """Why this model file among `[model] cpu_variants` ("" without variants), for the start-up line."""

    @property
    def settings(self) -> Settings:
        return self.loaded.settings


class Pool:
    """Master-only state that lives as long as the master: the run folder and the slot table."""

    def __init__(self, run: RunFolder) -> None:
        self.run = run
        self.master_pid = os.getpid()
        self.slots = SlotTable(1)
        # Made before the first fork, kept across HUPs: every generation's workers share one board.
        self.seats = Seats(Board())
        self._lanes: int | None = None

    def lanes_bound(self, callers: CallerBook) -> int:
        """Callers' lanes bound beside the pool's socket: the first generation's, for the master's life
        (gunicorn would close the old workers' sockets at a HUP that changed its listeners)."""
        if self._lanes is None:
            self._lanes = callers.lane_count
        return self._lanes

    def validate(self, loaded: LoadedSettings) -> Generation:
        """Check the model against the settings and plan the layout; raises ModelError.

        The model is validated from a private copy, which becomes current only
        when the generation is adopted.
        """
        loaded, choice = self._variant_for_this_cpu(loaded)
        settings = loaded.settings
        model, model_file, digest = self._validated_model(settings)
        # The recipe comes from the preflight subprocess (ModelInfo.metadata), the flags from
        # /proc/cpuinfo: the master itself never imports onnxruntime (or onnx).
        fit = check_fit(ModelRecipe.from_metadata(model.metadata_map), cpu_flags())
        if not fit.ok and settings.model.cpu_mismatch == "refuse":
            self.run.discard_model(model_file)  # only a copy of the run folder is removed
            raise ModelError(f"{settings.model.path}: {fit.message}")
        server = settings.server
        layout = plan_layout(cpu_allowance(), server.workers, server.threads_per_worker)
        return Generation(
            loaded=loaded,
            model=model,
            model_file=model_file,
            layout=layout,
            model_digest=digest,
            cpu_fit=fit,
            model_choice=choice,
        )

    def adopt(self, generation: Generation) -> None:
        """Make `generation` what new workers get."""
        self.run.promote_model(generation.model_file)
        # Keep the slot table when its size holds: running workers hold slots in it.
        if self.slots.size != generation.layout.slots:
            self.slots = SlotTable(generation.layout.slots)

    def reject(self, generation: Generation) -> None:
        """Drop a generation that failed a later check (its model copy goes)."""
        if generation.model_file != self.run.current_model:
            self.run.discard_model(generation.model_file)

    def _variant_for_this_cpu(self, loaded: LoadedSettings) -> tuple[LoadedSettings, str]:
        """`[model] cpu_variants`: the first build made for this CPU's int8 kernels replaces `path`.

        Each variant's recipe is read by the preflight subprocess (the master never imports
        onnxruntime); a variant that is missing or does not load is one line and is passed over.
        """
        model = loaded.settings.model
        if not model.cpu_variants:
            return loaded, ""
        flags = cpu_flags()
        for variant in model.cpu_variants:
            try:
                recipe = ModelRecipe.from_metadata(probe_model(variant).metadata_map)
            except ModelError as exc:
                log.warning("[model] cpu_variants: %s passed over: %s", variant, exc)
                continue
            why = made_for_this_cpu(recipe, flags)
            if why is not None:
                chosen = model.model_copy(update={"path": variant})
                settings = loaded.settings.model_copy(update={"model": chosen})
                return replace(loaded, settings=settings), f"model file: {variant} ({why}), not {model.path}"
        others = ", ".join(str(v) for v in model.cpu_variants)
        return loaded, f"model file: {model.path} (none of [model] cpu_variants is made for this CPU: {others})"

    def _validated_model(self, settings: Settings) -> tuple[ModelInfo, Path, str]:
        """Copy the model's bytes, validate what workers will load; that file and the digest of the bytes.

        `[model] share_weights`: the preflight writes the mapped form from the byte copy
        (run_folder.served_form) and the byte copy goes. If onnxruntime cannot write that form
        of a model that loads, every worker loads the byte copy (one warning line). A model that
        does not load from a lone copy (external data files beside it) is read in place.
        """
        source = settings.model.path
        try:
            copy = self.run.copy_model(source)
        except FileNotFoundError:
            raise ModelError(f"model file {source} does not exist") from None
        except OSError as exc:
            raise ModelError(f"model file {source} cannot be read: {exc.strerror}") from None
        digest = model_digest(copy, in_place=False)
        unmapped: ModelError | None = None
        if settings.model.share_weights:
            served = self.run.served_form(copy)
            try:
                model = preflight(settings, copy, into=served)
            except ModelError as exc:
                unmapped = exc
            else:
                copy.unlink()  # the served form is written: the bytes are not read again
                return model, served, digest
        try:
            model = preflight(settings, copy)
        except ModelError:
            return self._validated_in_place(settings, copy)
        if unmapped is not None:
            log.warning("model %s: no mapped form (%s): every worker loads a copy of its own", source, unmapped)
        return model, copy, digest

    def _validated_in_place(self, settings: Settings, copy: Path) -> tuple[ModelInfo, Path, str]:
        """A model with external data files of its own: its mapped form is written from where it is.

        Without `share_weights` workers load it from its configured path. Raises the error
        about the real file if it is bad.
        """
        source = settings.model.path
        served = self.run.served_form(copy) if settings.model.share_weights else source
        self.run.discard_model(copy)  # the lone byte copy is of no use
        if served != source:
            served.parent.mkdir()
        try:
            model = preflight(settings, into=served if served != source else None)
        except ModelError:
            self.run.discard_model(served)
            raise
        log.info("model %s does not load from a lone copy (external data?): %s", source, _read_in_place(served, source))
        return model, served, model_digest(source, in_place=True)


def _read_in_place(served: Path, source: Path) -> str:
    if served == source:
        return "workers load it in place"
    return "its mapped form was written from it in place"


def model_digest(path: Path, *, in_place: bool) -> str:
    """sha256 of the model file; identical files on several hosts give the same digest.

    A model with external data files of its own (see run_folder) may change in files this
    does not read, so each of its generations gets a digest of its own.
    """
    with path.open("rb") as f:
        digest = "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()
    return f"{digest}+{uuid.uuid4().hex}" if in_place else digest
