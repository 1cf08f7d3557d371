"""BASELINE, not onnxpool: FastAPI in ONE process, the model run in FastAPI's thread pool.

The other ordinary way to serve a model with FastAPI: a single `uvicorn` process (no
`--workers`), one default onnxruntime session (its thread pool sized from the machine's cores),
and plain `def` endpoints, which FastAPI runs in its thread pool (AnyIO's, 40 threads), so
several requests are in the session at once. Same preprocessing, session and replies as
`fastapi_app.py` (its `classify` and `embed`); only how the requests reach them differs.

Run: python -m benchmarks.baselines.uvicorn_nodelay benchmarks.baselines.fastapi_threadpool:app --port 8002
(BASELINE_TEXT_MODEL=models/minilm/model.onnx for /v1/embeddings).
"""

from __future__ import annotations

from typing import Any

from fastapi import Body, FastAPI, File, UploadFile

from benchmarks.baselines.fastapi_app import classify, embed

app = FastAPI(title="baseline classifier, one process, thread pool")


@app.get("/health")
def health() -> dict[str, bool]:
    return {"ok": True}


@app.post("/predict")
def predict(image: UploadFile = File(...), top_k: int = 5) -> dict[str, object]:  # noqa: B008
    return classify(image.file.read(), top_k)


@app.post("/v1/embeddings")
def embeddings(payload: dict[str, Any] = Body(...)) -> dict[str, object]:  # noqa: B008
    return embed(payload)
