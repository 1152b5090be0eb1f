"""One deadline per query bounds every model call: the query ends by it, answered from what it
has, and the receipt says what ran out."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from llm_server import chat_body

from suffice import DeadlineError, EngineConfig, ProviderError, ScriptedLLM
from suffice._llm import OpenAIHTTP

Q = [{"role": "user", "content": "What is the capital of France?"}]
MARGIN_S = 1.0  # thread start-up and a loaded machine; the bound itself is what is tested


def test_a_slow_reader_is_cut_off_and_the_answer_degrades(memory):
    t0 = time.monotonic()
    ans = memory.ask("What is the name of Dana's cat?", scope="dana", timeout=0.3,
                     llm=ScriptedLLM("<answer>Figo</answer>", delay_s=3.0))
    assert time.monotonic() - t0 < 0.3 + MARGIN_S
    r = ans.receipt
    assert r.degraded and r.out_of_time == ("answer",) and r.deadline_s == 0.3
    assert any("deadline of 0.3 s cut short" in n and n.endswith(": answer") for n in r.notes)
    assert ans.text == r.hits[0].item.text  # the top evidence stands in, and says so


def test_slow_block_agents_do_not_hold_the_query(memory):
    def respond(messages):
        return "<answer>Figo</answer>"
    slow_agents = ScriptedLLM(respond, delay_s=2.0)
    t0 = time.monotonic()
    ans = memory.ask("When is the Kyoto trip?", scope="dana", mode="deep", timeout=0.5, llm=slow_agents,
                     engine=EngineConfig(deep_agents=True))
    assert time.monotonic() - t0 < 0.5 + MARGIN_S
    r = ans.receipt
    assert r.degraded and "agents" in r.out_of_time
    assert r.blocks and all(not b.ok and "DeadlineError" in b.error for b in r.blocks)


def test_an_agent_that_ignores_the_deadline_is_not_waited_for(memory):
    from suffice._deep import AgentNote

    class Stubborn:
        def read(self, question, block, items, hit_seqs, *, ledger=None, deadline=None):
            time.sleep(3.0)
            return AgentNote(block.index, block.first_seq, block.last_seq, "x", "", True, 3000.0)

    t0 = time.monotonic()
    r = memory.ask("When is the Kyoto trip?", scope="dana", mode="deep", timeout=0.5, agent=Stubborn(),
                   llm=ScriptedLLM("<answer>November</answer>"),
                   engine=EngineConfig(deep_agents=True)).receipt
    assert time.monotonic() - t0 < 0.5 + MARGIN_S
    assert "agents" in r.out_of_time


def test_a_slow_router_model_is_cut_off_and_the_query_still_ends_in_time(memory):
    from suffice import LMRouter
    slow = ScriptedLLM("<answer>Figo</answer>", delay_s=2.0, probs={"yes": 1.0})
    t0 = time.monotonic()
    r = memory.ask("cat name?", scope="dana", mode="auto", router=LMRouter(slow), timeout=0.4,
                   llm=ScriptedLLM("<answer>Figo</answer>", delay_s=2.0)).receipt
    assert time.monotonic() - t0 < 0.4 + MARGIN_S
    assert "router" in r.out_of_time and r.degraded


def test_a_retrieval_that_uses_up_the_time_is_named_and_the_query_does_not_go_deep(memory, monkeypatch):
    """Out of time after the prefix, auto mode answers from the fast context it already made
    (reading wider would only spend more), and the receipt names the prefix."""
    from suffice import ScoreRouter
    from suffice._engine import Engine

    original = Engine.prefix

    def slow_prefix(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(0.4)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "prefix", slow_prefix)
    strong = ScriptedLLM("<answer>Figo</answer>", model="strong")
    r = memory.ask("What is the name of Dana's cat?", scope="dana", mode="auto", router=ScoreRouter(),
                   tau=1.0, timeout=0.3, llm=ScriptedLLM("<answer>Figo</answer>"), deep_llm=strong,
                   engine=EngineConfig(stop_reader="deep")).receipt
    assert r.path == "fast" and r.out_of_time[0] == "prefix" and r.degraded
    assert not strong.calls  # nor the deep model's answer to an early stop
    assert r.router_score is None and not r.levers  # nothing of the deep path ran
    assert any("answered from the fast context" in n for n in r.notes)


def test_no_deadline_means_none_on_the_receipt(memory):
    r = memory.ask("cat name?", scope="dana", llm=ScriptedLLM("<answer>Figo</answer>")).receipt
    assert r.deadline_s is None and r.out_of_time == () and not r.degraded
    with pytest.raises(Exception, match="timeout_s"):
        EngineConfig(timeout_s=-1.0)


@contextmanager
def trickling_server(interval_s: float = 0.5, headers: bool = False) -> Iterator[str]:
    """Sends its headers, then one byte of a JSON body every ``interval_s`` seconds; with
    ``headers``, one header line every ``interval_s`` seconds and never a body."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                sock.settimeout(0.2)
                conn, _ = sock.accept()
            except OSError:
                continue
            conn.recv(65536)
            if headers:
                try:
                    conn.sendall(b"HTTP/1.1 200 OK\r\n")
                    while not stop.is_set():
                        conn.sendall(b"X-Pad: a\r\n")
                        time.sleep(interval_s)
                except OSError:
                    pass
                conn.close()
                continue
            body = (str(chat_body("Paris")).replace("'", '"')).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         + f"Content-Length: {len(body)}\r\n\r\n".encode())
            try:
                for b in body:
                    if stop.is_set():
                        break
                    conn.sendall(bytes([b]))
                    time.sleep(interval_s)
            except OSError:
                pass
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join(timeout=3)
        sock.close()


