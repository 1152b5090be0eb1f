"""Decisions: whether the prefix evidence suffices, and (later) which tier each module runs."""

from .sufficiency import LMRouter, RouterDecision, ScoreRouter, SufficiencyRouter

__all__ = ["LMRouter", "RouterDecision", "ScoreRouter", "SufficiencyRouter"]
