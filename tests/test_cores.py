"""Usable cores (affinity + cgroup quota), the pin/no-pin decision, layouts, core shares, slots."""

from __future__ import annotations

from pathlib import Path

import pytest

from onnxpool.workers.cores import SlotTable, cgroup_cpu_limit, cpu_allowance, plan_layout, usable_cores


def cgroup_v2(tmp_path: Path, limits: dict[str, str], member: str = "/kubepods/pod1/ctr") -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for rel, text in limits.items():
        (root / rel).mkdir(parents=True, exist_ok=True)
        (root / rel / "cpu.max").write_text(text)
    proc = tmp_path / "proc_cgroup"
    proc.write_text(f"0::{member}\n")
    return root, proc


def test_v2_quota_of_own_cgroup(tmp_path: Path) -> None:
    root, proc = cgroup_v2(tmp_path, {"kubepods/pod1/ctr": "200000 100000\n", "": "max 100000\n"})
    assert cgroup_cpu_limit(root, proc) == 2.0


def test_v2_tightest_ancestor_wins(tmp_path: Path) -> None:
    root, proc = cgroup_v2(tmp_path, {"kubepods/pod1/ctr": "max 100000", "kubepods/pod1": "150000 100000"})
    assert cgroup_cpu_limit(root, proc) == 1.5


def test_v2_no_limit(tmp_path: Path) -> None:
    root, proc = cgroup_v2(tmp_path, {"": "max 100000"}, member="/")
    assert cgroup_cpu_limit(root, proc) is None


def test_v2_namespaced_container_sees_root(tmp_path: Path) -> None:
    root, proc = cgroup_v2(tmp_path, {"": "400000 100000"}, member="/")
    assert cgroup_cpu_limit(root, proc) == 4.0


