"""Draw one request's trace as docs/DEPLOYING.md shows it (docs/tracing-timeline.png).

Runs what tests/test_tracing.py runs: the test's OTLP receiver (the official opentelemetry-proto
classes), a real onnxpool (one worker, the demo image model) tracing to it and, when nginx is
installed, nginx in front; sends one traced request with a photo (a cache miss), and draws the
spans that arrived as a timeline, one bar per span, each under its parent, with the reply's
Server-Timing beside it. From a checkout, with the dev extra installed:

    .venv/bin/python tools/trace_picture.py --out docs/tracing-timeline.png
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.deploy_harness import nginx_binary, start_nginx  # noqa: E402
from tests.harness import DATA, start_server  # noqa: E402
from tests.otlp_receiver import ReceivedSpan, otlp_receiver  # noqa: E402


def one_trace(folder: Path) -> tuple[list[ReceivedSpan], str, str]:
    """The spans of one traced /predict (through nginx when it is installed), its Server-Timing, the path."""
    with otlp_receiver() as receiver:
        settings = {"ONNXPOOL_SERVER__WORKERS": "1", "ONNXPOOL_TRACING__ENDPOINT": receiver.endpoint}
        server = start_server(folder, {**settings, "OTEL_BSP_SCHEDULE_DELAY": "50"}, workers=1)
        nginx = start_nginx(folder, [f"127.0.0.1:{server.port}"]) if nginx_binary() else None
        try:
            url = (nginx or server).url
            requests.post(url + "/predict", files={"image": (DATA / "chelsea-cat.jpg").read_bytes()})  # warm
            trace_id = secrets.token_hex(16)
            headers = {"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}
            photo = {"image": (DATA / "coffee.jpg").read_bytes()}  # not the warm-up's: a cache miss
            reply = requests.post(url + "/predict", files=photo, headers=headers)
            receiver.wait_for(lambda spans: any(s.trace_id == trace_id and s.is_server for s in spans))
            time.sleep(0.2)
        finally:
            if nginx is not None:
                nginx.stop()
            server.stop()
        path = "client -> nginx -> gunicorn worker" if nginx is not None else "client -> gunicorn worker"
        return receiver.trace(trace_id), reply.headers.get("Server-Timing", ""), path


def depth_order(spans: list[ReceivedSpan]) -> list[tuple[int, ReceivedSpan]]:
    """Spans parent first, children by start time, each with its depth under the trace's first span here."""
    by_parent: dict[str, list[ReceivedSpan]] = {}
    ids = {s.span_id for s in spans}
    for span in spans:
        by_parent.setdefault(span.parent_id if span.parent_id in ids else "", []).append(span)
    ordered: list[tuple[int, ReceivedSpan]] = []

    def walk(parent: str, depth: int) -> None:
        for span in sorted(by_parent.get(parent, []), key=lambda s: s.start_ns):
            ordered.append((depth, span))
            walk(span.span_id, depth + 1)

    walk("", 0)
    return ordered


def draw(spans: list[ReceivedSpan], timing: str, path: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = depth_order(spans)
    origin = min(s.start_ns for s in spans)
    colours = {"queue": "#9e9e9e", "decode": "#4c78a8", "cache": "#f58518", "infer": "#e45756", "encode": "#54a24b"}
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) + 1.6))
    for row, (depth, span) in enumerate(rows):
        start, width = (span.start_ns - origin) / 1e6, span.ms
        colour = "#2f4b7c" if span.is_server else colours.get(span.name, "#b279a2")
        ax.barh(row, max(width, 0.02), left=start, color=colour, height=0.6)
        extra = ""
        if span.name == "infer":
            extra = f"  batch {span.attributes['onnxpool.batch_size']}, {span.attributes['onnxpool.threads']} threads"
        if span.name == "cache":
            extra = f"  {span.attributes['onnxpool.cache']}"
        ax.text(start + width + 0.1, row, f"{'  ' * depth}{span.name}  {width:.2f} ms{extra}", va="center", fontsize=9)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([("  " * depth) + span.name for depth, span in rows], fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("ms since nginx received the request (X-Request-Start)")
    server = next(s for _, s in rows if s.is_server)
    ax.set_xlim(0, server.ms * 1.45)
    ax.set_title(
        f"One /predict (a cache miss) in the caller's trace {server.trace_id[:16]}…, {path}\nServer-Timing: {timing}",
        fontsize=9,
        loc="left",
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "tracing-timeline.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        spans, timing, path = one_trace(Path(folder))
    draw(spans, timing, path, args.out)
    print(f"{args.out}: {len(spans)} spans; Server-Timing: {timing}")


if __name__ == "__main__":
    main()
