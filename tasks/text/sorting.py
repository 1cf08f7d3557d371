"""Plan a request's inputs into length-sorted sub-batches, and put the results back in order.

A batch is padded to its longest input, and the model computes every padded position
(attention is quadratic in it), so one long sentence makes every short one in its batch
cost as much as itself. Sorted by length and cut into sub-batches, each sub-batch is padded
only to its own longest: measured in process, 32 mixed-length sentences ran at 101
sentences/s as one batch and at 168 sorted in sub-batches of 8. Results are independent
of the grouping (pooling uses the attention mask), so only the order has to be restored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SubBatchPlan:
    """`batches[k]` holds the original indices of sub-batch k (shortest inputs first)."""

    batches: tuple[np.ndarray, ...]
    count: int

    def restore(self, results: Sequence[np.ndarray]) -> np.ndarray:
        """Per-sub-batch results (rows in `batches[k]`'s order) -> one array in the original order."""
        if len(results) != len(self.batches):
            raise ValueError(f"{len(results)} results for {len(self.batches)} sub-batches")
        if not results:
            raise ValueError("nothing to restore: the plan has no inputs")
        first = results[0]
        out = np.empty((self.count, *first.shape[1:]), dtype=first.dtype)
        for rows, result in zip(self.batches, results, strict=True):
            if result.shape[0] != rows.size:
                raise ValueError(f"a sub-batch of {rows.size} inputs gave {result.shape[0]} results")
            out[rows] = result
        return out


def plan_sub_batches(
    lengths: Sequence[int] | np.ndarray, batch_size: int | None, max_tokens: int | None = None
) -> SubBatchPlan:
    """Sort inputs by token count (stable: equal lengths keep their order) and cut into
    sub-batches of at most `batch_size`; None (or a size covering all) = one batch as sent.

    `max_tokens` also caps a sub-batch's PADDED tokens (inputs x its longest input; one input
    always fits): the memory a run needs grows with it (attention scores with inputs x
    length^2), so eight inputs of 256 tokens would need several times what eight of 64 do.
    """
    sizes = np.asarray(lengths, dtype=np.int64)
    count = int(sizes.size)
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be at least 1 (or None for one batch), got {batch_size}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1 (or None for no cap), got {max_tokens}")
    if count == 0:
        return SubBatchPlan((), 0)
    if max_tokens is None and (batch_size is None or batch_size >= count):
        return SubBatchPlan((np.arange(count, dtype=np.int64),), count)
    order = np.argsort(sizes, kind="stable")
    if max_tokens is None:
        assert batch_size is not None
        return SubBatchPlan(tuple(order[start : start + batch_size] for start in range(0, count, batch_size)), count)
    limit = count if batch_size is None else batch_size
    batches, start = [], 0
    for end in range(1, count + 1):
        # Sorted ascending: the sub-batch [start, end] is padded to the length of its last input.
        full = end - start == limit or end == count
        if full or (end - start + 1) * int(sizes[order[end]]) > max_tokens:
            batches.append(order[start:end])
            start = end
    return SubBatchPlan(tuple(batches), count)
