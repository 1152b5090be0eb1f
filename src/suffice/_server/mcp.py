"""The MCP server (``suffice mcp``): memory as six tools an agent framework can call.

Built on the official MCP Python SDK (2.x, ``mcp.server.mcpserver.MCPServer``). Each tool
checks its arguments against a typed schema, runs one :class:`suffice.Memory` call on a worker
thread, and answers with the same JSON the REST server sends (``wire.to_json`` inside the same
envelope: ``{"items": ...}``, ``{"context": ...}``, ``{"answer": ...}``, ``{"forgotten": ...}``),
as structured content and, for clients that read only text, as the JSON text of it.

A suffice error (bad input, unknown scope, a scope the server is not bound to, a model that
failed) becomes the SDK's error result, ``isError`` with ``ClassName: message``; it never
stops the server. Scope binding is the core's: the server holds ``memory.restrict(scopes)``.
Over streamable HTTP with a key file (``keys``), every request needs ``Authorization: Bearer
<key>`` (the SDK's bearer middleware over :class:`suffice._access.KeyRing`: 401 without a known
key) and each tool call runs on that key's ``restrict`` view, as on the REST server.
No model is loaded before the first ``ask``, so a client's launch of the server is quick, and
nothing but the protocol is ever written to stdout (the SDK points fd 1 at stderr while it
serves stdio; logs go to stderr).
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal

import anyio
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from .. import __version__
from .._access import Grant, KeyRing
from .._api import Memory
from .._errors import (
    AccessDeniedError,
    AuthenticationError,
    ConfigError,
    InvalidQueryError,
    MissingExtraError,
    SufficeError,
)
from .._llm.base import LLM, Completion, Ledger, Message
from .wire import WHOLE, hidden, to_json

try:
    from mcp.server.auth.middleware.auth_context import get_access_token
    from mcp.server.auth.provider import AccessToken
    from mcp.server.auth.settings import AuthSettings
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
    from mcp_types import CallToolResult, TextContent, ToolAnnotations
    from pydantic import ValidationError
except ImportError as exc:  # pragma: no cover - the [server] extra is not installed
    raise MissingExtraError("server", "mcp") from exc

log = logging.getLogger("suffice.mcp")


class _Server(MCPServer[Any]):
    """The SDK's server, with arguments that fail their schema reported in one line, as every
    other refusal is (``InvalidInputError: budget_tokens: Input should be ...``), not as
    pydantic's multi-line dump with a link in it."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        tool = self._tool_manager.get_tool(name)
        if tool is not None and isinstance(arguments, dict):
            # The SDK drops argument names it does not know. A misspelt `userId` would then
            # write to the shared scope, and `agent_id` on forget would widen it to the scope.
            known = set(tool.parameters.get("properties", {}))
            unknown = sorted(set(arguments) - known)
            if unknown:
                raise ToolError(f"InvalidInputError: {name} takes no argument "
                                f"{', '.join(map(repr, unknown))}; it takes {', '.join(sorted(known))}")
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(exc, UnexpectedToolError) or not isinstance(cause, ValidationError):
                raise  # a crash inside the tool stays the SDK's: logged, its text hidden
            errors = cause.errors(include_url=False, include_input=False)
            if not errors:
                raise ToolError("InvalidInputError: invalid arguments") from cause
            where = ".".join(str(p) for p in errors[0]["loc"])
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            raise ToolError(f"InvalidInputError: {where + ': ' if where else ''}"
                            f"{errors[0]['msg']}{more}") from cause

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_ITEMS = 2_000
"""Items or messages one ``remember`` may carry (the REST server's default limit too)."""
MAX_BUDGET = 200_000
"""Largest recall or ask budget in tokens: above any model's context, below a memory bomb."""
MAX_LIST = 1_000
MAX_TEXT = 100_000
MAX_NAME = 400
MAX_ASK_SECONDS = 600.0
WORKERS = 4
"""Tool calls other than ``ask`` running at once; more wait. SQLite has one writer."""
ASK_WORKERS = 2
"""``ask`` calls running at once, apart from the others: a slow model never holds up a read or
a write, and a CPU model takes a core each."""
ASK_DEADLINE_S = 300.0
"""An ``ask`` that gives no ``timeout_s`` gets this many seconds, as on the REST server: one
caller's slow question cannot hold an ask slot for ever."""

