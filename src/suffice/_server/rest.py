"""The REST server: every route checks its input, turns the API key into a restricted memory,
and hands the call to :class:`suffice.AsyncMemory`. Nothing else happens here.

Scope checks are not made in this module: a key becomes ``memory.restrict(key's scopes)``
and the core refuses any other scope (:class:`suffice.AccessDeniedError`, 403). Every error
leaves as ``{"error": {"code", "type", "message"}}`` with a stable ``code``. Bodies above
``max_body_bytes`` are refused (413) before they are read whole; each call runs under a
deadline (504 when it passes; ``ask`` also tells the engine, which then answers from what
it has).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from .._access import KeyRing
from .._api import AsyncMemory, Memory
from .._errors import AuthenticationError, ConfigError, DeadlineError, InvalidQueryError, SufficeError
from .wire import WHOLE, error_json, error_status, to_json

T = TypeVar("T")
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_TEXT = 100_000
"""Characters of one query or question: far above a real one, far below a memory bomb."""


class ServerSettings(BaseSettings):
    """Limits of one server; each may be set by ``SUFFICE_SERVER_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="SUFFICE_SERVER_", extra="forbid")

    max_body_bytes: int = Field(2_000_000, ge=1_000, description="Largest request body accepted.")
    deadline_s: float = Field(30.0, gt=0, description="Seconds a call other than ask may take.")
    ask_deadline_s: float = Field(300.0, gt=0, description=(
        "Seconds an ask may take (a local model on a CPU takes seconds per call)."))
    max_items: int = Field(2_000, ge=1, description="Items or messages one add may carry.")
    max_k: int = Field(1_000, ge=1, description="Largest k of a search, or limit of a list.")
    max_budget_tokens: int = Field(200_000, ge=100, description="Largest render or ask budget.")
    ask_workers: int = Field(2, ge=1, le=64, description=(
        "Asks answered at once, on threads of their own (other calls have four): a local model "
        "answers one prompt at a time anyway; raise it for a remote model that serves several."))


def server_settings() -> ServerSettings:
    """The limits from ``SUFFICE_SERVER_*``, checked before a server starts: a bad value, or a
    name that is no setting (a typo would be ignored), is a ConfigError naming it."""
    import os

    from pydantic import ValidationError

    known = {f"SUFFICE_SERVER_{name.upper()}" for name in ServerSettings.model_fields}
    unknown = sorted(k for k in os.environ
                     if k.upper().startswith("SUFFICE_SERVER_") and k.upper() not in known)
    if unknown:
        raise ConfigError(f"{unknown[0]} is not a server setting; the settings are "
                          f"{', '.join(sorted(known))}")
    try:
        return ServerSettings()
    except ValidationError as exc:
        first = exc.errors()[0]
        name = f"SUFFICE_SERVER_{str(first['loc'][0]).upper()}" if first.get("loc") else "SUFFICE_SERVER_*"
        raise ConfigError(f"{name}: {first['msg']}") from None


# -- request bodies ---------------------------------------------------------------------------------

class _Body(BaseModel):
    # Strict: JSON types as sent ("yes" is not true, "100" not 100: `everything: "yes"` wiped a scope).
    model_config = ConfigDict(extra="forbid", strict=True)


class Where(_Body):
    """Where a call reads or writes: a scope by name, or by Mem0-style ids."""

    scope: str | None = Field(None, max_length=400)
    user_id: str | None = Field(None, max_length=400)
    agent_id: str | None = Field(None, max_length=400)
    run_id: str | None = Field(None, max_length=400)

    def ident(self) -> dict[str, Any]:
        return {"scope": self.scope, "user_id": self.user_id, "agent_id": self.agent_id,
                "run_id": self.run_id}


TimeIn = str | float


class Filters(Where):
    session: str | None = None
    speaker: str | None = None
    kind: str | None = None
    role: str | None = None
    since: TimeIn | None = Field(None, description="ISO time, or POSIX seconds.")
    until: TimeIn | None = None
    meta: dict[str, Any] | None = Field(None, description="Items whose meta has these key/values.")

    def filters(self) -> dict[str, Any]:
        return {"session": self.session, "speaker": self.speaker, "kind": self.kind,
                "role": self.role, "since": self.since, "until": self.until, "meta": self.meta}


class ItemIn(_Body):
    """One turn or step to store verbatim."""

    text: str = Field(max_length=2_000_000)
    id: str | None = Field(None, max_length=400, description="Client id: adding it again is a no-op.")
    session: str = ""
    speaker: str = ""
    role: str = ""
    kind: str = "message"
    observed_at: str = Field("", description=(
        "When it happened, as written (relative dates resolve against it)."))
    meta: dict[str, Any] = Field(default_factory=dict)
    agent: str = ""


