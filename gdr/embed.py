"""Sentence embeddings with any sentence-transformers model (bundled ``minilm-l6`` by default)."""
from __future__ import annotations

import logging
from functools import lru_cache
from typing import Sequence

import numpy as np

from gdr.models import EMBED_BATCH, EMBED_MODEL, resolve_model

log = logging.getLogger(__name__)

__all__ = ["load_encoder", "embed_texts"]


@lru_cache(maxsize=4)
def load_encoder(name: str = "minilm-l6", device: str | None = None):
    from sentence_transformers import SentenceTransformer  # optional: gdr[offline]

    return SentenceTransformer(resolve_model(name), device=device)


def embed_texts(
    texts: Sequence[str], model: str = EMBED_MODEL, batch_size: int = EMBED_BATCH,
    normalize: bool = True, device: str | None = None, progress: bool = True,
) -> np.ndarray:
    """Embed ``texts``; returns float32 array of shape (len(texts), dim), L2-normalised by default."""
    enc = load_encoder(model, device)
    emb = enc.encode(list(texts), batch_size=batch_size, show_progress_bar=progress,
                     convert_to_numpy=True, normalize_embeddings=normalize)
    return np.ascontiguousarray(emb, dtype=np.float32)
