"""Models as skl2onnx and onnxmltools write them by default, served by real servers and compared with
onnxruntime in process: KServe v1, v2 JSON, v2 binary (tritonclient.http) and gRPC (tritonclient.grpc).

The converters run here (tests/converted_models.py): a RandomForest pipeline ending in skl2onnx's
ZipMap, the same forest on string classes, a ColumnTransformer + LogisticRegression pipeline over
float, int64 and string columns (ZipMap on and off), a Ridge regressor, LightGBM (ZipMap) and
XGBoost (a probability tensor). Each is served with `task = "auto"` and nothing else set: the
start must choose tabular, read the ZipMap and the string columns, and answer equal labels and
probabilities within 1e-6. Bad rows get a 400 naming the feature, and the workers live on.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from tests.converted_models import BUILDERS, IRIS_ROWS, Converted, build, onnx_feeds
from tests.harness import Server, free_port, running_server, start_and_collect

pytestmark = pytest.mark.slow


class Served:
    """A converted model, its server (one worker, gRPC on), and what onnxruntime in process answers."""

    def __init__(self, model: Converted, server: Server, grpc_address: str) -> None:
        self.model, self.server, self.grpc = model, server, grpc_address
        self.session = ort.InferenceSession(str(model.path), providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

    @property
    def v1(self) -> str:
        return f"{self.server.url}/v1/models/{self.model.name}:predict"

    def expected(self, rows: list[dict[str, Any]]) -> tuple[list[Any], np.ndarray, list[str]]:
        """onnxruntime's (labels, probabilities (n, classes) or values, class names in order)."""
        results = self.session.run(None, onnx_feeds(self.model, rows, self.inputs))
        if not self.model.classifier:
            return [], np.asarray(results[0], dtype=np.float64), []
        labels, probabilities = results[0], results[1]
        if isinstance(probabilities, list):  # ZipMap: one {class: probability} per row
            keys = list(probabilities[0])
            matrix = np.array([[row[k] for k in keys] for row in probabilities], dtype=np.float64)
            return [*np.asarray(labels).reshape(-1).tolist()], matrix, [str(k) for k in keys]
        matrix = np.asarray(probabilities, dtype=np.float64)
        return [*np.asarray(labels).reshape(-1).tolist()], matrix, [str(i) for i in range(matrix.shape[1])]

    def v2_inputs(self, module: Any, rows: list[dict[str, Any]], binary: bool) -> list[Any]:
        tensors = []
        for name, array in onnx_feeds(self.model, rows, self.inputs).items():
            datatype = {"f": "FP32", "i": "INT64", "O": "BYTES"}[array.dtype.kind]
            tensor = module.InferInput(name, list(array.shape), datatype)
            data = array
            if datatype == "BYTES":  # tritonclient sends bytes objects as BYTES elements
                data = np.array([item.encode() for item in array.reshape(-1)], dtype=object).reshape(array.shape)
            if module is thttp:
                tensor.set_data_from_numpy(data, binary_data=binary)
            else:
                tensor.set_data_from_numpy(data)
            tensors.append(tensor)
        return tensors


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp(request.param)
    model = build(request.param, folder)
    grpc_address = f"127.0.0.1:{free_port()}"
    settings = {
        "ONNXPOOL_MODEL__PATH": str(model.path),
        "ONNXPOOL_MODEL__NAME": model.name,
        "ONNXPOOL_MODEL__TASK": model.task,
        "ONNXPOOL_SERVER__WORKERS": "1",
        "ONNXPOOL_SERVER__GRPC_BIND": grpc_address,
        "ONNXPOOL_CACHE__ENABLED": "false",
    }
    with running_server(folder, settings, workers=1) as server:
        yield Served(model, server, grpc_address)


def rows_of(served: Served) -> list[dict[str, Any]]:
    return [dict(row) for row in served.model.rows]


def test_the_start_chose_the_tabular_task_and_rehearsed_it(served: Served) -> None:
    log = served.server.log()
    assert "task: tabular" in log, log[-2000:]
    assert "answered its own sample request (POST /v1/models/" in log


def test_kserve_v1_equals_onnxruntime(served: Served) -> None:
    rows = rows_of(served)
    named = all(served.model.features)
    instances: list[Any] = [row if named else list(row.values()) for row in rows]
    if named:  # the same values as lists in feature order
        instances += [[row[k] for k in served.model.features] for row in rows]
    reply = requests.post(served.v1, json={"instances": instances}, timeout=30)
    assert reply.status_code == 200, reply.text
    predictions = reply.json()["predictions"]
    labels, expected, names = served.expected(rows + rows if named else rows)
    if not served.model.classifier:
        assert np.allclose(predictions, expected.reshape(len(predictions), -1)[:, 0], atol=1e-6, rtol=0)
        return
    for prediction, label, row in zip(predictions, labels, expected, strict=True):
        assert prediction["label"] == str(label)
        assert list(prediction["probabilities"]) == names
        assert np.allclose(list(prediction["probabilities"].values()), row, atol=1e-6, rtol=0)


