"""onnxpool.tasks.text.sorting: length-sorted sub-batches, and the results back in request order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from onnxpool.tasks.text.sorting import plan_sub_batches


def test_sorted_by_length_and_cut() -> None:
    plan = plan_sub_batches([5, 1, 9, 1, 3], 2)
    assert [b.tolist() for b in plan.batches] == [[1, 3], [4, 0], [2]]  # stable: index 1 before 3
    assert plan.count == 5


def test_one_batch_as_sent() -> None:
    for size in (None, 5, 100):
        plan = plan_sub_batches([5, 1, 9, 1, 3], size)
        assert [b.tolist() for b in plan.batches] == [[0, 1, 2, 3, 4]]


def test_empty_and_bad_sizes() -> None:
    assert plan_sub_batches([], 4).batches == ()
    with pytest.raises(ValueError, match="at least 1"):
        plan_sub_batches([1], 0)
    with pytest.raises(ValueError, match="nothing to restore"):
        plan_sub_batches([], 4).restore([])


def test_restore_checks_counts() -> None:
    plan = plan_sub_batches([3, 1, 2], 2)
    with pytest.raises(ValueError, match="1 results for 2 sub-batches"):
        plan.restore([np.zeros((2, 1))])
    with pytest.raises(ValueError, match="gave 1 results"):
        plan.restore([np.zeros((1, 1)), np.zeros((1, 1))])


@given(
    lengths=st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=80),
    size=st.one_of(st.none(), st.integers(min_value=1, max_value=20)),
)
def test_every_input_once_sorted_and_restored(lengths: list[int], size: int | None) -> None:
    plan = plan_sub_batches(lengths, size)
    flat = np.concatenate(plan.batches)
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    assert all(b.size <= (size or len(lengths)) for b in plan.batches)
    if size is not None and size < len(lengths):
        ordered = [lengths[i] for i in flat]
        assert ordered == sorted(lengths)
    # a "model" whose row result is (original index, length): restore must put each back
    source = np.array([[i, n] for i, n in enumerate(lengths)])
    restored = plan.restore([source[b] * 1 for b in plan.batches])
    assert np.array_equal(restored, source)
