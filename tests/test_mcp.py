"""The MCP server, driven by the MCP SDK's own client: over stdio against `suffice mcp` run as
a subprocess (the way Claude Desktop and other clients launch it), over streamable HTTP on
loopback, and in-process for the parts that need no process."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

mcp = pytest.importorskip("mcp")

from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402
from mcp_types import CallToolResult  # noqa: E402

from suffice import HashEmbedder, Memory  # noqa: E402
from suffice._llm import ScriptedLLM  # noqa: E402
from suffice._server.mcp import ASK_DEADLINE_S, MAX_BUDGET, LazyModel, build_mcp_server  # noqa: E402
from suffice._server.wire import to_json, without_timings  # noqa: E402

TOOLS = {"remember", "recall", "ask", "list", "forget", "fit"}
REPLY = "Figo, a grey cat."
QUESTION = "What is the name of Dana's cat?"


def server_args(db: Path, *extra: str) -> list[str]:
    return ["-m", "suffice._cli", "mcp", "--db", str(db), "--provider", "scripted", "--model", REPLY,
            *extra]


def stdio(db: Path, *extra: str) -> Client:
    return Client(StdioServerParameters(command=sys.executable, args=server_args(db, *extra),
                                        cwd=str(db.parent)))


def run(main: Any, seconds: float = 90.0) -> None:
    async def bounded() -> None:
        with anyio.fail_after(seconds):
            await main()
    anyio.run(bounded)


def error_text(result: CallToolResult) -> str:
    assert result.is_error, result
    assert result.structured_content is None
    return result.content[0].text  # type: ignore[union-attr]


def ok(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert result.structured_content is not None
    # Clients that read only text get the same JSON.
    assert json.loads(result.content[0].text) == result.structured_content  # type: ignore[union-attr]
    return result.structured_content


DANA = [
    "Dana adopted a grey cat named Figo last spring.",
    {"text": "I moved to Lisbon for the new job.", "speaker": "Dana", "id": "move",
     "observed_at": "2023-05-08T10:00:00Z", "meta": {"topic": "home"}},
    {"role": "user", "name": "Dana", "content": "Figo knocked my coffee over again this morning."},
    {"role": "assistant", "content": "",
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "note", "arguments": "{\"pet\": \"Figo\"}"}}]},
]


def test_stdio_session_remember_list_recall_ask_forget(tmp_path: Path, embedder: Any) -> None:
    db = tmp_path / "mcp.db"

    async def main() -> None:
        async with stdio(db) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == TOOLS
            for t in tools.values():
                assert t.description and t.input_schema["type"] == "object"
                assert t.output_schema is not None and t.output_schema["type"] == "object"
            budget = tools["recall"].input_schema["properties"]["budget_tokens"]
            assert budget["maximum"] == MAX_BUDGET and budget["minimum"] == 1
            assert tools["ask"].input_schema["required"] == ["question"]
            assert tools["forget"].annotations.destructive_hint is True  # type: ignore[union-attr]
            assert tools["recall"].annotations.read_only_hint is True  # type: ignore[union-attr]

            stored = ok(await client.call_tool("remember", {"items": DANA, "scope": "dana"}))["items"]
            assert [it["kind"] for it in stored] == ["message", "message", "message", "tool_call"]
            assert [it["seq"] for it in stored] == [0, 1, 2, 3]
            assert stored[1]["id"] == "move" and stored[1]["meta"] == {"topic": "home"}
            assert stored[2]["speaker"] == "Dana" and stored[2]["role"] == "user"
            again = ok(await client.call_tool("remember", {"items": [DANA[1]], "scope": "dana"}))
            assert again["items"] == [stored[1]]  # a client id makes it idempotent
            ok(await client.call_tool("remember", {"items": ["Eve keeps bees."], "scope": "eve"}))

            listed = ok(await client.call_tool("list", {"scope": "dana"}))["items"]
            assert listed == stored
            page = ok(await client.call_tool("list", {"scope": "dana", "offset": 1, "limit": 2,
                                                      "newest_first": True}))["items"]
            assert [it["seq"] for it in page] == [2, 1]
            only = ok(await client.call_tool("list", {"scope": "dana", "meta": {"topic": "home"}}))
            assert [it["id"] for it in only["items"]] == ["move"]

            ctx = ok(await client.call_tool("recall", {"query": "the cat's name", "scope": "dana",
                                                       "budget_tokens": 300}))["context"]
            assert "Figo" in ctx["text"] and 0 < ctx["tokens"] <= 300 and ctx["budget"] == 300
            assert ctx["parts"] and all(p["reason"] for p in ctx["parts"])

            answer = ok(await client.call_tool("ask", {"question": QUESTION, "scope": "dana"}))["answer"]
            assert answer["text"] == REPLY
            receipt = answer["receipt"]
            assert receipt["model"].startswith("scripted-") and receipt["path"] == "fast"
            assert receipt["question"] == QUESTION and receipt["scope"] == "dana"
            assert [c["stage"] for c in receipt["calls"]] == ["answer"]
            assert any("Figo" in h["item"]["text"] for h in receipt["hits"])

            # The same calls through the Python API, on the store the server is serving, give
            # the same JSON (the wire shape the REST server sends too), measured times aside.
            mem = Memory(db, embedder=embedder)
            try:
                assert listed == to_json(mem.items(scope="dana"))
                same = mem.render("the cat's name", 300, scope="dana")
                assert without_timings(ctx) == without_timings(to_json(same))
                same_answer = mem.ask(QUESTION, scope="dana", llm=ScriptedLLM(REPLY, model=receipt["model"]),
                                      timeout=ASK_DEADLINE_S)  # the server's default
                assert without_timings(answer) == without_timings(to_json(same_answer))
            finally:
                mem.close()

            # Errors are tool results naming the suffice error; the server keeps serving.
            text = error_text(await client.call_tool("recall", {"query": "x", "scope": "nobody"}))
            assert text == "UnknownScopeError: unknown scope 'nobody': it holds no items"
            text = error_text(await client.call_tool("remember", {"items": ["  "], "scope": "dana"}))
            assert text.startswith("InvalidItemError: item 0") and "text is empty" in text
            text = error_text(await client.call_tool("list", {"scope": "dana", "user_id": "dana"}))
            assert text.startswith("InvalidQueryError: give scope or user_id")
            text = error_text(await client.call_tool("recall", {"query": "x", "scope": "dana",
                                                                "budget_tokens": MAX_BUDGET + 1}))
            assert text == "InvalidInputError: budget_tokens: Input should be less than or equal to 200000"
            text = error_text(await client.call_tool("remember", {"items": "not a list", "scope": "dana"}))
            assert text.startswith("InvalidInputError: items: ") and "\n" not in text
            text = error_text(await client.call_tool("forget", {"scope": "dana"}))
            assert text.startswith("InvalidQueryError: say what to forget")

            gone = ok(await client.call_tool("forget", {"scope": "dana", "ids": ["move"]}))["forgotten"]
            assert gone["scope"] == "dana" and gone["items"] == 1 and gone["pieces"] >= 1
            left = ok(await client.call_tool("list", {"scope": "dana"}))["items"]
            assert [it["id"] for it in left] == [stored[i]["id"] for i in (0, 2, 3)]
            wiped = ok(await client.call_tool("forget", {"scope": "eve", "everything": True}))
            assert wiped["forgotten"]["items"] == 1
            assert ok(await client.call_tool("list", {"scope": "eve"}))["items"] == []

    run(main)


def test_a_scope_bound_server_refuses_other_scopes(tmp_path: Path, embedder: Any) -> None:
    db = tmp_path / "bound.db"
    mem = Memory(db, embedder=embedder)
    mem.add("Dana's secret.", scope="dana")
    mem.add("Eve's secret.", scope="eve")
    mem.close()

    async def main() -> None:
        async with stdio(db, "--scope", "dana") as client:
            # One bound scope is the default of calls that name none.
            mine = ok(await client.call_tool("list", {}))["items"]
            assert [it["text"] for it in mine] == ["Dana's secret."]
            ok(await client.call_tool("remember", {"items": ["More of Dana."]}))
            for tool, args, asked in [
                    ("list", {"scope": "eve"}, "eve"),
                    ("recall", {"query": "secret", "scope": "eve"}, "eve"),
                    ("ask", {"question": "What is the secret?", "scope": "eve"}, "eve"),
                    ("remember", {"items": ["x"], "scope": "eve"}, "eve"),
                    ("forget", {"scope": "eve", "everything": True}, "eve"),
                    ("list", {"user_id": "dana"}, "user:dana")]:
                # The message names the scope asked for, never the ones granted.
                assert error_text(await client.call_tool(tool, args)) == (
                    f"AccessDeniedError: access to scope '{asked}' is not granted"), tool

    run(main)
    mem = Memory(db, embedder=embedder)
    try:
        assert [it.text for it in mem.items(scope="eve")] == ["Eve's secret."]  # nothing reached it
        assert [it.text for it in mem.items(scope="dana")] == ["Dana's secret.", "More of Dana."]
    finally:
        mem.close()


def test_stdout_carries_only_the_protocol(tmp_path: Path) -> None:
    """Everything on stdout is JSON-RPC: start-up lines, warnings and logs go to stderr."""
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "remember", "arguments": {"items": ["hello"], "scope": "s"}}},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "recall", "arguments": {"query": "x", "scope": "missing"}}},
    ]
    proc = subprocess.Popen([sys.executable, *server_args(tmp_path / "raw.db")], cwd=tmp_path,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines: list[str] = []
    try:
        assert proc.stdin is not None and proc.stdout is not None
        for m in messages:  # one at a time, each answered before the next is sent
            proc.stdin.write(json.dumps(m) + "\n")
            proc.stdin.flush()
            if "id" in m:
                lines.append(proc.stdout.readline())
        rest, stderr = proc.communicate(timeout=60)  # closes stdin: the server then exits
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines += rest.splitlines()
    replies = [json.loads(line) for line in lines if line.strip()]
    assert [r["id"] for r in replies] == [1, 2, 3]
    assert replies[0]["result"]["serverInfo"]["name"] == "suffice"
    assert replies[1]["result"]["structuredContent"]["items"][0]["text"] == "hello"
    assert replies[2]["result"]["isError"] is True
    assert "serving over stdio" in stderr
    assert proc.returncode == 0


@contextlib.contextmanager
def http_server(db: Path, *extra: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`suffice mcp --transport http --port 0` as a subprocess: its announced URL, and it."""
    proc = subprocess.Popen([sys.executable, *server_args(db, "--transport", "http", "--port", "0", *extra)],
                            cwd=db.parent, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        url = ""
        deadline = time.monotonic() + 60
        while not url and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            if "streamable HTTP on " in line:
                url = line.split("streamable HTTP on ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp"), url
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_streamable_http_on_loopback(tmp_path: Path) -> None:
    with http_server(tmp_path / "http.db") as (url, proc):
        async def main() -> None:
            async with Client(url) as client:
                assert {t.name for t in (await client.list_tools()).tools} == TOOLS
                ok(await client.call_tool("remember", {"items": ["Dana's cat is Figo."], "scope": "d"}))
                ctx = ok(await client.call_tool("recall", {"query": "cat", "scope": "d",
                                                           "budget_tokens": 100}))["context"]
                assert "Figo" in ctx["text"]
                answer = ok(await client.call_tool("ask", {"question": "Whose cat?", "scope": "d"}))
                assert answer["answer"]["text"] == REPLY
                assert error_text(await client.call_tool("list", {"scope": "d", "user_id": "x"}))

        run(main)
        assert proc.poll() is None  # still serving


def _post_status(url: str, token: str | None) -> int:
    """HTTP status of a bare initialize POST (401 is the bearer middleware's refusal)."""
    import urllib.error
    import urllib.request
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"}}}).encode()
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "content-type": "application/json", "accept": "application/json, text/event-stream",
        **({"authorization": f"Bearer {token}"} if token else {})})
    try:  # the URL is announced once the socket listens: no retry needed
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def keyed(url: str, token: str) -> Client:
    """An SDK client of the streamable HTTP server at ``url`` that sends ``token`` as its key."""
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    return Client(streamable_http_client(url, http_client=create_mcp_http_client(
        headers={"Authorization": f"Bearer {token}"})))


