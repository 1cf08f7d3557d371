"""benchmarks/text.py's pieces against a local stub server: the request cycle, the vector check, the summary.

No timing assertions: the stub's delay only bounds latencies from below.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import numpy as np
import orjson
import pytest

from benchmarks.text import Reference, check_target, decode_vectors, request_body, vector_agreement, workload
from benchmarks.text_report import FASTAPI, INFINITY, ONNXPOOL, Measurement, summarise, table
from benchmarks.text_targets import process_tree, tree_memory
from onnxpool.measure.loadgen import LoadGenerator, StepPlan
from onnxpool.tasks.text.openai_schema import EncodingFormat, parse_request, render_response

DELAY = 0.02
DIM = 8


def token_embeddings(text: str) -> np.ndarray:
    """A fake model: a few pseudo-random token vectors per text (seeded by the text)."""
    rng = np.random.default_rng(list(text.encode()) or [0])
    return rng.normal(size=(3 + len(text) % 4, DIM)).astype(np.float32)


def mean_pooled(text: str) -> np.ndarray:
    vector = token_embeddings(text).mean(axis=0)
    return np.asarray(vector / np.linalg.norm(vector))


def cls_pooled(text: str) -> np.ndarray:
    vector = token_embeddings(text)[0]
    return np.asarray(vector / np.linalg.norm(vector))


class Handler(BaseHTTPRequestHandler):
    """Answers like an embeddings server after DELAY, pooling as `pooling` says; every 5th request a 500."""

    seen: ClassVar[Counter[bytes]] = Counter()
    count = 0
    fail_every = 0
    pooling = staticmethod(mean_pooled)
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with Handler.lock:
            Handler.count += 1
            Handler.seen[body] += 1
            fail = Handler.fail_every and Handler.count % Handler.fail_every == 0
        time.sleep(DELAY)
        request = parse_request(body)
        texts = orjson.loads(body)["input"]
        vectors = np.stack([Handler.pooling(text) for text in texts])
        reply = render_response(vectors, model="m", prompt_tokens=1, encoding_format=request.encoding_format)
        self.send_response(500 if fail else 200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def url() -> Iterator[str]:
    Handler.seen, Handler.count, Handler.fail_every, Handler.pooling = Counter(), 0, 0, staticmethod(mean_pooled)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/embeddings"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


TEXTS = ["alpha", "beta gamma", "", "delta epsilon zeta", "eta"]


def reference() -> Reference:
    return Reference(TEXTS, np.stack([mean_pooled(t) for t in TEXTS]))


def test_check_target_passes_the_same_pooling_and_fails_another(url: str) -> None:
    assert "min cosine" in check_target(url, reference(), 0.999, chunk=2)
    Handler.pooling = staticmethod(cls_pooled)
    with pytest.raises(SystemExit, match="vectors differ"):
        check_target(url, reference(), 0.999, chunk=2)


def test_vector_agreement_sees_cosine_and_norm() -> None:
    vectors = np.stack([mean_pooled(t) for t in TEXTS])
    assert vector_agreement(vectors, vectors) == pytest.approx((1.0, 0.0), abs=1e-6)
    cosine, norm_error = vector_agreement(vectors * 2, vectors)  # not normalised
    assert cosine == pytest.approx(1.0, abs=1e-6) and norm_error == pytest.approx(1.0)
    with pytest.raises(ValueError, match="shape"):
        vector_agreement(vectors[:2], vectors)


def test_workload_splits_the_same_sentences_by_size() -> None:
    texts = ["a", "b", "c", "d"]
    ones, pairs = workload(texts, 1), workload(texts, 2)
    assert ones.items == 1 and len(ones.requests) == 4
    assert pairs.items == 2 and [orjson.loads(r.body)["input"] for r in pairs.requests] == [["a", "b"], ["c", "d"]]
    # connections start at different requests, then cycle through all of them
    first = [next(ones.wires("h", 1, connection)) for connection in range(4)]
    assert len(set(first)) == 4
    wires = ones.wires("h", 1, 1)
    assert [next(wires) for _ in range(5)] == [*first[1:], first[0], first[1]]


def test_load_generator_cycles_and_counts_errors(url: str) -> None:
    Handler.fail_every = 5
    with LoadGenerator(url, workload(TEXTS[:4], 1), 2, conns_per_process=2) as generator:
        # a number of requests, not a window: the count must not depend on how fast this machine is now
        step = generator.run_step(StepPlan(2, warmup=0.0, requests=12))
    assert step.requests == 12 and step.error_count >= 1  # every 5th is a 500, counted apart
    assert float(step.latencies.min()) >= DELAY
    assert step.items_per_request == 1
    assert len(Handler.seen) == 4  # all four one-sentence requests were sent


def test_decode_vectors_reads_both_formats() -> None:
    vectors = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    for fmt in EncodingFormat:
        raw = render_response(vectors, model="m", prompt_tokens=1, encoding_format=fmt)
        assert np.array_equal(decode_vectors(raw), vectors)
    assert orjson.loads(request_body(["x"]))["encoding_format"] == "base64"


def test_tree_memory_sums_the_children() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert child.pid in process_tree(os.getpid())
        rss, pss = tree_memory(os.getpid())
        own_rss, _ = tree_memory(child.pid)
        assert rss > own_rss > 0 and pss > 0
    finally:
        child.kill()
        child.wait()


def measurement(target: str, rate: float, p99: float, rss_mib: int, round_: int = 0, pss_mib: int = 0) -> Measurement:
    return Measurement(target, 32, 4, round_, rate, p99 / 2, p99, 100, 0, rss_mib << 20, (pss_mib or rss_mib) << 20)


def test_summary_takes_medians_and_judges_the_goals() -> None:
    rows = []
    for round_, (ours, theirs) in enumerate([(100.0, 40.0), (300.0, 45.0), (110.0, 50.0)]):
        rows.append(measurement(ONNXPOOL, ours, 10.0, 450, round_=round_, pss_mib=300))  # a pre-fork tree
        rows.append(measurement(FASTAPI, theirs, 30.0, 900, round_=round_))
        rows.append(measurement(INFINITY, 100.0, 20.0, 1200, round_=round_))
    [cell] = summarise(rows)["cells"]
    assert cell["targets"][ONNXPOOL]["sentences_per_s"] == 110.0  # the median, not the 300 outlier
    assert cell["ratios"]["throughput_vs_fastapi-st"] == pytest.approx(110 / 45)
    assert cell["ratios"]["rss_vs_infinity"] == pytest.approx(0.375)
    assert cell["ratios"]["pss_vs_infinity"] == pytest.approx(0.25)
    assert cell["goals"] == {
        "throughput_vs_fastapi-st": True,
        "p99_vs_fastapi-st": True,
        "throughput_vs_infinity": False,  # 1.1x, not 1.25x
        "p99_vs_infinity": True,
        "rss_vs_infinity": False,  # over a third by RSS ...
        "pss_vs_infinity": True,  # ... under it by PSS
    }
    text = table(summarise(rows), [ONNXPOOL, FASTAPI, INFINITY])
    assert "2.44" in text and "1.10" in text
