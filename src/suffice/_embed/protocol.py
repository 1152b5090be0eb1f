"""The model interfaces: an embedder (texts in, L2-normalised float32 rows out) and a
reranker (a query and texts in, one score per text out)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Embedder(Protocol):
    name: str
    """Identifies the vectors in the store: change the model, change the name."""
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-length rows, one per text, dtype float32."""
        ...

    def embed_query(self, text: str) -> np.ndarray:
        ...


@runtime_checkable
class Reranker(Protocol):
    name: str

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """One relevance score per text (higher is better), in the order given."""
        ...
