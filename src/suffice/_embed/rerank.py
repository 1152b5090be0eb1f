"""A cross-encoder that rescores the prefix's top candidates, run with onnxruntime (no torch).

A bi-encoder embeds the question and each item apart and compares two vectors; a cross-encoder
reads the question and one item together, so it can see that "when did she move" is answered by
a turn that names a date *and* a move. It costs one network pass per candidate, so it only ever
reorders the first few dozen items of the fused prefix. The network is MiniLM fine-tuned here
(``suffice train reranker``) with a one-unit head over the mean-pooled output; its folder holds
``model.onnx`` and ``card.json`` as a trained encoder's does.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np

from .card import onnx_session, open_model


class CrossEncoderReranker:
    """Scores (query, text) pairs; higher means more likely to be evidence for the query."""

    def __init__(self, model_path: str | Path, *, name: str, threads: int = 2,
                 max_length: int = 160, batch_size: int = 32) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.name = name
        tok = Tokenizer.from_str(resources.files("suffice").joinpath("data/minilm_tokenizer.json")
                                 .read_text(encoding="utf-8"))
        # Longest-first truncation trims the longer of the two texts, so a long item never
        # crowds out the question.
        tok.enable_truncation(max_length)
        tok.no_padding()
        self._tok = tok
        self._chars = 32 * max_length
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self._sess = onnx_session(model_path, opts, ("input_ids", "attention_mask", "token_type_ids"),
                                  "cross-encoder reranker")
        self._batch = batch_size
        self._lock = threading.Lock()

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """One float per text, in the order given."""
        out = np.zeros(len(texts), dtype=np.float32)
        if not texts:
            return out
        encs = self._tok.encode_batch([(query, t[:self._chars]) for t in texts])
        order = sorted(range(len(encs)), key=lambda i: len(encs[i].ids))
        for b in range(0, len(order), self._batch):
            idx = order[b:b + self._batch]
            width = max(len(encs[i].ids) for i in idx)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros_like(ids)
            types = np.zeros_like(ids)
            for r, i in enumerate(idx):
                e = encs[i]
                n = len(e.ids)
                ids[r, :n], mask[r, :n], types[r, :n] = e.ids, 1, e.type_ids
            with self._lock:
                scores = self._sess.run(None, {"input_ids": ids, "attention_mask": mask,
                                               "token_type_ids": types})[0]
            out[idx] = np.asarray(scores, dtype=np.float32).reshape(-1)
        return out


def load_reranker(path: str | Path, *, threads: int = 2) -> CrossEncoderReranker:
    """A trained reranker from the folder ``suffice train reranker`` wrote; the weights are
    checked against the digest in its card."""
    model, name = open_model(path, "reranker")
    return CrossEncoderReranker(model, name=name, threads=threads)
