"""The REST server over a real loopback socket: every route, keys bound to scopes, JSON errors
with stable codes, body limits, deadlines, and concurrent writers that lose nothing."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")

from server_utils import serving  # noqa: E402

from suffice import HashEmbedder, KeyRing, Memory, ScriptedLLM  # noqa: E402
from suffice._server.rest import ServerSettings, create_app  # noqa: E402
from suffice._server.wire import to_json, without_timings  # noqa: E402


@pytest.fixture
def mem(tmp_path):
    m = Memory(tmp_path / "m.db", embedder=HashEmbedder(),
               llm=ScriptedLLM(lambda msgs: "<answer>Lisbon</answer>"))
    m.add(["Ana moved to Lisbon in May.", "Her cat Figo came with her."], user_id="ana",
          observed_at="2025-06-01")
    m.add(["Bob lives in Porto."], user_id="bob")
    yield m
    m.close()


@pytest.fixture
def keyed(mem, tmp_path):
    ring = KeyRing(tmp_path / "keys.json")
    ana, _ = ring.create(["user:ana"])
    admin, _ = ring.create(["*"])
    with serving(create_app(mem, keys=ring)) as url:
        yield url, {"ana": {"Authorization": f"Bearer {ana}"}, "admin": {"X-API-Key": admin}}, ring


@pytest.fixture
def dev(mem):
    with serving(create_app(mem)) as url:
        yield url


def test_health_needs_no_key(keyed):
    url, _, _ = keyed
    assert httpx.get(f"{url}/v1/health").json()["status"] == "ok"


def test_every_route_answers_over_the_socket(dev, mem):
    c = httpx.Client(base_url=dev, timeout=30)
    added = c.post("/v1/items", json={"user_id": "ana", "items": [
        "She works at a bakery.", {"text": "Figo likes fish.", "id": "fig-1", "meta": {"t": 1}}]})
    assert added.status_code == 201 and [i["seq"] for i in added.json()["items"]] == [2, 3]
    msgs = c.post("/v1/messages", json={"user_id": "ana", "run_id": "chat-2", "messages": [
        {"role": "user", "content": "Remind me to buy fish."}]})
    assert msgs.status_code == 201 and msgs.json()["items"][0]["session"] == "chat-2"
    assert c.get("/v1/items/fig-1", params={"user_id": "ana"}).json()["item"]["meta"] == {"t": 1}
    listed = c.get("/v1/items", params={"user_id": "ana", "meta": '{"t": 1}'}).json()["items"]
    assert [i["id"] for i in listed] == ["fig-1"]
    assert len(c.get("/v1/items", params={"user_id": "ana", "limit": 2, "newest_first": True}
                     ).json()["items"]) == 2
    ev = c.post("/v1/search", json={"user_id": "ana", "query": "Where does Ana live?", "k": 2}).json()
    assert ev["evidence"]["hits"] and "Lisbon" in ev["evidence"]["text"]
    ctx = c.post("/v1/render", json={"user_id": "ana", "query": "cat", "budget_tokens": 200}).json()
    assert ctx["context"]["tokens"] <= 200 and ctx["context"]["parts"]
    ans = c.post("/v1/ask", json={"user_id": "ana", "question": "Where does Ana live?"}).json()["answer"]
    assert ans["text"] == "Lisbon" and ans["receipt"]["path"] == "fast" and ans["receipt"]["calls"]
    assert c.get("/v1/stats", params={"scope": "user:ana"}).json()["stats"]["items"] == 5
    assert c.get("/v1/scopes").json()["scopes"] == ["user:ana", "user:bob"]
    assert c.delete("/v1/items/fig-1", params={"user_id": "ana"}).json()["forgotten"]["items"] == 1
    gone = c.post("/v1/forget", json={"user_id": "ana", "run_id": "chat-2"}).json()["forgotten"]
    assert gone["items"] == 1 and mem.stats("user:ana").items == 3
    # Items as objects (every field sent, session "") under a run are stored in that run.
    r = c.post("/v1/items", json={"user_id": "ana", "run_id": "chat-3", "items": [{"text": "Porto, then."}]})
    assert r.status_code == 201 and r.json()["items"][0]["session"] == "chat-3", r.text
    gone = c.post("/v1/forget", json={"user_id": "ana", "run_id": "chat-3", "everything": True})
    assert gone.status_code == 200 and gone.json()["forgotten"]["items"] == 1
    # A body that names nothing to forget is refused: a client that drops a field (ids: null)
    # must not wipe a memory. The whole scope takes everything: true.
    for body in ({"user_id": "ana"}, {"user_id": "ana", "ids": None}, {"user_id": "ana", "session": ""}):
        r = c.post("/v1/forget", json=body)
        assert r.status_code == 422 and "everything: true" in r.json()["error"]["message"], (body, r.text)
    assert mem.stats("user:ana").items == 3
    refused = c.post("/v1/forget", json={"user_id": "ana", "everything": True, "ids": ["x"]})
    assert refused.status_code == 422 and mem.stats("user:ana").items == 3
    wiped = c.post("/v1/forget", json={"user_id": "ana", "everything": True}).json()["forgotten"]
    assert wiped["items"] == 3


def test_the_payload_is_the_core_result_as_json(dev, mem):
    body = httpx.post(f"{dev}/v1/search", json={"user_id": "ana", "query": "cat", "k": 2}).json()
    direct = to_json(mem.search("cat", user_id="ana", k=2))
    assert without_timings(body["evidence"]) == without_timings(direct)


def test_a_key_reads_its_scopes_and_gets_403_elsewhere(keyed):
    url, auth, _ = keyed
    c = httpx.Client(base_url=url, headers=auth["ana"])
    assert c.post("/v1/search", json={"user_id": "ana", "query": "Lisbon"}).status_code == 200
    for method, path, kw in [
        ("POST", "/v1/search", {"json": {"user_id": "bob", "query": "Porto"}}),
        ("POST", "/v1/render", {"json": {"user_id": "bob", "query": "Porto", "budget_tokens": 100}}),
        ("POST", "/v1/ask", {"json": {"user_id": "bob", "question": "Where?"}}),
        ("POST", "/v1/items", {"json": {"user_id": "bob", "items": ["planted"]}}),
        ("POST", "/v1/forget", {"json": {"user_id": "bob", "everything": True}}),
        ("GET", "/v1/items", {"params": {"user_id": "bob"}}),
        ("GET", "/v1/items/x", {"params": {"user_id": "bob"}}),
        ("DELETE", "/v1/items/x", {"params": {"user_id": "bob"}}),
        ("GET", "/v1/stats", {"params": {"scope": "user:bob"}}),
    ]:
        r = c.request(method, path, **kw)
        assert r.status_code == 403, (method, path, r.text)
        assert r.json()["error"]["code"] == "forbidden"
        assert "Porto" not in r.text
    assert c.get("/v1/scopes").json()["scopes"] == ["user:ana"]
    assert c.get("/v1/stats").json()["stats"]["items"] == 2
    admin = httpx.get(f"{url}/v1/stats", headers=auth["admin"]).json()["stats"]
    assert admin["items"] == 3


def test_no_key_or_a_wrong_or_revoked_key_is_401(keyed):
    url, auth, ring = keyed
    body = {"user_id": "ana", "query": "Lisbon"}
    for headers in ({}, {"Authorization": "Bearer sfk_nothing"}, {"Authorization": "Basic abc"}):
        r = httpx.post(f"{url}/v1/search", json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"
    ring.revoke(ring.keys()[0].key_id)
    assert httpx.post(f"{url}/v1/search", json=body, headers=auth["ana"]).status_code == 401


@pytest.mark.parametrize(("body", "code"), [
    ({"user_id": "ana", "query": ""}, "invalid_input"),
    ({"user_id": "ana", "query": "x", "k": -1}, "invalid_input"),
    ({"user_id": "ana", "query": "x", "k": 10**7}, "invalid_input"),
    ({"user_id": "ana", "query": "x", "surprise": 1}, "invalid_input"),
    ({"user_id": "nobody", "query": "x"}, "unknown_scope"),
    ({"scope": "a", "user_id": "b", "query": "x"}, "invalid_input"),
    ({"user_id": "ana", "query": "x", "since": "2025-07-01", "until": "2025-01-01"}, "invalid_input"),
])
def test_bad_requests_get_a_json_error_with_a_stable_code(dev, body, code):
    r = httpx.post(f"{dev}/v1/search", json=body)
    assert r.status_code in (404, 422) and r.json()["error"]["code"] == code
    assert set(r.json()["error"]) == {"code", "type", "message"}


def test_a_bad_add_writes_nothing(dev, mem):
    before = mem.stats().items
    r = httpx.post(f"{dev}/v1/items", json={"user_id": "ana", "items": ["fine", "   "]})
    assert r.status_code == 422 and "empty" in r.json()["error"]["message"]
    r = httpx.post(f"{dev}/v1/items", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    latin1 = '{"user_id": "ana", "items": ["caf\xe9"]}'.encode("latin-1")  # not UTF-8
    r = httpx.post(f"{dev}/v1/items", content=latin1, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_input", r.text
    assert "not UTF-8" in r.json()["error"]["message"]
    assert mem.stats().items == before


def test_a_body_over_the_limit_is_refused_unread(mem):
    app = create_app(mem, settings=ServerSettings(max_body_bytes=10_000))
    with serving(app) as url:
        big = {"user_id": "ana", "items": ["word " * 5_000]}
        r = httpx.post(f"{url}/v1/items", json=big)
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"

        def chunks():  # no Content-Length: counted while it streams
            yield b'{"user_id": "ana", "items": ["'
            for _ in range(100):
                yield b"x" * 1_000
            yield b'"]}'
        r = httpx.post(f"{url}/v1/items", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
    assert mem.stats("user:ana").items == 2


def test_a_slow_ask_answers_within_the_servers_deadline(tmp_path):
    slow = ScriptedLLM("<answer>late</answer>", delay_s=5.0)
    with Memory(tmp_path / "s.db", embedder=HashEmbedder(), llm=slow) as m:
        m.add("Ana moved to Lisbon.", user_id="ana")
        app = create_app(m, settings=ServerSettings(ask_deadline_s=0.5))
        with serving(app) as url:
            r = httpx.post(f"{url}/v1/ask", json={"user_id": "ana", "question": "Where?"}, timeout=20)
            over = httpx.post(f"{url}/v1/ask", json={"user_id": "ana", "question": "Where?", "timeout": 60})
    # The engine keeps the deadline: it answers from the evidence and says so in the receipt.
    receipt = r.json()["answer"]["receipt"]
    assert r.status_code == 200 and receipt["degraded"] and receipt["deadline_s"] == 0.5
    # A longer timeout than the server allows is refused, not quietly cut to its deadline.
    assert over.status_code == 422 and "0.5 s at most" in over.json()["error"]["message"]


def test_concurrent_writers_lose_and_double_nothing(dev, mem):
    def writer(n: int) -> None:
        with httpx.Client(base_url=dev, timeout=60) as c:
            for j in range(10):
                items = [{"text": f"writer {n} note {j} part {p}", "id": f"w{n}-{j}-{p}"} for p in range(3)]
                assert c.post("/v1/items", json={"scope": "shared", "items": items}).status_code == 201
                # the same batch again is a no-op (idempotent ids)
                assert c.post("/v1/items", json={"scope": "shared", "items": items}).status_code == 201
    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    items = mem.items(scope="shared")
    assert len(items) == 8 * 10 * 3 == len({it.id for it in items})
    assert [it.seq for it in items] == list(range(240))


def test_the_openapi_schema_lists_every_route(dev):
    paths = httpx.get(f"{dev}/openapi.json").json()["paths"]
    assert {"/v1/items", "/v1/items/{item_id}", "/v1/messages", "/v1/search", "/v1/render",
            "/v1/ask", "/v1/forget", "/v1/stats", "/v1/scopes", "/v1/health"} <= set(paths)


class SlowEmbedder(HashEmbedder):
    """Takes ``seconds`` over every batch it embeds: a write that outlasts a server deadline."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def embed(self, texts):  # type: ignore[no-untyped-def]
        time.sleep(self.seconds)
        return super().embed(texts)


