"""Decisions: whether the prefix evidence suffices, and (later) which tier each module runs."""

from .sufficiency import LMRouter, RouterDecision, ScoreRouter, SufficiencyRouter, over_budget

__all__ = ["LMRouter", "RouterDecision", "ScoreRouter", "SufficiencyRouter", "over_budget"]
