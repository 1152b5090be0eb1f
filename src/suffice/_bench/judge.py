"""An LLM judge for answers whose wording differs from the reference but means the same.

Token F1 punishes a correct "7 May 2023" against a gold "May 7, 2023"; a judge model does not.
The judge is part of a benchmark run, so it must never take the run down: any failure (provider
error, unreadable output after one re-ask) becomes a verdict with ``ok=False`` and score 0,
which the report counts separately.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import InvalidInputError, OutputParseError
from .._files import write_atomic
from .._llm.base import LLM, Ledger
from .._llm.parse import ask_parsed, extract_json
from .._prompts import JUDGE_FORMAT, judge_messages

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


def _answers(rec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The answer results of one record: the record itself (bench qa) or its paths (progressive)."""
    if "answer" in rec:
        yield rec
    for value in rec.values():
        if isinstance(value, dict) and "answer" in value:
            yield value


def _results_file(path: Path) -> list[dict[str, Any]]:
    """The records of a results file of bench qa or progressive; any other file is refused
    before it is rewritten (an export, a figures JSON, a note: judging would lose lines). Only
    the last line may be cut (a kill while the benchmark wrote it): its benchmark redoes it."""
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    recs: list[dict[str, Any]] = []
    for n, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines) and recs:  # a cut line after records; a lone line is no record
                continue
            raise InvalidInputError(f"{path}:{n}: not JSON; not a results file of bench qa or "
                                    "progressive, so it is left as it is") from None
        if not isinstance(rec, dict) or "key" not in rec or next(_answers(rec), None) is None:
            raise InvalidInputError(f"{path}:{n}: not a record of bench qa or progressive (a key "
                                    "and an answer); the file is left as it is")
        recs.append(rec)
    return recs


def judge_file(path: Path, llm: LLM, *, max_tokens: int = 10, save_every: int = 10,
               progress: Callable[[int], None] | None = None) -> dict[str, float]:
    """Add ``llm``'s verdict to every answer of a results JSONL (bench qa or progressive).

    Lets a stronger judge grade a run after the fact, on a machine that had no room for it
    during the run. Answers this judge model already graded are skipped (failed verdicts are
    tried again), so a rerun resumes. The file is rewritten atomically every ``save_every``
    records, so a kill loses at most those verdicts and never a record. Do not run it while a
    benchmark appends to ``path``.
    The verdict only needs the score, which the judge writes first, so ``max_tokens`` is small.
    """
    recs = _results_file(path)
    judged = failed = skipped = 0

    def save() -> None:
        write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))

    for i, rec in enumerate(recs):
        for res in _answers(rec):
            if res.get("judge_model") == llm.model and res.get("judge") is not None:
                skipped += 1
                continue
            v = judge(llm, str(rec.get("question", "")), rec.get("gold", ""), str(res["answer"]),
                      max_tokens=max_tokens)
            judged += 1
            if v.ok:
                res["judge"], res["judge_model"], res["judge_reason"] = v.score, llm.model, v.reason[:200]
                res.pop("judge_error", None)
            else:  # keep whatever verdict was there; a rerun tries again
                res.setdefault("judge", None)
                res["judge_error"] = f"{llm.model}: {v.reason[:200]}"
                failed += 1
        if (i + 1) % save_every == 0:
            save()
        if progress:
            progress(1)
    save()
    scores = [res["judge"] for r in recs for res in _answers(r) if res.get("judge") is not None]
    return {"records": len(recs), "judged": judged, "failed": failed, "skipped": skipped,
            "mean_judge": 100 * sum(scores) / len(scores) if scores else 0.0}


__all__ = ["ALLOWED_SCORES", "JudgeVerdict", "judge", "judge_file", "parse_verdict"]
