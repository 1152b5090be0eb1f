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


def test_one_model_name_on_two_backends_is_cached_apart(tmp_path):
    """Two servers (or two weight files) may answer under one model name: each keeps its own
    answers, and the first backend's stay readable as before."""
    a = ScriptedLLM(lambda messages: "<answer>Figo</answer>", model="m")
    b = ScriptedLLM(lambda messages: "<answer>Milo</answer>", model="m")
    a.identity = "http://server-a/v1 m"  # type: ignore[attr-defined]
    b.identity = "http://server-b/v1 m"  # type: ignore[attr-defined]
    assert CachedLLM(a, tmp_path / "c.db").chat(Q).text == "<answer>Figo</answer>"
    assert CachedLLM(b, tmp_path / "c.db").chat(Q).text == "<answer>Milo</answer>"
    again = CachedLLM(a, tmp_path / "c.db")
    assert again.chat(Q).text == "<answer>Figo</answer>" and again.hits == 1 and len(a.calls) == 1


def test_an_http_model_names_its_server():
    from suffice._llm.http import OpenAIHTTP
    one = OpenAIHTTP(base_url="http://127.0.0.1:9/v1", model="m")
    two = OpenAIHTTP(base_url="http://127.0.0.1:10/v1", model="m")
    assert one.identity != two.identity and "127.0.0.1:9" in one.identity


def test_a_cache_that_cannot_keep_a_call_still_returns_the_answer(tmp_path, caplog):
    import sqlite3
    base = ScriptedLLM(lambda messages: "<answer>Figo</answer>")
    cache = CachedLLM(base, tmp_path / "c.db")
    blocker = sqlite3.connect(tmp_path / "c.db", timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")  # another process holds the file
    cache._db.execute("PRAGMA busy_timeout = 50")
    out = cache.chat(Q)
    assert out.text == "<answer>Figo</answer>" and len(base.calls) == 1
    assert "could not keep a call" in caplog.text or "unreadable" in caplog.text
    blocker.rollback()


def test_a_failed_call_is_on_the_callers_ledger_with_what_it_billed(tmp_path):
    """It vanished when the cache was in between: a degraded answer's receipt showed no call."""
    from suffice._llm.base import CallRecord

    class BillsThenFails(ScriptedLLM):
        def chat(self, messages, *, ledger=None, stage="answer", **kw):  # type: ignore[no-untyped-def]
            if ledger is not None:
                ledger.add(CallRecord("m", stage, 900, 0, 5.0, 0.00225, ok=False, error="no content"))
            raise ProviderError("a 200 reply with no content", endpoint="x", status=200)

    ledger = Ledger()
    with pytest.raises(ProviderError):
        CachedLLM(BillsThenFails("x"), tmp_path / "c.db").chat(Q, ledger=ledger)
    assert [(r.ok, r.input_tokens, r.cost_usd) for r in ledger.records] == [(False, 900, 0.00225)]


def test_a_replay_is_costed_at_the_prices_set_now(tmp_path):
    from suffice._llm import Price

    CachedLLM(ScriptedLLM("<answer>Figo</answer>"), tmp_path / "c.db").chat(Q)  # no price then
    priced = ScriptedLLM("<answer>Figo</answer>", price=Price(100.0, 100.0))
    ledger = Ledger()
    CachedLLM(priced, tmp_path / "c.db").chat(Q, ledger=ledger)
    rec = ledger.records[0]
    assert rec.cached and rec.cost_usd == pytest.approx((rec.input_tokens + rec.output_tokens) * 100 / 1e6)


@pytest.mark.parametrize("value", ["not json", "[1, 2]", '{"record": {}}',
                                   '{"text": "x", "finish_reason": "", "record": {"model": "m", "tier": 1}}'])
def test_an_entry_that_cannot_be_replayed_is_a_miss_and_is_replaced(tmp_path, value):
    """A damaged entry, or one another version wrote, crashed the call (or ask) every time."""
    import sqlite3

    base = ScriptedLLM(lambda messages: "<answer>Figo</answer>")
    cache = CachedLLM(base, tmp_path / "c.db")
    cache.chat(Q)
    con = sqlite3.connect(tmp_path / "c.db")
    con.execute("UPDATE calls SET value = ?", (value,))
    con.commit()
    con.close()
    assert cache.chat(Q).text == "<answer>Figo</answer>" and len(base.calls) == 2
    assert cache.chat(Q).text == "<answer>Figo</answer>" and len(base.calls) == 2  # replaced: replayed now


def test_a_cache_file_that_is_no_database_is_a_config_error(tmp_path):
    from suffice import ConfigError

    bad = tmp_path / "c.db"
    bad.write_text("not a database, but somebody's notes " * 100)
    with pytest.raises(ConfigError, match="model call cache"):
        CachedLLM(ScriptedLLM("x"), bad)
