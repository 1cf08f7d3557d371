"""`onnxpool tune` on a settings file with several models: each model measured for real (briefly) on
one core with its task's own requests, then the budgets for the traffic mix, printed and written."""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path

import pytest

from onnxpool.cli import main
from onnxpool.measure.tomledit import set_model_cpus
from onnxpool.measure.tune_models import (
    MIN_CPUS,
    ModelsTuneOptions,
    ModelsTuneResult,
    mix_plan,
    parse_traffic,
    round_budgets,
    run_tune_models,
)
from onnxpool.workers.cores import usable_cores
from tests.harness import REPO
from tests.text_models import build_text_model_folder
from tests.tiny_models import build_tiny_model

IRIS = REPO / "models" / "iris"


def zoo_text(models: Path) -> str:
    """A several-model file: an image model, iris, a text model and a missing optional one; comments everywhere."""
    return f"""\
# A zoo for the tune tests.
[server]
bind = "127.0.0.1:8000"  # the front door

[models.image]
path = "{models / "image.onnx"}"
task = "image-classification"
# The image model's budget.
cpus = 1.0   # set by hand
traffic = 1.0

[models.iris]
path = "{IRIS / "model.onnx"}"
task = "tabular"
cpus = 0.25
[tasks.iris]
labels = "{IRIS / "labels.txt"}"
features = ["sepal_length", "sepal_width", "petal_length", "petal_width"]

[models.text]
path = "{models / "text" / "model.onnx"}"
task = "text-embedding"
cpus = 0.5  # a comment after the value

[models.later]
path = "{models / "not-built.onnx"}"
optional = true
cpus = 0.25
"""


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("zoo")
    build_tiny_model(folder / "image.onnx", 0.0)
    build_text_model_folder(folder / "text")
    config = folder / "zoo.toml"
    config.write_text(zoo_text(folder))
    return config


@pytest.fixture(scope="module")
def measured(zoo: Path) -> ModelsTuneResult:
    """One real run: every model about half a second on one core."""
    return run_tune_models(ModelsTuneOptions(config=zoo, budget=2.0))


def test_each_model_is_measured_on_its_tasks_requests(measured: ModelsTuneResult) -> None:
    assert [m.name for m in measured.models] == ["image", "iris", "text"]
    for model in measured.models:
        assert model.result is not None and model.result.calls > 0 and model.per_core > 0
        assert (model.result.workers, model.result.threads) == (1, 1)
    inputs = {m.name: m.result.inputs for m in measured.models if m.result}
    assert inputs["image"].startswith("image-classification: chelsea-cat.jpg")
    assert inputs["iris"].startswith("tabular: rows of 4 features")
    assert inputs["text"].startswith("text-embedding: 8 sentences")


def test_budgets_sum_to_the_usable_cores(measured: ModelsTuneResult) -> None:
    cores = len(usable_cores())
    plan = measured.plan
    assert measured.cores == cores
    assert sum(plan.budgets.values()) == pytest.approx(cores)
    assert sum(plan.cpus.values()) == pytest.approx(cores, abs=1e-6)  # rounded, yet still every core
    assert all(value >= MIN_CPUS for value in plan.cpus.values())
    for model in measured.models:  # each budget is what the model needs at the mix's highest rate
        rate = plan.rate_per_traffic * model.traffic
        assert plan.budgets[model.name] == pytest.approx(rate / model.per_core)


def test_more_traffic_gets_a_larger_budget(measured: ModelsTuneResult) -> None:
    rates = {m.name: m.per_core for m in measured.models}
    once = mix_plan(rates, {"image": 1.0, "iris": 1.0, "text": 1.0}, measured.cores)
    thrice = mix_plan(rates, {"image": 1.0, "iris": 1.0, "text": 3.0}, measured.cores)
    assert thrice.budgets["text"] > once.budgets["text"]
    assert thrice.cpus["text"] > once.cpus["text"]
    assert thrice.budgets["image"] < once.budgets["image"]


def test_a_missing_optional_model_is_skipped(measured: ModelsTuneResult) -> None:
    assert "later" in measured.skipped and "does not exist" in measured.skipped["later"]
    assert "later" not in measured.plan.cpus