class AddItems(Where):
    items: list[ItemIn | str] = Field(min_length=1)
    session: str = ""
    speaker: str = ""
    role: str = ""
    kind: str = "message"
    observed_at: str = ""
    meta: dict[str, Any] | None = None


class AddMessages(Where):
    messages: list[dict[str, Any]] = Field(min_length=1, description="OpenAI-style chat messages.")
    session: str = ""
    observed_at: str = ""
    meta: dict[str, Any] | None = None


class SearchIn(Filters):
    query: str = Field(max_length=MAX_TEXT)
    k: Annotated[int | None, WHOLE] = Field(None, ge=0)
    method: Literal["bm25", "dense", "fused", "recency"] = "fused"


class RenderIn(Filters):
    query: str = Field("", max_length=MAX_TEXT)
    budget_tokens: Annotated[int, WHOLE] = Field(ge=0)
    mode: Literal["unit", "piece", "unit+piece", "timeline"] | None = None
    agent: bool = Field(False, description="Agent mode: the newest items verbatim first.")


class AskIn(Filters):
    question: str = Field(max_length=MAX_TEXT)
    mode: Literal["fast", "deep", "auto"] = "fast"
    tau: float | None = Field(None, ge=0.0, le=1.0)
    budget: Annotated[int | None, WHOLE] = Field(None, ge=1)
    timeout: float | None = Field(None, gt=0, description=(
        "Seconds for the whole query (at most the server's ask deadline)."))
    tiered: bool = Field(False, description="The deep path reads through the tier pipeline.")
    lam: float | None = Field(None, ge=0.0, le=100.0)
    tier_cap: Literal["low", "mid", "high"] | None = None


class FitIn(Where):
    messages: list[dict[str, Any]] = Field(min_length=1, description=(
        "The agent's whole running message list (OpenAI format)."))
    budget_tokens: Annotated[int, WHOLE] = Field(ge=1)
    session: str | None = Field(None, max_length=400, description="The run these messages belong to.")
    recent_share: float = Field(0.25, gt=0.0, le=1.0, description=(
        "Share of the budget kept verbatim as the newest messages."))
    query: str | None = Field(None, max_length=MAX_TEXT, description=(
        "What the memory is for (default: the newest user text)."))


class ForgetIn(Where):
    ids: list[str] | None = Field(None, description="Items to forget.")
    session: str | None = Field(None, description="A session to forget (run_id names one too).")
    everything: bool = Field(False, description=(
        "Forget the whole scope. Required for that: a body that names no ids, session or run "
        "is refused, so a client that leaves a field out cannot wipe a memory."))


# -- the app ----------------------------------------------------------------------------------------

