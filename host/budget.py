"""Several models on one host: each model's budget, its layout, and the weight that holds the budget.

Pure arithmetic (no I/O): the host (onnxpool.host) plans with it at start and on every HUP,
and each pool's master plans with it again from the same settings, so both print and apply
the same numbers.

Why weights and not pinning (docs/ARCHITECTURE.md, "Several models"): the kernel shares a
busy core per runnable entity. A model pinned to "its" cores is protected from a flooded
neighbour, but its neighbour's idle core is wasted. A model whose workers may run on every
core, with a scheduler weight proportional to its budget, gets its budget's share of each
core while the others are busy and every idle cycle when they are not (weights are
work-conserving). So every model's pool is laid out over all usable cores (its workers
cover the host, as one server owning the host would) and its budget becomes:
- a cgroup's CPU weight (v2 `cpu.weight`, v1 `cpu.shares`) when the host may make cgroups
  (root, systemd `Delegate=`): the model's processes together weigh its budget, however
  many workers it runs;
- else a nice value per worker, scaled by the model's worker count: the kernel weighs each
  process (nice 0 = 1024, each step 1.25x less), so a model's processes together weigh
  (its budget / its workers) x its workers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from onnxpool.config.settings import ModelEntry
from onnxpool.workers.cores import CpuAllowance, Layout, plan_layout

NICE_STEP = 1.25
"""The kernel's weight ratio between two adjacent nice values (sched_prio_to_weight)."""
MAX_NICE = 19
CGROUP_V2_WEIGHT_PER_CPU = 100
"""cgroup v2 `cpu.weight` of one core's budget (the default weight of a cgroup is 100)."""
CGROUP_V1_SHARES_PER_CPU = 1024
"""cgroup v1 `cpu.shares` of one core's budget (the default is 1024)."""


@dataclass(frozen=True)
class ModelPlan:
    """One model's share of the host: its budget and the layout of its pool."""

    name: str
    budget: float
    """Cores' worth the model keeps while every model is busy."""
    layout: Layout
    nice: int
    """Nice value of each of its workers when no cgroup can carry the weight."""

    @property
    def cgroup_v2_weight(self) -> int:
        return max(1, min(10000, round(self.budget * CGROUP_V2_WEIGHT_PER_CPU)))

    @property
    def cgroup_v1_shares(self) -> int:
        return max(2, min(262144, round(self.budget * CGROUP_V1_SHARES_PER_CPU)))


def budgets(entries: Mapping[str, ModelEntry], cpus: int) -> dict[str, float]:
    """Each model's budget in cores: `cpus`, else workers x threads when set, else an equal share of the rest."""
    fixed: dict[str, float] = {}
    for name, entry in entries.items():
        if isinstance(entry.cpus, float):
            fixed[name] = entry.cpus
        elif isinstance(entry.workers, int) or isinstance(entry.threads_per_worker, int):
            layout = plan_layout(list(range(cpus)), entry.workers, entry.threads_per_worker)
            fixed[name] = float(layout.workers * layout.threads)
    rest = [name for name in entries if name not in fixed]
    left = cpus - sum(fixed.values())
    # Budgets that leave nothing for the "auto" ones: those share the host as equals would.
    share = left / len(rest) if rest and left > 0 else cpus / max(1, len(entries))
    return {name: fixed.get(name, share) for name in entries}


def plan_models(entries: Mapping[str, ModelEntry], allowance: CpuAllowance) -> dict[str, ModelPlan]:
    """The plan of every model: its budget, its pool's layout over the usable cores, its nice value."""
    cores = budgets(entries, allowance.cpus)
    layouts = {name: plan_layout(allowance, entry.workers, entry.threads_per_worker) for name, entry in entries.items()}
    per_process = {name: cores[name] / layouts[name].workers for name in entries}
    heaviest = max(per_process.values(), default=1.0)
    return {
        name: ModelPlan(
            name=name,
            budget=cores[name],
            layout=layouts[name],
            nice=nice_for(per_process[name], heaviest),
        )
        for name in entries
    }


def nice_for(weight: float, heaviest: float) -> int:
    """The nice value that makes a process weigh `weight` when the heaviest one (nice 0) weighs `heaviest`."""
    if weight <= 0 or heaviest <= weight:
        return 0
    return min(MAX_NICE, round(math.log(heaviest / weight) / math.log(NICE_STEP)))


def oversubscribed_budgets(plans: Mapping[str, ModelPlan], cpus: int) -> float | None:
    """The budgets' sum when it exceeds the usable cores (they then hold as proportions only), else None."""
    total = sum(plan.budget for plan in plans.values())
    return total if total > cpus + 1e-9 else None
