"""`onnxpool tune` on a settings file with several models: each model's budget for a traffic mix.

A host that serves several models gives each a budget (`[models.<name>] cpus`: the cores' worth
it keeps while every model is busy, host/budget.py). Which budgets serve a mix of requests
best depends on what one request of each model costs, so each model is measured here, one
after the other, in process (`measure.limit`): one worker x one thread pinned to one core,
running its task's own requests (read -> run -> reply -> JSON, `measure.task_input`) back to
back. That gives its requests/s per core, thr_m.

At a total rate R (requests/s of the mix, where model m takes the share s_m = traffic_m /
sum(traffic)), model m needs R s_m / thr_m cores; the usable cores C are all busy when
R = C / sum(s_m / thr_m): the mix's highest sustainable rate. Each model's budget is what it
needs there, budget_m = R s_m / thr_m, i.e. proportional to traffic_m / thr_m and summing to C.
Rounded to 0.01 core (at least 0.05) so that the rounded budgets still sum to C.

No HTTP: per-request HTTP and nginx costs are about the same for every model, so they shift the
rates, not much the proportions; a model measured 1x1 scales about linearly with cores when its
workers run one thread each (the default with several models).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from onnxpool.config.loader import ConfigError, LoadedSettings, load_settings
from onnxpool.host.budget import budgets
from onnxpool.measure.limit import LimitPlan, LimitResult, measure_limit
from onnxpool.measure.progress import Progress, bar
from onnxpool.measure.report import format_table
from onnxpool.measure.tomledit import set_model_cpus
from onnxpool.workers.cores import plan_layout, usable_cores

INPROCESS_OVERHEAD_S = 2.0
"""Rough fixed cost of one measurement (spawn, import onnxruntime, build the session and the task,
warm up): only to size the measured windows within the budget."""
MIN_CPUS = 0.05
"""The smallest budget written: a model whose share rounds to nothing still gets a weight."""
STEP = 0.01


@dataclass(frozen=True)
class ModelsTuneOptions:
    config: Path | None = None
    budget: float = 120.0
    traffic: Mapping[str, float] = field(default_factory=dict)
    """`--traffic`: shares that replace the settings' `traffic` of the models named."""


@dataclass
class ModelMeasure:
    """One model of the file: its traffic share and what was measured."""

    name: str
    path: Path
    task: str
    traffic: float
    cpus_now: float
    """Its budget as the settings give it now (`workers.budget.budgets` over the measured models)."""
    result: LimitResult | None = None

    @property
    def per_core(self) -> float:
        """Requests/s on one core."""
        return self.result.items_per_second / self.result.batch if self.result else float("nan")

    @property
    def p50_ms(self) -> float:
        return self.result.percentile(50) * 1000 if self.result else float("nan")


@dataclass
class MixPlan:
    """The budgets that serve the mix best on `cores`."""

    cores: int
    budgets: dict[str, float]
    """Exact budget per model (cores), summing to `cores`."""
    cpus: dict[str, float]
    """The budgets as written: 0.01 steps, each >= MIN_CPUS, summing to `cores` when they can."""
    rate_per_traffic: float
    """The mix's highest sustainable rate, per unit of traffic: model m then takes this x traffic_m req/s."""


@dataclass
class ModelsTuneResult:
    models: list[ModelMeasure]
    plan: MixPlan
    cores: int
    measured_at: str
    seconds: float
    window: float
    """Measured seconds per model."""
    config: Path | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    """Models left out (an optional model's missing file), with why."""


def parse_traffic(text: str) -> dict[str, float]:
    """`name=3,other=1` -> {"name": 3.0, "other": 1.0}; ValueError naming what is wrong."""
    shares: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        name = name.strip()
        try:
            share = float(value)
        except ValueError:
            share = float("nan")
        if not sep or not name or not math.isfinite(share) or share <= 0:
            raise ValueError(f"traffic shares are name=share pairs with shares > 0, e.g. image=3,iris=1; got {part!r}")
        if name in shares:
            raise ValueError(f"model {name} is named twice in the traffic shares")
        shares[name] = share
    return shares