INSTRUCTIONS = """\
Long-term memory. `remember` stores turns, steps or chat messages verbatim; nothing is
summarised away. `recall` renders what memory holds for a query within a token budget (put
its text in your context). `ask` answers a question from memory with a receipt of how.
`list` pages through stored items; `forget` deletes items, a session or a whole scope.
`fit` takes your whole running message list and a budget, stores it, and returns the
messages to send next, with memory in place of the dropped middle.
A scope is a hard partition: name it with `scope`, or with `user_id` (plus `agent_id` or
`run_id` to narrow within a user's memory)."""


# -- inputs ---------------------------------------------------------------------------------------

Name = Annotated[str | None, Field(max_length=MAX_NAME)]
ScopeArg = Annotated[str | None, Field(max_length=MAX_NAME, description=(
    "The scope (hard partition) to use; give it, or user_id / agent_id / run_id, not both. "
    "Default: the server's scope when it is bound to one, else 'default'."))]
UserArg = Annotated[str | None, Field(max_length=MAX_NAME, description=(
    "Whose memory: the scope user:<user_id>."))]
AgentArg = Annotated[str | None, Field(max_length=MAX_NAME, description=(
    "Which agent's items within the user's scope (alone: the scope agent:<agent_id>)."))]
RunArg = Annotated[str | None, Field(max_length=MAX_NAME, description=(
    "One run (a session) of the scope (alone: the scope run:<run_id>)."))]
SessionArg = Annotated[str | None, Field(max_length=MAX_NAME, description="Only items of this session.")]
FitSessionArg = Annotated[str | None, Field(max_length=MAX_NAME, description=(
    "The session the messages are stored in (default: run_id, else 'agent'); unlike run_id it "
    "does not narrow what the memory draws on."))]
SpeakerArg = Annotated[str | None, Field(max_length=MAX_NAME, description="Only items of this speaker.")]
KindArg = Annotated[str | None, Field(max_length=MAX_NAME, description=(
    "Only items of this kind (message, tool_call, tool_result, ...)."))]
RoleArg = Annotated[str | None, Field(max_length=MAX_NAME, description="Only items of this role.")]
SinceArg = Annotated[str | float | None, Field(description=(
    "Only items observed at or after this time (ISO 8601 text or POSIX seconds)."))]
UntilArg = Annotated[str | float | None, Field(description=(
    "Only items observed before this time (ISO 8601 text or POSIX seconds)."))]
MetaArg = Annotated[dict[str, Any] | None, Field(description=(
    "Only items whose meta has these top-level keys with these values."))]


class ItemIn(BaseModel):
    """One turn or step, stored verbatim; fields left out take the call's values."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=2_000_000, description="The verbatim text.")
    id: Name = Field(None, description="Client id: remembering it again is a no-op.")
    session: Name = None
    speaker: Name = None
    role: Name = None
    kind: Name = Field(None, description="message (default), tool_call, tool_result, note, ...")
    observed_at: Name = Field(None, description=(
        "When it happened, as written ('1:56 pm on 8 May, 2023', ISO 8601); relative dates in "
        "the text are read against it."))
    meta: dict[str, Any] | None = Field(None, description="Any JSON object, kept with the item.")
    agent: Name = Field(None, description=(
        "The agent whose memory this is, when a scope holds several (agent_id sets it for all)."))


class ChatMessageIn(BaseModel):
    """An OpenAI-style chat message; tool calls and tool results become items of their own."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = Field(None, description=(
        "Text, or content parts (text parts are joined; others are kept in meta)."))
    name: Name = Field(None, description="Who spoke (default: the role).")
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: Name = None
    id: Name = Field(None, description="Client id: remembering it again is a no-op.")
    session: Name = None
    observed_at: Name = None
    meta: dict[str, Any] | None = None


def _entry_kind(value: Any) -> str:
    if isinstance(value, str):
        return "text"
    if isinstance(value, ChatMessageIn) or (isinstance(value, Mapping) and "role" in value
                                            and "text" not in value):
        return "message"
    return "item"


Entry = Annotated[
    Annotated[str, Tag("text")] | Annotated[ItemIn, Tag("item")] | Annotated[ChatMessageIn, Tag("message")],
    Discriminator(_entry_kind),
]


# -- outputs (the JSON of wire.to_json; extra keys are allowed so a newer core still validates) ---

