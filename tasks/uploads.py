"""Uploads: how a task reads the files a request carries, multipart/form-data or a raw body.

One reader for every task (the image task's photos too). A task names its file fields, each
with the media types it takes, and gets the files of either form a client may send:

    TABLE = FileField("table", media_types=("text/csv", "text/plain"))

    class CsvScorer(Task[...]):
        content_types = ("multipart/form-data", "text/csv")    # the server answers 415 for others

        def read(self, request):
            upload = read_uploads(request, TABLE).one(TABLE)   # curl -F table=@rows.csv
            ...                                                # or --data-binary @rows.csv -H 'Content-Type: text/csv'

- multipart/form-data: every part of a named field is a file of it, in the order sent, with or
  without a filename (`-F table=@rows.csv` and `-F table=<rows.csv` both work); a part whose own
  Content-Type is not one of the field's is a 415 naming the field (a part without one, or with
  application/octet-stream, what clients send when they do not know, is taken); more files than
  the field's `max_files` is a 413; a required field without a file is a 400 naming the fields
  sent. Other parts without a filename are small text fields (`Uploads.fields`, at most
  MAX_FIELD_BYTES each); files in other fields are skipped (their names still show in errors).
- A raw body whose Content-Type is one of a field's media types is that field's one file.
- Anything else is a 415 naming what is accepted.

The body is already in memory and size-checked (`[server] max_body_bytes`, a 413 naming the
setting), so it is handed to `multipart.PushMultipartParser` in one piece: ~0.03 ms for a 35 KB
photo, against ~0.28 ms for werkzeug's form parser (measured in a tight loop on the 2-core box).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from multipart import MultipartError, ParserLimitReached, PushMultipartParser, parse_options_header

from onnxpool.tasks.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from onnxpool.tasks.media_types import media_type_matches

if TYPE_CHECKING:  # an annotation only: tasks.api's default OpenAPI description imports this module's kin
    from onnxpool.tasks.api import RequestParts

MAX_FIELD_BYTES = 4096
"""Text fields are parameters, not data: anything longer is a client error."""
MAX_OTHER_PARTS = 32
"""Parts that are not files of a named field, beyond the files allowed."""
UNKNOWN_TYPES = ("", "application/octet-stream")
"""A part's Content-Type that says nothing of what it is: taken by any field."""


@dataclass(frozen=True)
class FileField:
    """A form field that carries files, and what it takes."""

    name: str
    media_types: tuple[str, ...] = ()
    """The media types its files may have (`image/*` a wildcard); () = any."""
    max_files: int = 1
    required: bool = True
    noun: str = "files"
    """What its files are, for messages: "more than 4 images sent"."""


@dataclass(slots=True)
class Upload:
    """One file: its field, filename (None when the client sent none), media type and bytes."""

    field: str
    filename: str | None
    media_type: str
    data: bytes
    index: int = 0
    raw: bool = False
    """The request's whole body (no multipart)."""

    @property
    def name(self) -> str:
        """How error messages name it: `table[0] "rows.csv"`, or `request body (text/csv)`."""
        if self.raw:
            return f"request body ({self.media_type})"
        return f'{self.field}[{self.index}] "{self.filename or "unnamed"}"'


@dataclass(slots=True)
class Uploads:
    """The files of one request by field, its text fields, and every part name seen (for messages)."""

    files: dict[str, list[Upload]] = field(default_factory=dict)
    fields: dict[str, str] = field(default_factory=dict)
    """Parts without a filename outside the file fields, as text (the first of a repeated name wins)."""
    names: list[str] = field(default_factory=list)

    def of(self, file_field: FileField | str) -> list[Upload]:
        """The files of `file_field`, in the order sent ([] when none)."""
        return self.files.get(file_field.name if isinstance(file_field, FileField) else file_field, [])

    def one(self, file_field: FileField | str) -> Upload:
        """The first file of `file_field` (a required field always has one)."""
        found = self.of(file_field)
        if not found:
            name = file_field if isinstance(file_field, str) else file_field.name
            raise BadRequest(f"no file in field '{name}' (fields sent: {self.sent()})")
        return found[0]

    def sent(self) -> str:
        """The part names sent, bounded (they come from the client: any text, or none)."""
        shown = sorted({repr(name)[:40] for name in self.names})
        return ", ".join(shown[:10]) + (", ..." if len(shown) > 10 else "") or "none"