def test_streamable_http_with_keys_gives_each_key_its_scopes(tmp_path: Path) -> None:
    from suffice._access import KeyRing
    ring = KeyRing(tmp_path / "keys.json")
    key_a, a = ring.create(["team:a"], "a")
    key_b, _ = ring.create(["team:b"], "b")
    with http_server(tmp_path / "keyed.db", "--keys", str(tmp_path / "keys.json")) as (url, _):
        assert _post_status(url, None) == 401
        assert _post_status(url, "sk-not-a-key") == 401
        assert 200 <= _post_status(url, key_a) < 300

        async def main() -> None:
            async with keyed(url, key_a) as ca:
                ok(await ca.call_tool("remember", {"items": ["Dana's cat is Figo."]}))  # team:a, by default
                assert "Figo" in ok(await ca.call_tool("recall", {"query": "cat", "budget_tokens": 100}))[
                    "context"]["text"]
                assert "AccessDeniedError" in error_text(await ca.call_tool("list", {"scope": "team:b"}))
            async with keyed(url, key_b) as cb:
                assert ok(await cb.call_tool("list", {}))["items"] == []
                assert "AccessDeniedError" in error_text(await cb.call_tool("recall", {
                    "query": "cat", "scope": "team:a"}))
                assert "AccessDeniedError" in error_text(await cb.call_tool("forget", {
                    "scope": "team:a", "everything": True}))

        run(main)
        assert ring.revoke(a.key_id)
        assert _post_status(url, key_a) == 401  # refused from the next request on
        assert 200 <= _post_status(url, key_b) < 300