def test_a_write_past_the_deadline_says_it_goes_on_and_a_resend_stores_nothing_twice(tmp_path):
    with Memory(tmp_path / "s.db", embedder=SlowEmbedder(1.0)) as m:
        with serving(create_app(m, settings=ServerSettings(deadline_s=0.2))) as url:
            body = {"user_id": "ana", "items": [{"text": "Ana moved to Lisbon.", "id": "move"}]}
            r = httpx.post(f"{url}/v1/items", json=body, timeout=20)
            assert r.status_code == 504
            assert "not stopped" in r.json()["error"]["notes"][0]
            deadline = time.monotonic() + 10
            while not m.items(user_id="ana") and time.monotonic() < deadline:
                time.sleep(0.1)  # the write finishes on its worker thread
            assert [it.id for it in m.items(user_id="ana")] == ["move"]
            again = httpx.post(f"{url}/v1/items", json=body, timeout=20)  # stored: no embedding now
            assert again.status_code == 201 and len(m.items(user_id="ana")) == 1


def test_a_keyless_server_answers_only_requests_for_a_loopback_host(dev):
    """DNS rebinding: a page's own name resolved to 127.0.0.1 reaches the socket, but its
    Host header names the page, and a server without keys refuses it."""
    for host in ("attacker.example", "attacker.example:8765", "127.0.0.1.nip.io"):
        r = httpx.get(f"{dev}/v1/items", params={"user_id": "ana"}, headers={"Host": host})
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    port = dev.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}"):
        assert httpx.get(f"{dev}/v1/health", headers={"Host": host}).status_code == 200


