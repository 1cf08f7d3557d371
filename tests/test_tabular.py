"""The tabular task: KServe v1 `{"instances": [...]}` on the iris demo through real gunicorn, every
bad input named in a 400, the response cache keyed on the values (a list and an object with the same
numbers are one request), a regressor, and settings errors that name the key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from onnxpool.config.loader import ConfigError, load_settings
from onnxpool.tasks.api import TaskConfigError
from onnxpool.tasks.registry import build_task
from onnxpool.tasks.tabular.task import Instances, Tabular
from onnxpool.workers.model_info import ModelInfo, TensorSpec
from tests.harness import REPO, Server, running_server
from tests.tiny_models import linear_regressor

pytestmark = pytest.mark.slow

IRIS = "/v1/models/iris:predict"
SETOSA = [5.1, 3.5, 1.4, 0.2]
VIRGINICA = {"sepal_length": 6.7, "sepal_width": 3.0, "petal_length": 5.2, "petal_width": 2.3}
FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
IRIS_TENSORS = ModelInfo(
    inputs=(TensorSpec("input", "tensor(float)", (-1, 4)),),
    outputs=(TensorSpec("label", "tensor(int64)", (-1,)), TensorSpec("probabilities", "tensor(float)", (-1, 3))),
)


@pytest.fixture(scope="module")
def iris(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(
        tmp_path_factory.mktemp("iris"),
        {"ONNXPOOL_SERVER__WORKERS": "2", "ONNXPOOL_LIMITS__MAX_BATCH": "8"},
        config=REPO / "config" / "iris.toml",
    ) as server:
        yield server


def predict(server: Server, document: Any, path: str = IRIS, **headers: str) -> requests.Response:
    return requests.post(server.url + path, json=document, headers=headers, timeout=30)


def test_both_instance_shapes_on_both_urls(iris: Server) -> None:
    for path in (IRIS, "/predict"):
        reply = predict(iris, {"instances": [SETOSA, VIRGINICA]}, path)
        assert reply.status_code == 200, reply.text
        first, second = reply.json()["predictions"]
        assert (first["label"], second["label"]) == ("setosa", "virginica")
        assert list(first["probabilities"]) == ["setosa", "versicolor", "virginica"]
        assert sum(first["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)
        assert first["probabilities"]["setosa"] > 0.9 and second["probabilities"]["virginica"] > 0.9
    status = requests.get(iris.url + "/v1/models/iris", timeout=10)
    assert status.json() == {"name": "iris", "ready": True}
    assert requests.get(iris.url + "/v1/models", timeout=10).json() == {"models": ["iris"]}


@pytest.mark.parametrize(
    ("document", "status", "message"),
    [
        (
            {"instances": [{k: v for k, v in VIRGINICA.items() if k != "petal_width"}]},
            400,
            "missing feature 'petal_width'",
        ),
        ({"instances": [{**VIRGINICA, "stem_length": 1.0}]}, 400, "unknown feature(s) 'stem_length'"),
        ({"instances": [{**VIRGINICA, "sepal_width": "wide"}]}, 400, "feature 'sepal_width' is a string, not a number"),
        (
            {"instances": [SETOSA, [5.1, 3.5, None, 0.2]]},
            400,
            "instances[1]: the model gives no prediction (NaN) for this row; missing (null): petal_length",
        ),
        ({"instances": [SETOSA, [5.1, True, 1.4, 0.2]]}, 400, "instances[1] feature 'sepal_width' is a boolean"),
        ({"instances": [[5.1, 3.5, 1.4]]}, 400, "instances[0] has 3 values; the model takes 4 features"),
        ({"instances": [SETOSA] * 9}, 400, "9 instances in one request; max_batch is 8"),
        ({"instances": []}, 400, '"instances" must be a non-empty list'),
        ({"instances": "many"}, 400, '"instances" must be a non-empty list'),
        ({"instances": ["row"]}, 400, "instances[0] is a string"),
        ({"rows": [SETOSA]}, 400, 'must be a JSON object with "instances"'),
        ({"instances": [SETOSA], "extra": 1}, 400, "unknown member(s) 'extra'"),
        ([SETOSA], 400, 'must be a JSON object with "instances"'),
    ],
)
def test_bad_instances_get_a_400_naming_the_problem(iris: Server, document: Any, status: int, message: str) -> None:
    reply = predict(iris, document)
    assert reply.status_code == status, reply.text
    assert message in reply.json()["error"]


def test_bad_bodies_and_urls(iris: Server) -> None:
    broken = requests.post(iris.url + IRIS, data=b'{"instances": [[1,', timeout=10)
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["error"]
    upload = requests.post(iris.url + IRIS, files={"image": b"x"}, timeout=10)
    assert upload.status_code == 415
    other = requests.post(iris.url + "/v1/models/roses:predict", json={"instances": [SETOSA]}, timeout=10)
    assert other.status_code == 404 and "unknown model 'roses'" in other.json()["error"]
    wrong_method = requests.get(iris.url + IRIS, timeout=10)  # the status route's <model> takes "iris:predict"
    assert wrong_method.status_code in (404, 405) and "error" in wrong_method.json()
    assert predict(iris, {"instances": [SETOSA]}).status_code == 200  # the workers lived through it all


def test_a_repeated_instance_list_is_a_cache_hit_whatever_its_shape(iris: Server) -> None:
    rows = {"instances": [[6.1, 2.8, 4.7, 1.2], SETOSA]}
    first = predict(iris, rows)
    again = predict(iris, rows)
    as_objects = predict(iris, {"instances": [dict(zip(FEATURES, row, strict=True)) for row in rows["instances"]]})
    assert first.headers["X-Cache"] == "MISS"
    assert again.headers["X-Cache"] == "HIT" and again.content == first.content
    assert as_objects.headers["X-Cache"] == "HIT" and as_objects.content == first.content
    other = predict(iris, {"instances": [[6.1, 2.8, 4.7, 1.3], SETOSA]})
    assert other.headers["X-Cache"] == "MISS"
    metrics = requests.get(iris.url + "/metrics", timeout=10).text
    hits = [
        line for line in metrics.splitlines() if line.startswith("onnxpool_requests_total") and 'cache="hit"' in line
    ]
    assert any('model="iris"' in line and 'task="tabular"' in line for line in hits), hits


def test_a_regressor_answers_values(tmp_path: Path) -> None:
    model = linear_regressor(tmp_path / "reg.onnx", features=3)
    loaded = load_settings(
        environ={},
        overrides={
            "model.task": "tabular",
            "model.path": str(model),
            "task.features": ["a", "b", "c"],
        },
    )
    info = ModelInfo(
        inputs=(TensorSpec("x", "tensor(float)", (-1, 3)),), outputs=(TensorSpec("y", "tensor(float)", (-1, 1)),)
    )
    task = build_task(loaded, info)
    assert isinstance(task, Tabular)
    inputs = Instances({"x": np.array([[1, 2, 3], [0.5, 0, 0]], dtype=np.float32)}, 2)
    assert list(task.feeds(inputs)) == ["x"] and task.output_names() == ["y"]
    assert task.reply(inputs, {"y": np.array([[12.0], [1.0]], dtype=np.float32)}) == {"predictions": [12.0, 1.0]}


def test_settings_errors_name_the_key(tmp_path: Path) -> None:
    config = tmp_path / "t.toml"
    config.write_text('[model]\ntask = "tabular"\n[task]\nfeaturez = ["a"]\n')
    with pytest.raises(ConfigError) as err:
        build_task(load_settings(config, environ={}), IRIS_TENSORS)
    assert "task.featurez: unknown key (from file" in str(err.value) and "allowed here: features" in str(err.value)
    with pytest.raises(ConfigError) as err:
        build_task(load_settings(config, environ={"ONNXPOOL_TASK__FEATUREZ": "1"}), IRIS_TENSORS)
    assert "(from env ONNXPOOL_TASK__FEATUREZ)" in str(err.value)
    config.write_text('[model]\ntask = "tabular"\n[task]\nfeatures = ["a", "a"]\n')
    with pytest.raises(ConfigError) as err:
        build_task(load_settings(config, environ={}), IRIS_TENSORS)
    assert "task.features = ('a', 'a')" in str(err.value) or "task.features = ['a', 'a']" in str(err.value)
    assert "repeated: a" in str(err.value)
    iris = load_settings(REPO / "config" / "iris.toml", environ={"ONNXPOOL_TASK__FEATURES": '["a", "b"]'})
    with pytest.raises(TaskConfigError, match=r"task\.features names 2 features but input 'input' takes 4 columns"):
        build_task(iris, IRIS_TENSORS)


def test_iris_refused_at_start_when_its_features_do_not_fit(tmp_path: Path) -> None:
    from tests.harness import start_server

    server = start_server(
        tmp_path, {"ONNXPOOL_TASK__FEATURES": '["a", "b"]'}, config=REPO / "config" / "iris.toml", wait=False
    )
    try:
        assert server.process.wait(timeout=60) == 1
    finally:
        server.stop()
    assert "task.features names 2 features but input 'input' takes 4 columns" in server.log()


def test_auto_serves_a_model_without_an_image_input_as_named_tensors(tmp_path: Path) -> None:
    model = linear_regressor(tmp_path / "reg.onnx", features=3)
    settings = {"ONNXPOOL_MODEL__PATH": str(model), "ONNXPOOL_SERVER__WORKERS": "1"}
    with running_server(tmp_path, settings, workers=1) as server:
        reply = predict(server, {"inputs": {"x": [[1, 2, 3], [0.5, 0, 0]]}}, "/predict")
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"] == {"y": [[12.0], [1.0]]}
        bad = predict(server, {"inputs": {"x": [[1, 2]]}}, "/predict")
        assert bad.status_code == 400 and "input 'x' dimension 1 is 2; the model takes 3" in bad.json()["error"]
        missing = predict(server, {"inputs": {}}, "/predict")
        assert missing.status_code == 400 and "input 'x' is missing" in missing.json()["error"]
        assert "task: tensors (auto: the model's first input has shape [-1, 3])" in server.log()
