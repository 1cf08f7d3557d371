"""Describing a task's route in OpenAPI (`Task.openapi`) in a couple of lines: the common request shapes.

    def openapi(self, route):
        return describe(
            "Score the rows of a CSV file",
            files=[TABLE],                          # multipart/form-data, its file fields (tasks.uploads)
            fields={"threshold": {"type": "number"}},   # and its text fields
            raw=TABLE.media_types,                  # or the raw file
            reply={"type": "object", "properties": {"scores": {"type": "array"}}},
        )

    describe("Classify a text", json={"type": "object", "required": ["inputs"]}, example={"inputs": "hi"})

The server wraps what this returns: the operation id, the `<model>` parameter, the deadline and
cache headers, every error reply (docs/TASKS.md, "The API page").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from onnxpool.tasks.media_types import JSON
from onnxpool.tasks.uploads import FileField

Schema = dict[str, Any]
BINARY: Schema = {"type": "string", "format": "binary"}
MULTIPART = "multipart/form-data"


def describe(
    summary: str,
    *,
    json: Schema | None = None,
    example: Any = None,
    files: Sequence[FileField] = (),
    fields: Mapping[str, Schema] | None = None,
    raw: Sequence[str] = (),
    reply: Schema | None = None,
    reply_description: str = "the task's reply",
) -> Schema:
    """An OpenAPI operation fragment: a JSON body (`json`, its schema, and a working `example` for /docs'
    try-it-out), a multipart body (`files` and text `fields`), a raw body of `raw` media types, or
    several of them; the 200 reply's JSON `reply` schema."""
    content: dict[str, Schema] = {}
    if json is not None:
        content[JSON] = {"schema": json} | ({} if example is None else {"example": example})
    if files or fields:
        content[MULTIPART] = {"schema": multipart_schema(files, fields or {})}
    for media in raw:
        content[media] = {"schema": BINARY}
    return {
        "summary": summary,
        "requestBody": {"required": True, "content": content},
        "responses": {"200": {"description": reply_description, "content": {JSON: {"schema": reply or {}}}}},
    }


def multipart_schema(files: Sequence[FileField], fields: Mapping[str, Schema]) -> Schema:
    """A multipart/form-data body's schema: each file field (an array when it takes several), each text field."""
    properties: dict[str, Schema] = {}
    for file_field in files:
        taken = f" ({', '.join(file_field.media_types)})" if file_field.media_types else ""
        if file_field.max_files > 1:
            properties[file_field.name] = {
                "type": "array",
                "items": BINARY,
                "description": f"Up to {file_field.max_files} {file_field.noun}{taken}.",
            }
        else:
            properties[file_field.name] = {**BINARY, "description": f"One {file_field.noun.removesuffix('s')}{taken}."}
    properties.update(fields)
    return {
        "type": "object",
        "required": [file_field.name for file_field in files if file_field.required],
        "properties": properties,
    }


def default_operation(name: str, content_types: Sequence[str]) -> Schema:
    """What a task that does not describe its route gets: a body of each declared content type (a JSON
    document, a form of any fields, the raw bytes of any other type)."""
    raw = [media for media in content_types if media not in (JSON, MULTIPART)]
    operation = describe(f"Run the {name} task", json={} if JSON in content_types else None, raw=raw)
    if MULTIPART in content_types:
        operation["requestBody"]["content"][MULTIPART] = {"schema": {"type": "object"}}
    return operation