def test_a_key_on_a_scope_bound_server_reaches_what_both_allow(tmp_path: Path) -> None:
    from suffice._access import KeyRing
    ring = KeyRing(tmp_path / "keys.json")
    admin, _ = ring.create(["*"], "admin")
    other, _ = ring.create(["team:b"], "b")
    with http_server(tmp_path / "bound.db", "--scope", "team:a", "--keys", str(tmp_path / "keys.json")) \
            as (url, _):
        async def main() -> None:
            async with keyed(url, admin) as c:  # "*" on a server bound to team:a: team:a, as default
                ok(await c.call_tool("remember", {"items": ["Dana's cat is Figo."]}))
                assert len(ok(await c.call_tool("list", {"scope": "team:a"}))["items"]) == 1
                assert "AccessDeniedError" in error_text(await c.call_tool("list", {"scope": "team:b"}))
            async with keyed(url, other) as c:  # no overlap with the binding: refused, with the reason
                assert "outside the scopes this server is bound to" in error_text(
                    await c.call_tool("list", {"scope": "team:b"}))

        run(main)


@pytest.mark.parametrize(("args", "message"), [
    (("--transport", "http", "--host", "0.0.0.0"), "binds loopback only"),
    (("--keys", "keys.json"), "needs --transport http"),
    (("--transport", "carrier-pigeon"), "unknown transport"),
    (("--provider", "psychic"), "unknown provider"),
])
def test_cli_refuses_bad_options_before_opening_the_store(tmp_path: Path, args: tuple[str, ...],
                                                          message: str) -> None:
    from typer.testing import CliRunner

    from suffice._cli import app
    r = CliRunner().invoke(app, ["mcp", "--db", str(tmp_path / "never.db"), *args])
    assert r.exit_code == 2 and message in r.output
    assert not (tmp_path / "never.db").exists()


