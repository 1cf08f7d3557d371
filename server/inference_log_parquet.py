"""The inference log's Parquet files (`[inference_log] format = "parquet"`): a row per request, via pyarrow.

Imported only by the shipper's thread, in a worker after fork, when the first batch is written (pyarrow
keeps thread pools of its own, which must not start in the master; here they are held to one thread:
the worker's cores are its session's). The columns are the JSON record's (`server.inference_log_events`),
flat: scalars as typed columns, the nested parts (metadata, the request's inputs and body, the reply's
body) as JSON text, which a columnar reader (DuckDB, pandas, Spark) parses where it needs them.
Each rotated file is closed with its footer; a worker killed mid-file leaves one no reader opens
(JSON lines lose only a line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from onnxpool.tasks import jsonfast

pa.set_cpu_count(1)
pa.set_io_thread_count(1)

SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("model", pa.string()),
        ("endpoint", pa.string()),
        ("status", pa.int32()),
        ("namespace", pa.string()),
        ("source", pa.string()),
        ("request_time", pa.string()),
        ("request_content_type", pa.string()),
        ("request_bytes", pa.int64()),
        ("metadata", pa.string()),
        ("inputs", pa.string()),
        ("request_body", pa.string()),
        ("response_time", pa.string()),
        ("response_content_type", pa.string()),
        ("response_body", pa.string()),
    ]
)


def _text(value: Any) -> str | None:
    return None if value is None else jsonfast.dumps(value).decode()


def row(record: dict[str, Any]) -> dict[str, Any]:
    """A JSON record (one request, both sides) as a Parquet row."""
    request = record.get("request") or {}
    response = record.get("response") or {}
    return {
        "id": record.get("id"),
        "model": record.get("model"),
        "endpoint": record.get("endpoint"),
        "status": record.get("status"),
        "namespace": record.get("namespace"),
        "source": record.get("source"),
        "request_time": request.get("time"),
        "request_content_type": request.get("content_type"),
        "request_bytes": request.get("bytes"),
        "metadata": _text(request.get("metadata")),
        "inputs": _text(request.get("inputs")),
        "request_body": _text(request.get("body")),
        "response_time": response.get("time"),
        "response_content_type": response.get("content_type"),
        "response_body": _text(response.get("body")),
    }


class ParquetFile:
    """One open Parquet file: a row group per write."""

    def __init__(self, path: Path) -> None:
        self.writer = pq.ParquetWriter(str(path), SCHEMA, compression="zstd")

    def write(self, records: list[dict[str, Any]]) -> None:
        self.writer.write_table(pa.Table.from_pylist([row(r) for r in records], schema=SCHEMA))

    def close(self) -> None:
        self.writer.close()