@pytest.mark.parametrize("wire", ["v2 json", "v2 binary", "grpc"])
def test_v2_and_grpc_equal_onnxruntime(served: Served, wire: str) -> None:
    rows = rows_of(served)
    labels, expected, _ = served.expected(rows)
    names = served.outputs
    if wire == "grpc":
        with tgrpc.InferenceServerClient(served.grpc) as client:
            result: Any = client.infer(served.model.name, served.v2_inputs(tgrpc, rows, binary=True))
    else:
        binary = wire == "v2 binary"
        with thttp.InferenceServerClient(served.server.url.removeprefix("http://")) as client:
            outputs = [thttp.InferRequestedOutput(name, binary_data=binary) for name in names]
            result = client.infer(served.model.name, served.v2_inputs(thttp, rows, binary), outputs=outputs)
    if not served.model.classifier:
        assert np.allclose(result.as_numpy(names[0]).astype(np.float64), expected, atol=1e-6, rtol=0)
        return
    label = result.as_numpy(names[0]).reshape(-1)
    probabilities = result.as_numpy(names[1])
    assert probabilities.dtype == np.float32 and probabilities.shape == expected.shape
    assert np.allclose(probabilities, expected, atol=1e-6, rtol=0)
    decoded = [item.decode() if isinstance(item, bytes) else item for item in label.tolist()]
    assert decoded == labels


def test_metadata_says_how_to_call(served: Served) -> None:
    metadata = requests.get(f"{served.server.url}/v2/models/{served.model.name}", timeout=10).json()
    by_name = {t["name"]: t["datatype"] for t in metadata["inputs"]}
    model_types = {i.name: i.type for i in served.session.get_inputs()}
    words = {"tensor(float)": "FP32", "tensor(int64)": "INT64", "tensor(string)": "BYTES"}
    assert by_name == {name: words[kind] for name, kind in model_types.items()}
    if served.model.classifier:
        probabilities = metadata["outputs"][1]
        assert probabilities["datatype"] == "FP32" and len(probabilities["shape"]) == 2
        assert probabilities["shape"][1] == served.expected(rows_of(served))[1].shape[1]
    example = metadata["parameters"]["example"]
    assert example["route"].startswith("/v1/models/")
    reply = requests.post(served.server.url + example["route"], json=example["body"], timeout=10)
    assert reply.status_code == 200, reply.text
    document = requests.get(f"{served.server.url}/openapi.json", timeout=10).json()
    operation = document["paths"]["/predict"]["post"]
    body = operation["requestBody"]["content"]["application/json"]
    assert requests.post(served.v1, json=body["example"], timeout=10).status_code == 200


def bad_rows(model: Converted) -> list[tuple[Any, str]]:
    """(instances, what the 400 must name) for rows this model cannot take."""
    first = dict(model.rows[0])
    number = next(name for name, value in first.items() if isinstance(value, float))
    cases: list[tuple[Any, str]] = [
        ([[*first.values()][:-1]], f"has {len(first) - 1} values; the model takes {len(first)} features"),
    ]
    if all(model.features):
        cases += [
            ([{**first, number: "many"}], f"feature '{number}' is a string, not a number"),
            ([{k: v for k, v in first.items() if k != number}], f"missing feature '{number}'"),
        ]
    else:
        cases.append(([["many", *[*first.values()][1:]]], "feature 'column 0' is a string, not a number"))
    if "city" in first:
        cases += [
            ([{**first, "city": 3}], "feature 'city' is a number; the model takes a string"),
            ([{**first, "visits": 2.5}], "feature 'visits' is 2.5; the model takes an integer"),
            ([{**first, "visits": None}], "feature 'visits' is null"),
        ]
    return cases


def test_bad_rows_get_a_400_naming_the_feature_and_the_worker_lives(served: Served) -> None:
    workers = served.server.workers()
    for instances, message in bad_rows(served.model):
        reply = requests.post(served.v1, json={"instances": instances}, timeout=10)
        assert reply.status_code == 400, (instances, reply.text)
        assert message in reply.json()["error"], (instances, reply.text)
    wrong_type = {"inputs": [{"name": served.inputs[0], "datatype": "BOOL", "shape": [1, 1], "data": [True]}]}
    reply = requests.post(f"{served.server.url}/v2/models/{served.model.name}/infer", json=wrong_type, timeout=10)
    assert reply.status_code == 400 and served.inputs[0] in reply.json()["error"], reply.text
    good = [list(row.values()) for row in rows_of(served)]  # in feature order
    assert requests.post(served.v1, json={"instances": good}, timeout=10).status_code == 200
    assert served.server.workers() == workers


