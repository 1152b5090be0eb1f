"""Isolation across every surface: thousands of random operations by three tenants, each bound
to its own scope (a restricted memory, an API key, a scope-bound MCP server), never see a
byte of another tenant's memory, before or after forgets, and every attempt to name another
tenant's scope is refused without touching it.

Every tenant's texts carry a word no other tenant uses, so a leak shows in any payload: hits,
listed items, a rendered context, an answer, an error message.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from suffice import AccessDeniedError, HashEmbedder, KeyRing, Memory, ScriptedLLM, SufficeError
from suffice._llm.scripted import digest_answer
from suffice._server.wire import error_status, to_json

TENANTS = ("alba", "bruno", "chen")
MARK = {t: f"zz{t}mark" for t in TENANTS}
WORDS = "river flood cat kayak tea wedding october red blue garden".split()
OPS_PER_RUN = 400

Call = Callable[[str, str, str, dict[str, Any]], tuple[int, Any]]
"""(tenant, operation, target scope, arguments) -> (status, JSON payload)."""


def scope_of(tenant: str) -> str:
    return f"user:{tenant}"


def python_surface(mem: Memory) -> Iterator[Call]:
    views = {t: mem.restrict([scope_of(t)]) for t in TENANTS}

    def call(tenant: str, op: str, scope: str, args: dict[str, Any]) -> tuple[int, Any]:
        view = views[tenant]
        try:
            if op == "add":
                return 201, {"items": to_json(view.add(args["items"], scope=scope, session=args["session"]))}
            if op == "search":
                return 200, {"evidence": to_json(view.search(args["query"], scope=scope, k=5))}
            if op == "render":
                return 200, {"context": to_json(view.render(args["query"], 300, scope=scope))}
            if op == "ask":
                return 200, {"answer": to_json(view.ask(args["query"], scope=scope))}
            if op == "list":
                return 200, {"items": to_json(view.items(scope=scope, limit=50))}
            if op == "get":
                return 200, {"item": to_json(view.get(args["id"], scope=scope))}
            if op == "forget":
                return 200, {"forgotten": to_json(view.forget(scope=scope, ids=args.get("ids"),
                                                              session=args.get("session")))}
            raise AssertionError(op)
        except SufficeError as exc:
            return error_status(exc)[0], {"error": str(exc)}
    yield call


def rest_surface(mem: Memory, tmp_path) -> Iterator[Call]:
    from server_utils import serving

    from suffice._server.rest import create_app
    ring = KeyRing(tmp_path / "keys.json")
    tokens = {t: ring.create([scope_of(t)])[0] for t in TENANTS}
    routes = {"add": ("POST", "/v1/items"), "search": ("POST", "/v1/search"),
              "render": ("POST", "/v1/render"), "ask": ("POST", "/v1/ask"), "list": ("GET", "/v1/items"),
              "get": ("GET", "/v1/items/{id}"),
              "forget": ("POST", "/v1/forget")}
    with serving(create_app(mem, keys=ring)) as url, httpx.Client(base_url=url, timeout=60) as c:
        def call(tenant: str, op: str, scope: str, args: dict[str, Any]) -> tuple[int, Any]:
            method, path = routes[op]
            headers = {"Authorization": f"Bearer {tokens[tenant]}"}
            if op == "add":
                r = c.post(path, headers=headers, json={"scope": scope, "items": args["items"],
                                                        "session": args["session"]})
            elif op in ("search", "render", "ask"):
                key = "question" if op == "ask" else "query"
                body: dict[str, Any] = {"scope": scope, key: args["query"]}
                if op == "render":
                    body["budget_tokens"] = 300
                r = c.post(path, headers=headers, json=body)
            elif op == "list":
                r = c.get(path, headers=headers, params={"scope": scope, "limit": 50})
            elif op == "get":
                r = c.get(path.format(id=args["id"]), headers=headers, params={"scope": scope})
            else:
                r = c.post(path, headers=headers, json={"scope": scope, **args})
            return r.status_code, r.json()
        yield call


def mcp_surface(mem: Memory) -> Iterator[Call]:
    """One MCP server per tenant, bound to its scope (``suffice mcp --scope``), each driven by
    the SDK's client over the in-memory transport (stdio is covered by tests/test_mcp.py)."""
    from anyio.from_thread import start_blocking_portal
    from mcp import Client

    from suffice._server.mcp import build_mcp_server
    tools = {"add": "remember", "search": "recall", "render": "recall", "ask": "ask", "list": "list",
             "get": "list", "forget": "forget"}
    with start_blocking_portal() as portal:
        clients = {t: portal.wrap_async_context_manager(Client(build_mcp_server(mem, scopes=[scope_of(t)])))
                   for t in TENANTS}
        sessions = {t: c.__enter__() for t, c in clients.items()}
        try:
            def call(tenant: str, op: str, scope: str, args: dict[str, Any]) -> tuple[int, Any]:
                if op == "add":
                    body: dict[str, Any] = {"items": args["items"], "session": args["session"]}
                elif op in ("search", "render"):
                    body = {"query": args["query"], "budget_tokens": 300}
                elif op == "ask":
                    body = {"question": args["query"]}
                elif op in ("list", "get"):
                    body = {"limit": 50}
                else:
                    body = dict(args)
                result = portal.call(sessions[tenant].call_tool, tools[op], {"scope": scope, **body})
                if result.is_error:
                    text = result.content[0].text
                    return (403 if text.startswith("AccessDeniedError") else 422), {"error": text}
                return 200, result.structured_content
            yield call
        finally:
            for c in clients.values():
                c.__exit__(None, None, None)


