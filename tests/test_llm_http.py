"""OpenAIHTTP: against a real llama.cpp server, and scripted failures on loopback."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator

import pytest
from llm_server import FakeOpenAI, Reply, chat_body, free_port, llama_server, silent_server, smollm2_path

from suffice._errors import ConfigError, ProviderError
from suffice._llm import Ledger, Message, OpenAIHTTP, Price

Q: list[Message] = [{"role": "user", "content": "What is the capital of France?"}]
YES_NO = {"yes": ["Yes", "yes"], "no": ["No", "no"]}


def fast(base_url: str, **kw: object) -> OpenAIHTTP:
    """A client with tiny backoff so retry tests stay quick."""
    args: dict[str, object] = {"model": "m", "timeout": 2.0, "retries": 2, "backoff": 0.01}
    args.update(kw)
    return OpenAIHTTP(base_url, **args)  # type: ignore[arg-type]


# -- configuration ----------------------------------------------------------------------------


def test_env_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUFFICE_LLM_BASE_URL", "http://127.0.0.1:9/v1/")
    monkeypatch.setenv("SUFFICE_LLM_MODEL", "gpt-4o-mini")
    monkeypatch.delenv("SUFFICE_LLM_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    llm = OpenAIHTTP()
    assert llm.base_url == "http://127.0.0.1:9/v1"
    assert llm.chat_url == "http://127.0.0.1:9/v1/chat/completions"
    assert llm.model == "gpt-4o-mini"
    assert llm.price == Price(0.15, 0.60)


def test_missing_config_is_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SUFFICE_LLM_BASE_URL", "OPENAI_BASE_URL", "SUFFICE_LLM_MODEL"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="SUFFICE_LLM_BASE_URL"):
        OpenAIHTTP()
    with pytest.raises(ConfigError, match="SUFFICE_LLM_MODEL"):
        OpenAIHTTP("http://127.0.0.1:9/v1")


# -- scripted server: the happy path --------------------------------------------------------------


def test_chat_uses_usage_price_and_sends_key() -> None:
    with FakeOpenAI([Reply(body=chat_body("Paris"))]) as srv:
        llm = fast(srv.base_url, api_key="sk-1", prices=Price(1.0, 2.0))
        ledger = Ledger()
        out = llm.chat(Q, max_tokens=5, stop=["\n"], stage="answer", ledger=ledger)
    assert out.text == "Paris"
    assert out.finish_reason == "stop"
    rec = out.record
    assert (rec.input_tokens, rec.output_tokens, rec.usage_counted) == (11, 3, False)
    assert rec.cost_usd == pytest.approx((11 * 1.0 + 3 * 2.0) / 1e6)
    assert rec.latency_ms > 0
    assert ledger.records == [rec]
    sent = srv.requests[0]
    assert sent["model"] == "m" and sent["max_tokens"] == 5 and sent["stop"] == ["\n"]
    assert sent["messages"] == Q
    assert srv.headers[0]["Authorization"] == "Bearer sk-1"


def test_chat_without_usage_counts_tokens() -> None:
    with FakeOpenAI([Reply(body=chat_body("Paris is the capital", usage=False))]) as srv:
        out = fast(srv.base_url).chat(Q)
    assert out.record.usage_counted is True
    assert out.record.output_tokens == 4
    assert out.record.input_tokens > 0


def test_choice_probs_sums_matching_variants() -> None:
    top = [
        {"token": "Yes", "logprob": -0.5},
        {"token": " yes", "logprob": -2.0},
        {"token": "No", "logprob": -1.0},
        {"token": "The", "logprob": -3.0},
    ]
    body = chat_body("Yes", logprobs=None)
    body["choices"][0]["logprobs"] = {"content": [{"token": "Yes", "logprob": -0.5,
                                                   "top_logprobs": top}]}
    with FakeOpenAI([Reply(body=body)]) as srv:
        ledger = Ledger()
        probs = fast(srv.base_url).choice_probs(Q, YES_NO, ledger=ledger)
        sent = srv.requests[0]
    yes = math.exp(-0.5) + math.exp(-2.0)
    no = math.exp(-1.0)
    assert probs["yes"] == pytest.approx(yes / (yes + no))
    assert probs["no"] == pytest.approx(no / (yes + no))
    assert sent["max_tokens"] == 1 and sent["logprobs"] is True and sent["top_logprobs"] == 20
    assert ledger.records[0].stage == "router"


def test_choice_probs_without_any_variant_fails() -> None:
    body = chat_body("The")
    body["choices"][0]["logprobs"] = {"content": [{"token": "The", "logprob": -0.1,
                                                   "top_logprobs": [{"token": "The", "logprob": -0.1}]}]}
    with FakeOpenAI([Reply(body=body)]) as srv:
        ledger = Ledger()
        with pytest.raises(ProviderError, match="none of the variants") as err:
            fast(srv.base_url).choice_probs(Q, YES_NO, ledger=ledger)
    assert err.value.endpoint.endswith("/chat/completions")
    assert ledger.records[0].ok is False


def test_choice_probs_when_server_sends_no_logprobs() -> None:
    with FakeOpenAI([Reply(body=chat_body("Yes"))]) as srv:
        with pytest.raises(ProviderError, match="no logprobs"):
            fast(srv.base_url).choice_probs(Q, YES_NO)


# -- failures: each must end in a ProviderError, quickly --------------------------------------------


def test_connection_refused() -> None:
    port = free_port()
    ledger = Ledger()
    t0 = time.monotonic()
    with pytest.raises(ProviderError) as err:
        fast(f"http://127.0.0.1:{port}/v1").chat(Q, ledger=ledger, stage="answer")
    assert time.monotonic() - t0 < 5
    assert err.value.endpoint == f"http://127.0.0.1:{port}/v1/chat/completions"
    assert err.value.status is None
    assert "cannot reach" in str(err.value) and "3 attempts" in str(err.value)
    assert len(ledger.records) == 1
    rec = ledger.records[0]
    assert rec.ok is False and "cannot reach" in rec.error and rec.cost_usd == 0


def test_timeout_when_server_never_answers() -> None:
    with silent_server() as url:
        llm = fast(url, timeout=0.5, retries=1)
        t0 = time.monotonic()
        with pytest.raises(ProviderError, match="no response within 0.5 s") as err:
            llm.chat(Q)
        elapsed = time.monotonic() - t0
    assert 0.9 < elapsed < 5  # two attempts of 0.5 s each
    assert err.value.endpoint.endswith("/chat/completions")


def test_500_then_success_is_retried() -> None:
    replies = [Reply(500, {"error": {"message": "boom"}}), Reply(body=chat_body("ok"))]
    with FakeOpenAI(replies) as srv:
        ledger = Ledger()
        out = fast(srv.base_url).chat(Q, ledger=ledger)
        assert len(srv.requests) == 2
    assert out.text == "ok"
    assert [r.ok for r in ledger.records] == [True]  # one logical call, one record


def test_429_is_retried_honouring_retry_after() -> None:
    replies = [Reply(429, {"error": "slow down"}, {"Retry-After": "0.2"}), Reply(body=chat_body("ok"))]
    with FakeOpenAI(replies) as srv:
        t0 = time.monotonic()
        out = fast(srv.base_url).chat(Q)
        elapsed = time.monotonic() - t0
    assert out.text == "ok"
    assert 0.2 <= elapsed < 3


def test_persistent_503_gives_up_with_status() -> None:
    with FakeOpenAI([Reply(503, "overloaded")]) as srv:
        ledger = Ledger()
        with pytest.raises(ProviderError) as err:
            fast(srv.base_url, retries=2).chat(Q, ledger=ledger)
        assert len(srv.requests) == 3
    assert err.value.status == 503
    assert "HTTP 503" in str(err.value) and "overloaded" in str(err.value)
    assert ledger.records[0].ok is False


def test_retries_stop_at_one_deadline_for_the_whole_call() -> None:
    with FakeOpenAI([Reply(503, "overloaded")]) as srv:
        llm = OpenAIHTTP(srv.base_url, model="m", timeout=0.5, retries=50, backoff=0.2)
        t0 = time.perf_counter()
        with pytest.raises(ProviderError, match="deadline"):
            llm.chat(Q)
        assert time.perf_counter() - t0 < 1.5  # 2 x timeout, not 50 retries of back-off
        assert 1 < len(srv.requests) < 10


def test_400_is_not_retried_and_shows_server_message() -> None:
    with FakeOpenAI([Reply(400, {"error": {"message": "context length exceeded"}})]) as srv:
        with pytest.raises(ProviderError, match="HTTP 400: context length exceeded") as err:
            fast(srv.base_url).chat(Q)
        assert len(srv.requests) == 1
    assert err.value.status == 400


def test_malformed_json_body() -> None:
    with FakeOpenAI([Reply(200, b"{not json")]) as srv:
        with pytest.raises(ProviderError, match="not JSON") as err:
            fast(srv.base_url).chat(Q)
    assert err.value.status == 200
    assert err.value.endpoint.endswith("/chat/completions")


def test_a_2xx_reply_that_cannot_be_used_is_still_billed() -> None:
    """The server charged for the prompt even though the body was unusable."""
    price = Price(input_per_m=1_000_000.0, output_per_m=0.0)  # $1 per input token
    body = chat_body("The")  # usage: 11 prompt tokens, 3 completion tokens
    body["choices"][0]["logprobs"] = {"content": [{"token": "The", "logprob": -0.1,
                                                   "top_logprobs": [{"token": "The", "logprob": -0.1}]}]}
    with FakeOpenAI([Reply(body=body)]) as srv:
        ledger = Ledger()
        with pytest.raises(ProviderError):
            fast(srv.base_url, prices=price).choice_probs(Q, YES_NO, ledger=ledger)
    rec = ledger.records[0]
    assert (rec.ok, rec.input_tokens, rec.output_tokens, rec.usage_counted) == (False, 11, 3, False)
    assert rec.cost_usd == pytest.approx(11.0)

    with FakeOpenAI([Reply(200, b"{not json")]) as srv:  # no usage to read: count the prompt
        ledger = Ledger()
        with pytest.raises(ProviderError):
            fast(srv.base_url, prices=price).chat(Q, ledger=ledger)
    rec = ledger.records[0]
    assert rec.ok is False and rec.usage_counted is True
    assert rec.input_tokens > 0 and rec.output_tokens == 0
    assert rec.cost_usd == pytest.approx(rec.input_tokens)


def test_a_reply_without_choices_is_billed_from_its_usage() -> None:
    body = {"object": "chat.completion", "choices": [],
            "usage": {"prompt_tokens": 42, "completion_tokens": 0}}
    with FakeOpenAI([Reply(200, body)]) as srv:
        ledger = Ledger()
        with pytest.raises(ProviderError, match="no choices"):
            fast(srv.base_url).chat(Q, ledger=ledger)
    rec = ledger.records[0]
    assert (rec.input_tokens, rec.output_tokens, rec.usage_counted) == (42, 0, False)


def test_a_refused_call_costs_nothing() -> None:
    with FakeOpenAI([Reply(400, {"error": {"message": "bad request"}})]) as srv:
        ledger = Ledger()
        with pytest.raises(ProviderError):
            fast(srv.base_url).chat(Q, ledger=ledger)
    rec = ledger.records[0]
    assert (rec.ok, rec.input_tokens, rec.output_tokens, rec.cost_usd) == (False, 0, 0, 0.0)


def test_missing_choices() -> None:
    with FakeOpenAI([Reply(200, {"object": "chat.completion", "choices": []})]) as srv:
        with pytest.raises(ProviderError, match="no choices"):
            fast(srv.base_url).chat(Q)


def test_concurrency_is_bounded() -> None:
    """With max_concurrency=2, the server never sees more than two requests at once."""
    with FakeOpenAI([Reply(body=chat_body("ok"))], delay_s=0.15) as srv:
        llm = fast(srv.base_url, max_concurrency=2)
        threads = [threading.Thread(target=llm.chat, args=(Q,)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
    assert srv.peak == 2
    assert len(srv.requests) == 6


# -- a real OpenAI-compatible server ------------------------------------------------------------


@pytest.fixture(scope="module")
def real_server() -> Iterator[str]:
    with llama_server(smollm2_path()) as url:
        yield url


@pytest.mark.llm
def test_real_server_chat_records_usage(real_server: str) -> None:
    llm = OpenAIHTTP(real_server, "smol", timeout=60, retries=0)
    ledger = Ledger()
    out = llm.chat(
        [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        max_tokens=8,
        ledger=ledger,
    )
    assert "paris" in out.text.lower()
    rec = ledger.records[0]
    assert rec.ok and not rec.usage_counted
    assert rec.input_tokens > 5 and 0 < rec.output_tokens <= 8
    assert rec.cost_usd == 0.0


@pytest.mark.llm
def test_real_server_choice_probs(real_server: str) -> None:
    llm = OpenAIHTTP(real_server, "smol", timeout=60, retries=0)
    messages: list[Message] = [
        {"role": "user", "content": "Is the sky blue on a clear day? Answer Yes or No."}
    ]
    probs = llm.choice_probs(messages, YES_NO)
    assert set(probs) == {"yes", "no"}
    assert sum(probs.values()) == pytest.approx(1.0)
    assert all(0.0 <= p <= 1.0 for p in probs.values())


def test_bad_url_is_a_provider_error() -> None:
    with pytest.raises(ProviderError, match="not a usable URL") as err:
        fast("ftp://127.0.0.1:1/v1").chat(Q)
    assert err.value.endpoint == "ftp://127.0.0.1:1/v1/chat/completions"


# -- replies are not trusted as given ----------------------------------------------------------


@pytest.mark.parametrize("content", [None, "", "  \n"])
def test_a_reply_with_no_text_is_a_failed_call_not_an_empty_answer(content: object) -> None:
    body = chat_body("x")
    body["choices"][0]["message"]["content"] = content
    with FakeOpenAI([Reply(body=body)]) as srv:
        ledger = Ledger()
        with pytest.raises(ProviderError, match="no text"):
            fast(srv.base_url).chat(Q, ledger=ledger)
    assert not ledger.records[0].ok  # billed for the prompt, marked failed


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": 10**12, "completion_tokens": 3},
    {"prompt_tokens": 11, "completion_tokens": 10**9},
    {"prompt_tokens": -5, "completion_tokens": 3},
    {"prompt_tokens": "11", "completion_tokens": 3},
])
def test_absurd_usage_is_not_billed_the_tokens_are_counted_here(usage: dict[str, object]) -> None:
    body = chat_body("Paris")
    body["usage"] = usage
    with FakeOpenAI([Reply(body=body)]) as srv:
        out = fast(srv.base_url, prices=Price(1.0, 2.0)).chat(Q)
    assert out.record.usage_counted is True
    assert out.record.input_tokens < 100 and out.record.output_tokens < 10
    assert out.record.cost_usd < 1e-3


def test_waiting_for_a_connection_slot_counts_against_the_deadline():
    """With every slot taken by other calls, a call gives up when its deadline passes, not
    when a slot frees up."""
    from suffice import DeadlineError
    llm = OpenAIHTTP("http://127.0.0.1:9/v1", model="m", max_concurrency=1, retries=0)
    llm._sem.acquire()  # another query holds the only slot...
    threading.Timer(2.0, llm._sem.release).start()  # ...for two seconds
    with pytest.raises(DeadlineError, match="free connection slot"):
        llm.chat([{"role": "user", "content": "hi"}], deadline=time.monotonic() + 0.3)


def test_a_gzipped_reply_is_read() -> None:
    """Servers behind nginx or a CDN compress their replies; every such call failed."""
    import gzip
    import json as _json

    body = gzip.compress(_json.dumps(chat_body("Lisbon")).encode())
    with FakeOpenAI([Reply(200, body, headers={"Content-Encoding": "gzip"})]) as srv:
        assert fast(srv.base_url).chat(Q).text == "Lisbon"


def test_a_reply_nested_deeper_than_the_json_reader_goes_is_a_provider_error() -> None:
    with FakeOpenAI([Reply(200, b"[" * 200_000 + b"]" * 200_000)]) as srv:
        with pytest.raises(ProviderError, match="not JSON"):
            fast(srv.base_url).chat(Q)


def test_credentials_never_reach_a_message_a_receipt_or_the_cache_identity() -> None:
    with pytest.raises(ConfigError, match="control characters") as caught:
        OpenAIHTTP(base_url="http://127.0.0.1:9/v1", model="m", api_key="sk-SECRET123\n")
    assert "SECRET" not in str(caught.value)
    with FakeOpenAI([Reply(500, {"error": {"message": "down"}})]) as srv:
        port = srv.base_url.split(":")[2].split("/")[0]
        llm = OpenAIHTTP(base_url=f"http://bob:hunter2@127.0.0.1:{port}/v1", model="m", retries=0, timeout=5)
        with pytest.raises(ProviderError) as err:
            llm.chat(Q)
        assert "hunter2" not in str(err.value) and "hunter2" not in llm.identity
        assert srv.headers[-1]["Authorization"].startswith("Basic ")  # still sent, as auth


def test_credentials_in_the_url_win_over_a_key_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-for-something-else")
    with FakeOpenAI([Reply(200, chat_body("ok"))]) as srv:
        port = srv.base_url.split(":")[2].split("/")[0]
        assert OpenAIHTTP(base_url=f"http://bob:pw@127.0.0.1:{port}/v1", model="m").chat(Q).text == "ok"
        assert srv.headers[-1]["Authorization"].startswith("Basic ")
    with pytest.raises(ConfigError, match="give the credentials once"):
        OpenAIHTTP(base_url="http://bob:pw@127.0.0.1:9/v1", model="m", api_key="sk-explicit")
