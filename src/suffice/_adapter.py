"""Fit an agent's running message list into a token budget, the way agent frameworks need it.

An agent loop holds an OpenAI-style message list that grows past any context window. ``fit``
keeps what a model must see verbatim (the leading system messages and a recent window of
about ``recent_share`` of the budget, FlexA-Mem's agentic setting) and puts, in place of the
dropped middle, one message holding the memory rendered for the current step under the budget
left. Every message is written to memory once (ids derived from the session and position, so
sending the grown list again writes only the new messages), so nothing dropped is lost: it is
what the rendered memory draws on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._config import RenderConfig, RetrievalConfig
from ._errors import BudgetError, InvalidItemError
from ._render import Renderer
from ._tokens import count_tokens
from ._types import Context, Filter, Item

Add = Callable[[list[dict[str, Any]], str, str], list[Item]]
"""(messages with ids, scope, session) -> the items as stored: how the adapter writes."""

MESSAGE_OVERHEAD = 4
"""Tokens a chat format spends per message beyond its content (role and separators)."""
MEMORY_HEADER = "Memory of earlier steps (verbatim, in time order; a timeline line per part):"
LEADING_ROLES = ("system", "developer")


@dataclass(frozen=True, slots=True)
class FittedMessages:
    """The messages to send, and how they were made."""

    messages: list[dict[str, Any]]
    tokens: int
    """Estimated tokens of ``messages`` (o200k content plus a per-message overhead)."""
    budget: int
    kept_recent: int
    """Messages of the recent window, sent verbatim."""
    dropped: int
    """Messages left out (they are in memory; the rendered memory draws on them)."""
    context: Context | None
    """The rendered memory (with its parts and reasons), None when everything fitted."""
    stored: int
    """Items this call wrote to memory (0 when every message was stored before)."""


def message_tokens(msg: Mapping[str, Any]) -> int:
    """Estimated tokens of one chat message: its text, its tool calls, and the overhead."""
    content = msg.get("content")
    if isinstance(content, list):
        text = "\n".join(p.get("text", "") if isinstance(p, Mapping) else str(p) for p in content)
    else:
        text = content if isinstance(content, str) else ""
    calls = msg.get("tool_calls")
    extra = json.dumps(calls, ensure_ascii=False, sort_keys=True) if calls else ""
    return count_tokens(text) + (count_tokens(extra) if extra else 0) + MESSAGE_OVERHEAD


def _message_id(session: str, index: int, msg: Mapping[str, Any]) -> str:
    body = json.dumps(msg, ensure_ascii=False, sort_keys=True, default=str)
    return f"{session}:{index}:{hashlib.sha256(body.encode('utf-8')).hexdigest()[:16]}"


def fit_messages(add: Add, renderer: Renderer, retrieval: RetrievalConfig, scope: str,
                 messages: Sequence[Mapping[str, Any]], budget_tokens: int, *, session: str,
                 recent_share: float = 0.25, query: str | None = None, render: RenderConfig | None = None,
                 memory_role: str = "system") -> FittedMessages:
    """See :meth:`suffice.Memory.fit`; the memory hands in how to write and how to render."""
    if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int) or budget_tokens <= 0:
        raise BudgetError(f"budget_tokens must be a positive whole number, got {budget_tokens!r}")
    if not 0.0 < recent_share <= 1.0:
        raise BudgetError(f"recent_share must be in (0, 1], got {recent_share!r}")
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise InvalidItemError("messages must be a list of chat messages")
    msgs = [dict(m) if isinstance(m, Mapping) else m for m in messages]
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidItemError(f"message {i}: a chat message needs a 'role'")
    if not msgs:
        raise InvalidItemError("messages is empty")

    lead = 0
    while lead < len(msgs) and msgs[lead]["role"] in LEADING_ROLES:
        lead += 1
    costs = [message_tokens(m) for m in msgs]
    fixed = sum(costs[:lead])
    if fixed > budget_tokens:
        raise BudgetError(f"the system messages alone take {fixed} tokens, over the budget of "
                          f"{budget_tokens}")

    # Written once: ids from session and position, so a re-sent list stores only its new tail.
    body = msgs[lead:]
    with_ids = [{**m, "id": m.get("id") or _message_id(session, lead + i, m)} for i, m in enumerate(body)]
    last_seq = renderer.store.max_seq(scope)  # -1 for a new scope
    stored = add(with_ids, scope, session) if with_ids else []
    written = sum(1 for it in stored if it.seq > last_seq)  # messages stored before come back as they were
    first_seq: dict[str, int] = {}
    for it in stored:
        base = it.id.split("#call", 1)[0]
        first_seq.setdefault(base, it.seq)

    if sum(costs) <= budget_tokens:
        return FittedMessages(list(msgs), sum(costs), budget_tokens, len(body), 0, None, written)

    # Recent window: newest messages while they fit in recent_share of the budget (the newest
    # one always, when it fits the budget at all); it never starts with a tool result cut off
    # from the call that asked for it.
    window = int(recent_share * budget_tokens)
    start, used = len(msgs), 0
    while start > lead and (used + costs[start - 1] <= window or start == len(msgs)):
        if fixed + used + costs[start - 1] > budget_tokens:
            break
        start -= 1
        used += costs[start]
    while start < len(msgs) and msgs[start]["role"] in ("tool", "function"):
        used -= costs[start]
        start += 1
    recent = msgs[start:]

    left = budget_tokens - fixed - used - MESSAGE_OVERHEAD - count_tokens(MEMORY_HEADER) - 1
    context = None
    middle: list[dict[str, Any]] = []
    if left > 0 and start > lead:
        cut = first_seq.get(with_ids[start - lead]["id"]) if start < len(msgs) else None
        flt = Filter(before_seq=cut) if cut is not None else None
        q = query if query is not None else _last_text(msgs)
        context = renderer.render(scope, q, left, config=render or RenderConfig.for_agent(),
                                  retrieval=retrieval, flt=flt, agent=False)
        if context.text:
            middle = [{"role": memory_role, "content": f"{MEMORY_HEADER}\n{context.text}"}]
    out = [*msgs[:lead], *middle, *recent]
    tokens = sum(message_tokens(m) for m in out)
    if tokens > budget_tokens and middle:  # token merges at the header's seam: never over budget
        out = [*msgs[:lead], *recent]
        tokens, context = sum(message_tokens(m) for m in out), None
    return FittedMessages(out, tokens, budget_tokens, len(recent), start - lead, context, written)


def _last_text(msgs: Sequence[Mapping[str, Any]]) -> str:
    """What the next step is about: the newest message with text (a user turn first)."""
    for role in ("user", None):
        for m in reversed(msgs):
            content = m.get("content")
            if isinstance(content, str) and content.strip() and (role is None or m.get("role") == role):
                return content
    return ""
