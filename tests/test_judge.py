"""The LLM judge: lenient parsing, one re-ask, and never raising."""

from __future__ import annotations

import pytest

from suffice.bench.judge import JudgeVerdict, judge, parse_verdict
from suffice.errors import ProviderError
from suffice.llm import Ledger, ScriptedLLM


def test_json_verdict() -> None:
    llm = ScriptedLLM(['{"score": 1, "reason": "same date"}'])
    ledger = Ledger()
    v = judge(llm, "When?", "7 May 2023", "May 7th, 2023", ledger=ledger)
    assert v == JudgeVerdict(score=1.0, reason="same date", ok=True)
    assert ledger.by_stage()["judge"]["calls"] == 1
    # the judge saw the question, the gold and the prediction
    sent = llm.calls[0][-1]["content"]
    assert "When?" in sent and "7 May 2023" in sent and "May 7th, 2023" in sent


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ('```json\n{"score": 0.5, "reason": "partly"}\n```', 0.5),
        ('Verdict: {"score": "0", "reason": "wrong"}', 0.0),
        ('{"score": 1.0}', 1.0),
        ("score: 0.5 because half the list is there", 0.5),
    ],
)
def test_lenient_parsing(reply: str, score: float) -> None:
    assert parse_verdict(reply)[0] == score


@pytest.mark.parametrize("reply", ['{"score": 0.7}', '{"score": true}', '{"reason": "x"}', "no idea"])
def test_invalid_verdicts(reply: str) -> None:
    with pytest.raises((ValueError, ProviderError)):
        parse_verdict(reply)


def test_reasks_once_then_succeeds() -> None:
    llm = ScriptedLLM(["I would say it is right.", '{"score": 1, "reason": "ok"}'])
    v = judge(llm, "q", "a", "a")
    assert v.ok and v.score == 1.0
    assert len(llm.calls) == 2


def test_unreadable_twice_gives_not_ok() -> None:
    llm = ScriptedLLM(["hmm", '{"score": 3}'])
    v = judge(llm, "q", "a", "b")
    assert v.ok is False and v.score == 0.0 and "judge failed" in v.reason


def test_provider_failure_never_raises() -> None:
    ledger = Ledger()
    v = judge(ScriptedLLM([ProviderError("down", endpoint="e", status=503)]), "q", "a", "b",
              ledger=ledger)
    assert v.ok is False and v.score == 0.0 and "down" in v.reason
    assert ledger.records[0].ok is False