class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class ItemOut(_Out):
    """One stored item. ``seq`` is its position in the scope (it shifts after a forget); ``id``
    names it for good."""

    id: str
    scope: str
    seq: int
    session: str
    speaker: str
    role: str
    kind: str
    observed_at: str
    text: str
    meta: dict[str, Any]
    tokens: int
    observed_ts: float | None = Field(description="observed_at as UTC POSIX seconds; null when undated.")
    agent: str


class ItemsOut(_Out):
    items: list[ItemOut]


class PartOut(_Out):
    """One part of a rendered memory and why it is there."""

    kind: str = Field(description="record, raw, excerpt, piece, recent or notice.")
    unit: int | None
    seqs: list[int] = Field(description="The items (by seq) the part shows.")
    tokens: int
    reason: str = Field(description="Why it was included: 'seed 0.82', 'link from unit 4', 'timeline', ...")
    score: float | None


class ContextOut(_Out):
    text: str = Field(description="The rendered memory: put this in your context.")
    tokens: int = Field(description="Its exact size in o200k tokens; never above the budget.")
    budget: int
    cap: int
    mode: str
    parts: list[PartOut]
    notice: str = Field(description="Set when the budget was too small for something.")
    timings_ms: dict[str, float | None]


class RecallOut(_Out):
    context: ContextOut


class HitOut(_Out):
    item: ItemOut
    score: float | None
    rank: int
    source: str
    piece: int | None
    unit: int
    blocks: list[int]
    bm25_score: float | None
    dense_score: float | None
    excerpt: str | None


class CallOut(_Out):
    model: str
    stage: str
    input_tokens: int
    output_tokens: int
    latency_ms: float | None
    cost_usd: float | None
    ok: bool
    error: str


class ReceiptOut(_Out):
    """How the answer was made: path, router decision, evidence, model calls, tokens, cost, time."""

    question: str
    scope: str
    mode: str
    path: str = Field(description="fast (answered from the shared prefix) or deep (memory agents).")
    model: str
    hits: list[HitOut]
    context_tokens: int
    parts: list[PartOut]
    calls: list[CallOut]
    stages_ms: dict[str, float | None]
    t_mem_ms: float | None
    t_e2e_ms: float | None
    router: str
    router_score: float | None
    tau: float | None
    router_reason: str
    blocks: list[dict[str, Any]]
    degraded: bool
    notes: list[str]
    input_tokens: int
    output_tokens: int
    cost_usd: float | None


class AnswerOut(_Out):
    text: str = Field(description="The answer.")
    receipt: ReceiptOut
    evidence: list[ItemOut]


class AskOut(_Out):
    answer: AnswerOut


class FittedOut(_Out):
    messages: list[dict[str, Any]]
    tokens: int
    budget: int
    kept_recent: int
    dropped: int
    context: dict[str, Any] | None
    stored: int


class FitOut(_Out):
    fitted: FittedOut


class ForgottenOut(_Out):
    """What was deleted: counts only."""

    scope: str
    items: int
    pieces: int
    vectors: int
    records: int
    links: int
    checkpointed: bool = Field(description="True when no copy is left in the write-ahead log either.")
    scrubbed: bool = Field(default=False, description=(
        "True when the database file was rewritten, so no stale copy is left in free page space."))


class ForgetOut(_Out):
    forgotten: ForgottenOut


# -- the server -----------------------------------------------------------------------------------

class LazyModel:
    """A reader model that is built by ``factory`` when a call first needs it, then kept.

    A local model takes seconds to load and hundreds of MB, and a client launches the server
    for every session, most of which only remember and recall. It stands in for the model it
    builds (it is an :class:`~suffice._llm.base.LLM`), so the core checks scopes and
    arguments before anything is loaded, and a refused ``ask`` loads nothing.
    """

    def __init__(self, factory: Callable[[], LLM]) -> None:
        self._factory = factory
        self._llm: LLM | None = None
        self._lock = threading.Lock()

    def get(self) -> LLM:
        with self._lock:  # concurrent first asks build one model
            if self._llm is None:
                self._llm = self._factory()
            return self._llm

    @property
    def loaded(self) -> bool:
        return self._llm is not None

    @property
    def model(self) -> str:
        return self.get().model

    @model.setter
    def model(self, value: str) -> None:
        self.get().model = value

    def chat(self, messages: Sequence[Message], *, max_tokens: int = 256, temperature: float = 0.0,
             stop: Sequence[str] | None = None, stage: str = "answer", ledger: Ledger | None = None,
             deadline: float | None = None) -> Completion:
        return self.get().chat(messages, max_tokens=max_tokens, temperature=temperature, stop=stop,
                               stage=stage, ledger=ledger, deadline=deadline)

    def choice_probs(self, messages: Sequence[Message], choices: Mapping[str, Sequence[str]], *,
                     stage: str = "router", ledger: Ledger | None = None,
                     deadline: float | None = None) -> dict[str, float]:
        return self.get().choice_probs(messages, choices, stage=stage, ledger=ledger, deadline=deadline)

    def __getattr__(self, name: str) -> Any:
        # Anything else a backend offers (price, n_ctx, ...) is the built model's.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.get(), name)

    def close(self) -> None:
        closer = getattr(self._llm, "close", None)
        if callable(closer):
            closer()