def mix_plan(per_core: Mapping[str, float], traffic: Mapping[str, float], cores: int) -> MixPlan:
    """The budgets for the mix `traffic` of models serving `per_core` requests/s on one core each."""
    for name, rate in per_core.items():
        if not rate > 0:
            raise ValueError(f"model {name}: no request finished while it was measured (a longer --budget)")
    need = {name: traffic[name] / rate for name, rate in per_core.items()}  # cores per unit of traffic
    rate_per_traffic = cores / sum(need.values())
    exact = {name: rate_per_traffic * cost for name, cost in need.items()}
    return MixPlan(cores, exact, round_budgets(exact, cores), rate_per_traffic)


def round_budgets(
    exact: Mapping[str, float], cores: int, step: float = STEP, minimum: float = MIN_CPUS
) -> dict[str, float]:
    """`exact` in `step`s, each at least `minimum`, summing to `cores` (largest remainders round up)
    unless the minimums alone exceed it."""
    units = {name: value / step for name, value in exact.items()}
    floor_min = round(minimum / step)
    counts = {name: max(floor_min, math.floor(u + 1e-9)) for name, u in units.items()}
    target = round(cores / step)
    by_remainder = sorted(units, key=lambda n: -(units[n] - math.floor(units[n] + 1e-9)))
    while sum(counts.values()) < target:
        for name in by_remainder:
            if sum(counts.values()) >= target:
                break
            counts[name] += 1
    while sum(counts.values()) > target:
        above = [name for name in counts if counts[name] > floor_min]
        if not above:
            break
        counts[max(above, key=lambda n: counts[n] - units[n])] -= 1
    return {name: round(count * step, 2) for name, count in counts.items()}


def plan_window(budget: float, models: int) -> float:
    """Measured seconds per model so that every model fits `budget` (0.5 to 10 s)."""
    spare = budget - models * INPROCESS_OVERHEAD_S
    per_model = spare / max(1, models) / 1.25  # + a warm-up of a quarter of the window
    return min(10.0, max(0.5, per_model))


def _entries(loaded: LoadedSettings, traffic: Mapping[str, float]) -> tuple[dict[str, float], dict[str, str]]:
    """The traffic of every model to measure, and the models left out (with why)."""
    models = loaded.settings.models
    unknown = sorted(set(traffic) - set(models))
    if unknown:
        raise ConfigError(f"--traffic names {', '.join(unknown)}: not a model of {loaded.config_file} "
                          f"(models: {', '.join(models)})")  # fmt: skip
    shares: dict[str, float] = {}
    skipped: dict[str, str] = {}
    for name, entry in models.items():
        if not entry.path.is_file():
            problem = f"model {name}: {entry.path} does not exist"
            if not entry.optional:
                raise ConfigError(f"{problem} ([models.{name}] optional = true leaves it out)")
            skipped[name] = f"{entry.path} does not exist (optional = true)"
            continue
        shares[name] = traffic.get(name, entry.traffic)
    if not shares:
        raise ConfigError("no model to measure: every model's file is missing")
    return shares, skipped


