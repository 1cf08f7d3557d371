"""Settings files that name several models: what the host reads and what each model's pool sees."""

from __future__ import annotations

from pathlib import Path

import pytest

from onnxpool.config.loader import ConfigError, load_settings

ZOO = """
[server]
bind = "127.0.0.1:9000"
[limits]
max_queue_ms = 250
max_batch = 8
[cache]
max_bytes = 2097152
[models.image]
path = "models/image.onnx"
cpus = 1.5
[models.image.limits]
max_queue_ms = 100
[models.iris]
path = "models/iris.onnx"
task = "tabular"
cache = false
aliases = ["iris-v1", "org/iris"]
[tasks.iris]
labels = "models/labels.txt"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "zoo.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_host_reads_every_model_with_paths_beside_the_file(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, ZOO), environ={}).settings
    assert list(settings.models) == ["image", "iris"]
    assert settings.models["image"].path == tmp_path / "models" / "image.onnx"
    assert settings.models["iris"].aliases == ("iris-v1", "org/iris")
    assert settings.models["image"].cpus == 1.5 and settings.models["iris"].cpus == "auto"


def test_each_pool_sees_its_model_as_model_and_task(tmp_path: Path) -> None:
    path = write(tmp_path, ZOO)
    image = load_settings(path, environ={}, pool="image")
    assert image.settings.model.name == "image"
    assert image.settings.model.path == tmp_path / "models" / "image.onnx"
    assert (image.settings.limits.max_queue_ms, image.settings.limits.max_batch) == (100, 8)
    assert image.settings.cache.enabled and image.settings.cache.max_bytes == 2097152
    assert image.settings.models == {} and image.settings.task == {}
    iris = load_settings(path, environ={"ONNXPOOL_POOL": "iris"})
    assert (iris.settings.model.name, iris.settings.model.task) == ("iris", "tabular")
    assert iris.settings.task == {"labels": "models/labels.txt"}
    assert iris.task_path_bases["labels"] == tmp_path  # the task resolves it beside the file
    assert iris.settings.limits.max_queue_ms == 250
    assert not iris.settings.cache.enabled
    assert iris.settings.model.aliases == ("iris-v1", "org/iris")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (ZOO + "[model]\npath = 'x.onnx'\n", "[model] and [models.<name>] together"),
        (ZOO.replace("[server]\n", "[server]\nworkers = 2\n"), "[server] workers is per model"),
        (ZOO + "[models.'bad name']\npath = 'x.onnx'\n", "[models.bad name]: a model name is"),
        (ZOO + "[models.other]\npath = 'x.onnx'\naliases = ['iris-v1']\n", "the name 'iris-v1' is already iris's"),
        (ZOO + "[tasks.nobody]\nlabels = 'x'\n", "[tasks.nobody] names no model"),
        (ZOO.replace("cpus = 1.5", "cpus = -1.0"), "models.image.cpus"),
        (ZOO.replace("cache = false", "cache = false\nspeed = 3"), "models.iris.speed: unknown key"),
        (ZOO.replace('aliases = ["iris-v1", "org/iris"]', 'aliases = ["no spaces please"]'), "alias 'no spaces"),
    ],
)
def test_bad_files_are_one_line_naming_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, text), environ={})
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_pool_of_an_unknown_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no \[models.text\] \(models: image, iris\)"):
        load_settings(write(tmp_path, ZOO), environ={}, pool="text")


def test_one_model_files_are_unchanged(tmp_path: Path) -> None:
    loaded = load_settings(environ={})
    assert loaded.settings.models == {} and loaded.settings.model.name == "efficientnet-lite0"