def test_a_keyed_server_does_not_depend_on_the_host_header(keyed):
    url, headers, _ = keyed
    r = httpx.get(f"{url}/v1/items", params={"user_id": "ana"},
                  headers={**headers["ana"], "Host": "memory.example.com"})
    assert r.status_code == 200  # behind a proxy the name is the proxy's: keys guard it


def test_stats_names_its_scope_like_every_other_route(dev):
    c = httpx.Client(base_url=dev, timeout=30)
    by_id = c.get("/v1/stats", params={"user_id": "ana"}).json()["stats"]
    assert by_id["items"] == 2 and by_id["scopes"] == 1  # user:ana, not the whole store
    assert c.get("/v1/stats", params={"scope": "user:ana "}).json()["stats"]["items"] == 2  # normalised
    assert c.get("/v1/stats").json()["stats"]["items"] == 3


def test_an_unreadable_key_file_refuses_callers_without_naming_it(keyed, caplog):
    url, headers, ring = keyed
    ring.path.write_text("{not json")
    r = httpx.get(f"{url}/v1/items", params={"user_id": "ana"}, headers=headers["ana"])
    assert r.status_code == 401 and str(ring.path) not in r.text
    assert "cannot read the key file" in caplog.text


def test_a_write_queued_behind_others_still_runs_when_its_deadline_passes(tmp_path):
    """A queued write was cancelled at its deadline, while its 504 said that it completes."""
    from suffice import AsyncMemory

    with Memory(tmp_path / "s.db", embedder=SlowEmbedder(0.6)) as m:
        one_thread = AsyncMemory(m, workers=1)
        with serving(create_app(one_thread, settings=ServerSettings(deadline_s=0.2))) as url:
            def write(name: str) -> int:
                body = {"user_id": "ana", "items": [{"text": f"note {name}", "id": name}]}
                return httpx.post(f"{url}/v1/items", json=body, timeout=20).status_code
            threads = [threading.Thread(target=write, args=(n,)) for n in ("first", "queued")]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            deadline = time.monotonic() + 10
            while len(m.items(user_id="ana")) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert sorted(it.id for it in m.items(user_id="ana")) == ["first", "queued"]


