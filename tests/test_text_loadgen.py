"""benchmarks/text.py's closed-loop load generator and response decoding, against a local stub server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from benchmarks.text import closed_loop, decode_vectors, request_body
from onnxpool.tasks.text.openai_schema import EncodingFormat, parse_request, render_response

DELAY = 0.02


class Handler(BaseHTTPRequestHandler):
    """Answers like an embeddings server, after DELAY; every 5th request gets a 500."""

    seen = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with Handler.lock:
            Handler.seen += 1
            fail = Handler.seen % 5 == 0
        time.sleep(DELAY)
        request = parse_request(body)
        vectors = np.full((len(request), 3), 0.5, dtype=np.float32)
        reply = render_response(vectors, model="m", prompt_tokens=1, encoding_format=request.encoding_format)
        self.send_response(500 if fail else 200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/embeddings"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_closed_loop_counts_answers_errors_and_latency(url: str) -> None:
    Handler.seen = 0
    body = request_body(["a", "b"], "m")
    result = closed_loop(url, body, concurrency=2, duration=0.6, warmup=0.1, inputs_per_request=2)
    answered = len(result.latencies) + result.errors
    # two clients, >= DELAY per request: at most 2 * 0.6 / 0.02 = 60 in the window
    assert 5 <= answered <= 60
    assert result.errors >= 1 and len(result.latencies) >= 4  # every 5th is a 500, counted apart
    assert min(result.latencies) >= DELAY
    assert result.inputs_per_second == pytest.approx(2 * len(result.latencies) / 0.6)
    assert result.percentile(50) <= result.percentile(99)


def test_decode_vectors_reads_both_formats() -> None:
    vectors = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    for fmt in EncodingFormat:
        raw = render_response(vectors, model="m", prompt_tokens=1, encoding_format=fmt)
        assert np.array_equal(decode_vectors(raw), vectors)