def test_a_missing_number_is_nan_for_the_model_to_decide(tmp_path: Path) -> None:
    """XGBoost routes a missing value down its default branch: null in JSON is that NaN, as in process."""
    model = build("xgboost", tmp_path)
    session = ort.InferenceSession(str(model.path), providers=["CPUExecutionProvider"])
    row = [5.1, None, 1.4, 0.2]
    expected = session.run(None, {"input": np.array([[5.1, np.nan, 1.4, 0.2]], dtype=np.float32)})[1][0]
    with running_server(
        tmp_path, {"ONNXPOOL_MODEL__PATH": str(model.path), "ONNXPOOL_SERVER__WORKERS": "1"}, workers=1
    ) as server:
        reply = requests.post(server.url + "/predict", json={"instances": [row]}, timeout=10)
    assert reply.status_code == 200, reply.text
    got = list(reply.json()["predictions"][0]["probabilities"].values())
    assert np.allclose(got, expected, atol=1e-6, rtol=0)


def test_schemathesis_covers_the_string_and_integer_features(tmp_path: Path) -> None:
    """The API page of a model with float, int64 and string columns, fuzzed: no 500, no reply outside its schema."""
    model = build("credit", tmp_path)
    settings = {
        "ONNXPOOL_MODEL__PATH": str(model.path),
        "ONNXPOOL_SERVER__WORKERS": "1",
        "ONNXPOOL_CACHE__ENABLED": "0",
    }
    with running_server(tmp_path, settings, workers=1) as server:
        document = requests.get(server.url + "/openapi.json", timeout=10).json()
        row = document["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        by_name = row["properties"]["instances"]["items"]["anyOf"][1]["properties"]
        assert by_name["city"]["type"] == "string" and by_name["visits"]["type"] == "integer"
        command = [
            str(Path(sys.executable).parent / "schemathesis"),
            "run",
            server.url + "/openapi.json",
            "--include-path-regex",
            "predict",
            "--include-method",
            "POST",
            # Bodies valid and invalid by the schema; the coverage phase's requests with headers no schema
            # names (which every HTTP server accepts) are left out.
            "--phases",
            "examples,fuzzing",
            "--mode",
            "all",
            "--checks",
            "all",
            # A schema-valid row may hold null ages: NaN for this linear model, a 400 naming the row.
            "--exclude-checks",
            "positive_data_acceptance",
            "--max-examples",
            "30",
            "--generation-deterministic",
            "--request-timeout",
            "10",
            "--continue-on-failure",
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=tmp_path, check=False)
        workers = server.workers()
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
        assert re.search(r"\d+ generated, \d+ passed", done.stdout), done.stdout[-2000:]
        assert server.workers() == workers and "Traceback" not in server.log()


def test_a_hup_to_a_model_the_task_cannot_serve_keeps_the_last_good_one(tmp_path: Path) -> None:
    """The rehearsal on HUP: [task] classes that do not match the ZipMap's classes refuse the reload in one
    line, and the running workers serve on."""
    model = build("forest", tmp_path)
    config = tmp_path / "forest.toml"
    config.write_text(f'[model]\nname = "forest"\npath = "{model.path}"\n', encoding="utf-8")
    with running_server(tmp_path, {"ONNXPOOL_SERVER__WORKERS": "1"}, workers=1, config=config) as server:
        config.write_text(
            config.read_text(encoding="utf-8") + '\n[task]\nclasses = ["setosa", "versicolor"]\n', encoding="utf-8"
        )
        server.signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while "reload: keeping the running configuration" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        line = next(line for line in server.log().splitlines() if "reload: keeping the running" in line)
        assert "2 class names ([task] classes or labels) but output 'output_probability' has 3 classes" in line
        reply = requests.post(server.url + "/predict", json={"instances": [list(IRIS_ROWS[0].values())]}, timeout=10)
        assert reply.status_code == 200 and list(reply.json()["predictions"][0]["probabilities"]) == ["0", "1", "2"]


def test_the_tensors_task_names_the_task_that_serves_a_zipmap(tmp_path: Path) -> None:
    model = build("forest", tmp_path)
    code, lines = start_and_collect(
        tmp_path, {"ONNXPOOL_MODEL__PATH": str(model.path), "ONNXPOOL_MODEL__TASK": "tensors"}
    )
    assert code == 1 and len(lines) == 1, lines
    assert "output_probability (seq(map(int64,tensor(float))))" in lines[0] and 'task = "tabular"' in lines[0]
