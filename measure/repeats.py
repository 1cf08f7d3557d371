"""A /predict workload where a given fraction of the requests repeat earlier ones (the response cache's case).

Each connection sends a stream: with probability `fraction` a request repeats an
image this connection sent before, drawn Zipf-like over them (the first image
sent is the most popular: rank r has weight 1/r^zipf), otherwise it sends an
image never sent before. Distinct images are the sample photo with a JPEG
comment segment (COM) holding a run nonce, the connection, the step and a
counter: a few bytes changed, so the server's cache key changes and a new
image is a real miss (a full decode and inference of the same picture), while
building it costs the load generator a copy of the bytes, not a JPEG encode.
"""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from onnxpool.measure.payloads import PreparedRequest, multipart_body
from onnxpool.measure.rawhttp import wire_bytes

JPEG_START = b"\xff\xd8"
COMMENT_MARKER = b"\xff\xfe"


def jpeg_variant(jpeg: bytes, tag: str) -> bytes:
    """`jpeg` with a comment segment holding `tag` right after its start marker (same picture, other bytes)."""
    if not jpeg.startswith(JPEG_START):
        raise ValueError("the repeat workload needs a JPEG image (it adds a comment segment to make variants)")
    text = tag.encode()
    if len(text) > 0xFFFF - 2:
        raise ValueError("tag too long for a JPEG comment")
    return JPEG_START + COMMENT_MARKER + (len(text) + 2).to_bytes(2, "big") + text + jpeg[len(JPEG_START) :]


@dataclass(frozen=True)
class RepeatWorkload:
    """Requests for the load generator, one stream per connection and step (see the module doc)."""

    image: Path
    fraction: float
    zipf: float = 1.1
    path: str = "/predict"
    nonce: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    items: int = 1

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"--repeat-fraction must be between 0 and 1, got {self.fraction}")
        if self.zipf <= 0:
            raise ValueError(f"zipf exponent must be > 0, got {self.zipf}")

    def request(self, jpeg: bytes, tag: str) -> PreparedRequest:
        body, content_type = multipart_body("image", [(self.image.name, jpeg_variant(jpeg, tag), "image/jpeg")])
        return PreparedRequest("POST", self.path, body, {"Content-Type": content_type})

    def wires(self, host: str, port: int, connection: int, step: str) -> Iterator[bytes]:
        """The request bytes this connection sends in one step, endlessly."""
        jpeg = self.image.read_bytes()
        rng = np.random.default_rng([connection, zlib.crc32(step.encode())])
        distinct = 0  # images sent so far; image i is rebuilt when it repeats (memory stays flat)
        weights = np.zeros(0)
        while True:
            if distinct and rng.random() < self.fraction:
                if weights.size != distinct:
                    weights = np.cumsum(np.arange(1, distinct + 1, dtype=np.float64) ** -self.zipf)
                image = min(int(np.searchsorted(weights, rng.random() * weights[-1], side="right")), distinct - 1)
            else:
                image, distinct = distinct, distinct + 1
            tag = f"onnxpool bench {self.nonce} connection {connection} step {step} image {image}"
            yield wire_bytes(self.request(jpeg, tag), host, port)

    def sample(self) -> PreparedRequest:
        """One request of the workload (to check the image before the run)."""
        return self.request(self.image.read_bytes(), f"onnxpool bench {self.nonce} sample")