# -- in process: no subprocess, a hashing embedder ------------------------------------------------

def test_the_model_is_built_on_the_first_ask_only(tmp_path: Path) -> None:
    built: list[ScriptedLLM] = []

    def factory() -> ScriptedLLM:
        built.append(ScriptedLLM("an answer"))
        return built[-1]

    mem = Memory(tmp_path / "lazy.db", embedder=HashEmbedder())
    lazy = LazyModel(factory)
    server = build_mcp_server(mem, llm=lazy)

    async def main() -> None:
        async with Client(server) as client:
            ok(await client.call_tool("remember", {"items": ["one fact"], "scope": "s"}))
            ok(await client.call_tool("recall", {"query": "fact", "scope": "s"}))
            ok(await client.call_tool("list", {"scope": "s"}))
            assert not built and not lazy.loaded
            refused = await client.call_tool("ask", {"question": "What fact?", "scope": "nobody"})
            assert error_text(refused).startswith("UnknownScopeError") and not built
            for _ in range(2):
                assert ok(await client.call_tool("ask", {"question": "What fact?", "scope": "s"})
                          )["answer"]["text"] == "an answer"
            assert len(built) == 1 and len(built[0].calls) == 2

    try:
        run(main, 30)
    finally:
        mem.close()


def test_prefix_binding_and_no_default_scope_for_several(tmp_path: Path) -> None:
    mem = Memory(tmp_path / "prefix.db", embedder=HashEmbedder())
    mem.add("red notes", scope="team:red")
    mem.add("blue notes", scope="team:blue")
    mem.add("private", scope="ceo")
    server = build_mcp_server(mem, scopes=["team:*", "ops"], llm=ScriptedLLM("x"))

    async def main() -> None:
        async with Client(server) as client:
            for scope in ("team:red", "team:blue"):
                assert ok(await client.call_tool("list", {"scope": scope}))["items"]
            assert error_text(await client.call_tool("list", {"scope": "ceo"})).startswith(
                "AccessDeniedError")
            # Two patterns: no default scope, so a call naming none asks for 'default'.
            assert error_text(await client.call_tool("list", {})) == (
                "AccessDeniedError: access to scope 'default' is not granted")
            text = error_text(await client.call_tool("forget", {"scope": "team:red", "everything": True,
                                                                "ids": ["a"]}))
            assert text.startswith("InvalidQueryError: everything=true")
            assert ok(await client.call_tool("list", {"scope": "team:red"}))["items"]

    try:
        run(main, 30)
    finally:
        mem.close()
    assert Memory(tmp_path / "prefix.db", embedder=HashEmbedder()).items(scope="ceo")[0].text == "private"


