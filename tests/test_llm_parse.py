"""Lenient answer extraction and the single re-ask."""

from __future__ import annotations

import pytest

from suffice._errors import OutputParseError, ProviderError
from suffice._llm import Ledger, Message, ScriptedLLM, ask_parsed, extract_answer, extract_json
from suffice._llm.parse import strip_fences

Q: list[Message] = [{"role": "user", "content": "q"}]


@pytest.mark.parametrize(
    ("raw", "answer"),
    [
        ("Paris", "Paris"),
        ("  Paris \n", "Paris"),
        ("Thinking... <answer>Paris</answer>", "Paris"),
        ("Format: <answer>short answer</answer>\n<answer> Paris </answer>", "Paris"),
        ("<ANSWER>Paris</ANSWER>", "Paris"),
        ("<answer>Paris", "Paris"),
        ("```\nParis\n```", "Paris"),
        ("```text\nParis\n```", "Paris"),
        ("The answer: ```Paris```", "Paris"),
        ("<answer>```\nParis\n```</answer>", "Paris"),
        # a fence inside prose is part of the answer, not all of it
        ("Run:\n```bash\npytest -x\n```\nthen fix the 3 errors it shows.",
         "Run:\n```bash\npytest -x\n```\nthen fix the 3 errors it shows."),
        ("<answer>Plan: ```1. feed Figo``` Also book the vet.</answer>",
         "Plan: ```1. feed Figo``` Also book the vet."),
    ],
)
def test_extract_answer(raw: str, answer: str) -> None:
    assert extract_answer(raw) == answer


def test_strip_fences_without_fence_is_identity() -> None:
    assert strip_fences(" plain ") == "plain"


@pytest.mark.parametrize(
    ("raw", "obj"),
    [
        ('{"score": 1, "reason": "same"}', {"score": 1, "reason": "same"}),
        ('Sure! ```json\n{"score": 0.5}\n```', {"score": 0.5}),
        ('Here: {"a": {"b": [1, 2]}, "c": "x"} trailing', {"a": {"b": [1, 2]}, "c": "x"}),
        ('{"reason": "has } and { inside", "score": 0}', {"reason": "has } and { inside", "score": 0}),
        ('{"reason": "escaped \\" quote }", "score": 1}', {"reason": 'escaped " quote }', "score": 1}),
        ('{bad} then {"score": 1}', {"score": 1}),
    ],
)
def test_extract_json(raw: str, obj: dict[str, object]) -> None:
    assert extract_json(raw) == obj


@pytest.mark.parametrize("raw", ["no json here", "{unclosed", "[1, 2]", ""])
def test_extract_json_failure(raw: str) -> None:
    with pytest.raises(OutputParseError):
        extract_json(raw)


def test_ask_parsed_first_try() -> None:
    llm = ScriptedLLM(['{"x": 1}'])
    assert ask_parsed(llm, Q, extract_json) == {"x": 1}
    assert len(llm.calls) == 1


def test_ask_parsed_reasks_once_with_the_bad_output() -> None:
    llm = ScriptedLLM(["I think it's fine", '{"x": 2}'])
    ledger = Ledger()
    out = ask_parsed(llm, Q, extract_json, expected="Reply with JSON.", stage="judge", ledger=ledger)
    assert out == {"x": 2}
    second = llm.calls[1]
    assert second[:1] == Q
    assert second[1] == {"role": "assistant", "content": "I think it's fine"}
    assert second[2]["role"] == "user" and "Reply with JSON." in second[2]["content"]
    assert [r.stage for r in ledger.records] == ["judge", "judge"]


def test_ask_parsed_gives_up_after_one_reask() -> None:
    llm = ScriptedLLM(["nope", "still nope", '{"never": "reached"}'])
    with pytest.raises(OutputParseError, match="unreadable output twice"):
        ask_parsed(llm, Q, extract_json)
    assert len(llm.calls) == 2


def test_ask_parsed_accepts_any_value_error_from_the_parser() -> None:
    llm = ScriptedLLM(["abc", "42"])
    assert ask_parsed(llm, Q, int) == 42


def test_ask_parsed_lets_provider_errors_through() -> None:
    llm = ScriptedLLM([ProviderError("down", endpoint="e", status=503)])
    with pytest.raises(ProviderError) as err:
        ask_parsed(llm, Q, extract_json)
    assert not isinstance(err.value, OutputParseError)
    assert err.value.status == 503
