"""A process's memory as the kernel counts it: private bytes and PSS, from /proc/<pid>/smaps_rollup.

Private (Private_Clean + Private_Dirty) is what the process alone holds: what one more
worker costs the host. PSS (proportional set size) also charges each page shared with
other processes (the mapped model copy, libraries inherited from the master) as its
share: the workers' PSS sum to what the pool holds. RSS counts every shared page in
full in every process, so it overstates a pool of workers that share a model copy.
One read of smaps_rollup costs the kernel a walk of the process's mappings (well
under a millisecond for a worker), so it is read at start-up and then at most every
few seconds (`MemoryProbe`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MB = 1 << 20


@dataclass(frozen=True)
class ProcessMemory:
    """Bytes of one process (smaps_rollup)."""

    private: int
    pss: int
    rss: int

    def describe(self) -> str:
        """For log lines: `private 31 MB, PSS 52 MB`."""
        return f"private {self.private / MB:.0f} MB, PSS {self.pss / MB:.0f} MB"


def parse_smaps_rollup(text: str) -> ProcessMemory:
    """The fields of a smaps_rollup text (values in kB) as bytes."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        parts = rest.split()
        if sep and len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            fields[name.strip()] = int(parts[0]) * 1024
    try:
        private = fields["Private_Clean"] + fields["Private_Dirty"]
        return ProcessMemory(private=private, pss=fields["Pss"], rss=fields["Rss"])
    except KeyError as missing:
        raise ValueError(f"smaps_rollup has no {missing.args[0]} field") from None


def read_memory(pid: int | str = "self") -> ProcessMemory:
    """Memory of process `pid` (this one by default); OSError if it is gone or not ours to read."""
    return parse_smaps_rollup(Path(f"/proc/{pid}/smaps_rollup").read_text())


class MemoryProbe:
    """This process's memory, read again only when the last reading is `interval` seconds old.

    Timer-free by design: a worker calls `due()` after its requests, so nothing runs in
    a thread of its own (no thread may cross gunicorn's fork, and a sync worker has none).
    """

    def __init__(self, interval: float = 5.0) -> None:
        self.interval = interval
        self._next = 0.0

    def due(self) -> ProcessMemory | None:
        """A fresh reading if the last one is old enough, else None (a clock read: nothing else)."""
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self.interval
        try:
            return read_memory()
        except (OSError, ValueError):  # no /proc (not Linux) or an unexpected kernel: the gauge stays as it was
            return None


PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def anonymous_bytes() -> int:
    """This process's resident memory that no file backs (heap, arenas): resident minus shared in
    /proc/self/statm. One small read (microseconds): cheap enough to check after every inference.
    Pages of the mapped model copy are file pages: they do not count here."""
    fields = Path("/proc/self/statm").read_text().split()
    return (int(fields[1]) - int(fields[2])) * PAGE_BYTES


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None)
        trim: Callable[[int], int] = libc.malloc_trim  # glibc only (musl has none)
    except (OSError, AttributeError):
        return None
    return trim


def trim_heap() -> bool:
    """Give the C heap's free pages back to the kernel (glibc `malloc_trim(0)`); False if there is no glibc.

    glibc keeps freed memory for the next malloc: at the top of the heap beyond a threshold it
    returns it, but free pages between live allocations stay resident until a trim, which
    releases every free page of every malloc arena.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
