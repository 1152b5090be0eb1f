"""Decisions: whether the fast context suffices, and which tier each pipeline module runs."""

from .sufficiency import (
    LMRouter,
    RouterDecision,
    RouterInput,
    ScoreRouter,
    SufficiencyRouter,
    over_budget,
    router_tau,
)
from .trained import TrainedRouter, default_router

__all__ = ["LMRouter", "RouterDecision", "RouterInput", "ScoreRouter", "SufficiencyRouter", "TrainedRouter",
           "default_router", "over_budget", "router_tau"]
