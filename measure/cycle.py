"""A load-generator workload of several prepared requests, sent in turn.

For workloads whose requests must differ (one sentence per request over a set of
sentences, benchmarks/text.py) while costing the load generator no more than one
prepared request: the wire bytes are built once per connection and step, then cycled.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from onnxpool.measure.payloads import PreparedRequest
from onnxpool.measure.rawhttp import wire_bytes


@dataclass(frozen=True)
class RequestCycle:
    """`requests` in order, endlessly; connection c starts at request c (mod their count)."""

    requests: tuple[PreparedRequest, ...]

    def __post_init__(self) -> None:
        if not self.requests:
            raise ValueError("a request cycle needs at least one request")

    @property
    def items(self) -> int:
        """Inputs per request (the first request's; a cycle's requests carry equally many)."""
        return self.requests[0].items

    def wires(self, host: str, port: int, connection: int) -> Iterator[bytes]:
        # Connections start at different requests, so concurrent requests carry different inputs.
        wires = [wire_bytes(request, host, port) for request in self.requests]
        start = connection % len(wires)
        return itertools.cycle(wires[start:] + wires[:start])
