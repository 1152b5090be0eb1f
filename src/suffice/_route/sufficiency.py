"""Sufficiency routers: does the shared prefix's evidence already answer the query?

A router returns a score in [0, 1] and a reason; the engine stops after the prefix when the
score reaches tau. Two untrained routers live here: a zero-shot LM router that reads one
next-token distribution (no generated text), and a cheap router over retrieval signals.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .._errors import ProviderError
from .._llm.base import LLM, Ledger
from .._prompts import sufficiency_messages
from .._text import query_terms, words
from .._tokens import count_tokens
from .._types import Evidence

YES_NO: dict[str, list[str]] = {
    "yes": ["Yes", "yes", " Yes", " yes", "YES"],
    "no": ["No", "no", " No", " no", "NO"],
}
"""Surface variants of each answer token; a model may put any of them first."""


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

    def score(self, query: str, evidence: Evidence, *, ledger: Ledger | None = None,
              deadline: float | None = None) -> RouterDecision:
        """The score of ``evidence`` for ``query``; a model call must end by ``deadline``."""
        ...


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

    def score(self, query: str, evidence: Evidence, *, ledger: Ledger | None = None,
              deadline: float | None = None) -> RouterDecision:
        t0 = time.perf_counter()
        text = evidence.text
        refused = over_budget(count_tokens(text), self.input_budget, _ms(t0))
        if refused is not None:
            return refused
        try:
            probs = self.llm.choice_probs(sufficiency_messages(query, text), YES_NO,
                                          stage="router", ledger=ledger, deadline=deadline)
        except ProviderError as exc:
            return RouterDecision(0.0, f"router model failed ({exc}); going deep", _ms(t0), ok=False)
        p = float(probs.get("yes", 0.0))
        return RouterDecision(p, f"P(yes)={p:.3f} from {self.llm.model}", _ms(t0))


class ScoreRouter:
    """A baseline from retrieval signals alone: term coverage, top similarity and margin.

    score = sigmoid(w_coverage * coverage + w_dense * top cosine + w_margin * (top - second
    cosine) + bias), where coverage is the share of the query's content words found in the
    evidence. Untrained: the weights are set by hand (coverage dominates: with every query
    word found, a top cosine above 0.25 reaches 0.5). It costs no model call, which makes it the
    floor any learned router has to beat.
    """

    name = "retrieval-signals"

    def __init__(self, *, input_budget: int = 100_000, w_coverage: float = 3.0,
                 w_dense: float = 4.0, w_margin: float = 2.0, bias: float = -4.0) -> None:
        self.input_budget = input_budget
        self.w = (w_coverage, w_dense, w_margin, bias)

    def features(self, query: str, evidence: Evidence) -> dict[str, float]:
        terms = query_terms(query)
        present = set(words(evidence.text))
        coverage = sum(t in present for t in terms) / len(terms) if terms else 0.0
        dense = sorted((h.dense_score for h in evidence.hits if h.dense_score is not None),
                       reverse=True)
        top = dense[0] if dense else 0.0
        margin = (dense[0] - dense[1]) if len(dense) > 1 else 0.0
        return {"coverage": coverage, "top_dense": top, "dense_margin": margin}

    def score(self, query: str, evidence: Evidence, *, ledger: Ledger | None = None,
              deadline: float | None = None) -> RouterDecision:
        t0 = time.perf_counter()
        f = self.features(query, evidence)
        wc, wd, wm, b = self.w
        z = wc * f["coverage"] + wd * f["top_dense"] + wm * f["dense_margin"] + b
        s = 1.0 / (1.0 + math.exp(-z))
        reason = ", ".join(f"{k}={v:.2f}" for k, v in f.items())
        return RouterDecision(s, reason, _ms(t0))


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3