def _result(payload: dict[str, Any]) -> CallToolResult:
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=payload)


def _error(tool: str, exc: SufficeError, hide: Sequence[str] = ()) -> CallToolResult:
    message = "\n".join([f"{type(exc).__name__}: {exc}", *map(str, getattr(exc, "__notes__", ()))])
    log.info("tool %s refused: %r", tool, message)  # the server's own log keeps the path
    message = hidden(message, hide)
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


class KeyVerifier:
    """The SDK's token verifier over a key file: a bearer token is a suffice API key, its
    client id the key's id and its scopes the key's grant (``None``, i.e. 401, when unknown)."""

    def __init__(self, keys: KeyRing) -> None:
        self.keys = keys
        self._warned = False

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            key = await anyio.to_thread.run_sync(self.keys.authenticate, token)
        except AuthenticationError:
            return None
        except ConfigError as exc:  # the key file became unreadable: refuse (401), say why once
            if not self._warned:
                log.error("cannot read the key file, refusing every request: %s", exc)
                self._warned = True
            return None
        self._warned = False
        return AccessToken(token=key.key_id, client_id=key.key_id, scopes=list(key.grant.patterns))


Where = Callable[[str | None, str | None, str | None, str | None], dict[str, Any]]
"""Turns a call's scope arguments into ``Memory`` keyword arguments (with the default scope)."""


