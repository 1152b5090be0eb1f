"""Ledgers add up per stage across backends, threads and failures."""

from __future__ import annotations

import threading

import pytest

from suffice._errors import ProviderError
from suffice._llm import Ledger, Message, Price, ScriptedLLM

Q: list[Message] = [{"role": "user", "content": "q"}]


def test_ledger_adds_up_per_stage() -> None:
    ledger = Ledger()
    price = Price(input_per_m=1_000_000.0, output_per_m=2_000_000.0)  # $1 per input token
    llm = ScriptedLLM(["a b", "c", ProviderError("x"), "d e f"], price=price)
    llm.chat(Q, stage="router", ledger=ledger)
    llm.chat(Q, stage="answer", ledger=ledger)
    with pytest.raises(ProviderError):
        llm.chat(Q, stage="answer", ledger=ledger)
    llm.chat(Q, stage="deep", ledger=ledger)
    llm.choice_probs(Q, {"y": ["Yes"], "n": ["No"]}, stage="router", ledger=ledger)

    n_in = ledger.records[0].input_tokens  # every call sends the same prompt
    assert ledger.calls == 5
    assert ledger.output_tokens == 2 + 1 + 0 + 3 + 0
    assert ledger.input_tokens == 4 * n_in  # the failed call counts no tokens
    stages = ledger.by_stage()
    assert stages["router"]["calls"] == 2
    assert stages["router"]["output_tokens"] == 2
    assert stages["answer"]["calls"] == 2
    assert stages["answer"]["output_tokens"] == 1
    assert stages["deep"]["cost_usd"] == pytest.approx(n_in * 1.0 + 3 * 2.0)
    assert ledger.cost_usd == pytest.approx(sum(s["cost_usd"] for s in stages.values()))
    assert [r.ok for r in ledger.records] == [True, True, False, True, True]


def test_ledger_is_safe_across_threads() -> None:
    ledger = Ledger()
    llm = ScriptedLLM("x")
    threads = [
        threading.Thread(target=lambda: [llm.chat(Q, ledger=ledger) for _ in range(50)])
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ledger.calls == 200


def test_ledgers_merge() -> None:
    a, b = Ledger(), Ledger()
    ScriptedLLM("x").chat(Q, ledger=a)
    ScriptedLLM("y").chat(Q, ledger=b, stage="judge")
    a.extend(b)
    assert a.calls == 2 and set(a.by_stage()) == {"answer", "judge"}
