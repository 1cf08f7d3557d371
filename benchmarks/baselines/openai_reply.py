"""BASELINE helper: OpenAI's embeddings reply, as the FastAPI baselines answer it (no onnxpool code)."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np


def embeddings_reply(payload: dict[str, Any], vectors: np.ndarray, tokens: int) -> dict[str, Any]:
    """The reply to `payload` (its `encoding_format` and `model` read) for these vectors."""
    as_base64 = payload.get("encoding_format") == "base64"
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(np.asarray(v, "<f4").tobytes()).decode() if as_base64 else v.tolist(),
        }
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"object": "list", "data": data, "model": payload.get("model", ""), "usage": usage}


def texts_of(payload: dict[str, Any]) -> list[str]:
    """The request's `input`: one string or a list of them."""
    texts = payload["input"]
    return texts if isinstance(texts, list) else [texts]