def read_uploads(request: RequestParts, *file_fields: FileField) -> Uploads:
    """The files of `file_fields` in `request`: a multipart/form-data body, or a raw body of one of
    their media types (4xx naming what is wrong, as the module doc says)."""
    mimetype = request.mimetype
    if mimetype == "multipart/form-data":
        uploads = parse_form(request.body(), request.content_type, file_fields)
        for wanted in file_fields:
            if wanted.required and not uploads.files[wanted.name]:
                raise BadRequest(f"multipart body has no file in field '{wanted.name}' (fields sent: {uploads.sent()})")
        return uploads
    for wanted in file_fields:
        if mimetype and mimetype not in UNKNOWN_TYPES and media_type_matches(mimetype, wanted.media_types):
            return Uploads({wanted.name: [Upload(wanted.name, None, mimetype, request.body(), raw=True)]})
    raise UnsupportedMediaType(not_accepted(mimetype, file_fields))


def not_accepted(mimetype: str, file_fields: Sequence[FileField]) -> str:
    """A 415's message: what was sent, and what a client should send instead."""
    names = " and ".join(f"'{wanted.name}'" for wanted in file_fields)
    advice = f"send multipart/form-data with the file(s) in field {names}"
    raw = sorted({media for wanted in file_fields for media in wanted.media_types if media != "*/*"})
    if raw:
        one = file_fields[0].noun.removesuffix("s") if len(file_fields) == 1 else "file"
        article = "an" if raw[0][:1] in "aeiou" else "a"
        advice += f", or the raw {one} with {article} {' or '.join(raw)} Content-Type"
    return f"Content-Type {mimetype or 'missing'} is not accepted: {advice}"


def boundary_of(content_type: str) -> str:
    """The boundary parameter of a multipart/form-data Content-Type header."""
    _, options = parse_options_header(content_type)
    boundary = str(options.get("boundary", ""))
    if not boundary:
        raise BadRequest("multipart/form-data needs a boundary parameter in its Content-Type header")
    return boundary


def parse_form(body: bytes, content_type: str, file_fields: Sequence[FileField]) -> Uploads:
    """Split a whole multipart/form-data body into the fields' files and the text fields.

    More files in a field than its `max_files` is a 413 (stopped as soon as one too many
    starts); a file of a type its field does not take is a 415; a malformed body is a 400."""
    wanted, max_segments = _plan(tuple(file_fields))
    files: dict[str, list[Upload]] = {name: [] for name in wanted}
    uploads = Uploads(files, {}, [])
    parser = PushMultipartParser(boundary_of(content_type), content_length=len(body), max_segment_count=max_segments)
    try:
        with parser:  # leaving it checks that the body was complete
            part: FileField | None = None
            name: str | None = None
            filename: str | None = None
            media = ""
            chunks: list[bytes] = []
            for event in parser.parse(body):
                if event is None:  # end of a part
                    if part is not None:
                        kept = files[part.name]
                        kept.append(Upload(part.name, filename, media, b"".join(chunks), len(kept)))
                    elif name and filename is None and name not in uploads.fields:
                        uploads.fields[name] = b"".join(chunks).decode("utf-8", errors="replace")
                elif isinstance(event, bytes):
                    if part is not None:
                        chunks.append(event)
                    elif filename is None:  # a text field: kept, within bounds
                        chunks.append(event)
                        if sum(map(len, chunks)) > MAX_FIELD_BYTES:
                            raise PayloadTooLarge(f"form field {repr(name or '')[:40]} is over {MAX_FIELD_BYTES} bytes")
                    # a file in another field is not ours: skipped, only its name is reported
                else:  # a new part's headers
                    name, filename, chunks = event.name, event.filename, []
                    media = event.content_type or ""
                    uploads.names.append(name or "")
                    part = wanted.get(name or "")
                    if part is not None:
                        _check_part(files[part.name], part, filename, media)
    except ParserLimitReached as exc:
        raise PayloadTooLarge(f"multipart body exceeds a limit: {exc}") from None
    except MultipartError as exc:
        raise BadRequest(f"malformed multipart/form-data body: {exc}") from None
    return uploads


@functools.lru_cache(maxsize=64)
def _plan(file_fields: tuple[FileField, ...]) -> tuple[dict[str, FileField], int]:
    """The fields by name and the parts a body may have: worked out once per set of fields (a task's
    fields are constants; this is on every request's path, a cache hit's too)."""
    return {item.name: item for item in file_fields}, sum(item.max_files for item in file_fields) + MAX_OTHER_PARTS + 1


def _check_part(kept: list[Upload], part: FileField, filename: str | None, media: str) -> None:
    if len(kept) == part.max_files:
        raise PayloadTooLarge(f"more than {part.max_files} {part.noun} sent; the limit is {part.max_files} per request")
    if media not in UNKNOWN_TYPES and not media_type_matches(media, part.media_types):
        shown = f'{part.name}[{len(kept)}] "{filename or "unnamed"}"'
        raise UnsupportedMediaType(f"{shown} is {media}: field '{part.name}' takes {' or '.join(part.media_types)}")