def build_mcp_server(memory: Memory, *, scopes: Sequence[str] | None = None,
                     llm: LLM | None = None, keys: KeyRing | None = None, name: str = "suffice",
                     log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "WARNING",
                     ) -> MCPServer[Any]:
    """The MCP server over ``memory``.

    ``scopes`` binds it (``memory.restrict(scopes)``): exact names or prefixes ending in ``*``.
    ``keys``: over streamable HTTP every request must carry one of the file's API keys, and its
    calls may touch only the scopes both that key and ``scopes`` (when given) allow. When the scopes a
    call may touch are exactly one name, calls that name none use it. ``llm`` answers ``ask``
    (a :class:`LazyModel` builds it when first needed; the caller closes it); None: the
    memory's own model, which is also loaded on first use.
    """
    base = memory.restrict(scopes) if scopes else memory
    views: dict[tuple[str, tuple[str, ...]], Memory] = {}
    limiters: dict[str, anyio.CapacityLimiter] = {}

    def caller() -> Memory:
        """The memory this call may use: the server's, or its key's view of it."""
        if keys is None:
            return base
        token = get_access_token()
        if token is None:  # the bearer middleware refuses such requests before they get here
            raise AuthenticationError("an API key is required (Authorization: Bearer <key>)")
        slot = (token.client_id, tuple(token.scopes))
        if slot not in views:
            # A key reaches the scopes both it and the server's binding allow.
            key_grant = Grant.of(token.scopes)
            grant = key_grant if base.grant is None else base.grant.intersect(key_grant)
            if grant is None:
                raise AccessDeniedError(f"this key's scopes ({', '.join(key_grant.patterns)}) are outside "
                                        "the scopes this server is bound to")
            views[slot] = base.restrict(grant.patterns)
        return views[slot]

    def where_for(mem: Memory) -> Where:
        grant = mem.grant
        default = (grant.patterns[0] if grant is not None and len(grant.patterns) == 1
                   and not grant.patterns[0].endswith("*") else None)

        def where(scope: str | None, user_id: str | None, agent_id: str | None,
                  run_id: str | None) -> dict[str, Any]:
            if default is not None and all(v is None for v in (scope, user_id, agent_id, run_id)):
                scope = default
            return {"scope": scope, "user_id": user_id, "agent_id": agent_id, "run_id": run_id}
        return where

    async def call(tool: str, fn: Callable[[Memory, Where], dict[str, Any]]) -> CallToolResult:
        kind = "ask" if tool == "ask" else "other"
        if kind not in limiters:  # made inside the event loop that serves the calls
            limiters[kind] = anyio.CapacityLimiter(ASK_WORKERS if kind == "ask" else WORKERS)
        limiter = limiters[kind]
        try:
            mem = caller()  # here, in the request's context, not on the worker thread
            where = where_for(mem)
            return _result(await anyio.to_thread.run_sync(lambda: fn(mem, where), limiter=limiter))
        except SufficeError as exc:
            return _error(tool, exc, hide=(memory.path,))

    auth: dict[str, Any] = {}
    if keys is not None:
        # A resource server only: no OAuth routes, no metadata; the issuer is a required field.
        auth = {"token_verifier": KeyVerifier(keys),
                "auth": AuthSettings(issuer_url="http://127.0.0.1", resource_server_url=None)}
    server: MCPServer[Any] = _Server(name, version=__version__, instructions=INSTRUCTIONS,
                                     log_level=log_level, **auth)

    async def remember(
        items: Annotated[list[Entry], Field(min_length=1, max_length=MAX_ITEMS, description=(
            "What to store: plain strings, items ({text, ...}) or chat messages "
            "({role, content, ...}), in the order they happened."))],
        scope: ScopeArg = None, user_id: UserArg = None, agent_id: AgentArg = None,
        run_id: RunArg = None,
        session: Annotated[str, Field(max_length=MAX_NAME, description=(
            "Session of the entries that name none."))] = "",
        observed_at: Annotated[str, Field(max_length=MAX_NAME, description=(
            "When the entries that name no time happened."))] = "",
        meta: Annotated[dict[str, Any] | None, Field(description=(
            "Meta merged into every entry's."))] = None,
    ) -> Annotated[CallToolResult, ItemsOut]:
        """Store turns, steps or chat messages verbatim (idempotent for entries with an id).

        Returns the items as stored, with their ids and positions."""
        entries: list[Any] = [e if isinstance(e, str) else e.model_dump(exclude_none=True) for e in items]
        return await call("remember", lambda mem, where: {"items": to_json(mem.add(
            entries, **where(scope, user_id, agent_id, run_id), session=session,
            observed_at=observed_at, meta=meta))})

    async def recall(
        query: Annotated[str, Field(max_length=MAX_TEXT, description=(
            "What the memory is for (a question, the task at hand); empty: the timeline alone."))] = "",
        budget_tokens: Annotated[int, Field(strict=True, ge=1, le=MAX_BUDGET, description=(
            "Most tokens (o200k) the rendered memory may take.")), WHOLE] = 2000,
        mode: Annotated[Literal["unit", "piece", "unit+piece", "timeline"] | None, Field(description=(
            "What fills the budget beside the timeline; default: the server's render config."))] = None,
        agent_mode: Annotated[bool, Field(strict=True, description=(
            "Keep the newest items verbatim first (for an agent's working memory)."))] = False,
        scope: ScopeArg = None, user_id: UserArg = None, agent_id: AgentArg = None,
        run_id: RunArg = None, session: SessionArg = None, speaker: SpeakerArg = None,
        kind: KindArg = None, role: RoleArg = None, since: SinceArg = None, until: UntilArg = None,
        meta: MetaArg = None,
    ) -> Annotated[CallToolResult, RecallOut]:
        """Render memory for a query within a token budget: a timeline plus the details that
        matter, each part with the reason it is there. Deterministic, no model call."""
        return await call("recall", lambda mem, where: {"context": to_json(mem.render(
            query, budget_tokens, **where(scope, user_id, agent_id, run_id), mode=mode, agent=agent_mode,
            session=session, speaker=speaker, kind=kind, role=role, since=since, until=until,
            meta=meta))})

    async def ask(
        question: Annotated[str, Field(min_length=1, max_length=MAX_TEXT, description="The question.")],
        mode: Annotated[Literal["fast", "deep", "auto"], Field(description=(
            "fast: answer from the retrieved evidence at once; deep: memory agents read the "
            "relevant stretches first (slower, for questions that span much); auto: deep only "
            "when the evidence does not suffice."))] = "fast",
        budget: Annotated[int | None, Field(strict=True, ge=1, le=MAX_BUDGET, description=(
            "Tokens of context the reader gets (default: the engine's).")), WHOLE] = None,
        timeout_s: Annotated[float | None, Field(strict=True, gt=0, le=MAX_ASK_SECONDS, description=(
            "Seconds for the whole question, model calls included; then it answers from "
            f"what it has (default {ASK_DEADLINE_S:.0f})."))] = None,
        tau: Annotated[float | None, Field(strict=True, ge=0.0, le=1.0, description=(
            "With mode auto: the router score at which the fast answer stands."))] = None,
        scope: ScopeArg = None, user_id: UserArg = None, agent_id: AgentArg = None,
        run_id: RunArg = None, session: SessionArg = None, speaker: SpeakerArg = None,
        kind: KindArg = None, role: RoleArg = None, since: SinceArg = None, until: UntilArg = None,
        meta: MetaArg = None,
    ) -> Annotated[CallToolResult, AskOut]:
        """Answer a question from memory. The receipt says how: path, router decision, the
        evidence used, each model call with its tokens, cost and time."""
        def run(mem: Memory, where: Where) -> dict[str, Any]:
            answer = mem.ask(question, **where(scope, user_id, agent_id, run_id),
                             llm=llm, mode=mode, budget=budget, timeout=timeout_s or ASK_DEADLINE_S,
                             tau=tau, session=session, speaker=speaker, kind=kind,
                             role=role, since=since, until=until, meta=meta)
            return {"answer": to_json(answer)}
        return await call("ask", run)

    async def list_items(
        scope: ScopeArg = None, user_id: UserArg = None, agent_id: AgentArg = None,
        run_id: RunArg = None, session: SessionArg = None, speaker: SpeakerArg = None,
        kind: KindArg = None, role: RoleArg = None, since: SinceArg = None, until: UntilArg = None,
        meta: MetaArg = None,
        offset: Annotated[int, Field(strict=True, ge=0, le=1_000_000,
                                     description="Skip this many matching items."), WHOLE] = 0,
        limit: Annotated[int, Field(strict=True, ge=1, le=MAX_LIST,
                                    description="Return at most this many."), WHOLE] = 50,
        newest_first: Annotated[bool, Field(strict=True, description="Newest items first.")] = False,
    ) -> Annotated[CallToolResult, ItemsOut]:
        """List stored items in the order they happened (or newest first), filtered and paged.
        Fewer than ``limit`` items back means there are no more."""
        return await call("list", lambda mem, where: {"items": to_json(mem.items(
            **where(scope, user_id, agent_id, run_id), session=session, speaker=speaker, kind=kind,
            role=role, since=since, until=until, meta=meta, offset=offset, limit=limit,
            newest_first=newest_first))})

    async def forget(
        ids: Annotated[list[Annotated[str, Field(min_length=1, max_length=MAX_NAME)]] | None, Field(
            max_length=MAX_ITEMS, description="Forget these items (by id).")] = None,
        session: Annotated[str | None, Field(max_length=MAX_NAME, description=(
            "Forget this session."))] = None,
        everything: Annotated[bool, Field(strict=True, description=(
            "Forget the whole scope (or run). Needed when neither ids nor session is given, so "
            "a call cannot wipe a memory by leaving arguments out."))] = False,
        scope: ScopeArg = None, user_id: UserArg = None, run_id: RunArg = None,
    ) -> Annotated[CallToolResult, ForgetOut]:
        """Delete items, a session or a whole scope, and every trace derived from them (for
        privacy); cannot be undone. Returns counts only."""
        def run(mem: Memory, where: Where) -> dict[str, Any]:
            nonlocal ids, session
            # Clients fill optional arguments with "" and []: those mean "not given". Passed on,
            # everything=true with session="" forgot only the items of the unnamed session.
            ids, session = ids or None, session or None
            if not (ids or session or everything or run_id):
                raise InvalidQueryError("say what to forget: ids, a session or run_id, or everything=true "
                                        "for the whole scope")
            if everything and (ids or session):
                raise InvalidQueryError("everything=true forgets the whole scope or run; do not "
                                        "combine it with ids or a session")
            return {"forgotten": to_json(mem.forget(ids=ids, session=session, everything=everything,
                                                    **where(scope, user_id, None, run_id)))}
        return await call("forget", run)

    async def fit(
        messages: Annotated[list[dict[str, Any]], Field(min_length=1, max_length=MAX_ITEMS * 10, description=(
            "The agent's whole running message list, OpenAI format."))],
        budget_tokens: Annotated[int, Field(strict=True, ge=1, le=MAX_BUDGET, description=(
            "Most tokens the returned messages may take.")), WHOLE],
        recent_share: Annotated[float, Field(strict=True, gt=0.0, le=1.0, description=(
            "Share of the budget kept verbatim as the newest messages."))] = 0.25,
        query: Annotated[str | None, Field(max_length=MAX_TEXT, description=(
            "What the memory is for (default: the newest user text)."))] = None,
        scope: ScopeArg = None, user_id: UserArg = None, agent_id: AgentArg = None,
        run_id: RunArg = None, session: FitSessionArg = None,
    ) -> Annotated[CallToolResult, FitOut]:
        """The messages to send the agent's model next: system messages and the newest ones
        verbatim, the dropped middle replaced by memory rendered for this step. Every message
        is stored once, so nothing dropped is lost."""
        return await call("fit", lambda mem, where: {"fitted": to_json(mem.fit(
            messages, budget_tokens, **where(scope, user_id, agent_id, run_id), session=session,
            recent_share=recent_share, query=query))})

    server.add_tool(fit, annotations=ToolAnnotations(
        title="Fit an agent's messages into a budget", read_only_hint=False, destructive_hint=False,
        idempotent_hint=True, open_world_hint=False))
    server.add_tool(remember, annotations=ToolAnnotations(
        title="Remember", read_only_hint=False, destructive_hint=False, idempotent_hint=False,
        open_world_hint=False))
    server.add_tool(recall, annotations=ToolAnnotations(
        title="Recall memory under a token budget", read_only_hint=True, open_world_hint=False))
    server.add_tool(ask, annotations=ToolAnnotations(
        title="Ask memory", read_only_hint=True, open_world_hint=False))
    server.add_tool(list_items, name="list", annotations=ToolAnnotations(
        title="List items", read_only_hint=True, open_world_hint=False))
    server.add_tool(forget, annotations=ToolAnnotations(
        title="Forget", read_only_hint=False, destructive_hint=True, idempotent_hint=True,
        open_world_hint=False))
    for tool in server._tool_manager.list_tools():  # what call_tool enforces, in the schema
        tool.parameters["additionalProperties"] = False
    return server