def test_v1_cfs_quota(tmp_path: Path) -> None:
    mount = tmp_path / "cgroup" / "cpu,cpuacct" / "docker" / "abc"
    mount.mkdir(parents=True)
    (mount / "cpu.cfs_quota_us").write_text("300000\n")
    (mount / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text("12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n")
    assert cgroup_cpu_limit(tmp_path / "cgroup", proc) == 3.0


def test_v1_unlimited(tmp_path: Path) -> None:
    mount = tmp_path / "cgroup" / "cpu,cpuacct"
    mount.mkdir(parents=True)
    (mount / "cpu.cfs_quota_us").write_text("-1\n")
    (mount / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text("4:cpu,cpuacct:/\n")
    assert cgroup_cpu_limit(tmp_path / "cgroup", proc) is None


def test_missing_files_mean_no_limit(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path / "absent", tmp_path / "absent_proc") is None


def cgroup_v1(
    tmp_path: Path, quota_us: int, member: str = "/kubepods/burstable/pod1/ctr", controllers: str = "cpu,cpuacct"
) -> tuple[Path, Path]:
    """A fake v1 sysfs: the cpu hierarchy (`cpu,cpuacct`, or `cpu` alone) with a CFS quota at the container's cgroup."""
    mount = tmp_path / "cgroup" / controllers
    leaf = mount / member.strip("/")
    leaf.mkdir(parents=True)
    for folder in (mount, leaf):
        (folder / "cpu.cfs_period_us").write_text("100000\n")
        (folder / "cpu.cfs_quota_us").write_text("-1\n")
    (leaf / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text(f"11:memory:{member}\n4:{controllers}:{member}\n1:name=systemd:{member}\n")
    return tmp_path / "cgroup", proc


# The pin/no-pin decision (issue 12). The old behaviour cut a 64-core mask to
# ceil(quota) cores and pinned the workers to cores 0..n-1: in a pod under the
# default CPU manager those are shared with every other pod on the node.


@pytest.mark.parametrize("version", ["v1", "v1-cpu-alone", "v2"])
def test_shared_pool_wider_than_quota_is_not_pinned(tmp_path: Path, version: str) -> None:
    if version == "v1":
        root, proc = cgroup_v1(tmp_path, 250000)
    elif version == "v1-cpu-alone":  # this CI host mounts cpu and cpuacct separately
        root, proc = cgroup_v1(tmp_path, 250000, controllers="cpu")
    else:
        root, proc = cgroup_v2(tmp_path, {"kubepods/pod1/ctr": "250000 100000", "": "max 100000"})
    allowance = cpu_allowance(affinity=list(range(64)), cpu_limit=cgroup_cpu_limit(root, proc))
    layout = plan_layout(allowance, "auto", "auto")
    assert not layout.pinned
    assert (layout.workers, layout.threads, layout.share_size) == (2, 1, 1)  # floor(2.5) single-threaded workers
    assert layout.cpu_mode == "unpinned (affinity 64 cores > quota 2.5)"
    assert not layout.oversubscribed


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_own_cores_within_quota_are_pinned(tmp_path: Path, version: str) -> None:
    # static CPU manager: a Guaranteed pod with limits.cpu 2 gets exactly two exclusive cores
    if version == "v1":
        root, proc = cgroup_v1(tmp_path, 200000)
    else:
        root, proc = cgroup_v2(tmp_path, {"kubepods/pod1/ctr": "200000 100000"})
    layout = plan_layout(cpu_allowance(affinity=[6, 7], cpu_limit=cgroup_cpu_limit(root, proc)), "auto", "auto")
    assert layout.pinned and layout.cpu_mode == "pinned"
    assert [layout.core_share_for(s) for s in range(layout.workers)] == [(6,), (7,)]


@pytest.mark.parametrize(
    ("affinity", "quota", "pinned", "cpus"),
    [
        (4, None, True, 4),  # bare metal, taskset: no quota
        (2, 4.0, True, 2),  # quota larger than the mask: the mask is the limit
        (3, 3.0, True, 3),  # equal: the cores are the pod's own
        (4, 3.5, False, 3),  # wider than the quota: floor
        (8, 0.5, False, 1),  # less than one CPU: still one worker
        (2, 1.999999, False, 1),
    ],
)
def test_pin_decision(affinity: int, quota: float | None, pinned: bool, cpus: int) -> None:
    allowance = cpu_allowance(affinity=list(range(affinity)), cpu_limit=quota)
    assert (allowance.own_cores, allowance.cpus) == (pinned, cpus)
    layout = plan_layout(allowance, "auto", "auto")
    assert (layout.pinned, layout.workers, layout.threads) == (pinned, cpus, 1)


def test_unpinned_explicit_workers_fill_the_quota_with_threads() -> None:
    layout = plan_layout(cpu_allowance(affinity=list(range(16)), cpu_limit=4.0), 2, "auto")
    assert (layout.pinned, layout.workers, layout.threads, layout.slots, layout.share_size) == (False, 2, 2, 2, 2)
    assert plan_layout(cpu_allowance(affinity=list(range(16)), cpu_limit=2.0), 3, 1).oversubscribed


def test_usable_cores_counts_the_quota_floor_and_honours_affinity() -> None:
    assert usable_cores(affinity=[4, 5, 6, 7], cpu_limit=2.5) == [4, 5]
    assert usable_cores(affinity=[3, 9], cpu_limit=None) == [3, 9]
    assert usable_cores(affinity=[3, 9], cpu_limit=8.0) == [3, 9]


@pytest.mark.parametrize(
    ("cores", "workers", "threads", "expected"),
    [
        (8, "auto", "auto", (8, 1)),
        (8, "auto", 2, (4, 2)),
        (8, 2, "auto", (2, 4)),
        (8, 3, "auto", (3, 2)),
        (2, 4, 1, (4, 1)),
        (1, "auto", "auto", (1, 1)),
    ],
)
def test_plan_layout(cores: int, workers: int | str, threads: int | str, expected: tuple[int, int]) -> None:
    layout = plan_layout(list(range(cores)), workers, threads)
    assert (layout.workers, layout.threads) == expected


def test_core_shares_are_disjoint_and_cover_the_cores() -> None:
    layout = plan_layout([2, 3, 5, 7, 11, 13], "auto", 2)
    shares = [layout.core_share_for(s) for s in range(layout.workers)]
    assert shares == [(2, 3), (5, 7), (11, 13)]
    assert not layout.oversubscribed


def test_extra_workers_wrap_around_and_are_flagged() -> None:
    layout = plan_layout([0, 1], 3, 1)
    assert layout.oversubscribed
    assert [layout.core_share_for(s) for s in range(3)] == [(0,), (1,), (0,)]


def test_slot_table_reuses_the_freed_slot() -> None:
    table = SlotTable(3)
    assert [table.acquire(w) for w in (1, 2, 3)] == [0, 1, 2]
    assert table.release(2) == 1
    assert table.acquire(4) == 1  # the replacement lands on the cores its predecessor left
    assert table.release(99) is None


def test_slot_table_during_hup_spreads_new_workers() -> None:
    table = SlotTable(2)
    table.acquire(1), table.acquire(2)  # old generation
    assert [table.acquire(3), table.acquire(4)] == [0, 1]  # new generation, one per share
    table.release(1), table.release(2)
    assert table.holders() == {0: 1, 1: 1}
