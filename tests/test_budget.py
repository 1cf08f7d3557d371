"""Several models' budgets: the plan's arithmetic, the nice values, the cgroup a host may make (fake /sys)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from onnxpool.config.settings import ModelEntry
from onnxpool.host.budget import budgets, nice_for, oversubscribed_budgets, plan_models
from onnxpool.host.priority import Priority, choose
from onnxpool.workers.cores import CpuAllowance


def entry(**keys: object) -> ModelEntry:
    return ModelEntry.model_validate({"path": "/m.onnx", **keys})


def test_auto_budgets_share_what_the_given_ones_leave() -> None:
    got = budgets({"image": entry(cpus=1.0), "text": entry(), "tab": entry()}, cpus=4)
    assert got == {"image": 1.0, "text": 1.5, "tab": 1.5}


def test_workers_times_threads_is_a_budget() -> None:
    got = budgets({"a": entry(workers=1, threads_per_worker=2), "b": entry()}, cpus=4)
    assert got == {"a": 2.0, "b": 2.0}


def test_budgets_that_leave_nothing_make_auto_ones_equals() -> None:
    got = budgets({"a": entry(cpus=2.0), "b": entry(cpus=1.0), "c": entry()}, cpus=2)
    assert got["c"] == pytest.approx(2 / 3)


def test_every_model_covers_the_host_and_weighs_its_budget() -> None:
    allowance = CpuAllowance(affinity=(0, 1), quota=None)
    plans = plan_models({"image": entry(cpus=1.0), "iris": entry(cpus=0.25), "text": entry(cpus=0.75)}, allowance)
    for plan in plans.values():
        assert (plan.layout.workers, plan.layout.threads, plan.layout.pinned) == (2, 1, True)
    assert [plans[n].cgroup_v1_shares for n in ("image", "iris", "text")] == [1024, 256, 768]
    assert [plans[n].cgroup_v2_weight for n in ("image", "iris", "text")] == [100, 25, 75]
    # nice: the heaviest per-process share at 0; 1/4 of it is log1.25(4) = 6.2 steps down
    assert [plans[n].nice for n in ("image", "iris", "text")] == [0, 6, 1]
    assert oversubscribed_budgets(plans, 2) is None


def test_nice_values_make_the_models_weigh_their_budgets() -> None:
    """Per-process kernel weight 1024 / 1.25**nice, times the workers: proportional to the budgets."""
    allowance = CpuAllowance(affinity=(0, 1, 2, 3), quota=None)
    plans = plan_models({"big": entry(cpus=3.0, workers=4), "small": entry(cpus=1.0, workers=2)}, allowance)
    weight = {n: p.layout.workers * 1024 / 1.25**p.nice for n, p in plans.items()}
    assert weight["big"] / weight["small"] == pytest.approx(3.0, rel=0.15)


def test_a_quota_only_allowance_gives_an_unpinned_layout_per_model() -> None:
    allowance = CpuAllowance(affinity=tuple(range(16)), quota=2.5)
    plans = plan_models({"a": entry(cpus=1.5), "b": entry(cpus=1.0)}, allowance)
    assert all((p.layout.workers, p.layout.pinned) == (2, False) for p in plans.values())


def test_nice_is_bounded() -> None:
    assert nice_for(1.0, 1.0) == 0
    assert nice_for(1e-9, 1.0) == 19
    assert nice_for(0.5, 1.0) == round(math.log(2) / math.log(1.25))


def test_oversubscribed_budgets_are_reported() -> None:
    allowance = CpuAllowance(affinity=(0, 1), quota=None)
    plans = plan_models({"a": entry(cpus=2.0), "b": entry(cpus=1.0)}, allowance)
    assert oversubscribed_budgets(plans, 2) == 3.0


def _cgroup_v1_tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "sys"
    (root / "cpu,cpuacct" / "user.slice").mkdir(parents=True)
    proc = tmp_path / "cgroup"
    proc.write_text("12:cpu,cpuacct:/user.slice\n11:memory:/user.slice\n0::/user.slice\n")
    return root, proc


def test_cgroup_v1_group_per_model(tmp_path: Path) -> None:
    root, proc = _cgroup_v1_tree(tmp_path)
    priority = choose("7", root=root, proc_cgroup=proc)
    assert priority.kind == "cgroup-v1"
    assert priority.folder == root / "cpu,cpuacct" / "user.slice" / "onnxpool-7"
    plan = plan_models({"text": entry(cpus=0.75)}, CpuAllowance((0, 1), None))["text"]
    priority.apply([plan])
    assert (priority.folder / "text" / "cpu.shares").read_text() == "768\n"
    assert (priority.folder / "cpu.shares").read_text() == "768\n"  # the host weighs its budgets' sum
    assert priority.describe(plan).startswith("cgroup v1 cpu.shares=768")


def test_cgroup_v2_without_a_delegated_cpu_controller_is_nice(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    (root / "user.slice").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (root / "user.slice" / "cgroup.controllers").write_text("memory pids\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/user.slice\n")
    priority = choose("7", root=root, proc_cgroup=proc)
    assert priority.kind == "nice" and "not delegated" in priority.why


def test_cgroup_v2_delegated_enables_cpu_below_it(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    own = root / "system.slice" / "onnxpool.service"
    own.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (own / "cgroup.controllers").write_text("cpu memory\n")
    (own / "cgroup.subtree_control").write_text("cpu\n")  # systemd's Delegate= with cpu already enabled
    proc = tmp_path / "cgroup"
    proc.write_text("0::/system.slice/onnxpool.service\n")
    # the new folder's control file: a real cgroupfs makes it; here it starts empty
    (own / "onnxpool-7").mkdir()
    (own / "onnxpool-7" / "cgroup.subtree_control").write_text("")
    priority = choose("7", root=root, proc_cgroup=proc)
    assert priority.kind == "cgroup-v2", priority.why
    assert (own / "onnxpool-7" / "cgroup.subtree_control").read_text() == "+cpu\n"
    plan = plan_models({"image": entry(cpus=1.5)}, CpuAllowance((0, 1), None))["image"]
    priority.apply([plan])
    assert (own / "onnxpool-7" / "image" / "cpu.weight").read_text() == "150\n"
    assert (own / "onnxpool-7" / "cpu.weight").read_text() == "150\n"


def test_no_cgroup_to_make_falls_back_to_nice(tmp_path: Path) -> None:
    root, proc = _cgroup_v1_tree(tmp_path)
    (root / "cpu,cpuacct" / "user.slice").rmdir()
    (root / "cpu,cpuacct").rmdir()  # the controller is named, its hierarchy is not mounted
    priority = choose("7", root=root, proc_cgroup=proc)
    assert (priority.kind, priority.folder) == ("nice", None)
    assert "not mounted" in priority.why
    proc.write_text("0::/\n")  # cgroup v2 named, nothing mounted at root
    assert choose("7", root=root, proc_cgroup=proc).kind == "nice"


def test_nice_priority_describes_each_model() -> None:
    plan = plan_models({"a": entry(cpus=1.0), "b": entry(cpus=0.25)}, CpuAllowance((0, 1), None))["b"]
    assert Priority("nice").describe(plan) == "nice 6 per worker"
