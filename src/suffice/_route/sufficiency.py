"""Sufficiency routers: does the fast context already hold what the query needs?

A router reads a :class:`RouterInput` (the context the fast reader would get, its items, the
prefix's top hits and the query's ranking) and returns a score in [0, 1] and a reason; the
engine stops after the prefix when the score reaches tau. Two untrained routers live here: a
zero-shot LM router that reads one next-token distribution (no generated text), and a cheap
router over retrieval signals. The trained router is in :mod:`suffice._route.trained`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .._errors import ProviderError
from .._llm.base import LLM, Ledger
from .._prompts import sufficiency_messages
from .._retrieve import Ranking
from .._text import query_terms, words
from .._tokens import count_tokens
from .._types import ContextPart, Evidence, Item

YES_NO: dict[str, list[str]] = {
    "yes": ["Yes", "yes", " Yes", " yes", "YES"],
    "no": ["No", "no", " No", " no", "NO"],
}
"""Surface variants of each answer token; a model may put any of them first."""


@dataclass(frozen=True, slots=True)
class RouterInput:
    """What a router reads for one query: the fast path's context and where it came from."""

    query: str
    text: str
    """The context exactly as the fast reader would read it."""
    tokens: int
    parts: tuple[ContextPart, ...]
    """The context's parts (records, pieces, raw items) and why each is there."""
    items: Mapping[int, Item]
    """The items the context shows (whole or by a piece), and the ranking's first few that it
    does not, by seq; ``parts`` says which are shown."""
    evidence: Evidence
    """The prefix's top ``k`` hits, best first (C_f)."""
    ranking: Ranking | None = field(default=None, repr=False, compare=False)
    """The query's ranking: every source's scores, the query vector, the scope's vectors."""

    @classmethod
    def of_evidence(cls, query: str, evidence: Evidence) -> RouterInput:
        """The prefix hits themselves as the context (for a caller that has only hits)."""
        text = evidence.text
        parts = tuple(ContextPart("raw", h.unit, (h.seq,), 0, f"prefix rank {h.rank + 1}", h.score)
                      for h in evidence.hits)
        return cls(query, text, count_tokens(text), parts, {h.seq: h.item for h in evidence.hits}, evidence)


@dataclass(frozen=True, slots=True)
class RouterDecision:
    score: float
    """Estimated probability that the prefix evidence suffices."""
    reason: str
    latency_ms: float
    ok: bool = True
    """False when the router could not score (over its input budget, or its model failed)."""


@runtime_checkable
class SufficiencyRouter(Protocol):
    name: str
    input_budget: int
    """Evidence above this many tokens is not scored: the engine goes deep instead."""

    def score(self, inp: RouterInput, *, ledger: Ledger | None = None,
              deadline: float | None = None) -> RouterDecision:
        """How likely ``inp.text`` suffices for ``inp.query``; a model call must end by ``deadline``."""
        ...


DEFAULT_TAU = 0.5
"""The threshold for a router that carries no calibrated one."""


def router_tau(router: object) -> float:
    """The router's own calibrated threshold (``router.tau``), else :data:`DEFAULT_TAU`."""
    tau = getattr(router, "tau", None)
    return float(tau) if isinstance(tau, int | float) and 0.0 <= tau <= 1.0 else DEFAULT_TAU


def router_identity(router: object | None) -> dict[str, Any]:
    """What a router's decisions depend on, for a benchmark's record fingerprints: its class and
    plain settings (weights of the signal router, input budget, τ, target), the model it asks,
    and a trained router's weights by their digest (a router retrained under the same name
    decides otherwise). None stands for the engine's default when no router is set."""
    if router is None:
        return {"router": None}
    plain = {k: v for k, v in sorted(vars(router).items())
             if not k.startswith("_") and (v is None or isinstance(v, bool | int | float | str | tuple))}
    card = getattr(router, "card", None)
    llm = getattr(router, "llm", None)
    return {"router": type(router).__name__, **plain, "tau": router_tau(router),
            "weights": card.get("sha256") if isinstance(card, dict) else None,
            "llm": getattr(llm, "model", None)}


