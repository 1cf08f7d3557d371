"""BASELINE, not onnxpool: the image-classifier service people commonly deploy today.

FastAPI + `uvicorn --workers N`, one global onnxruntime session per worker
process created at import with DEFAULT options (onnxruntime sizes its thread
pool from the machine's core count), an `async def` endpoint that reads the
upload and runs the model inline, Pillow + float numpy preprocessing. It
exists only so `benchmarks/compare.py` can measure onnxpool against it; it is kept
deliberately ordinary, with the same preprocessing as config/onnxpool.toml
(shorter side 256 bilinear, centre crop 224, (pixel - 127) / 128, RGB, NCHW).

Run: uvicorn benchmarks.baselines.fastapi_app:app --workers 2 --host 127.0.0.1 --port 8001
(needs `pip install 'onnxpool[baseline]'`). BASELINE_MODEL / BASELINE_LABELS
environment variables point it at another model. BASELINE_TEXT_MODEL (models/minilm/model.onnx,
`make minilm`) adds an OpenAI-style POST /v1/embeddings on it, as ordinary: a default session,
the model folder's tokenizer (cut at 256 tokens, padded to the longest), mean pooling, L2 norm.
The same routes in one process, run in FastAPI's thread pool: `fastapi_threadpool.py`.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
from fastapi import FastAPI, File, HTTPException, Request, UploadFile
from PIL import Image
from tokenizers import Tokenizer

from benchmarks.baselines.openai_reply import embeddings_reply, texts_of

ROOT = Path(__file__).resolve().parents[2]
MODEL = Path(os.environ.get("BASELINE_MODEL", ROOT / "models" / "efficientnet-lite0" / "model.onnx"))
LABELS = Path(os.environ.get("BASELINE_LABELS", ROOT / "models" / "efficientnet-lite0" / "labels.txt"))

app = FastAPI(title="baseline classifier")
session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
input_name = session.get_inputs()[0].name
labels = LABELS.read_text(encoding="utf-8").splitlines()
TEXT_MODEL = os.environ.get("BASELINE_TEXT_MODEL", "")
text_session = ort.InferenceSession(TEXT_MODEL, providers=["CPUExecutionProvider"]) if TEXT_MODEL else None
tokenizer = Tokenizer.from_file(str(Path(TEXT_MODEL).with_name("tokenizer.json"))) if TEXT_MODEL else None
if tokenizer is not None:
    tokenizer.enable_truncation(256)
    tokenizer.enable_padding()


def preprocess(data: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(data)).convert("RGB")
    width, height = image.size
    scale = 256 / min(width, height)
    image = image.resize((round(width * scale), round(height * scale)), Image.Resampling.BILINEAR)
    width, height = image.size
    left, top = (width - 224) // 2, (height - 224) // 2
    image = image.crop((left, top, left + 224, top + 224))
    array = (np.asarray(image, dtype=np.float32) - 127.0) / 128.0
    return array.transpose(2, 0, 1)[np.newaxis]


@app.get("/health")
def health() -> dict[str, bool]:
    return {"ok": True}


def classify(data: bytes, top_k: int) -> dict[str, object]:
    """The reply to one uploaded image."""
    try:
        batch = preprocess(data)
    except Exception as exc:
        raise HTTPException(status_code=400, detail=f"cannot read image: {exc}") from None
    logits = session.run(None, {input_name: batch})[0][0]
    scores = np.exp(logits - logits.max())
    scores /= scores.sum()
    best = np.argsort(scores)[::-1][:top_k]
    return {"predictions": [[{"label": labels[i], "index": int(i), "score": float(scores[i])} for i in best]]}


def embed(payload: dict[str, object]) -> dict[str, object]:
    """The OpenAI-style reply to one embeddings request (BASELINE_TEXT_MODEL)."""
    if text_session is None or tokenizer is None:
        raise HTTPException(status_code=404, detail="no text model (BASELINE_TEXT_MODEL)")
    encoded = tokenizer.encode_batch(texts_of(payload))
    ids = np.array([e.ids for e in encoded], dtype=np.int64)
    mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
    hidden = text_session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    weights = mask[..., np.newaxis].astype(np.float32)
    pooled = (hidden[0] * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
    vectors = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
    return embeddings_reply(payload, vectors, int(mask.sum()))


@app.post("/predict")
async def predict(image: UploadFile = File(...), top_k: int = 5) -> dict[str, object]:  # noqa: B008
    return classify(await image.read(), top_k)


@app.post("/v1/embeddings")
async def embeddings(request: Request) -> dict[str, object]:
    return embed(await request.json())