def run_tune_models(options: ModelsTuneOptions, progress: Progress | None = None) -> ModelsTuneResult:
    """Measure each model of the file on one core, then plan the budgets for its traffic mix."""
    progress = progress or Progress(enabled=False)
    started = time.monotonic()
    host = load_settings(options.config, pool="")
    if not host.settings.models:
        raise ConfigError(f"config file {host.config_file} names no [models.<name>]: tune measures its layouts instead")
    traffic, skipped = _entries(host, options.traffic)
    pools = {name: load_settings(options.config, pool=name) for name in traffic}  # every error before measuring
    cores = usable_cores()
    now = budgets({name: host.settings.models[name] for name in traffic}, len(cores))
    layout = plan_layout(cores, 1, 1)
    window = plan_window(options.budget, len(traffic))
    measures = [
        ModelMeasure(name, pools[name].settings.model.path, pools[name].settings.model.task, share, now[name])
        for name, share in traffic.items()
    ]
    for i, measure in enumerate(measures):
        elapsed = time.monotonic() - started
        progress.status(
            f"{bar(elapsed / options.budget)} {measure.name} ({i + 1}/{len(measures)}): its requests on 1 core "
            f"({window:.1f}s)",
            force=True,
        )
        settings = pools[measure.name]
        measure.result = measure_limit(
            LimitPlan(
                settings.settings.model.path,
                layout,
                pipeline="task",
                duration=window,
                warmup=min(1.0, window / 4),
                spin=settings.settings.server.spin,
                optimization=settings.settings.model.graph_optimization_level,
                settings=settings,
            )
        )
    plan = mix_plan({m.name: m.per_core for m in measures}, traffic, len(cores))
    seconds = time.monotonic() - started
    progress.done(f"{bar(1.0)} done in {seconds:.0f}s: {len(measures)} models measured")
    return ModelsTuneResult(
        measures, plan, len(cores), time.strftime("%Y-%m-%d %H:%M"), seconds, window, host.config_file, skipped
    )


def format_models(result: ModelsTuneResult) -> str:
    """The measurements, the budgets for the mix, and the settings to paste."""
    plan = result.plan
    total = sum(m.traffic for m in result.models)
    measured = [
        {
            "model": m.name,
            "task": m.task,
            "per_core": m.per_core,
            "p50": m.p50_ms,
            "traffic": f"{m.traffic:g}",
            "share": f"{m.traffic / total:.0%}",
        }
        for m in result.models
    ]
    planned = [
        {
            "model": m.name,
            "cpus": plan.cpus[m.name],
            "rate": plan.rate_per_traffic * m.traffic,
            "cpus_now": m.cpus_now,
            "rate_now": m.cpus_now * m.per_core,
        }
        for m in result.models
    ]
    inputs = [f"  {m.name}: {m.result.inputs}" for m in result.models if m.result is not None and m.result.inputs]
    peak = plan.rate_per_traffic * total
    lines = [
        f"# onnxpool tune: {len(result.models)} models, {result.cores} usable cores, {result.seconds:.0f}s, "
        f"{result.measured_at}" + (f", {result.config}" if result.config else ""),
        f"# each model alone on 1 core (1 worker x 1 thread, pinned, in process, no HTTP), {result.window:.1f}s, "
        "its task's own requests:",
        *inputs,
        format_table(
            measured,
            (
                ("model", "model", "{}"),
                ("task", "task", "{}"),
                ("per_core", "req/s per core", "{:.1f}"),
                ("p50", "p50 ms", "{:.2f}"),
                ("traffic", "traffic", "{}"),
                ("share", "share", "{}"),
            ),
        ),
        *(f"{name}: skipped, {why}" for name, why in result.skipped.items()),
        "",
        f"# budgets for this mix on {result.cores} cores: at most {peak:.1f} req/s in all, every core busy",
        format_table(
            planned,
            (
                ("model", "model", "{}"),
                ("cpus", "cpus", "{:.2f}"),
                ("rate", "req/s at that rate", "{:.1f}"),
                ("cpus_now", "cpus now", "{:.2f}"),
                ("rate_now", "req/s cpus now keep", "{:.1f}"),
            ),
        ),
        "",
        "# the settings (`--write FILE` sets them in place):",
    ]
    for m in result.models:
        lines += [f"[models.{table_name(m.name)}]", f"cpus = {plan.cpus[m.name]:.2f}", ""]
    return "\n".join(lines).rstrip("\n")


def table_name(name: str) -> str:
    """A model's name as a TOML key: bare when it can be, else quoted (`"iris.v1"`)."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f'"{name}"'


def write_cpus(path: Path, result: ModelsTuneResult) -> None:
    """Set each measured model's `cpus` in `path`, every other line as it was (ValueError: nothing written)."""
    text = path.read_text()
    path.write_text(set_model_cpus(text, result.plan.cpus))
