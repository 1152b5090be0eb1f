"""The LLM judge: lenient parsing, one re-ask, and never raising."""

from __future__ import annotations

import pytest

from suffice._bench.judge import JudgeVerdict, judge, parse_verdict
from suffice._errors import ProviderError
from suffice._llm import Ledger, ScriptedLLM


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


def test_judge_file_grades_every_answer_in_place_and_resumes(tmp_path) -> None:
    import json

    from suffice._bench.judge import judge_file

    path = tmp_path / "p.jsonl"
    recs = [
        {"key": "a", "question": "Q1?", "gold": "7 May 2023",
         "fast": {"answer": "May 7, 2023", "f1": 0.5}, "deep": {"answer": "June", "f1": 0.0}},
        {"key": "b", "question": "Q2?", "gold": 3, "answer": "three", "f1": 0.0},  # bench qa shape
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"key": "c", "quest')

    def grade(messages):
        return '{"score": 0' if "June" in messages[-1]["content"] else '{"score": 1, "rea'
    judge_llm = ScriptedLLM(grade, model="judge-a")
    counts = judge_file(path, judge_llm, save_every=1)
    assert counts["judged"] == 3 and counts["failed"] == 0
    out = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["key"] for r in out] == ["a", "b"]  # the cut line is dropped, nothing else
    assert (out[0]["fast"]["judge"], out[0]["deep"]["judge"], out[1]["judge"]) == (1.0, 0.0, 1.0)
    assert out[0]["fast"]["judge_model"] == "judge-a"
    assert counts["mean_judge"] == pytest.approx(100 * 2 / 3)

    # A rerun with the same judge asks nothing; another judge grades everything again.
    assert judge_file(path, judge_llm)["judged"] == 0 and len(judge_llm.calls) == 3
    assert judge_file(path, ScriptedLLM('{"score": 0.5}', model="judge-b"))["judged"] == 3


@pytest.mark.parametrize("text", ['{"schema": 1, "kind": "suffice export"}\n{"text": "a stored item"}\n',
                                  '{"key": "a", "answer": "x"}\nnot json\n{"key": "b", "answer": "y"}\n',
                                  '{"benchmark": "qa", "results": {"f1": 30.1}}\n',
                                  'hello\n'])  # one line of a note: not a record cut short
def test_judge_file_leaves_a_file_that_is_not_a_results_file_as_it_is(tmp_path, text) -> None:
    """It rewrote whatever it was given: an export lost its digest, a bad line was deleted."""
    from suffice import InvalidInputError
    from suffice._bench.judge import judge_file

    path = tmp_path / "backup.jsonl"
    path.write_text(text)
    with pytest.raises(InvalidInputError, match="left as it is"):
        judge_file(path, ScriptedLLM('{"score": 1}', model="judge-a"))
    assert path.read_text() == text


def test_judge_file_keeps_failed_verdicts_apart(tmp_path) -> None:
    import json

    from suffice._bench.judge import judge_file

    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"key": "a", "question": "Q?", "gold": "x", "answer": "y"}) + "\n")
    counts = judge_file(path, ScriptedLLM([ProviderError("down", endpoint="x")] * 3))
    rec = json.loads(path.read_text())
    assert counts["failed"] == 1 and rec["judge"] is None and "judge failed" in rec["judge_error"]
    # A rerun tries the failed verdict again.
    assert judge_file(path, ScriptedLLM('{"score": 1}'))["judged"] == 1
    # A failing second judge keeps the verdict already there.
    judge_file(path, ScriptedLLM([ProviderError("down", endpoint="x")] * 3, model="other"))
    rec = json.loads(path.read_text())
    assert rec["judge"] == 1.0 and rec["judge_model"] == "scripted" and "other" in rec["judge_error"]
