"""`onnxpool bench --repeat-fraction`: variants are the same picture in other bytes; repeats come as asked."""

from __future__ import annotations

import io
import itertools
import re
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from onnxpool.measure.paths import CAT_JPEG
from onnxpool.measure.repeats import RepeatWorkload, jpeg_variant

TAG = re.compile(rb"onnxpool bench \w+ connection 0 step 1 image (\d+)")


def test_a_variant_is_the_same_picture_in_other_bytes() -> None:
    jpeg = CAT_JPEG.read_bytes()
    a, b = jpeg_variant(jpeg, "a"), jpeg_variant(jpeg, "b")
    assert len({jpeg, a, b}) == 3
    pixels = [np.asarray(Image.open(io.BytesIO(data)).convert("RGB")) for data in (jpeg, a, b)]
    assert all(np.array_equal(pixels[0], p) for p in pixels[1:])
    with pytest.raises(ValueError, match="JPEG"):
        jpeg_variant(b"\x89PNG....", "x")


@pytest.mark.parametrize("fraction", [0.0, 0.5, 0.9])
def test_repeats_come_at_the_asked_fraction_and_favour_the_first_images(fraction: float) -> None:
    work = RepeatWorkload(CAT_JPEG, fraction)
    sent = list(itertools.islice(work.wires("127.0.0.1", 8000, connection=0, step="1"), 2000))
    images = [int(TAG.search(wire).group(1)) for wire in sent]  # type: ignore[union-attr]
    counts = Counter(images)
    assert abs((len(sent) - len(counts)) / len(sent) - fraction) < 0.04
    assert sorted(counts) == list(range(len(counts)))  # a new image is the next one
    if fraction:
        assert counts.most_common(1)[0][0] == 0  # rank 1, the first image sent, is the most popular
    # another connection or step sends other bytes: its new images are real misses too
    for connection, step in ((1, "1"), (0, "2")):
        wire = next(work.wires("127.0.0.1", 8000, connection=connection, step=step))
        assert f"connection {connection} step {step} image 0".encode() in wire
