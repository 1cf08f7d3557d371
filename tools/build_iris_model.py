"""Rebuild the tabular demo model, models/iris/: a scikit-learn classifier of the iris data, in ONNX.

    .venv/bin/pip install 'onnxpool[demo-models]'     # scikit-learn, skl2onnx (not needed to serve)
    .venv/bin/python tools/build_iris_model.py

The iris measurements ship with scikit-learn (150 flowers, 4 features, 3 species), so nothing is
downloaded. Training is seeded and the conversion pinned (opset, names, no ZipMap), so the same
package versions write the same bytes; the script prints the model's SHA-256 and its accuracy on
a held-out third of the flowers, both recorded in models/iris/MODEL_CARD.md.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from skl2onnx import to_onnx
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

OUT = Path(__file__).resolve().parents[1] / "models" / "iris"
FEATURES = ("sepal_length", "sepal_width", "petal_length", "petal_width")
CLASSES = ("setosa", "versicolor", "virginica")
OPSET = {"": 17, "ai.onnx.ml": 3}


def main() -> None:
    data = load_iris()
    x = data.data.astype(np.float32)
    y = data.target
    assert tuple(data.target_names) == CLASSES
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=1 / 3, random_state=0, stratify=y)
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000, random_state=0))
    model.fit(x_train, y_train)
    onx = to_onnx(
        model,
        x_train[:1],
        target_opset=OPSET,
        options={id(model.steps[-1][1]): {"zipmap": False}},
        final_types=None,
    )
    onx.graph.input[0].name = "input"
    for node in onx.graph.node:
        node.input[:] = ["input" if name == "X" else name for name in node.input]
    onx.graph.output[0].name, onx.graph.output[1].name = "label", "probabilities"
    for node in onx.graph.node:
        node.output[:] = [{"label": "label", "probabilities": "probabilities"}.get(n, n) for n in node.output]
    onx.producer_name, onx.producer_version, onx.doc_string = "onnxpool tools/build_iris_model.py", "1", ""
    onnx.checker.check_model(onx)
    OUT.mkdir(parents=True, exist_ok=True)
    data_bytes = onx.SerializeToString(deterministic=True)
    (OUT / "model.onnx").write_bytes(data_bytes)
    (OUT / "labels.txt").write_text("\n".join(CLASSES) + "\n")

    session = ort.InferenceSession(data_bytes, providers=["CPUExecutionProvider"])
    labels, probabilities = session.run(["label", "probabilities"], {"input": x_test})
    agree = float(np.mean(labels == model.predict(x_test)))
    close = float(np.max(np.abs(probabilities - model.predict_proba(x_test))))
    accuracy = float(np.mean(labels == y_test))
    print(f"wrote {OUT / 'model.onnx'} ({len(data_bytes)} bytes) sha256:{hashlib.sha256(data_bytes).hexdigest()}")
    print(f"held-out accuracy {accuracy:.3f} on {len(y_test)} flowers; ONNX vs scikit-learn: labels agree {agree:.3f}")
    print(f"largest probability difference {close:.2e}")


if __name__ == "__main__":
    main()