def test_a_reply_that_trickles_in_is_cut_off_at_the_deadline():
    with trickling_server() as url:
        llm = OpenAIHTTP(url, model="m", timeout=3.0, retries=2, backoff=0.01)
        t0 = time.monotonic()
        with pytest.raises(DeadlineError, match="deadline passed while the reply was arriving"):
            llm.chat(Q, deadline=time.monotonic() + 1.5)
        assert time.monotonic() - t0 < 1.5 + MARGIN_S
        # Without a query deadline, the call's own bound (twice the timeout) still holds.
        t0 = time.monotonic()
        with pytest.raises(ProviderError, match="no complete reply within the call's deadline of 2 s"):
            OpenAIHTTP(url, model="m", timeout=1.0, retries=0).chat(Q)
        assert time.monotonic() - t0 < 2.0 + MARGIN_S


def test_headers_that_trickle_in_are_cut_off_at_the_deadline_too():
    """Each read has its own timeout, so a header line every half second held the call for as
    long as the server kept sending."""
    with trickling_server(headers=True) as url:
        llm = OpenAIHTTP(url, model="m", timeout=1.0, retries=0)
        t0 = time.monotonic()
        with pytest.raises(DeadlineError):
            llm.chat(Q, deadline=time.monotonic() + 1.5)
        assert time.monotonic() - t0 < 1.5 + MARGIN_S


def test_a_deadline_already_passed_starts_no_call():
    llm = ScriptedLLM("x")
    with pytest.raises(DeadlineError, match="before"):
        llm.chat(Q, deadline=time.monotonic() - 1)
    assert llm.calls == []


@pytest.mark.llm
def test_the_local_model_stops_generating_at_the_deadline():
    from llm_server import smollm2_path

    from suffice import LocalLlama
    llm = LocalLlama(smollm2_path())
    llm.chat(Q, max_tokens=4)  # learns this machine's speed
    t0 = time.monotonic()
    with pytest.raises(DeadlineError):
        llm.chat([{"role": "user", "content": "Write a very long story about a river."}],
                 max_tokens=2000, deadline=time.monotonic() + 0.5)
    assert time.monotonic() - t0 < 0.5 + MARGIN_S
