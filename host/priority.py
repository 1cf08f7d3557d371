"""How a model's budget is enforced on this host: a cgroup per model with a CPU weight, or nice values.

The host (onnxpool.host) chooses once at start (`choose`): a cgroup of its own when it may make
one (cgroup v2 with the cpu controller delegated to it, e.g. systemd `Delegate=yes` or a
root-owned host; cgroup v1's cpu hierarchy when writable, i.e. root), else nice values. Process
rules: a pool's master joins its model's cgroup before gunicorn forks any worker (`join`,
run in the child between fork and exec), so every worker of the model is in it and a
replacement worker is too; a weight changed by a reload applies to running processes at once.
With nice values, each worker sets its own after fork (`apply_nice`): the master stays at 0.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from onnxpool.host.budget import ModelPlan

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")

STRAGGLER_SECONDS = 5.0
"""How long the host waits for processes left in a model's cgroup once its pool has stopped."""


@dataclass(frozen=True)
class Priority:
    """The mechanism: `cgroup-v2`, `cgroup-v1` (with the host's cgroup folder) or `nice`."""

    kind: str
    folder: Path | None = None
    why: str = ""
    """For `nice`: why no cgroup could be used (for the start-up line)."""

    def group(self, model: str) -> Path | None:
        return self.folder / model if self.folder is not None else None

    def describe(self, plan: ModelPlan) -> str:
        """The start-up line's priority part, e.g. `cgroup v1 cpu.shares=1024 (/sys/fs/cgroup/cpu/...)`."""
        group = self.group(plan.name)
        if self.kind == "cgroup-v2":
            return f"cgroup v2 cpu.weight={plan.cgroup_v2_weight} ({group})"
        if self.kind == "cgroup-v1":
            return f"cgroup v1 cpu.shares={plan.cgroup_v1_shares} ({group})"
        return f"nice {plan.nice} per worker"

    def apply(self, plans: Iterable[ModelPlan]) -> None:
        """Host: make each model's cgroup (if any) and write its weight (at start and on reload).

        The host's own cgroup, the models' parent, weighs their budgets together: one cgroup at the
        default weight would weigh as ONE process at nice 0 against everything outside it (nginx,
        a load generator, the host's other services), whatever the budgets; summed, onnxpool weighs
        what a one-model server with a worker per budgeted core would."""
        if self.folder is None:
            return
        plans = list(plans)
        total = sum(plan.budget for plan in plans)
        if self.kind == "cgroup-v2":
            (self.folder / "cpu.weight").write_text(f"{max(1, min(10000, round(total * 100)))}\n")
        else:
            (self.folder / "cpu.shares").write_text(f"{max(2, min(262144, round(total * 1024)))}\n")
        for plan in plans:
            group = self.folder / plan.name
            group.mkdir(exist_ok=True)
            if self.kind == "cgroup-v2":
                (group / "cpu.weight").write_text(f"{plan.cgroup_v2_weight}\n")
            else:
                (group / "cpu.shares").write_text(f"{plan.cgroup_v1_shares}\n")

    def join(self, model: str) -> None:
        """In the pool's process before exec: move this process into its model's cgroup."""
        group = self.group(model)
        if group is not None:
            (group / "cgroup.procs").write_text(f"{os.getpid()}\n")

    def remove(self, model: str | None = None, wait: float = STRAGGLER_SECONDS) -> None:
        """Host: remove a model's cgroup (or all of them and the host's) once its pools have stopped.

        A process still in it outlived its pool's master (a master that died leaves its workers,
        which notice only after gunicorn's timeout / 2): it is asked to stop (SIGTERM, nginx no
        longer routes to it) and given `wait` seconds, else its cgroup stays behind."""
        if self.folder is None or not self.folder.is_dir():
            return
        groups = [self.folder / model] if model else [p for p in self.folder.iterdir() if p.is_dir()]
        deadline = time.monotonic() + wait
        for group in groups:
            _stop_stragglers(group, deadline)
            with contextlib.suppress(OSError):
                group.rmdir()
        if model is None:
            with contextlib.suppress(OSError):
                self.folder.rmdir()