def serve(server: MCPServer[Any], transport: Literal["stdio", "http"] = "stdio", *,
          host: str = "127.0.0.1", port: int = 8000, path: str = "/mcp", allow_remote: bool = False,
          announce: Callable[[str], None] | None = None) -> None:
    """Run ``server`` until its client leaves (stdio) or the process is interrupted (http).

    Without keys, streamable HTTP binds loopback unless ``allow_remote``: any host that can
    reach the port would read and write the memory it is bound to. A server built with keys
    may bind any address. Port 0 takes any free port; ``announce`` (default: a line on stderr)
    gets the URL either way.
    """
    say = announce or (lambda line: print(line, file=sys.stderr, flush=True))
    if transport == "stdio":
        say(f"suffice mcp {__version__}: serving over stdio")
        anyio.run(server.run_stdio_async)
        return
    if transport != "http":
        raise ConfigError(f"unknown transport {transport!r}; use stdio or http")
    check_http(host, path, allow_remote or server.settings.auth is not None)
    anyio.run(_serve_http, server, host, port, path, say)


def check_http(host: str, path: str, allow_remote: bool = False) -> None:
    """Refuse, before anything is opened, an address or path streamable HTTP must not use."""
    if host not in LOOPBACK and not allow_remote:
        raise ConfigError(f"without API keys the MCP server binds loopback only; {host!r} would "
                          "expose the memory to the network (give --keys FILE, or pass --allow-remote "
                          "behind a proxy that authenticates)")
    if not path.startswith("/"):
        raise ConfigError(f"the HTTP path must start with '/', got {path!r}")


async def _serve_http(server: MCPServer[Any], host: str, port: int, path: str,
                      say: Callable[[str], None]) -> None:
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)  # connections queue from the moment the URL is announced
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror or exc})") from None
    bound = sock.getsockname()[1]  # the real port when 0 was asked for
    app = server.streamable_http_app(streamable_http_path=path, host=host)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    say(f"suffice mcp {__version__}: streamable HTTP on http://{shown}:{bound}{path}")
    with sock:
        await uvicorn.Server(config).serve(sockets=[sock])
