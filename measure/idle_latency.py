"""Keep idle CPUs polling instead of sleeping while a latency is measured (Linux PM QoS).

A request that reaches an idle server first waits for its CPU to wake up. On this
project's 2-core VM an idle vCPU halts (a VM exit), and the request that wakes it runs
on cold caches: a cache hit's server time was 0.56-0.76 ms that way against 0.42 ms with
idle CPUs polling (docs/BENCHMARKS.md). Holding /dev/cpu_dma_latency open with the value
0 asks the kernel for zero wake-up latency, so idle CPUs poll; it is what the
latency-performance profile of `tuned` sets on production hosts, and it lasts exactly as
long as the file stays open (so it ends with this process, whatever happens).

Only root may open the file; elsewhere `hold_idle_latency` yields False and changes
nothing, and `measured_polling` returns the reason instead of a measurement.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Callable, Iterator
from typing import TypeVar

PM_QOS_FILE = "/dev/cpu_dma_latency"
T = TypeVar("T")


@contextlib.contextmanager
def hold_idle_latency(microseconds: int = 0) -> Iterator[bool]:
    """While inside: idle CPUs wake within `microseconds` (0: they poll). Yields whether it took hold."""
    try:
        fd = os.open(PM_QOS_FILE, os.O_WRONLY)
    except OSError:
        yield False
        return
    try:
        os.write(fd, struct.pack("i", microseconds))  # the kernel takes a binary s32
        yield True
    finally:
        os.close(fd)


def measured_polling(measure: Callable[[], T]) -> T | str:
    """`measure()` run again with idle CPUs polling, or why it could not be (not root)."""
    with hold_idle_latency() as polling:
        if polling:
            return measure()
    return f"not measured: {PM_QOS_FILE} needs root"