def test_the_command_prints_and_writes_only_the_cpus(
    zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "zoo.toml"
    target.write_text(zoo.read_text())
    before = target.read_text()
    code = main(
        [
            "tune",
            "--config",
            str(zoo),
            "--budget",
            "1s",
            "--traffic",
            "text=3,iris=1",
            "--write",
            str(target),
            "--quiet",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == ""  # --quiet
    assert "later: skipped, " in out
    assert "[models.image]\ncpus = " in out and "[models.text]\ncpus = " in out
    text_row = next(line for line in out.splitlines() if line.split()[:2] == ["text", "text-embedding"])
    assert text_row.split()[-2:] == ["3", "60%"]  # --traffic replaced the file's 1.0
    after = target.read_text()
    changed = [
        line[1:] for line in difflib.ndiff(before.splitlines(), after.splitlines()) if line.startswith(("- ", "+ "))
    ]
    assert changed and all(line.lstrip(" ").startswith("cpus = ") for line in changed)
    assert (
        "# The image model's budget." in after and "# set by hand" in after and "# a comment after the value" in after
    )
    written = tomllib.loads(after)["models"]
    assert written["later"]["cpus"] == 0.25  # skipped: left as it was
    assert sum(written[name]["cpus"] for name in ("image", "iris", "text")) == pytest.approx(len(usable_cores()))
    printed = {line.split(" = ")[1] for line in out.splitlines() if line.startswith("cpus = ")}
    assert printed == {f"{written[name]['cpus']:.2f}" for name in ("image", "iris", "text")}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--traffic", "nobody=2"], "--traffic names nobody: not a model"),
        (["--top", "2"], "--top is for one model's layouts"),
    ],
)
def test_bad_arguments_are_one_line(
    zoo: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", "--config", str(zoo), "--budget", "1s", *argv]) == 2
    assert message in capsys.readouterr().err


def test_traffic_needs_several_models(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--config", str(REPO / "config" / "iris.toml"), "--traffic", "iris=2"]) == 2
    assert "traffic shares need [models.<name>] tables" in capsys.readouterr().err


def test_a_missing_model_that_is_not_optional_stops_before_measuring(
    zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "zoo.toml"
    config.write_text(zoo.read_text().replace("optional = true\n", ""))
    assert main(["tune", "--config", str(config)]) == 2
    assert "model later: " in capsys.readouterr().err


def test_parse_traffic() -> None:
    assert parse_traffic("image=3, iris=1,text=0.5") == {"image": 3.0, "iris": 1.0, "text": 0.5}
    for bad in ("image", "image=0", "image=-1", "image=x", "=2", "a=1,a=2", "a=inf"):
        with pytest.raises(ValueError):
            parse_traffic(bad)


def test_rounded_budgets_keep_the_sum_and_the_minimum() -> None:
    assert round_budgets({"a": 1.3333, "b": 0.6667}, 2) == {"a": 1.33, "b": 0.67}
    assert round_budgets({"a": 0.3333, "b": 0.3333, "c": 0.3334}, 1) == {"a": 0.33, "b": 0.33, "c": 0.34}
    tiny = round_budgets({"big": 3.999, "tiny": 0.001}, 4)
    assert tiny == {"big": 3.95, "tiny": 0.05}


def test_set_model_cpus_edits_only_cpus() -> None:
    text = (
        "# top\n[models.a]\npath = 'a.onnx'\ncpus = 1.0  # kept\n\n[models.a.limits]\ncpus = 'not this'\n"
        "[models.\"b.v2\"]\npath = 'b.onnx'\n"
    )
    out = set_model_cpus(text, {"a": 1.5, "b.v2": 0.5})
    assert "cpus = 1.50  # kept" in out and "cpus = 'not this'" in out and out.startswith("# top\n")
    data = tomllib.loads(out)
    assert data["models"]["a"]["cpus"] == 1.5 and data["models"]["b.v2"]["cpus"] == 0.5
    with pytest.raises(ValueError, match=r"no \[models.c\] table"):
        set_model_cpus(text, {"c": 1.0})
