"""Removing the host's cgroup tree while another remover works on it (the host and its janitor, both at a
SIGTERM in the start): each finishes without an error, and the tree is gone."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from onnxpool.host.program import remove_cgroup_tree


def make_tree(root: Path) -> None:
    for model in ("iris", "tiny", "minilm"):
        for worker in range(4):
            (root / model / f"w{worker}").mkdir(parents=True)


def test_two_removers_at_once_both_finish_and_leave_nothing(tmp_path: Path) -> None:
    failures: list[BaseException] = []

    def remove(root: Path, start: threading.Barrier) -> None:
        start.wait()
        try:
            remove_cgroup_tree(root, time.monotonic() + 5)
        except BaseException as error:  # counted: what a remover would have died of
            failures.append(error)

    for attempt in range(200):  # the race is a window of microseconds: give it many chances
        root = tmp_path / f"onnxpool-{attempt}"
        make_tree(root)
        start = threading.Barrier(2)
        removers = [threading.Thread(target=remove, args=(root, start)) for _ in range(2)]
        for remover in removers:
            remover.start()
        for remover in removers:
            remover.join(10)
        assert not root.exists()
    assert failures == [], failures[:3]


def test_a_tree_already_gone_is_done(tmp_path: Path) -> None:
    remove_cgroup_tree(tmp_path / "never-made", time.monotonic() + 1)