def _stop_stragglers(group: Path, deadline: float) -> None:
    """SIGTERM whatever is left in `group` and wait for it to leave (until `deadline`)."""
    procs = group / "cgroup.procs"
    try:
        left = procs.read_text().split()
    except OSError:
        return
    own = str(os.getpid())
    for pid in left:
        if pid != own:
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid), signal.SIGTERM)
    while [pid for pid in left if pid != own] and time.monotonic() < deadline:
        time.sleep(0.05)
        try:
            left = procs.read_text().split()
        except OSError:
            return


HOST_GROUP = "host"
"""cgroup v2: the host process's own leaf, when it must leave its cgroup to delegate it."""


def apply_nice(nice: int) -> None:
    """In a worker after fork: lower this process's weight to its model's share."""
    if nice > 0:
        os.setpriority(os.PRIO_PROCESS, 0, nice)


def _own_cgroups(text: str) -> dict[str, str]:
    """/proc/self/cgroup as controller -> path ("" for the v2 line)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            found[controller] = path
    return found


def choose(label: str, root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP) -> Priority:
    """The best mechanism this process may use; makes the host's cgroup folder `<own>/onnxpool-<label>`."""
    try:
        own = _own_cgroups(proc_cgroup.read_text())
    except OSError as exc:
        return Priority("nice", why=f"cannot read {proc_cgroup}: {exc.strerror}")
    if "cpu" in own:  # cgroup v1 (or hybrid): the cpu controller's own hierarchy
        mount = next((root / name for name in ("cpu,cpuacct", "cpu", "cpuacct,cpu") if (root / name).is_dir()), None)
        if mount is None:
            return Priority("nice", why="cgroup v1 cpu hierarchy not mounted")
        folder = mount / own["cpu"].lstrip("/") / f"onnxpool-{label}"
        try:
            folder.mkdir(exist_ok=True)
        except OSError as exc:
            return Priority("nice", why=f"cannot make a cgroup in {folder.parent}: {exc.strerror}")
        return Priority("cgroup-v1", folder)
    if "" in own and (root / "cgroup.controllers").is_file():
        return _choose_v2(root / own[""].lstrip("/"), label)
    return Priority("nice", why="no cgroup cpu controller")


def _choose_v2(own: Path, label: str) -> Priority:
    """cgroup v2: `<own>/onnxpool-<label>/{host,<model>...}` with the cpu controller enabled on the way."""
    try:
        if "cpu" not in (own / "cgroup.controllers").read_text().split():
            return Priority("nice", why=f"the cpu controller is not delegated to {own}")
        folder = own / f"onnxpool-{label}"
        folder.mkdir(exist_ok=True)
        _enable_cpu(own)
        _enable_cpu(folder)
        return Priority("cgroup-v2", folder)
    except OSError as exc:
        return Priority("nice", why=f"cannot delegate the cpu controller below {own}: {exc.strerror}")


def _enable_cpu(group: Path) -> None:
    """Enable the cpu controller for `group`'s children. A v2 cgroup with children may hold no
    process itself, so when `group` holds only this process (systemd's Delegate= service), this
    process first moves into a leaf of its own; other processes there make it fail (nice then)."""
    control = group / "cgroup.subtree_control"
    if "cpu" in control.read_text().split():
        return
    try:
        control.write_text("+cpu\n")
    except OSError:
        procs = (group / "cgroup.procs").read_text().split()
        if procs != [str(os.getpid())]:
            raise
        leaf = group / f"onnxpool-{HOST_GROUP}-{os.getpid()}"
        leaf.mkdir(exist_ok=True)
        (leaf / "cgroup.procs").write_text(f"{os.getpid()}\n")
        control.write_text("+cpu\n")
