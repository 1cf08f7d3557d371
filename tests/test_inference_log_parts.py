"""The inference log's parts in process: what each built-in task logs of its inputs (`Task.logged`), v2 bodies
as named tensors, KServe's event attributes, and the byte-bounded buffer with a dead sink."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path

import numpy as np

from onnxpool.config.settings import Settings
from onnxpool.local import LocalRequest, load_task
from onnxpool.server.inference_log_events import REQUEST_TYPE, RESPONSE_TYPE, Exchange, cloudevents, record, v2_view
from onnxpool.server.inference_log_plan import InferenceLogPlan, plan_inference_log
from onnxpool.server.inference_log_ship import Buffer, Item, Shipper
from onnxpool.server.v2codec import encode_infer_request
from onnxpool.tasks import jsonfast
from tests.harness import DEMO_MODEL, REPO, free_port
from tests.text_models import build_text_model_folder, text_settings_file

CAT = (REPO / "models" / "samples" / "chelsea-cat.jpg").read_bytes()


def plan(**keys: object) -> InferenceLogPlan:
    settings = Settings.model_validate({"model": {"name": "m", "path": str(DEMO_MODEL)}, "inference_log": keys})
    found = plan_inference_log(settings, {"POD_NAMESPACE": "ns", "HOSTNAME": "pod-1"})
    assert found is not None
    return found


def test_tabular_logs_its_rows_as_named_features() -> None:
    local = load_task(REPO / "config" / "iris.toml")
    rows = {"instances": [[5.1, 3.5, 1.4, 0.2], {"sepal_length": 6.7, "sepal_width": 3.0, "petal_length": 5.2,
                                                 "petal_width": 2.3}]}  # fmt: skip
    inputs = local.task.read(LocalRequest.json(rows, route="/v1/models/iris:predict"))
    logged = json.loads(jsonfast.dumps(local.task.logged(inputs)))  # as the log writes it
    assert logged["instances"][1] == rows["instances"][1]
    assert list(logged["instances"][0]) == ["sepal_length", "sepal_width", "petal_length", "petal_width"]


def test_an_image_is_logged_as_its_digest_and_size_never_its_bytes() -> None:
    local = load_task(REPO / "config" / "onnxpool.toml")
    inputs = local.task.read(LocalRequest.files([CAT, CAT[:]]))
    logged = local.task.logged(inputs)
    assert logged is not None
    assert [i["sha256"] for i in logged["images"]] == [hashlib.sha256(CAT).hexdigest()] * 2
    assert [i["bytes"] for i in logged["images"]] == [len(CAT)] * 2 and "top_k" in logged


def test_text_is_logged_as_its_strings(tmp_path: Path) -> None:
    build_text_model_folder(tmp_path)
    local = load_task(text_settings_file(tmp_path, "text-embedding", "k" * 24))
    request = LocalRequest.json({"input": ["héllo", "wörld"], "model": "tiny-text"}, route="/v1/embeddings")
    assert local.task.logged(local.task.read(request)) == {"texts": ["héllo", "wörld"]}


def test_v2_binary_bodies_become_named_tensors_with_their_data() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 10
    words = np.array([b"ab", "ç".encode()], dtype=object)
    encoded = encode_infer_request({"x": x, "w": words}, {"x", "w"}, binary_output=False, outputs=None)
    length = int(next(v for k, v in encoded.headers.items() if k.lower() == "inference-header-content-length"))
    view = json.loads(jsonfast.dumps(v2_view(encoded.body, length)))
    tensors = {t["name"]: t for t in view["inputs"]}
    assert tensors["x"]["shape"] == [2, 3] and tensors["x"]["datatype"] == "FP32"
    assert np.allclose(tensors["x"]["data"], x.reshape(-1))
    assert tensors["w"]["data"] == ["ab", "ç"]


def test_kserve_attributes_and_one_id_for_both_sides() -> None:
    exchange = Exchange("id-1", "/v2/models/m/infer", 1.5e9, "application/json", b"{}", None, {"X-T": ["a"]},
                        200, 1.5e9 + 0.01, "application/json", b'{"outputs":[]}')  # fmt: skip
    request, response = cloudevents(plan(url="http://sink/"), exchange, 1.5e9 + 0.02)
    assert request.headers["ce-type"] == REQUEST_TYPE and response.headers["ce-type"] == RESPONSE_TYPE
    for event in (request, response):
        assert event.headers["ce-id"] == "id-1" and event.headers["ce-specversion"] == "1.0"
        assert (event.headers["ce-namespace"], event.headers["ce-source"]) == ("ns", "pod-1")
        assert event.headers["ce-inferenceservicename"] == "m" and event.headers["ce-endpoint"] == "default"
    assert request.headers["ce-time"] == "2017-07-14T02:40:00.000000Z"
    # The binding's percent-encoding: `"`, `%`, space and non-ASCII (a header's value may be any of them).
    assert request.headers["ce-metadata"] == "{%22X-T%22:[%22a%22]}"
    exchange.metadata = {"X-T": ["é 5%"]}
    assert cloudevents(plan(url="http://sink/"), exchange, 0)[0].headers["ce-metadata"] == (
        "{%22X-T%22:[%22%C3%A9%205%25%22]}"
    )
    exchange.sides = (False, True)  # mode = "response"
    line = json.loads(record(plan(path="/tmp/x", mode="response"), exchange))
    assert "request" not in line and line["response"]["body"] == {"outputs": []}


def test_a_dead_sink_drops_past_max_bytes_and_counts_every_event() -> None:
    counted: dict[str, int] = {}
    lock = threading.Lock()

    def count(outcome: str, events: int) -> None:
        with lock:
            counted[outcome] = counted.get(outcome, 0) + events

    held: list[int] = []
    nobody = f"http://127.0.0.1:{free_port()}/"
    shipper = Shipper(plan(url=nobody, max_bytes=64 * 1024, retries=0), count, held.append, None)
    shipper.start()
    started = time.monotonic()
    body = b"x" * 1000
    for i in range(1000):  # each a request and its reply: two events
        exchange = Exchange(str(i), "/predict", time.time(), "application/json", body, None, {}, 200, time.time(),
                            "application/json", body)  # fmt: skip
        shipper.put(exchange)
    assert time.monotonic() - started < 0.5  # put never waits for the sink
    assert max(held) <= 64 * 1024
    shipper.close(0.5)
    assert sum(counted.values()) == 2000 and counted["dropped"] > 1000, counted


def test_a_large_tensor_is_recorded_by_its_digest_a_small_one_by_its_data() -> None:
    image = np.zeros((1, 3, 96, 96), np.float32)
    small = np.ones((1, 4), np.float32)
    encoded = encode_infer_request({"image": image, "small": small}, {"image", "small"}, binary_output=False)
    length = int(next(v for k, v in encoded.headers.items() if k.lower() == "inference-header-content-length"))
    view = v2_view(encoded.body, length, max_elements=16384)
    tensors = {t["name"]: t for t in view["inputs"]}
    assert "data" not in tensors["image"] and tensors["image"]["data_bytes"] == image.nbytes
    assert tensors["image"]["data_sha256"] == hashlib.sha256(image.tobytes()).hexdigest()
    assert tensors["image"]["shape"] == [1, 3, 96, 96] and list(tensors["small"]["data"]) == [1.0] * 4


def test_what_the_shipper_holds_counts_against_max_bytes_until_it_is_done() -> None:
    buffer = Buffer(10_000, eager=True)
    exchange = Exchange("a", "/predict", 0.0, "application/json", b"", None, {})
    items = [Item(exchange, 0.0, 4_000, 2) for _ in range(3)]
    assert [buffer.put(item) for item in items] == [True, True, False]
    taken = buffer.take(0)
    assert len(taken) == 2 and buffer.held == 8_000
    assert not buffer.put(items[2])  # a slow sink's batch in hand still holds its bytes
    buffer.release(4_000)
    assert buffer.put(items[2]) and buffer.held == 8_000
