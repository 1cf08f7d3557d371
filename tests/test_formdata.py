"""multipart/form-data parsing for the image endpoint (server.formdata), without a server."""

from __future__ import annotations

import pytest

from onnxpool.tasks.errors import BadRequest, PayloadTooLarge
from onnxpool.tasks.image.formdata import MAX_FIELD_BYTES, parse_form

BOUNDARY = "xYzZY-boundary"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"


def part(name: str, content: bytes, filename: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename is not None else "")
    return f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + content + b"\r\n"


def body(*parts: bytes) -> bytes:
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def test_uploads_in_order_with_or_without_filename_and_text_fields() -> None:
    form = parse_form(
        body(
            part("image", b"\x00first\r\n--not-a-boundary", "a.jpg"),
            part("top_k", b"3"),
            part("image", b"second"),  # curl -F 'image=<file' sends no filename
            part("top_k", b"9"),
        ),
        CONTENT_TYPE,
        "image",
        max_uploads=4,
    )
    assert form.uploads == [("a.jpg", b"\x00first\r\n--not-a-boundary"), (None, b"second")]
    assert form.fields == {"top_k": "3"}  # the first value of a repeated field wins
    assert form.names == ["image", "top_k", "image", "top_k"]


def test_a_file_in_another_field_is_skipped_but_named() -> None:
    form = parse_form(body(part("photo", b"x" * 100_000, "cat.jpg")), CONTENT_TYPE, "image", max_uploads=4)
    assert form.uploads == [] and form.fields == {} and form.names == ["photo"]


def test_one_upload_too_many_is_413_naming_the_limit() -> None:
    parts = [part("image", b"img", f"{i}.jpg") for i in range(3)]
    with pytest.raises(PayloadTooLarge, match="the limit is 2 per request"):
        parse_form(body(*parts), CONTENT_TYPE, "image", max_uploads=2)


def test_an_oversized_text_field_is_413() -> None:
    with pytest.raises(PayloadTooLarge, match=f"form field 'note' is over {MAX_FIELD_BYTES} bytes"):
        parse_form(body(part("note", b"n" * (MAX_FIELD_BYTES + 1))), CONTENT_TYPE, "image", max_uploads=2)


@pytest.mark.parametrize(
    ("data", "content_type", "message"),
    [
        (body(part("image", b"img")), "multipart/form-data", "needs a boundary parameter"),
        (part("image", b"img"), CONTENT_TYPE, "malformed multipart/form-data body"),  # never closed
        (b"no multipart here at all", CONTENT_TYPE, "malformed multipart/form-data body"),
        (f"--{BOUNDARY}\r\nbroken header line\r\n\r\nx\r\n--{BOUNDARY}--\r\n".encode(), CONTENT_TYPE, "malformed"),
    ],
)
def test_malformed_bodies_are_400_naming_the_problem(data: bytes, content_type: str, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parse_form(data, content_type, "image", max_uploads=2)
