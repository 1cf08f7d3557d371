"""`onnxpool replay LOG --to URL`: the requests of an inference log sent again, and the replies compared.

LOG is a folder (or one file) of `[inference_log] path` JSON lines, one record per request holding
both sides. Each replayable request (a JSON body: tabular, text, JSON tensors; or a v2 binary-tensor
request, re-sent as JSON tensors from its logged data) is POSTed to the same path on URL, and its
reply compared with the logged one: the status, then the JSON documents, numbers within a
tolerance (`--rtol`, `--atol`: a new onnxruntime or an INT8 build moves the last digits) and the
echoed `id` ignored. An image request is logged as its digest, not its bytes, so it is counted
as not replayable. The agreement is printed; `--min-agreement` makes it the exit status, so a
second version of a model can be judged in CI on a logged hour of real traffic.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from onnxpool.server.inference_log_events import v2_view
from onnxpool.server.v2codec import BINARY_HEADER

API_KEY_ENV = "ONNXPOOL_API_KEY"
IGNORED_KEYS = frozenset({"id", "parameters"})
"""Keys of a reply that are the request's own (v2's echoed id, a tensor's binary framing), not the answer."""


@dataclass
class Tally:
    replayed: int = 0
    agree: int = 0
    differ: list[str] = field(default_factory=list)
    not_replayable: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def agreement(self) -> float:
        return self.agree / self.replayed if self.replayed else 0.0


def records(log: Path) -> Iterator[dict[str, Any]]:
    """The log's records, file by file in name order (each file in its own order), skipping torn lines."""
    files = sorted(log.glob("*.jsonl")) if log.is_dir() else [log]
    for path in files:
        with path.open("rb") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line a worker killed mid-write left half
                if isinstance(record, dict):
                    yield record


def request_of(record: dict[str, Any]) -> tuple[str, bytes, dict[str, str]] | None:
    """(path, body, headers) to send again, or None: the log does not hold the request's bytes."""
    request = record.get("request")
    if not isinstance(request, dict) or not isinstance(record.get("endpoint"), str):
        return None
    headers = {"Content-Type": "application/json"}
    if "body" in request:
        return record["endpoint"], json.dumps(request["body"]).encode(), headers
    inputs = request.get("inputs")
    if record["endpoint"].endswith("/infer") and isinstance(inputs, dict) and "inputs" in inputs:
        document = dict(inputs)
        parameters = dict(document.get("parameters") or {})
        parameters.pop("binary_data_output", None)  # asked as JSON: compared with the logged tensors' data
        document["parameters"] = parameters
        for output in document.get("outputs") or ():
            if isinstance(output, dict) and isinstance(output.get("parameters"), dict):
                output["parameters"].pop("binary_data", None)
        return record["endpoint"], json.dumps(document).encode(), headers
    return None


def reply_document(response: requests.Response) -> Any:
    length = response.headers.get(BINARY_HEADER)
    if length is not None:
        return v2_view(response.content, int(length))
    try:
        return response.json()
    except ValueError:
        return response.text


def difference(old: Any, new: Any, rtol: float, atol: float, where: str = "") -> str | None:
    """Where two reply documents differ (None: they agree)."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            if key in IGNORED_KEYS:
                continue
            if key not in old or key not in new:
                return f"{where}/{key}: only in the {'new' if key in new else 'logged'} reply"
            found = difference(old[key], new[key], rtol, atol, f"{where}/{key}")
            if found:
                return found
        return None
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return f"{where}: {len(old)} items logged, {len(new)} now"
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            found = difference(a, b, rtol, atol, f"{where}/{i}")
            if found:
                return found
        return None
    numbers = (int, float)
    if isinstance(old, numbers) and isinstance(new, numbers) and not isinstance(old, bool):
        return None if abs(old - new) <= atol + rtol * abs(old) else f"{where}: {old} logged, {new} now"
    return None if old == new else f"{where}: {old!r} logged, {new!r} now"


def replay(log: Path, to: str, *, concurrency: int, limit: int | None, api_key: str, rtol: float, atol: float) -> Tally:
    tally = Tally()
    session = requests.Session()
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    jobs: list[tuple[dict[str, Any], str, bytes, dict[str, str]]] = []
    for record in records(log):
        if limit is not None and len(jobs) >= limit:
            break
        found = request_of(record)
        if found is None or not isinstance(record.get("response"), dict):
            tally.not_replayable += 1
            continue
        path, body, headers = found
        jobs.append((record, path, body, {**headers, **auth}))

    def send(job: tuple[dict[str, Any], str, bytes, dict[str, str]]) -> tuple[dict[str, Any], Any]:
        record, path, body, headers = job
        try:
            return record, session.post(to.rstrip("/") + path, data=body, headers=headers, timeout=60)
        except requests.RequestException as exc:
            return record, exc

    with ThreadPoolExecutor(max(1, concurrency)) as pool:
        for record, outcome in pool.map(send, jobs):
            tally.replayed += 1
            rid = record.get("id", "?")
            if isinstance(outcome, Exception):
                tally.errors.append(f"{rid}: {type(outcome).__name__}: {outcome}")
                continue
            logged = record["response"]
            if outcome.status_code != logged.get("status"):
                tally.differ.append(f"{rid}: status {logged.get('status')} logged, {outcome.status_code} now")
                continue
            differs = difference(logged.get("body"), reply_document(outcome), rtol, atol)
            if differs is None:
                tally.agree += 1
            else:
                tally.differ.append(f"{rid}: {differs}")
    return tally


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", type=Path, help="an [inference_log] path folder, or one of its .jsonl files")
    parser.add_argument("--to", required=True, help="the server to send them to, e.g. http://127.0.0.1:8000")
    parser.add_argument("-c", "--concurrency", type=int, default=1, help="requests in flight (default 1)")
    parser.add_argument("--limit", type=int, help="replay at most this many requests")
    parser.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance of numbers (default 1e-4)")
    parser.add_argument("--atol", type=float, default=1e-5, help="absolute tolerance of numbers (default 1e-5)")
    parser.add_argument(
        "--min-agreement", type=float, default=None, help="exit 1 when fewer replies than this share agree (0..1)"
    )
    parser.add_argument("--show", type=int, default=5, help="differences to print (default 5)")


def replay_command(args: argparse.Namespace) -> int:
    log: Path = args.log
    if not log.exists():
        print(f"onnxpool replay: error: {log}: no such file or folder", file=sys.stderr)
        return 2
    tally = replay(
        log,
        args.to,
        concurrency=args.concurrency,
        limit=args.limit,
        api_key=os.environ.get(API_KEY_ENV, ""),  # never logged, so the caller gives one
        rtol=args.rtol,
        atol=args.atol,
    )
    print(
        f"replayed {tally.replayed} requests to {args.to}: {tally.agree} agree ({tally.agreement:.1%}), "
        f"{len(tally.differ)} differ, {len(tally.errors)} failed to send; {tally.not_replayable} not replayable "
        f"(no request bytes in the log: images are logged as digests)"
    )
    for line in (tally.differ + tally.errors)[: max(0, args.show)]:
        print(f"  {line}")
    if args.min_agreement is not None and tally.agreement < args.min_agreement:
        return 1
    return 0