def test_empty_optional_arguments_do_not_narrow_forget_everything(tmp_path: Path) -> None:
    """Clients fill optional arguments with "" and []; with everything=true those must not turn
    a whole-scope forget into one of the unnamed session (or of no ids) reported as done."""
    mem = Memory(tmp_path / "empty.db", embedder=HashEmbedder())
    server = build_mcp_server(mem, llm=ScriptedLLM("x"))

    async def main() -> None:
        async with Client(server) as client:
            for filler in ({"session": ""}, {"ids": []}, {"session": "", "ids": []}):
                mem.add(["plain note", {"text": "chat turn", "session": "chat-7"}], scope="s")
                ok(await client.call_tool("forget", {"scope": "s", "everything": True, **filler}))
                assert ok(await client.call_tool("list", {"scope": "s"}))["items"] == [], filler
            text = error_text(await client.call_tool("forget", {"scope": "s", "session": "", "ids": []}))
            assert text.startswith("InvalidQueryError: say what to forget")

    try:
        run(main, 30)
    finally:
        mem.close()


def test_slow_asks_do_not_hold_up_reads_and_every_ask_has_a_deadline(tmp_path: Path, monkeypatch) -> None:
    """Four questions to a slow model and then a list: the list answers first (asks have slots
    of their own), and an ask that names no timeout gets the server's default one."""
    from suffice._server import mcp as mcp_module
    mem = Memory(tmp_path / "slow.db", embedder=HashEmbedder())
    mem.add("Dana adopted a grey cat named Figo.", scope="dana")
    seen: list[float | None] = []
    real_ask = Memory.ask

    def ask(self: Memory, *args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("timeout"))
        return real_ask(self, *args, **kwargs)

    monkeypatch.setattr(Memory, "ask", ask)
    server = build_mcp_server(mem, llm=ScriptedLLM(REPLY, delay_s=1.5))
    done: list[str] = []

    async def main() -> None:
        async with Client(server) as client:
            async def one(tool: str, args: dict[str, Any]) -> None:
                ok(await client.call_tool(tool, args))
                done.append(tool)

            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(one, "ask", {"scope": "dana", "question": QUESTION})
                await anyio.sleep(0.3)
                tg.start_soon(one, "list", {"scope": "dana"})

    try:
        run(main, 60)
    finally:
        mem.close()
    assert done[0] == "list" and done.count("ask") == 4
    assert seen == [mcp_module.ASK_DEADLINE_S] * 4


