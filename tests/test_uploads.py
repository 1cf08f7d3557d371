"""Uploads (onnxpool.tasks.uploads): multipart/form-data and raw bodies, read for a task, without a server."""

from __future__ import annotations

import pytest

from onnxpool.local import LocalRequest
from onnxpool.tasks.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from onnxpool.tasks.uploads import MAX_FIELD_BYTES, FileField, parse_form, read_uploads

BOUNDARY = "xYzZY-boundary"
CONTENT_TYPE = f"multipart/form-data; boundary={BOUNDARY}"
IMAGES = FileField("image", media_types=("image/*",), max_files=4, noun="images")
TABLE = FileField("table", media_types=("text/csv", "text/plain"))
NOTES = FileField("notes", required=False, max_files=2)


def part(name: str, content: bytes, filename: str | None = None, media: str | None = None) -> bytes:
    disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename is not None else "")
    header = f"Content-Disposition: {disposition}\r\n" + (f"Content-Type: {media}\r\n" if media else "")
    return f"--{BOUNDARY}\r\n{header}\r\n".encode() + content + b"\r\n"


def body(*parts: bytes) -> bytes:
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def test_uploads_in_order_with_or_without_filename_and_text_fields() -> None:
    form = parse_form(
        body(
            part("image", b"\x00first\r\n--not-a-boundary", "a.jpg", "image/jpeg"),
            part("top_k", b"3"),
            part("image", b"second"),  # curl -F 'image=<file' sends no filename (and no type)
            part("top_k", b"9"),
        ),
        CONTENT_TYPE,
        [IMAGES],
    )
    files = form.of(IMAGES)
    assert [(f.filename, f.media_type, f.data) for f in files] == [
        ("a.jpg", "image/jpeg", b"\x00first\r\n--not-a-boundary"),
        (None, "", b"second"),
    ]
    assert [f.name for f in files] == ['image[0] "a.jpg"', 'image[1] "unnamed"']
    assert form.fields == {"top_k": "3"}  # the first value of a repeated field wins
    assert form.names == ["image", "top_k", "image", "top_k"]


def test_several_file_fields_each_with_its_types() -> None:
    data = body(part("table", b"a,b\n1,2\n", "rows.csv", "text/csv"), part("notes", b"n1", "n.txt", "text/plain"))
    uploads = read_uploads(LocalRequest(data, CONTENT_TYPE), TABLE, NOTES)
    assert uploads.one(TABLE).data == b"a,b\n1,2\n" and uploads.one(TABLE).filename == "rows.csv"
    assert [f.data for f in uploads.of(NOTES)] == [b"n1"]
    only_table = read_uploads(LocalRequest(body(part("table", b"x", "t.csv")), CONTENT_TYPE), TABLE, NOTES)
    assert only_table.of(NOTES) == []  # optional


def test_a_raw_body_of_a_fields_type_is_its_one_file() -> None:
    uploads = read_uploads(LocalRequest(b"a,b\n1,2\n", "text/csv; charset=utf-8"), TABLE)
    upload = uploads.one(TABLE)
    assert upload.raw and upload.data == b"a,b\n1,2\n" and upload.name == "request body (text/csv)"


@pytest.mark.parametrize(
    ("data", "content_type", "error", "message"),
    [
        (b"{}", "application/json", UnsupportedMediaType,
         "Content-Type application/json is not accepted: send multipart/form-data with the file(s) in field "
         "'table', or the raw file with a text/csv or text/plain Content-Type"),
        (b"x", "", UnsupportedMediaType, "Content-Type missing is not accepted"),
        (body(part("table", b"\x89PNG", "t.png", "image/png")), CONTENT_TYPE, UnsupportedMediaType,
         "table[0] \"t.png\" is image/png: field 'table' takes text/csv or text/plain"),
        (body(part("tabel", b"x", "t.csv")), CONTENT_TYPE, BadRequest,
         "multipart body has no file in field 'table' (fields sent: 'tabel')"),
        (body(part("table", b"1", "a.csv"), part("table", b"2", "b.csv")), CONTENT_TYPE, PayloadTooLarge,
         "more than 1 files sent; the limit is 1 per request"),
    ],
)  # fmt: skip
def test_what_a_field_does_not_take_is_a_clear_4xx(
    data: bytes, content_type: str, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as raised:
        read_uploads(LocalRequest(data, content_type), TABLE)
    assert str(raised.value).startswith(message), str(raised.value)


def test_a_part_of_unknown_type_is_taken() -> None:
    data = body(part("table", b"a,b\n", "rows.csv", "application/octet-stream"))
    assert read_uploads(LocalRequest(data, CONTENT_TYPE), TABLE).one(TABLE).data == b"a,b\n"


def test_a_file_in_another_field_is_skipped_but_named() -> None:
    form = parse_form(body(part("photo", b"x" * 100_000, "cat.jpg")), CONTENT_TYPE, [IMAGES])
    assert form.of(IMAGES) == [] and form.fields == {} and form.names == ["photo"]


def test_one_upload_too_many_is_413_naming_the_limit() -> None:
    parts = [part("image", b"img", f"{i}.jpg") for i in range(3)]
    two = FileField("image", max_files=2, noun="images")
    with pytest.raises(PayloadTooLarge, match="more than 2 images sent; the limit is 2 per request"):
        parse_form(body(*parts), CONTENT_TYPE, [two])


def test_an_oversized_text_field_is_413() -> None:
    with pytest.raises(PayloadTooLarge, match=f"form field 'note' is over {MAX_FIELD_BYTES} bytes"):
        parse_form(body(part("note", b"n" * (MAX_FIELD_BYTES + 1))), CONTENT_TYPE, [IMAGES])


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
        parse_form(data, content_type, [IMAGES])
