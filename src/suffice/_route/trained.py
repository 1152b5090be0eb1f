"""The trained sufficiency router at run time: one ONNX pass over the context's feature set.

``suffice train router`` writes a folder with ``model.onnx`` and ``card.json``; the card holds the
threshold tau calibrated on validation conversations, the feature version the network was fit
to, and the encoder whose vectors it read. :class:`TrainedRouter` loads it with onnxruntime
(no torch), builds the features with :func:`suffice._route.features.extract` (the function the
training data came from) and returns the network's score.

:func:`default_router` is what ``Memory`` uses in auto mode when the caller names no router: the
router in ``$SUFFICE_ROUTER`` or the one installed with the package, when it was trained on
vectors of the memory's encoder.
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from .._embed.card import onnx_session, open_model
from .._errors import ModelFileError
from .._llm.base import Ledger
from .features import ELEMENT_FEATURES, FEATURES_VERSION, GLOBAL_FEATURES, extract
from .sufficiency import DEFAULT_TAU, RouterDecision, RouterInput, _ms

ROUTER_ENV = "SUFFICE_ROUTER"
"""Names a router folder to use by default instead of the one shipped with the package."""


class TrainedRouter:
    """A router trained with evidence-level labels and rationale distillation (Router-Mem)."""

    def __init__(self, folder: str | Path, *, threads: int = 1) -> None:
        import onnxruntime as ort

        model, name = open_model(folder, "router")
        card: dict[str, Any] = json.loads((Path(folder) / "card.json").read_text(encoding="utf-8"))
        if card.get("features_version") != FEATURES_VERSION:
            raise ModelFileError(
                f"{folder}: the router was trained on features of version {card.get('features_version')}, "
                f"this suffice makes version {FEATURES_VERSION}; train it again with `suffice train router`")
        if tuple(card.get("element_features") or ()) != ELEMENT_FEATURES or \
                tuple(card.get("global_features") or ()) != GLOBAL_FEATURES:
            raise ModelFileError(f"{folder}: the router's card lists other features than this suffice "
                                 "makes (of the same version); train it again with `suffice train router`")
        self.name = "trained"
        self.model = name
        self.card = card
        self.target = str(card.get("target", "evidence"))
        """What the score predicts: the context holds all the evidence ("evidence"), or reading
        twice as wide would show no more of it ("width")."""
        if self.target not in ("evidence", "width"):
            raise ModelFileError(f"{folder}: card.json's target must be 'evidence' or 'width', "
                                 f"got {self.target!r}")
        try:
            tau = float(card.get("tau", DEFAULT_TAU))
            dim = card.get("dim", 384)
            if isinstance(dim, bool) or not isinstance(dim, int):  # 384.9 would be cut to 384
                raise TypeError(f"dim must be a whole number, got {dim!r}")
            input_budget = int(card.get("input_budget", 100_000))
            budget = int(card["budget"]) if card.get("budget") is not None else None
            k = int(card["k"]) if card.get("k") is not None else None
        except (TypeError, ValueError) as exc:
            raise ModelFileError(f"{folder}: card.json has a value of the wrong type ({exc})") from None
        if not 0.0 <= tau <= 1.0 or dim <= 0 or input_budget <= 0 or (budget is not None and budget <= 0) \
                or (k is not None and k <= 0):
            raise ModelFileError(f"{folder}: card.json needs 0 <= tau <= 1 and positive dim, input_budget, "
                                 f"budget and k (tau {tau}, dim {dim}, input_budget {input_budget}, "
                                 f"budget {budget}, k {k})")
        self.trained_budget = budget
        """The reader budget of the contexts it was trained and calibrated on (None: not recorded)."""
        self.trained_k = k
        """How many of the prefix's hits counted as its top hits in training (features ``top_hit``
        and ``top_hits_in``; None: not recorded)."""
        self.tau = tau
        """The threshold calibrated on validation conversations (the engine's default tau)."""
        self.encoder = str(card.get("encoder", ""))
        self.dim = dim
        self.input_budget = input_budget
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self._sess = onnx_session(model, opts, ("query", "vectors", "elements", "context", "mask"),
                                  "sufficiency router")
        # The graph's fixed widths against the card and this version's features: a mismatch
        # would fail every score (auto then goes deep each time) instead of failing here.
        widths = {"query": dim, "vectors": dim, "elements": len(ELEMENT_FEATURES),
                  "context": len(GLOBAL_FEATURES)}
        for inp in self._sess.get_inputs():
            want, last = widths.get(inp.name), (inp.shape or [None])[-1]
            if want is not None and isinstance(last, int) and last != want:
                raise ModelFileError(f"{folder}: the model's input {inp.name!r} is {last} wide, its card "
                                     f"and this suffice give {want}; the card does not belong to this model")
        self._lock = threading.Lock()

    def score(self, inp: RouterInput, *, ledger: Ledger | None = None,
              deadline: float | None = None) -> RouterDecision:
        t0 = time.perf_counter()
        if inp.ranking is None:
            return RouterDecision(0.0, "the trained router needs the query's ranking; going deep",
                                  _ms(t0), ok=False)
        if inp.ranking.qvec is None:  # a memory without an embedder: every vector would be zero
            return RouterDecision(0.0, "the trained router needs the store's vectors (this memory "
                                  "has no embedder); going deep", _ms(t0), ok=False)
        f = extract(inp.query, inp.ranking, inp.parts, inp.items, [h.seq for h in inp.evidence.hits],
                    inp.tokens, dim=self.dim)
        if f.query.shape[0] != self.dim:
            return RouterDecision(0.0, f"the router reads {self.dim}-d vectors, the store has "
                                  f"{f.query.shape[0]}-d; going deep", _ms(t0), ok=False)
        n = len(f.seqs)
        feed = {"query": f.query[None, :],
                "vectors": f.vectors[None, :, :] if n else np.zeros((1, 1, self.dim), np.float32),
                "elements": (f.elements[None, :, :] if n
                             else np.zeros((1, 1, len(ELEMENT_FEATURES)), np.float32)),
                "context": f.context[None, :],
                "mask": np.ones((1, n), np.float32) if n else np.zeros((1, 1), np.float32)}
        with self._lock:
            p = float(np.asarray(self._sess.run(None, feed)[0]).reshape(-1)[0])
        said = "no more evidence wider" if self.target == "width" else "all evidence here"
        return RouterDecision(p, f"trained router {self.model} (P[{said}]): {p:.3f} over {n} item(s)",
                              _ms(t0))


def shipped_router_dir() -> Path | None:
    """The router folder installed with the package, if any."""
    folder = Path(str(resources.files("suffice").joinpath("data/router")))
    return folder if (folder / "card.json").is_file() else None


def default_router(encoder: str) -> TrainedRouter | None:
    """The trained router auto mode uses by default: ``$SUFFICE_ROUTER``'s, else the shipped
    one; None when there is none, or when it read another encoder's vectors than ``encoder``
    (or ``encoder`` is '', a memory without vectors)."""
    env = os.environ.get(ROUTER_ENV)
    folder = Path(env) if env else shipped_router_dir()
    if folder is None:
        return None
    try:
        router = TrainedRouter(folder)
    except ModelFileError as exc:
        if not env:
            raise
        raise ModelFileError(f"${ROUTER_ENV}={env}: {exc}; unset it, or train one there with "
                             "`suffice train router`") from None
    if router.encoder and router.encoder != encoder:  # no embedder ('') reads no vectors
        if env and encoder:  # named on purpose, it would be passed over without a word
            warnings.warn(f"${ROUTER_ENV}={env} was trained on vectors of {router.encoder}, this memory "
                          f"has {encoder}: auto mode uses the retrieval-signal router instead",
                          stacklevel=3)
        return None
    return router