def over_budget(evidence_tokens: int, input_budget: int, latency_ms: float = 0.0
                ) -> RouterDecision | None:
    """The "go deep" decision for evidence over a router's input budget, else None.

    One rule for every router: the engine applies it before any router runs, and a router that
    reads text with a model applies it itself when called directly.
    """
    if evidence_tokens <= input_budget:
        return None
    return RouterDecision(0.0, f"evidence of {evidence_tokens} tokens exceeds the router's input "
                          f"budget ({input_budget}); going deep", latency_ms, ok=False)


class LMRouter:
    """Zero-shot: P(yes) / (P(yes) + P(no)) over yes/no token variants, one forward pass."""

    name = "lm-zero-shot"

    def __init__(self, llm: LLM, *, input_budget: int = 3000) -> None:
        self.llm = llm
        self.input_budget = input_budget

    def score(self, inp: RouterInput, *, ledger: Ledger | None = None,
              deadline: float | None = None) -> RouterDecision:
        t0 = time.perf_counter()
        refused = over_budget(inp.tokens, self.input_budget, _ms(t0))
        if refused is not None:
            return refused
        try:
            probs = self.llm.choice_probs(sufficiency_messages(inp.query, inp.text), YES_NO,
                                          stage="router", ledger=ledger, deadline=deadline)
        except ProviderError as exc:
            return RouterDecision(0.0, f"router model failed ({exc}); going deep", _ms(t0), ok=False)
        p = float(probs.get("yes", 0.0))
        return RouterDecision(p, f"P(yes)={p:.3f} from {self.llm.model}", _ms(t0))


class ScoreRouter:
    """A baseline from retrieval signals alone: term coverage, top similarity and margin.

    score = sigmoid(w_coverage * coverage + w_dense * top cosine + w_margin * (top - second
    cosine) + bias), where coverage is the share of the query's content words found in the
    context. Untrained: the weights are set by hand (coverage dominates: with every query
    word found, a top cosine above 0.25 reaches 0.5). It costs no model call, which makes it the
    floor any learned router has to beat.
    """

    name = "retrieval-signals"

    def __init__(self, *, input_budget: int = 100_000, w_coverage: float = 3.0,
                 w_dense: float = 4.0, w_margin: float = 2.0, bias: float = -4.0) -> None:
        self.input_budget = input_budget
        self.w = (w_coverage, w_dense, w_margin, bias)

    def features(self, query: str, evidence: Evidence, text: str | None = None) -> dict[str, float]:
        """Coverage of the query's words by ``text`` (default: the evidence's), and the top
        hits' cosine and margin."""
        terms = query_terms(query)
        present = set(words(evidence.text if text is None else text))
        coverage = sum(t in present for t in terms) / len(terms) if terms else 0.0
        dense = sorted((h.dense_score for h in evidence.hits if h.dense_score is not None),
                       reverse=True)
        top = dense[0] if dense else 0.0
        margin = (dense[0] - dense[1]) if len(dense) > 1 else 0.0
        return {"coverage": coverage, "top_dense": top, "dense_margin": margin}

    def score(self, inp: RouterInput, *, ledger: Ledger | None = None,
              deadline: float | None = None) -> RouterDecision:
        t0 = time.perf_counter()
        f = self.features(inp.query, inp.evidence, inp.text)
        wc, wd, wm, b = self.w
        z = wc * f["coverage"] + wd * f["top_dense"] + wm * f["dense_margin"] + b
        s = 1.0 / (1.0 + math.exp(-z))
        reason = ", ".join(f"{k}={v:.2f}" for k, v in f.items())
        return RouterDecision(s, reason, _ms(t0))


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3
