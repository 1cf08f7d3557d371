"""Which cores this server may use, whether workers pin to them, and which share each slot gets.

Two limits reach a process: the inherited affinity mask (taskset, cpusets, the
kubelet's static CPU manager) and the cgroup CPU quota (`cpu.max` on v2,
`cpu.cfs_quota_us` on v1; a pod's `limits.cpu`). Workers pin to core ids only
when the cores are this process's own: the affinity mask is no larger than the
quota (or there is no quota), as on bare metal, under taskset, or in a
Guaranteed pod with the static CPU manager. When the mask is wider than the
quota (Kubernetes' default CPU manager: the node's whole shared pool plus a CFS
quota), pinning would stack the workers on cores other pods run on, so they are
NOT pinned; the worker count and thread pools are sized from the quota (its
floor, at least 1) and the kernel spreads them, throttled by the quota.
This module does no process changes; the post_fork hook applies what it computes.

Slots (bookkeeping in the gunicorn master): which core share each worker holds.

A slot is an index of a disjoint core share. `pre_fork` gives a new worker the
slot with the fewest holders (lowest index on ties), `child_exit` frees it. So a
replacement worker (crash, timeout kill, max_requests recycle) lands on the
cores its predecessor left, and during a HUP, when gunicorn briefly runs old
and new workers side by side, the new set still spreads over every share.
Lives only in the master; workers never touch it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def affinity_cores() -> list[int]:
    """Cores this process may run on, lowest first (honours taskset and cpusets)."""
    return sorted(os.sched_getaffinity(0))


def _quota_v2(text: str) -> float | None:
    """cgroup v2 `cpu.max`: "max 100000" (no limit) or "200000 100000" (2 CPUs)."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    quota, period = int(parts[0]), int(parts[1])
    return quota / period if quota > 0 and period > 0 else None


def _quota_v1(quota_text: str, period_text: str) -> float | None:
    """cgroup v1 `cpu.cfs_quota_us` (-1 = no limit) over `cpu.cfs_period_us`."""
    quota, period = int(quota_text.strip()), int(period_text.strip())
    return quota / period if quota > 0 and period > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _ancestors(relative: str) -> list[str]:
    """A cgroup path and each parent up to the root: a limit anywhere above applies."""
    parts = [p for p in relative.split("/") if p]
    return ["/".join(parts[:i]) for i in range(len(parts), -1, -1)]


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP) -> float | None:
    """The tightest CPU quota over this process's cgroup and its parents, in CPUs; None = none.

    Reads cgroup v2 (`cpu.max`) and v1 (`cpu,cpuacct/cpu.cfs_quota_us`). Inside a
    container the cgroup namespace makes the process's own cgroup appear as the
    root, so the root files are checked as well.
    """
    membership = _read(proc_cgroup) or ""
    limits: list[float] = []
    for line in membership.splitlines():
        hierarchy_id, _, rest = line.partition(":")
        controllers, _, relative = rest.partition(":")
        if hierarchy_id == "0" and controllers == "":
            for part in _ancestors(relative):
                text = _read(root / part / "cpu.max")
                limit = _quota_v2(text) if text else None
                if limit is not None:
                    limits.append(limit)
        elif "cpu" in controllers.split(","):
            mount = next(
                (root / name for name in ("cpu,cpuacct", "cpuacct,cpu", "cpu") if (root / name).is_dir()),
                None,
            )
            if mount is None:
                continue
            for part in _ancestors(relative):
                quota, period = _read(mount / part / "cpu.cfs_quota_us"), _read(mount / part / "cpu.cfs_period_us")
                limit = _quota_v1(quota, period) if quota and period else None
                if limit is not None:
                    limits.append(limit)
    return min(limits) if limits else None


_EPSILON = 1e-9


@dataclass(frozen=True)
class CpuAllowance:
    """The affinity mask and the cgroup CPU quota (in CPUs, None = no quota) of this process."""

    affinity: tuple[int, ...]
    quota: float | None

    @property
    def own_cores(self) -> bool:
        """The cores are this process's own (pin to them): the mask is no larger than the quota."""
        return self.quota is None or len(self.affinity) <= self.quota + _EPSILON

    @property
    def cpus(self) -> int:
        """CPUs' worth of compute to size workers from: the mask when owned, else floor(quota) (>= 1)."""
        if self.own_cores or self.quota is None:
            return max(1, len(self.affinity))
        return max(1, math.floor(self.quota + _EPSILON))