def _log_late_failure(task: asyncio.Future[Any]) -> None:
    """A write that outlived its request (the caller got a 504) and then failed: the only
    place its error can still be seen is the server's log."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("a write that passed its deadline then failed: %s", task.exception())


def _error(status: int, code: str, message: str, kind: str = "HTTPError") -> JSONResponse:
    return JSONResponse({"error": {"code": code, "type": kind, "message": message}}, status_code=status)


class BodyLimit:
    """Refuse a body above ``limit`` bytes with 413: by its Content-Length before reading it
    (the HTTP server holds the client to that length), or, for a chunked body without one,
    as soon as the bytes read pass the limit."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        too_big = _error(413, "too_large", f"the request body is over {self.limit:,} bytes")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                size = -1
            if size < 0:
                await _error(400, "bad_request", "Content-Length is not a number")(scope, receive, send)
                return
            if size > self.limit:
                await too_big(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        # No length given (chunked): read at most the limit, then hand the app the body.
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.limit:
                await too_big(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


log = logging.getLogger("suffice.rest")

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def _host_name(header: str) -> str:
    """The name in a Host header, without its port ("[::1]:8765" is "::1")."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class LoopbackOnly:
    """Dev mode has no keys, so loopback is its only guard, and a browser page can get past a
    loopback bind by DNS rebinding (its own name, resolved to 127.0.0.1, reaches the server
    with that name in the Host header). So every request must name a loopback host."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1").strip().lower()
            if _host_name(host) not in LOOPBACK_HOSTS:
                await _error(403, "forbidden", "a server without keys answers requests for "
                             "localhost only (Host header)")(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(memory: Memory | AsyncMemory, *, keys: KeyRing | None = None,
               settings: ServerSettings | None = None) -> FastAPI:
    """The REST app over ``memory``. ``keys=None`` is dev mode: no key, every scope (bind it to
    loopback only: ``suffice serve --dev`` does). With keys, each request's bearer key is
    looked up and the call runs on ``memory.restrict(key's scopes)``."""
    conf = settings or ServerSettings()
    amem = memory if isinstance(memory, AsyncMemory) else AsyncMemory(memory, ask_workers=conf.ask_workers)
    app = FastAPI(title="suffice", version=__version__, description=(
        "Long-term memory for LLM agents: write once, verbatim; render per call under a token "
        "budget; every answer with a receipt. Errors: {\"error\": {\"code\", \"type\", \"message\"}}."))

    # Where the server keeps its store and models is not the callers' business: an error that
    # names one (a tier policy folder that went missing) shows a placeholder instead.
    private: list[str | tuple[str, str]] = [amem.path]
    for var, label in (("SUFFICE_ROUTER", "router"), ("SUFFICE_TIERS", "tier policy"),
                       ("SUFFICE_CACHE_DIR", "model cache")):
        value = os.environ.get(var, "").strip()
        if value:  # as errors print it: the absolute path (a bare word would hide every use of it)
            private += [(str(Path(value).expanduser().resolve()), label)]
            if os.sep in value:
                private += [(value, label)]

    @app.exception_handler(SufficeError)
    async def _suffice_error(_: Request, exc: SufficeError) -> JSONResponse:
        status, _code = error_status(exc)
        return JSONResponse(error_json(exc, hide=private), status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        message = f"{where}: {first.get('msg', 'invalid request')}" if where else str(first.get("msg"))
        return _error(422, "invalid_input", message, "InvalidInputError")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and isinstance(exc.__cause__, UnicodeDecodeError):
            # FastAPI reads a body that is not UTF-8 as a bare 400: a malformed body, as any other
            cause = exc.__cause__
            return _error(422, "invalid_input", f"the body is not UTF-8 JSON ({cause.reason} at byte "
                          f"{cause.start})", "InvalidInputError")
        return _error(exc.status_code, f"http_{exc.status_code}", str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return _error(500, "internal", f"unexpected {type(exc).__name__}; the server log has details",
                      "InternalError")

    app.state.suffice = _State(amem, keys)

    async def within(call: Awaitable[T], seconds: float, *, write: bool = False) -> T:
        # A write is shielded from the deadline: one still queued for a thread would otherwise
        # be cancelled and never run, while the note below says that it completes.
        task = asyncio.ensure_future(call) if write else None
        try:
            return await asyncio.wait_for(asyncio.shield(task) if task is not None else call, timeout=seconds)
        except TimeoutError:
            err = DeadlineError(f"the call took longer than the server's {seconds:g} s deadline")
            if task is not None:  # the worker thread cannot be stopped: say what became of the write
                task.add_done_callback(_log_late_failure)
                err.add_note("the write was not stopped: it still completes or fails as a "
                             "whole. Send the same request again to learn which; a fit, a "
                             "forget and items with ids change nothing twice, but items sent "
                             "without ids would be stored again")
            raise err from None

    def limit_count(value: int | None, name: str) -> None:
        if value is not None and value > conf.max_k:
            raise InvalidQueryError(f"{name} is {value}; this server allows at most {conf.max_k}")

    @app.get("/v1/health", tags=["meta"])
    async def health() -> dict[str, Any]:
        """Liveness, without a key."""
        return {"status": "ok", "version": __version__}

    @app.post("/v1/items", status_code=201, tags=["write"])
    async def add_items(body: AddItems, mem: Caller) -> dict[str, Any]:
        """Store turns or steps verbatim, in one transaction per batch; ids make it idempotent."""
        if len(body.items) > conf.max_items:
            raise InvalidQueryError(f"{len(body.items)} items in one add; this server takes {conf.max_items}")
        # Only the fields an item names: the rest come from the call (its session, agent, meta...).
        items = [it if isinstance(it, str) else it.model_dump(exclude_unset=True) for it in body.items]
        stored = await within(mem.add(items, **body.ident(), session=body.session, speaker=body.speaker,
                                      role=body.role, kind=body.kind, observed_at=body.observed_at,
                                      meta=body.meta), conf.deadline_s, write=True)
        return {"items": to_json(stored)}

    @app.post("/v1/messages", status_code=201, tags=["write"])
    async def add_messages(body: AddMessages, mem: Caller) -> dict[str, Any]:
        """Store OpenAI-style chat messages (tool calls and results become items of their own)."""
        if len(body.messages) > conf.max_items:
            raise InvalidQueryError(f"{len(body.messages)} messages in one add; this server takes "
                                    f"{conf.max_items}")
        stored = await within(mem.add(list(body.messages), **body.ident(), session=body.session,
                                      observed_at=body.observed_at, meta=body.meta), conf.deadline_s,
                               write=True)
        return {"items": to_json(stored)}

    @app.get("/v1/items/{item_id:path}", tags=["read"])
    async def get_item(item_id: str, mem: Caller, where: At) -> dict[str, Any]:
        """One item by id (404 when this scope does not hold it)."""
        item = await within(mem.get(item_id, **where.ident()), conf.deadline_s)
        return {"item": to_json(item)}

    @app.get("/v1/items", tags=["read"])
    async def list_items(mem: Caller, where: At,
                         session: str | None = None, speaker: str | None = None, kind: str | None = None,
                         role: str | None = None, since: str | None = None, until: str | None = None,
                         meta: Annotated[str | None, Query(description="A JSON object.")] = None,
                         offset: Annotated[int, Query(ge=0)] = 0,
                         limit: Annotated[int | None, Query(ge=0)] = 100,
                         newest_first: bool = False) -> dict[str, Any]:
        """Items in log order (or newest first), filtered and paged. ``since`` / ``until`` are
        read as the Python API reads text: nine digits or more are POSIX seconds, "2023" the year."""
        limit_count(limit, "limit")
        if offset > 1_000_000:
            raise InvalidQueryError(f"offset is {offset}; at most 1,000,000")
        meta_map = _json_object(meta, "meta")
        items = await within(mem.items(**where.ident(), session=session, speaker=speaker, kind=kind,
                                       role=role, since=since, until=until, meta=meta_map,
                                       offset=offset, limit=limit, newest_first=newest_first),
                             conf.deadline_s)
        return {"items": to_json(items)}

    @app.delete("/v1/items/{item_id:path}", tags=["write"])
    async def delete_item(item_id: str, mem: Caller, where: At) -> dict[str, Any]:
        """Forget one item and everything derived from it."""
        report = await within(mem.forget(ids=[item_id], **where.ident()), conf.deadline_s, write=True)
        return {"forgotten": to_json(report)}

    @app.post("/v1/search", tags=["read"])
    async def search(body: SearchIn, mem: Caller) -> dict[str, Any]:
        """The shared retrieval prefix: the best k hits, each with its item and scores."""
        limit_count(body.k, "k")
        ev = await within(mem.search(body.query, **body.ident(), k=body.k, method=body.method,
                                     **body.filters()), conf.deadline_s)
        return {"evidence": to_json(ev)}

    @app.post("/v1/render", tags=["read"])
    async def render(body: RenderIn, mem: Caller) -> dict[str, Any]:
        """A memory for the query that fits budget_tokens, with why each part is there."""
        if body.budget_tokens > conf.max_budget_tokens:
            raise InvalidQueryError(f"budget_tokens is {body.budget_tokens}; "
                                    f"at most {conf.max_budget_tokens}")
        ctx = await within(mem.render(body.query, body.budget_tokens, **body.ident(), mode=body.mode,
                                      agent=body.agent, **body.filters()), conf.deadline_s)
        return {"context": to_json(ctx)}

    @app.post("/v1/ask", tags=["read"])
    async def ask(body: AskIn, mem: Caller) -> dict[str, Any]:
        """Answer from memory; the receipt says how (path, router, calls, tokens, cost, time)."""
        if body.budget is not None and body.budget > conf.max_budget_tokens:
            raise InvalidQueryError(f"budget is {body.budget}; at most {conf.max_budget_tokens}")
        if body.timeout is not None and body.timeout > conf.ask_deadline_s:
            raise InvalidQueryError(f"timeout is {body.timeout:g} s; this server answers within "
                                    f"{conf.ask_deadline_s:g} s at most")
        timeout = body.timeout or conf.ask_deadline_s
        tiers: dict[str, Any] = ({"agent": "tiered", "lam": body.lam, "tier_cap": body.tier_cap}
                                 if body.tiered else {})
        if not body.tiered and (body.lam is not None or body.tier_cap is not None):
            raise InvalidQueryError("lam and tier_cap go with tiered: true")
        # The engine keeps the deadline itself (and answers from what it has); the extra
        # seconds here only catch a call that would overrun it.
        answer = await within(mem.ask(body.question, **body.ident(), mode=body.mode, tau=body.tau,
                                      budget=body.budget, timeout=timeout, **tiers, **body.filters()),
                              timeout + 10.0)
        return {"answer": to_json(answer)}

    @app.post("/v1/fit", tags=["write"])  # it stores the messages
    async def fit(body: FitIn, mem: Caller) -> dict[str, Any]:
        """The messages to send the agent's model next: system messages and the newest ones
        verbatim, the dropped middle replaced by the memory rendered for this step; every
        message is stored once."""
        if body.budget_tokens > conf.max_budget_tokens:
            raise InvalidQueryError(f"budget_tokens is {body.budget_tokens}; "
                                    f"at most {conf.max_budget_tokens}")
        if len(body.messages) > conf.max_items * 10:
            raise InvalidQueryError(f"{len(body.messages)} messages; this server takes "
                                    f"{conf.max_items * 10}")
        fitted = await within(mem.fit(body.messages, body.budget_tokens, **body.ident(),
                                      session=body.session, recent_share=body.recent_share,
                                      query=body.query), conf.deadline_s, write=True)
        return {"fitted": to_json(fitted)}

    @app.post("/v1/forget", tags=["write"])
    async def forget(body: ForgetIn, mem: Caller) -> dict[str, Any]:
        """Delete items, a session or a whole scope, and every trace derived from them."""
        if body.ids is None and not body.session and body.run_id is None and not body.everything:
            # Said in the body's words (everything: true), before the core says it in Python's.
            raise InvalidQueryError("say what to forget: ids, a session or run_id, or everything: true "
                                    "for the whole scope")
        report = await within(mem.forget(ids=body.ids, session=body.session or None,
                                         everything=body.everything, **body.ident()),
                              conf.deadline_s, write=True)
        return {"forgotten": to_json(report)}

    @app.get("/v1/stats", tags=["meta"])
    async def stats(mem: Caller, where: At) -> dict[str, Any]:
        """Counts of one scope, or of every scope the key may see."""
        st = await within(mem.stats(**where.ident()), conf.deadline_s)
        out = to_json(st)
        out.pop("path", None)  # where the store lives is the operator's business
        return {"stats": out}

    @app.get("/v1/scopes", tags=["meta"])
    async def scopes(mem: Caller) -> dict[str, Any]:
        """Scopes holding items that the key may see."""
        return {"scopes": await within(mem.scopes(), conf.deadline_s)}

    app.add_middleware(BodyLimit, limit=conf.max_body_bytes)
    if keys is None:
        app.add_middleware(LoopbackOnly)
    return app


class _State:
    """What the routes of one app share: the memory, the keys, and one view per key."""

    def __init__(self, memory: AsyncMemory, keys: KeyRing | None) -> None:
        self.memory = memory
        self.keys = keys
        self.views: dict[tuple[str, tuple[str, ...]], AsyncMemory] = {}
        self._warned = False

    async def caller(self, request: Request) -> AsyncMemory:
        """The memory this request may use: all of it in dev mode, else its key's view."""
        if self.keys is None:
            return self.memory
        auth = request.headers.get("authorization", "")
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key")
        try:
            key = await asyncio.to_thread(self.keys.authenticate, token)
        except ConfigError as exc:  # the key file became unreadable: refuse (401), say why once
            if not self._warned:
                log.error("cannot read the key file, refusing every request: %s", exc)
                self._warned = True
            raise AuthenticationError("the server cannot check API keys now; its log says why") from None
        self._warned = False
        slot = (key.key_id, key.grant.patterns)
        if slot not in self.views:
            self.views[slot] = self.memory.restrict(key.grant.patterns)
        return self.views[slot]


async def _caller(request: Request) -> AsyncMemory:
    state: _State = request.app.state.suffice
    return await state.caller(request)


def _where_query(scope: Annotated[str | None, Query(max_length=400)] = None,
                 user_id: Annotated[str | None, Query(max_length=400)] = None,
                 agent_id: Annotated[str | None, Query(max_length=400)] = None,
                 run_id: Annotated[str | None, Query(max_length=400)] = None) -> Where:
    return Where(scope=scope, user_id=user_id, agent_id=agent_id, run_id=run_id)


def _json_object(raw: str | None, name: str) -> Mapping[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        raise InvalidQueryError(f"{name} must be a JSON object, got {raw[:60]!r}") from None
    if not isinstance(value, dict):
        raise InvalidQueryError(f"{name} must be a JSON object")
    return value


Caller = Annotated[AsyncMemory, Depends(_caller)]
At = Annotated[Where, Depends(_where_query)]
