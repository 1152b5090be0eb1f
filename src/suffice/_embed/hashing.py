"""A deterministic bag-of-words embedder: no model, for tests and fuzzing.

Words are hashed into 64 buckets; the counts are normalised to unit length. It has enough
structure for seeds, links and dense ranking to behave differently per text, and costs
microseconds, so property tests and fuzzers can run thousands of stores.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


class HashEmbedder:
    name = "hash-64"
    dim = 64

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for w in text.lower().split():
                out[i, int(hashlib.md5(w.encode()).hexdigest()[:6], 16) % self.dim] += 1.0
            n = np.linalg.norm(out[i])
            out[i] = out[i] / n if n > 0 else out[i]
        return out

    def embed_query(self, text: str) -> np.ndarray:
        vec: np.ndarray = self.embed([text])[0]
        return vec