def cpu_allowance(affinity: list[int] | None = None, cpu_limit: float | bool | None = False) -> CpuAllowance:
    """This process's allowance; `cpu_limit=False` reads the quota from the cgroup files.

    Pass `affinity` and a number or None as `cpu_limit` to decide them (tests do).
    """
    cores = affinity_cores() if affinity is None else sorted(affinity)
    limit = cgroup_cpu_limit() if cpu_limit is False else cpu_limit
    quota = float(limit) if isinstance(limit, (int, float)) and not isinstance(limit, bool) else None
    return CpuAllowance(affinity=tuple(cores), quota=quota)


def usable_cores(affinity: list[int] | None = None, cpu_limit: float | bool | None = False) -> list[int]:
    """As many cores as the allowance is worth (the whole mask when it is owned), lowest first.

    For tools that count or pin cores themselves (bench); the server plans from
    `cpu_allowance()` so that it can decide not to pin.
    """
    allowance = cpu_allowance(affinity, cpu_limit)
    return list(allowance.affinity[: allowance.cpus])


@dataclass(frozen=True)
class Layout:
    """How the CPUs are split: `workers` processes x `threads` each, pinned to core shares or not.

    Pinned (the cores are owned): each slot gets a disjoint share of `cores`.
    Unpinned (the mask is wider than the quota): no worker is pinned, the kernel
    schedules them anywhere in the mask, and floor(quota) is what the layout is
    sized from.
    """

    allowance: CpuAllowance
    workers: int
    threads: int

    @property
    def cores(self) -> tuple[int, ...]:
        """The affinity mask."""
        return self.allowance.affinity

    @property
    def pinned(self) -> bool:
        """Workers pin to their core share (post_fork follows this)."""
        return self.allowance.own_cores

    @property
    def cpus(self) -> int:
        """CPUs the layout is sized for: the cores when pinned, floor(quota) when not."""
        return self.allowance.cpus

    @property
    def slots(self) -> int:
        """Number of disjoint shares (at least 1)."""
        return max(1, self.cpus // self.threads)

    @property
    def share_size(self) -> int:
        """Threads of one worker's share: its intra-op thread count (never more than the CPUs)."""
        return min(self.threads, self.cpus)

    @property
    def oversubscribed(self) -> bool:
        """More threads than CPUs: throughput drops; allowed, with a loud warning."""
        return self.workers * self.threads > self.cpus

    @property
    def cpu_mode(self) -> str:
        """For the startup log line: `pinned` or `unpinned (affinity N cores > quota Q)`."""
        if self.pinned:
            return "pinned"
        return f"unpinned (affinity {len(self.cores)} cores > quota {self.allowance.quota:g})"

    def core_share_for(self, slot: int) -> tuple[int, ...]:
        """The cores slot `slot` is pinned to (pinned layouts); slots past the last share wrap around."""
        n = len(self.cores)
        if self.threads >= n:
            return self.cores
        start = (slot % self.slots) * self.threads
        return tuple(self.cores[(start + j) % n] for j in range(self.threads))


def plan_layout(cpus: CpuAllowance | list[int], workers: int | str, threads: int | str) -> Layout:
    """Resolve "auto" worker and thread counts, and whether to pin.

    `cpus` is the process's allowance (the server) or a list of cores to pin to
    (tools, tests). Both auto: one single-threaded worker per CPU (the fastest
    layout for most CPU models, see docs/ARCHITECTURE.md). One given: the other
    fills the CPUs. An allowance whose mask is wider than its quota gives an
    unpinned layout sized from floor(quota).
    """
    allowance = cpus if isinstance(cpus, CpuAllowance) else CpuAllowance(affinity=tuple(cpus), quota=None)
    n = allowance.cpus
    if isinstance(threads, int):
        t = threads
    elif isinstance(workers, int):
        t = max(1, n // workers)
    else:
        t = 1
    w = workers if isinstance(workers, int) else max(1, n // t)
    return Layout(allowance=allowance, workers=w, threads=t)


class SlotTable:
    """Holders per slot, keyed by a unique worker id (gunicorn's `worker.age`)."""

    def __init__(self, slots: int) -> None:
        self._holders: dict[int, set[int]] = {slot: set() for slot in range(max(1, slots))}

    @property
    def size(self) -> int:
        """Number of slots."""
        return len(self._holders)

    def acquire(self, worker_id: int) -> int:
        """Assign the least-held slot (lowest on ties) to worker_id and return it."""
        slot = min(self._holders, key=lambda s: (len(self._holders[s]), s))
        self._holders[slot].add(worker_id)
        return slot

    def release(self, worker_id: int) -> int | None:
        """Free worker_id's slot; idempotent (returns None if it held none)."""
        for slot, holders in self._holders.items():
            if worker_id in holders:
                holders.discard(worker_id)
                return slot
        return None

    def holders(self) -> dict[int, int]:
        """Slot -> number of live holders (for logs and tests)."""
        return {slot: len(h) for slot, h in self._holders.items()}
