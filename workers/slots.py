"""Slot bookkeeping in the gunicorn master: which core share each worker holds.

A slot is an index of a disjoint core share. `pre_fork` gives a new worker the
slot with the fewest holders (lowest index on ties), `child_exit` frees it. So a
replacement worker (crash, timeout kill, max_requests recycle) lands on the
cores its predecessor left, and during a HUP, when gunicorn briefly runs old
and new workers side by side, the new set still spreads over every share.
Lives only in the master; workers never touch it.
"""

from __future__ import annotations


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