def test_slow_asks_do_not_hold_up_other_callers_reads(tmp_path):
    """Every route shared four threads: four slow asks made every other request wait."""
    slow = ScriptedLLM("<answer>late</answer>", delay_s=2.0)
    with Memory(tmp_path / "s.db", embedder=HashEmbedder(), llm=slow) as m:
        m.add("Ana moved to Lisbon.", user_id="ana")
        m.add("Bob lives in Porto.", user_id="bob")
        with serving(create_app(m, settings=ServerSettings(deadline_s=1.5, ask_deadline_s=30))) as url:
            asks = [threading.Thread(target=httpx.post, args=(f"{url}/v1/ask",), kwargs={
                "json": {"user_id": "ana", "question": "Where?"}, "timeout": 30}) for _ in range(4)]
            for t in asks:
                t.start()
            time.sleep(0.2)
            r = httpx.get(f"{url}/v1/items", params={"user_id": "bob"}, timeout=30)
            for t in asks:
                t.join()
    assert r.status_code == 200 and r.json()["items"][0]["text"] == "Bob lives in Porto."


def test_an_id_with_a_slash_is_read_and_deleted_by_its_url(dev, mem):
    c = httpx.Client(base_url=dev, timeout=30)
    c.post("/v1/items", json={"user_id": "ana", "items": [{"text": "Turn three.", "id": "conv-1/turn-3"}]})
    got = c.get("/v1/items/conv-1%2Fturn-3", params={"user_id": "ana"})
    assert got.json()["item"]["text"] == "Turn three."
    assert c.delete("/v1/items/conv-1/turn-3", params={"user_id": "ana"}).json()["forgotten"]["items"] == 1


