"""The call cache: a call seen before is answered from disk, on the ledger as it was, and
nothing that should differ is ever replayed."""

import pytest

from suffice import ProviderError, ScriptedLLM
from suffice._llm import Ledger
from suffice._llm.cache import CachedLLM, replayed_ms

Q = [{"role": "user", "content": "What is the name of Dana's cat?"}]


def test_a_repeated_call_is_replayed_with_its_original_record(tmp_path):
    base = ScriptedLLM(lambda messages: "<answer>Figo</answer>", delay_s=0.05)
    first = CachedLLM(base, tmp_path / "c.db").chat(Q, stage="answer")
    again = CachedLLM(base, tmp_path / "c.db")  # a new process, the same file
    ledger = Ledger()
    out = again.chat(Q, stage="aggregate", ledger=ledger)
    assert out.text == first.text and len(base.calls) == 1 and again.hits == 1
    rec = ledger.records[0]
    assert rec.cached and rec.stage == "aggregate" and rec.input_tokens == first.record.input_tokens
    assert replayed_ms(ledger.records) == rec.latency_ms >= 40


def test_other_settings_or_another_model_are_not_replayed(tmp_path):
    base = ScriptedLLM(lambda messages: "<answer>Figo</answer>")
    cache = CachedLLM(base, tmp_path / "c.db")
    cache.chat(Q)
    cache.chat(Q, max_tokens=7)
    cache.chat(Q, temperature=0.7)
    cache.chat(Q, temperature=0.7)  # sampled replies are never replayed
    assert len(base.calls) == 4
    other = ScriptedLLM(lambda messages: "<answer>Miso</answer>", model="other")
    assert CachedLLM(other, tmp_path / "c.db").chat(Q).text.endswith("Miso</answer>")


def test_a_failed_call_is_not_stored(tmp_path):
    flaky = ScriptedLLM([ProviderError("HTTP 500", endpoint="x", status=500), "<answer>Figo</answer>"])
    cache = CachedLLM(flaky, tmp_path / "c.db")
    with pytest.raises(ProviderError):
        cache.chat(Q, ledger=Ledger())
    assert cache.chat(Q).text == "<answer>Figo</answer>" and len(flaky.calls) == 2
