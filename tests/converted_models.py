"""Tabular models as users have them: trained here, converted with skl2onnx's and onnxmltools' defaults.

No option a user would have to know is passed to a converter: skl2onnx ends classifiers in a
ZipMap (`seq(map(...))` probabilities), `to_onnx(pipeline, dataframe)` makes one (n, 1) input per
column of the column's own type (float, int64, string), onnxmltools' LightGBM converter ends in
a ZipMap too and its XGBoost converter in a probability tensor. The data are small and seeded:
a model is the same every run. The converters are the `converters` extra (setup.cfg), never a
dependency of onnxpool itself.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Converted:
    """A converted model, with rows a caller sends it (JSON values by feature) and its features in order."""

    name: str
    path: Path
    features: tuple[str, ...]
    rows: tuple[Mapping[str, Any], ...]
    classifier: bool = True
    task: str = "auto"
    """`[model] task`: a regressor's (n, 3) -> (n, 1) is any tensor model's shape, so it is named tabular."""


def _iris() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_iris

    features, target = load_iris(return_X_y=True)
    return features.astype(np.float32), target


IRIS_FEATURES = ("sepal_length", "sepal_width", "petal_length", "petal_width")
IRIS_ROWS = (
    dict(zip(IRIS_FEATURES, (5.1, 3.5, 1.4, 0.2), strict=True)),
    dict(zip(IRIS_FEATURES, (6.1, 2.8, 4.7, 1.2), strict=True)),
    dict(zip(IRIS_FEATURES, (6.7, 3.0, 5.2, 2.3), strict=True)),
)
CREDIT_ROWS = (
    {"age": 55.0, "income": 48.2, "visits": 3, "city": "rome"},
    {"age": 23.0, "income": 31.0, "visits": 0, "city": "oslo"},
    {"age": 41.0, "income": 75.5, "visits": 12, "city": "lisbon"},  # a city the encoder never saw
)


def _write(model: Any, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def random_forest(folder: Path) -> Converted:
    """make_pipeline(StandardScaler(), RandomForestClassifier()) on iris, `to_onnx(model, X[:1])`: ZipMap."""
    from skl2onnx import to_onnx
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    features, target = _iris()
    model = make_pipeline(StandardScaler(), RandomForestClassifier(n_estimators=12, random_state=0))
    model.fit(features, target)
    path = _write(to_onnx(model, features[:1]), folder / "forest.onnx")
    return Converted("forest", path, ("",) * 4, IRIS_ROWS)  # one (n, 4) input: positional


def random_forest_named(folder: Path) -> Converted:
    """The same forest trained on species names: a string label and a ZipMap keyed by the names."""
    from skl2onnx import to_onnx
    from sklearn.ensemble import RandomForestClassifier

    features, target = _iris()
    names = np.array(["setosa", "versicolor", "virginica"])[target]
    model = RandomForestClassifier(n_estimators=12, random_state=0).fit(features, names)
    path = _write(to_onnx(model, features[:1]), folder / "species.onnx")
    return Converted("species", path, ("",) * 4, IRIS_ROWS)  # one (n, 4) input: positional


def _credit_frame() -> tuple[Any, np.ndarray]:
    import pandas as pd

    rng = np.random.default_rng(7)
    size = 240
    frame = pd.DataFrame(
        {
            "age": rng.integers(18, 80, size).astype(np.float32),
            "income": rng.normal(50, 15, size).astype(np.float32),
            "visits": rng.integers(0, 20, size).astype(np.int64),
            "city": rng.choice(["rome", "paris", "oslo"], size),
        }
    )
    target = ((frame.age > 45) ^ (frame.city == "oslo")).astype(int).to_numpy()
    return frame, target


def credit_pipeline(folder: Path, zipmap: bool = True) -> Converted:
    """ColumnTransformer(StandardScaler on age, income, visits; OneHotEncoder on city) + LogisticRegression,
    `to_onnx(pipeline, dataframe[:1])`: inputs age, income (float), visits (int64), city (string)."""
    from skl2onnx import to_onnx
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    frame, target = _credit_frame()
    prepare = ColumnTransformer(
        [
            ("numbers", StandardScaler(), ["age", "income", "visits"]),
            ("city", OneHotEncoder(handle_unknown="ignore"), ["city"]),
        ]
    )
    model = Pipeline([("prepare", prepare), ("classify", LogisticRegression())]).fit(frame, target)
    options = None if zipmap else {id(model): {"zipmap": False}}
    name = "credit" if zipmap else "credit_tensors"
    path = _write(to_onnx(model, frame[:1], options=options), folder / f"{name}.onnx")
    return Converted(name, path, ("age", "income", "visits", "city"), CREDIT_ROWS)


def ridge_regressor(folder: Path) -> Converted:
    """make_pipeline(StandardScaler(), Ridge()) predicting petal width: a `variable` (n, 1) output."""
    from skl2onnx import to_onnx
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    features, _ = _iris()
    model = make_pipeline(StandardScaler(), Ridge()).fit(features[:, :3], features[:, 3])
    path = _write(to_onnx(model, features[:1, :3]), folder / "width.onnx")
    rows = tuple({k: row[k] for k in IRIS_FEATURES[:3]} for row in IRIS_ROWS)
    return Converted("width", path, ("",) * 3, rows, classifier=False, task="tabular")


def lightgbm_classifier(folder: Path) -> Converted:
    """LGBMClassifier on iris, onnxmltools.convert_lightgbm with its defaults (a ZipMap)."""
    import lightgbm
    import onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType

    features, target = _iris()
    model = lightgbm.LGBMClassifier(n_estimators=15, random_state=0, verbose=-1).fit(features, target)
    onnx = onnxmltools.convert_lightgbm(model, initial_types=[("input", FloatTensorType([None, 4]))])
    return Converted("lightgbm", _write(onnx, folder / "lightgbm.onnx"), ("",) * 4, IRIS_ROWS)


def xgboost_classifier(folder: Path) -> Converted:
    """XGBClassifier on iris, onnxmltools.convert_xgboost with its defaults (a probability tensor)."""
    import onnxmltools
    import xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType

    features, target = _iris()
    model = xgboost.XGBClassifier(n_estimators=15, max_depth=3, random_state=0).fit(features, target)
    onnx = onnxmltools.convert_xgboost(model, initial_types=[("input", FloatTensorType([None, 4]))])
    return Converted("xgboost", _write(onnx, folder / "xgboost.onnx"), ("",) * 4, IRIS_ROWS)


BUILDERS: dict[str, Callable[[Path], Converted]] = {
    "forest": random_forest,
    "species": random_forest_named,
    "credit": credit_pipeline,
    "credit_tensors": lambda folder: credit_pipeline(folder, zipmap=False),
    "width": ridge_regressor,
    "lightgbm": lightgbm_classifier,
    "xgboost": xgboost_classifier,
}


def build(name: str, folder: Path) -> Converted:
    with warnings.catch_warnings():  # the converters' deprecation chatter is not the test's business
        warnings.simplefilter("ignore")
        return BUILDERS[name](folder)


def onnx_feeds(model: Converted, rows: Sequence[Mapping[str, Any]], input_names: Sequence[str]) -> dict[str, Any]:
    """The rows as onnxruntime takes them in process: one (n, 1) array per input, or the (n, 4) matrix."""
    if len(input_names) == 1:
        matrix = np.array([[row[k] for k in row] for row in rows], dtype=np.float32)
        return {input_names[0]: matrix}
    feeds: dict[str, Any] = {}
    for name in input_names:
        values = [row[name] for row in rows]
        if isinstance(values[0], str):
            feeds[name] = np.array(values, dtype=object).reshape(-1, 1)
        elif isinstance(values[0], int):
            feeds[name] = np.array(values, dtype=np.int64).reshape(-1, 1)
        else:
            feeds[name] = np.array(values, dtype=np.float32).reshape(-1, 1)
    return feeds
