"""An LLM judge for answers whose wording differs from the reference but means the same.

Token F1 punishes a correct "7 May 2023" against a gold "May 7, 2023"; a judge model does not.
The judge is part of a benchmark run, so it must never take the run down: any failure (provider
error, unreadable output after one re-ask) becomes a verdict with ``ok=False`` and score 0,
which the report counts separately.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import OutputParseError
from ..llm.base import LLM, Ledger
from ..llm.parse import ask_parsed, extract_json
from ..prompts import JUDGE_FORMAT, judge_messages

ALLOWED_SCORES = (0.0, 0.5, 1.0)
_LOOSE_SCORE = re.compile(r"\bscore\b\W{0,4}(0\.5|1(?:\.0)?|0(?:\.0)?)(?![\d.])", re.I)


@dataclass(frozen=True, slots=True)
class JudgeVerdict:
    score: float
    """0, 0.5 or 1."""
    reason: str
    ok: bool
    """False when the judge could not be asked or read; ``score`` is then 0."""


def _as_score(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError(f"score must be 0, 0.5 or 1, got {value!r}")
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        number = float(value.strip())
    else:
        raise ValueError(f"score must be 0, 0.5 or 1, got {value!r}")
    for allowed in ALLOWED_SCORES:
        if abs(number - allowed) < 1e-9:
            return allowed
    raise ValueError(f"score must be 0, 0.5 or 1, got {value!r}")


def parse_verdict(text: str) -> tuple[float, str]:
    """(score, reason) from a judge reply: a JSON object, or failing that a 'score: x' phrase."""
    try:
        obj = extract_json(text)
    except OutputParseError:
        m = _LOOSE_SCORE.search(text)
        if m is None:
            raise
        return _as_score(m.group(1)), text.strip()[:300]
    if "score" not in obj:
        raise ValueError(f"judge reply has no 'score': {obj}")
    return _as_score(obj["score"]), str(obj.get("reason", "")).strip()


def judge(
    llm: LLM,
    question: str,
    gold: object,
    prediction: str,
    ledger: Ledger | None = None,
    *,
    stage: str = "judge",
    max_tokens: int = 128,
) -> JudgeVerdict:
    """Grade ``prediction`` against ``gold``; never raises (failures give ``ok=False``)."""
    try:
        score, reason = ask_parsed(
            llm,
            judge_messages(question, str(gold), prediction),
            parse_verdict,
            expected=JUDGE_FORMAT,
            max_tokens=max_tokens,
            temperature=0.0,
            stage=stage,
            ledger=ledger,
        )
    except Exception as exc:  # the judge must not take a benchmark run down
        return JudgeVerdict(score=0.0, reason=f"judge failed: {type(exc).__name__}: {exc}",
                            ok=False)
    return JudgeVerdict(score=score, reason=reason, ok=True)


__all__ = ["ALLOWED_SCORES", "JudgeVerdict", "judge", "parse_verdict"]