def test_meta_nested_past_what_json_readers_take_is_refused_before_anything_is_stored(dev, mem):
    deep: dict[str, object] = {"leaf": 1}
    for _ in range(300):
        deep = {"a": deep}
    c = httpx.Client(base_url=dev, timeout=30)
    r = c.post("/v1/items", json={"user_id": "ana", "items": [{"text": "deep", "meta": deep}]})
    assert r.status_code == 422 and "nested" in r.json()["error"]["message"]
    assert c.get("/v1/items", params={"user_id": "ana"}).status_code == 200  # the scope still reads
    r = c.get("/v1/items", params={"user_id": "ana", "meta": '{"a":' * 3000 + "1" + "}" * 3000})
    assert r.status_code == 422


def test_an_error_naming_where_the_server_keeps_its_models_hides_the_path(tmp_path, monkeypatch):
    missing = tmp_path / "secret-models" / "tiers"
    monkeypatch.setenv("SUFFICE_TIERS", str(missing))
    with Memory(tmp_path / "s.db", embedder=HashEmbedder(), llm=ScriptedLLM("<answer>x</answer>")) as m:
        m.add("Ana moved to Lisbon.", user_id="ana")
        with serving(create_app(m)) as url:
            body = {"user_id": "ana", "question": "Where?", "tiered": True, "mode": "deep"}
            r = httpx.post(f"{url}/v1/ask", json=body, timeout=30)
    assert r.status_code == 500 and "secret-models" not in r.text, r.text


def test_item_objects_take_the_calls_fields_they_do_not_name_as_strings_do(dev, mem):
    """An object item used to lose the call's session, agent and meta to the model's defaults:
    stored under no session, a forget of the session left it behind."""
    r = httpx.post(f"{dev}/v1/items", json={
        "user_id": "cy", "agent_id": "x", "session": "chat-42", "meta": {"src": "app"},
        "items": ["plain", {"text": "as object", "id": "p1"}, {"text": "own session", "session": "s2"}]})
    assert r.status_code == 201, r.text
    got = {it.text: it for it in mem.items(user_id="cy", agent_id="x")}
    assert got["as object"].session == got["plain"].session == "chat-42"
    assert got["as object"].agent == "x" and got["as object"].meta == {"src": "app"}
    assert got["own session"].session == "s2"  # a field the item names is its own
    assert httpx.get(f"{dev}/v1/items/p1", params={"user_id": "cy", "agent_id": "x"}).status_code == 200


def test_fields_must_have_their_json_type_not_one_that_converts(dev, mem):
    """`"everything": "yes"` passed as true and forgot the whole scope."""
    for route, body in (("forget", {"user_id": "ana", "everything": "yes"}),
                        ("search", {"user_id": "ana", "query": "Lisbon", "k": True}),
                        ("render", {"user_id": "ana", "query": "Lisbon", "budget_tokens": "300"})):
        r = httpx.post(f"{dev}/v1/{route}", json=body)
        assert r.status_code == 422, (route, r.text)
    assert len(mem.items(user_id="ana")) == 2


def test_a_whole_number_written_as_a_float_is_a_number_as_json_schema_reads_it(dev):
    r = httpx.post(f"{dev}/v1/search", json={"user_id": "ana", "query": "Lisbon", "k": 5.0})
    assert r.status_code == 200, r.text
    r = httpx.post(f"{dev}/v1/search", json={"user_id": "ana", "query": "Lisbon", "k": 5.5})
    assert r.status_code == 422
