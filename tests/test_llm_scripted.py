"""ScriptedLLM: the deterministic stand-in every higher-level unit test relies on."""

from __future__ import annotations

import threading
import time

import pytest

from suffice._errors import ConfigError, ProviderError
from suffice._llm import LLM, Ledger, Message, ScriptedLLM, make_llm

Q: list[Message] = [{"role": "user", "content": "hello"}]


def test_replays_in_order_and_records_calls() -> None:
    llm = ScriptedLLM(["one", "two"])
    assert llm.chat(Q).text == "one"
    assert llm.chat([{"role": "user", "content": "again"}]).text == "two"
    assert llm.calls == [Q, [{"role": "user", "content": "again"}]]
    assert llm.remaining == 0


def test_running_out_is_a_provider_error() -> None:
    llm = ScriptedLLM(["only"])
    llm.chat(Q)
    with pytest.raises(ProviderError, match="ran out of outputs after 1"):
        llm.chat(Q)


def test_scripted_exceptions_are_raised_and_recorded() -> None:
    ledger = Ledger()
    llm = ScriptedLLM([ProviderError("down", endpoint="x"), "ok"])
    with pytest.raises(ProviderError, match="down"):
        llm.chat(Q, ledger=ledger, stage="answer")
    assert llm.chat(Q, ledger=ledger).text == "ok"
    assert [r.ok for r in ledger.records] == [False, True]
    assert "down" in ledger.records[0].error


def test_function_of_messages_and_repeated_string() -> None:
    echo = ScriptedLLM(lambda msgs: msgs[-1]["content"].upper())
    assert echo.chat(Q).text == "HELLO"
    same = ScriptedLLM("fixed")
    assert [same.chat(Q).text for _ in range(3)] == ["fixed"] * 3


def test_stop_sequences_cut_the_output() -> None:
    assert ScriptedLLM(["Paris\nmore"]).chat(Q, stop=["\n"]).text == "Paris"


def test_records_tokens_and_stage() -> None:
    ledger = Ledger()
    rec = ScriptedLLM(["four token answer here"]).chat(Q, stage="deep", ledger=ledger).record
    assert rec.stage == "deep" and rec.model == "scripted" and rec.usage_counted
    assert rec.output_tokens == 4 and rec.input_tokens > 0


def test_delay_overlaps_across_threads() -> None:
    """Four calls of 0.3 s each from four threads take about 0.3 s, not 1.2 s."""
    llm = ScriptedLLM("x", delay_s=0.3)
    threads = [threading.Thread(target=llm.chat, args=(Q,)) for _ in range(4)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.monotonic() - t0 < 0.9
    assert len(llm.calls) == 4


def test_choice_probs_fixed_function_and_uniform() -> None:
    choices = {"yes": ["Yes"], "no": ["No"]}
    assert ScriptedLLM([], probs={"yes": 3.0, "no": 1.0}).choice_probs(Q, choices) == {
        "yes": 0.75, "no": 0.25}
    by_fn = ScriptedLLM([], probs=lambda m, c: {"yes": 0.2, "no": 0.8})
    assert by_fn.choice_probs(Q, choices) == pytest.approx({"yes": 0.2, "no": 0.8})
    assert ScriptedLLM([]).choice_probs(Q, choices) == {"yes": 0.5, "no": 0.5}
    llm = ScriptedLLM([], probs={"maybe": 1.0})
    with pytest.raises(ProviderError, match="no mass"):
        llm.choice_probs(Q, choices)
    assert llm.prob_calls == [Q]


def test_satisfies_the_protocol_and_factory() -> None:
    assert isinstance(ScriptedLLM([]), LLM)
    llm = make_llm("scripted", outputs=["hi"], model="fake")
    assert isinstance(llm, ScriptedLLM) and llm.model == "fake"
    assert llm.chat(Q).text == "hi"
    with pytest.raises(ConfigError, match="unknown LLM provider"):
        make_llm("nope")
