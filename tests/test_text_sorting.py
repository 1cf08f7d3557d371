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


def test_padded_tokens_cap_the_sub_batch() -> None:
    # sorted: 10, 10, 10, 60, 200, 300; cap 64 tokens: three of 10 (30), 60 alone, 200 and 300 each
    # alone (one input always fits, even over the cap)
    plan = plan_sub_batches([300, 10, 60, 10, 200, 10], 8, max_tokens=64)
    assert [b.tolist() for b in plan.batches] == [[1, 3, 5], [2], [4], [0]]
    assert [b.tolist() for b in plan_sub_batches([10, 10, 10], 2, max_tokens=1000).batches] == [[0, 1], [2]]
    assert [b.tolist() for b in plan_sub_batches([10, 10, 10], None, max_tokens=20).batches] == [[0, 1], [2]]
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        plan_sub_batches([1], 2, max_tokens=0)


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
    max_tokens=st.one_of(st.none(), st.integers(min_value=1, max_value=2000)),
)
def test_every_input_once_sorted_and_restored(lengths: list[int], size: int | None, max_tokens: int | None) -> None:
    plan = plan_sub_batches(lengths, size, max_tokens)
    flat = np.concatenate(plan.batches)
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    assert all(b.size <= (size or len(lengths)) for b in plan.batches)
    if max_tokens is not None:
        assert all(b.size == 1 or b.size * max(lengths[i] for i in b) <= max_tokens for b in plan.batches)
    if (size is not None and size < len(lengths)) or max_tokens is not None:
        ordered = [lengths[i] for i in flat]
        assert ordered == sorted(lengths)
    # a "model" whose row result is (original index, length): restore must put each back
    source = np.array([[i, n] for i, n in enumerate(lengths)])
    restored = plan.restore([source[b] * 1 for b in plan.batches])
    assert np.array_equal(restored, source)
