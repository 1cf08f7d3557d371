"""Settings: TOML file + env overrides, validation messages, provenance, `onnxpool config`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from onnxpool.config.loader import DEFAULT_CONFIG_FILE, ConfigError, load_settings
from onnxpool.tasks.image.settings import image_settings
from tests.harness import REPO, clean_env


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "onnxpool.toml"
    path.write_text(text)
    return path


def test_default_file_serves_the_demo_model() -> None:
    loaded = load_settings(environ={})
    assert loaded.config_file == DEFAULT_CONFIG_FILE
    assert loaded.settings.model.name == "efficientnet-lite0"
    assert loaded.settings.model.path == REPO / "models" / "efficientnet-lite0" / "model.onnx"
    assert loaded.settings.server.bind == "127.0.0.1:8000"
    assert loaded.settings.server.workers == "auto"


def test_env_overrides_file_and_is_recorded(tmp_path: Path) -> None:
    path = write(tmp_path, '[server]\nbind = "127.0.0.1:7000"\nworkers = 3\n')
    env = {"ONNXPOOL_SERVER__BIND": "127.0.0.1:9000", "ONNXPOOL_TASK__PREPROCESS__MEAN": "[1, 2, 3]"}
    loaded = load_settings(path, environ=env)
    assert loaded.settings.server.bind == "127.0.0.1:9000"
    assert loaded.settings.server.workers == 3
    assert image_settings(loaded).preprocess.mean == (1.0, 2.0, 3.0)
    assert loaded.sources["server.bind"] == "env ONNXPOOL_SERVER__BIND"
    assert loaded.sources["server.workers"] == f"file {path.resolve()}"
    assert loaded.sources["server.timeout"] == "default"


def test_config_file_chosen_by_env(tmp_path: Path) -> None:
    path = write(tmp_path, '[model]\nname = "other"\n')
    assert load_settings(environ={"ONNXPOOL_CONFIG": str(path)}).settings.model.name == "other"


def test_relative_paths_resolve_against_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[model]\npath = "models/m.onnx"\n[task]\nlabels = "l.txt"\n')
    loaded = load_settings(path, environ={"ONNXPOOL_TASK__INPUT_NAME": "x"})
    assert loaded.settings.model.path == tmp_path / "models" / "m.onnx"
    assert image_settings(loaded).labels == tmp_path / "l.txt"  # a [task] path: the task's model says it is one


def test_the_old_model_keys_load_with_one_warning_each(tmp_path: Path) -> None:
    """Settings written when [model] held the image task's keys: still served, each key named in a warning."""
    path = write(tmp_path, '[model]\npath = "m.onnx"\nlabels = "l.txt"\ntop_k = 3\n[model.preprocess]\ncrop = 200\n')
    loaded = load_settings(path, environ={"ONNXPOOL_MODEL__PREPROCESS__RESIZE": "220"})
    image = image_settings(loaded)
    assert (image.labels, image.top_k, image.preprocess.crop, image.preprocess.resize) == (
        tmp_path / "l.txt",
        3,
        200,
        220,
    )
    assert loaded.warnings == (
        f"settings: [model] labels (from file {path.resolve()}) is now [task] labels: move it there",
        f"settings: [model] top_k (from file {path.resolve()}) is now [task] top_k: move it there",
        f"settings: [model.preprocess] crop (from file {path.resolve()}) is now [task.preprocess] crop: move it there",
        "settings: [model.preprocess] resize (from env ONNXPOOL_MODEL__PREPROCESS__RESIZE) is now "
        "[task.preprocess] resize: move it there",
    )
    assert loaded.sources["task.top_k"] == f"file {path.resolve()}"
    # the new place wins over the old one in the same file; the environment wins over a file
    both = write(tmp_path, "[model]\ntop_k = 3\n[task]\ntop_k = 4\n")
    kept = load_settings(both, environ={})
    assert image_settings(kept).top_k == 4 and "is ignored: [task] top_k is set" in kept.warnings[0]
    assert image_settings(load_settings(both, environ={"ONNXPOOL_MODEL__TOP_K": "7"})).top_k == 7
    # checked by the task's own model, naming the key where it now is
    crop = write(tmp_path, "[model.preprocess]\ncrop = 300\n")
    with pytest.raises(ConfigError, match=r"task\.preprocess = .*crop \(300\) must not exceed resize \(256\)"):
        image_settings(load_settings(crop, environ={}))


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("[server]\nwrokers = 2\n", {}, "server.wrokers: unknown key"),
        ("[serverz]\n", {}, "serverz: unknown key"),
        ('[server]\nworkers = "many"\n', {}, "server.workers = 'many'"),
        ("[server]\nworkers = 0\n", {}, "must be a positive integer"),
        ('[server]\nworker_class = "eventlet"\n', {}, "Input should be 'sync' or 'gthread'"),
        ('[server]\nbind = "localhost"\n', {}, "must be HOST:PORT"),
        ("", {"ONNXPOOL_SERVER__TIMEOUT": "soon"}, "(from env ONNXPOOL_SERVER__TIMEOUT)"),
        ("", {"ONNXPOOL_SERVER__TIMOUT": "5"}, "unknown setting in environment variable ONNXPOOL_SERVER__TIMOUT"),
        ("[server\n", {}, "is not valid TOML"),
    ],
)
def test_bad_settings_name_key_value_and_what_is_allowed(
    tmp_path: Path, text: str, env: dict[str, str], expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text), environ=env)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


def test_unknown_key_lists_allowed_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="allowed here: bind, workers"):
        load_settings(write(tmp_path, "[server]\nwrokers = 2\n"), environ={})


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml", environ={})


def test_onnxpool_config_prints_values_and_sources(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\ntimeout = 45\n")
    env = clean_env({"ONNXPOOL_SERVER__WORKERS": "2"})
    cli = [sys.executable, "-m", "onnxpool.cli", "config", "--config", str(path)]
    out = subprocess.run(cli, env=env, cwd=REPO, capture_output=True, text=True, check=True).stdout
    lines = {line.split("=")[0].strip(): line for line in out.splitlines() if "=" in line}
    assert "45" in lines["server.timeout"] and "# file" in lines["server.timeout"]
    assert "2" in lines["server.workers"] and "# env ONNXPOOL_SERVER__WORKERS" in lines["server.workers"]
    assert "# default" in lines["server.keepalive"]


def test_onnxpool_config_fails_with_one_line(tmp_path: Path) -> None:
    env = clean_env({"ONNXPOOL_SERVER__WORKERS": "-1"})
    done = subprocess.run(
        [sys.executable, "-m", "onnxpool.cli", "config"], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "server.workers = -1" in done.stderr