@contextmanager
def surface(name: str, mem: Memory, tmp_path) -> Iterator[Call]:
    gen = {"python": lambda: python_surface(mem), "rest": lambda: rest_surface(mem, tmp_path),
           "mcp": lambda: mcp_surface(mem)}[name]()
    try:
        yield next(gen)
    finally:
        gen.close()


def random_walk(call: Call, mem: Memory, seed: int) -> dict[str, int]:
    """Random operations; after each, the checks. Returns how many of each outcome were seen."""
    rng = random.Random(seed)
    alive: dict[str, set[str]] = {t: set() for t in TENANTS}
    gone: set[str] = set()
    seen = {"ok": 0, "refused": 0, "forgets": 0}
    n = 0
    for _ in range(OPS_PER_RUN):
        tenant = rng.choice(TENANTS)
        target = tenant if rng.random() < 0.7 else rng.choice([t for t in TENANTS if t != tenant])
        scope = scope_of(target)
        op = rng.choices(["add", "search", "render", "ask", "list", "get", "forget"],
                         [4, 3, 2, 1, 2, 2, 1])[0]
        args: dict[str, Any] = {"query": " ".join(rng.sample(WORDS, 2)) + f" {MARK[rng.choice(TENANTS)]}"}
        if op == "add":
            items = []
            for _ in range(rng.randint(1, 3)):
                n += 1
                items.append({"text": f"{' '.join(rng.choices(WORDS, k=4))} {MARK[target]} #{n}",
                              "id": f"{target}-{n}"})
            args = {"items": items, "session": rng.choice(["s1", "s2"])}
        elif op == "get":
            pool = sorted(set().union(*alive.values()) | gone)
            args = {"id": rng.choice(pool) if pool else "none"}
        elif op == "forget":
            mine = sorted(alive[target])
            pick = rng.sample(mine, min(len(mine), rng.randint(1, 3))) if mine else []
            args = {"ids": pick} if pick and rng.random() < 0.7 else {"session": rng.choice(["s1", "s2"])}
        if not mem.store.has_scope(scope) and op not in ("add", "forget", "list"):
            continue
        before = mem.stats(scope).items if mem.store.has_scope(scope) else 0
        status, payload = call(tenant, op, scope, args)
        text = str(payload)
        for other in TENANTS:
            if other != tenant:
                # A query may name another tenant's word (to lure its items); the store's
                # answer must still never hold it.
                assert MARK[other] not in _results(payload), f"{tenant} saw {other}'s memory via {op}"
        if target != tenant:
            assert status == 403, (tenant, op, scope, status, text[:200])
            after = mem.stats(scope).items if mem.store.has_scope(scope) else 0
            assert after == before, "a refused call changed the store"
            seen["refused"] += 1
            continue
        assert status < 500, (op, status, text[:300])
        if status >= 300:
            continue
        seen["ok"] += 1
        for ident in _ids(payload):
            assert ident.startswith(f"{tenant}-"), f"{tenant} got item {ident} via {op}"
            if op != "forget":
                assert ident not in gone, f"forgotten item {ident} came back via {op}"
        if op == "add":
            alive[tenant] |= {i["id"] for i in args["items"]}
        elif op == "forget":
            seen["forgets"] += 1
            left = {it.id for it in mem.items(scope=scope)} if mem.store.has_scope(scope) else set()
            gone |= alive[tenant] - left
            alive[tenant] &= left
    return seen


def _results(payload: Any) -> str:
    """The parts of a payload that come from the store (not the query echoed back)."""
    if isinstance(payload, dict):
        return " ".join(_results(v) for k, v in payload.items() if k not in ("query", "question"))
    if isinstance(payload, list):
        return " ".join(_results(v) for v in payload)
    return str(payload)


def _ids(payload: Any) -> Iterator[str]:
    if isinstance(payload, dict):
        if "id" in payload and "scope" in payload and "seq" in payload:
            yield payload["id"]
        for v in payload.values():
            yield from _ids(v)
    elif isinstance(payload, list):
        for v in payload:
            yield from _ids(v)


@pytest.mark.parametrize("name", ["python", "rest", "mcp"])
def test_no_tenant_ever_sees_or_touches_another(name, store_location, tmp_path):
    with Memory(store_location("iso"), embedder=HashEmbedder(), llm=ScriptedLLM(digest_answer)) as mem:
        with surface(name, mem, tmp_path) as call:
            seen = random_walk(call, mem, seed=len(name))
    assert seen["ok"] > 120 and seen["refused"] > 60 and seen["forgets"] > 5, seen


def test_a_restricted_memory_refuses_by_name_not_by_content(tmp_path):
    with Memory(tmp_path / "m.db", embedder=HashEmbedder()) as mem:
        mem.add("alba's secret", scope="user:alba")
        with pytest.raises(AccessDeniedError):
            mem.restrict(["user:bruno"]).items(scope="user:alba")
