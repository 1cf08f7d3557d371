"""Usable cores (affinity + cgroup quota), layouts, core shares and slot bookkeeping."""

from __future__ import annotations

from pathlib import Path

import pytest

from onnxpool.workers.cores import SlotTable, cgroup_cpu_limit, plan_layout, usable_cores


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


def test_pod_with_two_cpus_on_64_core_node_gets_two_workers() -> None:
    cores = usable_cores(affinity=list(range(64)), cpu_limit=2.0)
    layout = plan_layout(cores, "auto", "auto")
    assert (layout.workers, layout.threads) == (2, 1)
    assert cores == [0, 1]


def test_fractional_quota_rounds_up_and_affinity_is_honoured() -> None:
    assert usable_cores(affinity=[4, 5, 6, 7], cpu_limit=2.5) == [4, 5, 6]
    assert usable_cores(affinity=[3, 9], cpu_limit=None) == [3, 9]


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
