"""One conversation, twenty questions, every surface: the Python API, AsyncMemory, the REST
server and the MCP server give the same answers and receipts (measured times aside), on each
backend. The model is deterministic and answers with a digest of its whole prompt, so equal
answers mean every surface handed the model exactly the same context."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Any

import httpx
import pytest

from suffice import AsyncMemory, Memory
from suffice._datasets.locomo import load_locomo
from suffice._llm.scripted import ScriptedLLM, digest_answer
from suffice._server.wire import to_json, without_timings

N_QUESTIONS = 20
MODES = ("fast", "auto")
TIMEOUT_S = 120.0
"""Every surface gets the same deadline (a server always sets one)."""


def digest_llm() -> ScriptedLLM:
    return ScriptedLLM(digest_answer, model="scripted-digest")


def normal(answer: Any) -> Any:
    """An answer's JSON without measured times, with calls in a fixed order (parallel memory
    agents may finish in any order)."""
    out = without_timings(answer)
    receipt = out["receipt"]
    for key in ("calls", "blocks"):
        receipt[key] = sorted(receipt[key], key=lambda x: json.dumps(x, sort_keys=True))
    return out


@pytest.fixture(scope="module")
def conversation(locomo_path):
    conv = min(load_locomo(locomo_path), key=lambda c: len(c.items))  # the smallest: fast to ingest
    questions = [q.question for q in conv.questions[:N_QUESTIONS]]
    return conv, [(q, MODES[i % len(MODES)]) for i, q in enumerate(questions)]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def store_at(request, tmp_path_factory, conversation, embedder):
    """A store holding the conversation, ingested once through the Python API."""
    conv, _ = conversation
    if request.param == "sqlite":
        location = str(tmp_path_factory.mktemp("surfaces") / "e2e.db")
    else:
        from conftest import with_schema
        location = with_schema(request.getfixturevalue("pg_server"), f"e2e_{uuid.uuid4().hex[:12]}")
    with Memory(location, embedder=embedder) as mem:
        mem.add(list(conv.items), scope=conv.scope)
    return location


def python_answers(location: str, scope: str, asks, embedder) -> list[Any]:
    with Memory(location, embedder=embedder, llm=digest_llm()) as mem:
        return [normal(to_json(mem.ask(q, scope=scope, mode=mode, timeout=TIMEOUT_S))) for q, mode in asks]


def async_answers(location: str, scope: str, asks, embedder) -> list[Any]:
    async def main() -> list[Any]:
        async with AsyncMemory(location, embedder=embedder, llm=digest_llm()) as amem:
            done = await asyncio.gather(*(amem.ask(q, scope=scope, mode=mode, timeout=TIMEOUT_S)
                                          for q, mode in asks))
            return [normal(to_json(a)) for a in done]
    return asyncio.run(main())


def rest_answers(location: str, scope: str, asks, embedder) -> list[Any]:
    from server_utils import serving

    from suffice._server.rest import create_app
    with Memory(location, embedder=embedder, llm=digest_llm()) as mem, serving(create_app(mem)) as url:
        with httpx.Client(base_url=url, timeout=120) as c:
            out = []
            for q, mode in asks:
                r = c.post("/v1/ask", json={"scope": scope, "question": q, "mode": mode,
                                              "timeout": TIMEOUT_S})
                assert r.status_code == 200, r.text
                out.append(normal(r.json()["answer"]))
            return out


def mcp_answers(location: str, scope: str, asks, embedder) -> list[Any]:
    """Through `suffice mcp` over stdio, driven by the MCP SDK's own client."""
    import anyio
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "suffice._cli", "mcp", "--db", location, "--provider", "scripted"])

    async def main() -> list[Any]:
        out = []
        with anyio.fail_after(300):
            async with Client(params) as client:
                for q, mode in asks:
                    result = await client.call_tool("ask", {"scope": scope, "question": q, "mode": mode,
                                                            "timeout_s": TIMEOUT_S})
                    assert not result.is_error, result.content
                    out.append(normal(result.structured_content["answer"]))
        return out
    return anyio.run(main)


def test_every_surface_gives_the_same_answers_and_receipts(store_at, conversation, embedder):
    conv, asks = conversation
    base = python_answers(store_at, conv.scope, asks, embedder)
    assert len(base) == N_QUESTIONS and len({a["text"] for a in base}) > N_QUESTIONS // 2
    assert {a["receipt"]["mode"] for a in base} == set(MODES)
    for name, run in (("async", async_answers), ("rest", rest_answers), ("mcp", mcp_answers)):
        got = run(store_at, conv.scope, asks, embedder)
        for i, (want, have) in enumerate(zip(base, got, strict=True)):
            assert have == want, f"{name}: question {i} differs"