def test_a_store_error_does_not_tell_the_client_where_the_store_lives(tmp_path: Path) -> None:
    import sqlite3

    from suffice import StoreError
    from suffice._server.wire import error_json
    from suffice._store.sqlite import SQLiteStore
    db = tmp_path / "hidden-place.db"
    mem = Memory(SQLiteStore(str(db), busy_timeout_s=0.3, max_retries=1), embedder=HashEmbedder())
    mem.add(["x"], scope="s")
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    server = build_mcp_server(mem, llm=ScriptedLLM("ok"))

    async def main() -> None:
        async with Client(server) as client:
            text = error_text(await client.call_tool("remember", {"items": ["y"], "scope": "s"}))
            assert text.startswith("StoreError: store <store>") and "hidden-place" not in text

    try:
        run(main, 30)
    finally:
        other.execute("ROLLBACK")
        mem.close()
    exc = StoreError(f"store {db}: locked")
    exc.add_note(f"see {db}")
    assert "hidden-place" not in json.dumps(error_json(exc, hide=(str(db),)))


def test_an_argument_a_tool_does_not_take_is_refused_not_dropped(tmp_path: Path) -> None:
    """Dropped silently, a misspelt `userId` wrote to the shared scope and `agent_id` on forget
    widened it to the whole user's memory."""
    mem = Memory(tmp_path / "args.db", embedder=HashEmbedder())
    mem.add(["ana's note", "x's note"], user_id="ana")
    mem.add("x's own", user_id="ana", agent_id="x")
    server = build_mcp_server(mem, llm=ScriptedLLM("x"))

    async def main() -> None:
        async with Client(server) as client:
            text = error_text(await client.call_tool("forget", {"user_id": "ana", "agent_id": "x",
                                                               "everything": True}))
            assert text.startswith("InvalidInputError: forget takes no argument 'agent_id'")
            text = error_text(await client.call_tool("remember", {"items": ["carol's secret"],
                                                                  "userId": "carol"}))
            assert text.startswith("InvalidInputError: remember takes no argument 'userId'")
            assert "user_id" in text  # the message lists what the tool does take

    try:
        run(main, 30)
    finally:
        mem.close()
    again = Memory(tmp_path / "args.db", embedder=HashEmbedder())
    assert len(again.items(user_id="ana")) == 3
    assert again.items() == []  # nothing went to the default scope


def test_arguments_must_have_their_json_type_not_one_that_converts(tmp_path: Path) -> None:
    """`everything: "yes"` passed as true and wiped the scope; `"100"` passed as a budget."""
    mem = Memory(tmp_path / "strict.db", embedder=HashEmbedder())
    mem.add(["kept"], scope="s")
    server = build_mcp_server(mem, llm=ScriptedLLM("x"))

    async def main() -> None:
        async with Client(server) as client:
            for tool, args in (("forget", {"scope": "s", "everything": "yes"}),
                               ("recall", {"scope": "s", "query": "kept", "budget_tokens": "100"}),
                               ("list", {"scope": "s", "limit": True})):
                assert error_text(await client.call_tool(tool, args)).startswith("InvalidInputError"), tool
            assert ok(await client.call_tool("list", {"scope": "s", "limit": 5}))["items"]
            assert ok(await client.call_tool("list", {"scope": "s", "limit": 5.0}))["items"]  # JSON's 5
            tools = (await client.list_tools()).tools
            assert all(t.input_schema["additionalProperties"] is False for t in tools)  # as enforced

    try:
        run(main, 30)
    finally:
        mem.close()
