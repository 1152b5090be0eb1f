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

import dataclasses
import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._config import RenderConfig, RetrievalConfig
from ._errors import BudgetError, InvalidItemError, InvalidQueryError
from ._messages import TEXT_PARTS, check_message, message_items
from ._render import Renderer
from ._store.base import validate_item
from ._tokens import count_tokens, cut_middle
from ._types import Context, Filter, Item

Add = Callable[[list[dict[str, Any]], str, str], list[Item]]
"""(messages with ids, scope, session) -> the items as stored: how the adapter writes."""

MESSAGE_OVERHEAD = 4
"""Tokens a chat format spends per message beyond its content (role and separators)."""
PART_TOKENS = 1_600
"""What a non-text content part (an image, audio, a file) is counted as: the most an image
costs at high detail in OpenAI's accounting (1,445, a tall screenshot) and about what
Anthropic's counts for the largest image it reads unscaled. An upper bound, so that a window
of screenshots never passes for less than it costs."""
MEMORY_HEADER = "Memory of earlier steps (verbatim, in time order; a timeline line per part):"
_STANDS_FOR = re.compile(re.escape(MEMORY_HEADER).replace(r"\(", r"\((\d+)\ earlier\ messages?;\ ", 1))
"""A memory message that says how many earlier messages it stands for, which lets a list sent
back keep its messages' positions: the whole header, with the count in it."""
LEADING_ROLES = ("system", "developer")
TASK_END = "(end of the task)"
SHARED_SESSION = "agent"
"""The session of fits that name none: every such run of a scope shares it, so its first user
message is not this run's task."""
_TASK_ID = re.compile(r"^The run's task[^\n]*?item (\"(?:[^\"\\]|\\.)*\")", re.M)
"""The task's item id in a memory message: sent back, the task is read again by it."""
TASK_SHARE = 0.5
"""Most of the memory's tokens the pinned task may take; a longer one is shown cut."""
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
"""Characters no store takes (NUL; lone surrogates, which UTF-8 cannot hold)."""
MEMORY_ROLES = ("system", "developer", "user")
RESULT_ROLES = ("tool", "function")


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


def _text_of(msg: Mapping[str, Any]) -> tuple[str, int]:
    """(the text of a message's content, how many non-text parts it has)."""
    content = msg.get("content")
    if isinstance(content, str):
        return content, 0
    if not isinstance(content, list):
        return "", 0
    texts, others = [], 0
    for p in content:
        if isinstance(p, str):
            texts.append(p)
        elif isinstance(p, Mapping) and p.get("type") in TEXT_PARTS:
            texts.append(str(p.get(TEXT_PARTS[p["type"]]) or ""))
        else:
            others += 1
    return "\n".join(texts), others


_COUNTED_APART = ("role", "content", "tool_calls", "function_call", "refusal", "name", "tool_call_id")


def message_tokens(msg: Mapping[str, Any]) -> int:
    """Estimated tokens of one chat message: its text, its other parts, its tool calls,
    refusal, name and tool call id, every other field it carries (a ``reasoning_content``
    is sent on with the message, so it counts), and the per-message overhead."""
    text, others = _text_of(msg)
    extra = [json.dumps(msg[k], ensure_ascii=False, sort_keys=True, default=str)
             for k in ("tool_calls", "function_call") if msg.get(k)]
    extra += [msg[k] for k in ("refusal", "name", "tool_call_id") if isinstance(msg.get(k), str)]
    extra += [v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, sort_keys=True, default=str)
              for k, v in msg.items() if k not in _COUNTED_APART and v is not None and v != ""]
    return (count_tokens(text) + sum(count_tokens(x) for x in extra) + others * PART_TOKENS
            + MESSAGE_OVERHEAD)


def _plain(msg: object) -> object:
    """A message as a dict: SDK message objects (pydantic models, as an OpenAI client returns
    them, tool calls included) are dumped; anything else is left for the checks."""
    if hasattr(msg, "model_dump"):
        msg = msg.model_dump(exclude_none=True)
    if not isinstance(msg, Mapping):
        return msg
    out = dict(msg)
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [c.model_dump(exclude_none=True) if hasattr(c, "model_dump") else c
                             for c in out["tool_calls"]]
    return out


def _storable(msg: Mapping[str, Any], sent_back: bool = False) -> bool:
    """Whether a message has anything to remember: an empty assistant turn is sent on as it is
    but stored as nothing; a tool result always is (an empty one as "(no output)"). A message
    an earlier fit sent cut, sent back (``sent_back``: it follows a memory message that stands
    for earlier ones), is a copy of one stored whole: not stored again. Elsewhere the marker's
    text is just text (a grep of this very file prints it)."""
    text, others = _text_of(msg)
    if sent_back and CUT_MARKER in text:
        return False
    if msg.get("role") in ("tool", "function"):
        return True
    refusal = msg.get("refusal")
    return bool(text.strip() or others or _calls(msg) or (isinstance(refusal, str) and refusal.strip()))


def _message_id(session: str, index: int, msg: Mapping[str, Any], agent: str | None = None) -> str:
    """An id from session, position and content. Null fields and empty annotations do not
    count, but for ``content``, counted as null when absent: the same message reloaded from
    JSON (where an SDK wrote its nulls) keeps its id, and so does the usual hand-written
    ``{"role": "assistant", "content": None, "tool_calls": [...]}`` of earlier versions. The
    agent, when there is one, goes into the digest: two agents of one user may open alike."""
    body = json.dumps({"content": None, **_without_nulls(msg)}, ensure_ascii=False, sort_keys=True,
                      default=str)
    if agent:
        body = json.dumps(agent) + "\x1f" + body
    digest = hashlib.sha256(body.encode('utf-8', 'surrogatepass')).hexdigest()  # a lone surrogate too
    return f"{session}:{index}:{digest[:16]}"


def _without_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items()
                if v is not None and not (k == "annotations" and v == [])}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _is_memory(msg: Mapping[str, Any]) -> bool:
    """A memory message an earlier ``fit`` made: sent back, it is dropped, not stored again."""
    content = msg.get("content")
    return (msg.get("role") in MEMORY_ROLES and isinstance(content, str)
            and (content.startswith(MEMORY_HEADER) or _STANDS_FOR.match(content) is not None))


def _memory_header(earlier: int) -> str:
    """The memory message's first line, saying how many earlier messages it stands for."""
    return MEMORY_HEADER.replace("(", f"({earlier} earlier message{'' if earlier == 1 else 's'}; ", 1)


def fit_messages(add: Add, renderer: Renderer, retrieval: RetrievalConfig, scope: str,
                 messages: Sequence[Mapping[str, Any]], budget_tokens: int, *, session: str,
                 recent_share: float = 0.25, query: str | None = None, render: RenderConfig | None = None,
                 memory_role: str = "system", flt: Filter | None = None,
                 agent: str | None = None) -> FittedMessages:
    """See :meth:`suffice.Memory.fit`; the memory hands in how to write and how to render,
    ``flt``, what of the scope the render may draw on (the call's agent and run), and
    ``agent``, whose messages these are (part of their ids: two agents of one user may open
    with the same message)."""
    if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int) or budget_tokens <= 0:
        raise BudgetError(f"budget_tokens must be a positive whole number, got {budget_tokens!r}")
    if isinstance(recent_share, bool) or not isinstance(recent_share, (int, float)) \
            or not 0.0 < recent_share <= 1.0:
        raise BudgetError(f"recent_share must be in (0, 1], got {recent_share!r}")
    if query is not None and (not isinstance(query, str) or not query.strip()):
        raise InvalidQueryError(f"query must be non-empty text when given, got {query!r:.40}")
    if memory_role not in MEMORY_ROLES:
        raise InvalidItemError(f"memory_role must be one of {', '.join(MEMORY_ROLES)}, got {memory_role!r}")
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise InvalidItemError("messages must be a list of chat messages")
    msgs: list[dict[str, Any]] = []
    at: list[int] = []  # each message's index in the caller's list, for errors
    # A list an earlier fit returned, sent back grown: its memory message stands for the
    # messages it replaced, so those after it keep their positions (and ids) in the whole run.
    resumed_at, earlier = len(messages) + 1, 0
    pinned = ""  # the id of the task a memory message sent back named
    for i, raw in enumerate(messages):
        m = _plain(raw)
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise InvalidItemError(f"message {i}: a chat message needs a 'role'")
        if not _is_memory(m):
            msgs.append(m)
            at.append(i)
        elif (said := _STANDS_FOR.match(m["content"])) is not None:
            resumed_at, earlier = len(msgs), int(said.group(1))
            pinned = _pinned_task(m["content"])
    if not msgs:
        raise InvalidItemError("messages is empty")
    for m, i in zip(msgs, at, strict=True):  # numbered as the caller's list, before anything is written
        check_message(m, i)
    _check_pairing(msgs, at)
    # What is stored: each message with the characters no store takes replaced (a tool's raw
    # bytes may hold NUL); it is sent on as it came. Refusing it would fail every later step.
    copies = [_storable_copy(m) for m in msgs]
    after_memory = [bool(earlier) and j >= resumed_at for j in range(len(msgs))]
    for c, i, back in zip(copies, at, after_memory, strict=True):
        if _storable(c, back):
            try:
                for new in message_items(c, i, {}):
                    validate_item(new, i)
            except InvalidItemError as exc:
                raise InvalidItemError(str(exc).replace(f"item {i}", f"message {i}", 1)) from None

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

    def place(at: int) -> int:  # a message's position in the whole run
        return at + (earlier if at >= resumed_at else 0)

    ids = [m.get("id") or _message_id(session, place(lead + i), m, agent) for i, m in enumerate(body)]
    # Stored without null fields, as the ids are made: a history reloaded from JSON (where an
    # SDK wrote its nulls) is the same messages.
    with_ids = [{**_without_nulls(c), "id": ident}
                for c, ident, back in zip(copies[lead:], ids, after_memory[lead:], strict=True)
                if _storable(c, back)]
    last_seq = renderer.store.max_seq(scope)  # -1 for a new scope
    stored = add(with_ids, scope, session) if with_ids else []
    written = sum(1 for it in stored if it.seq > last_seq)  # messages stored before come back as they were
    first_seq: dict[str, int] = {}
    for it in stored:
        base = it.id.split("#call", 1)[0]
        first_seq.setdefault(base, it.seq)

    # A list that fits is sent as it is, unless it stands for earlier messages: then it gets
    # memory of them again (sent back, its memory message was dropped above).
    if sum(costs) <= budget_tokens and not earlier:
        return FittedMessages(list(msgs), sum(costs), budget_tokens, len(body), 0, None, written)

    # Some messages will be left out: room for the memory message's header is kept first, so a
    # list sent back always says how many messages it stands for.
    reserve = MESSAGE_OVERHEAD + count_tokens(_memory_header(len(messages) + earlier)) + 1
    start, used = _recent_window(msgs, costs, lead, fixed, max(budget_tokens - reserve, 1), recent_share)
    cut_newest = False
    recent = msgs[start:]
    if start == len(msgs):  # the newest turn alone is over the budget: send it cut
        newest = _newest_cut(msgs, costs, lead, budget_tokens - fixed, reserve)
        if newest is None:
            # Sent without its newest turn, the list would ask the model about nothing (or be
            # empty): refuse, after storing it, so the caller can widen the budget.
            call = _asking_call(msgs, len(msgs) - 1, lead) if msgs[-1]["role"] in RESULT_ROLES else None
            if _calls(msgs[-1]):
                what = f"the newest message ({costs[-1]} tokens of tool calls, which cannot be cut)"
            elif call is not None:
                what = (f"the newest message ({costs[-1]} tokens), a tool result, with the tool call "
                        f"it answers ({costs[call]} tokens, which cannot be cut)")
            else:
                what = f"the newest message ({costs[-1]} tokens)"
            raise BudgetError(f"{what} cannot be sent within {budget_tokens} tokens, even cut, "
                              f"beside {fixed} tokens of system messages; it is stored")
        start, recent, cut_newest = len(msgs) - len(newest), newest, True
        used = sum(message_tokens(m) for m in newest)

    header = _memory_header(place(start) - lead)
    left = budget_tokens - fixed - used - MESSAGE_OVERHEAD - count_tokens(header) - 1
    context = None
    middle: list[dict[str, Any]] = []
    # The run's task: this list's first user message left out of the window, or the item the
    # memory message sent back named. The memory names it either way, so every later step
    # (sent back, its task message long gone) finds it again.
    first = next((j for j in range(lead, start) if msgs[j]["role"] == "user"), None)
    task_id = ids[first - lead] if first is not None and not earlier else pinned
    if not task_id and earlier and session != SHARED_SESSION:
        # Sent back from a step with no room to name it: a run's own session (run_id, or a
        # session named) holds one task, its first user message.
        where = dataclasses.replace(flt or Filter(), session=session, role="user", before_seq=None)
        found = renderer.store.find(scope, where, limit=1)
        task_id = found[0].id if found else ""
    if left > 0 and (start > lead or cut_newest or earlier):
        # The render draws only on what is older than the window (the window is sent verbatim),
        # except when the newest message went out cut: then its left-out middle is memory this
        # call may need, so the render may draw on it (and on the small call it answers).
        cut = None if cut_newest else next(
            (first_seq[ident] for ident in ids[start - lead:] if ident in first_seq), None)
        if cut is not None:
            flt = dataclasses.replace(flt or Filter(), before_seq=cut)
        # The task leads the memory when the window left it out: a step asked with a nudge
        # ("continue") says nothing of it, and the render for that step would drop it. Without
        # room for it, the memory still names it.
        task_item = renderer.store.get(scope, task_id) if task_id else None
        task = "" if task_item is None else (_task_block(task_item, int(left * TASK_SHARE))
                                             or _task_stub(task_item.id, shown=False))
        q = query if query is not None else _last_text(msgs)
        room = left - (count_tokens(task) + 1 if task else 0)
        context = renderer.render(scope, q, room, config=render or RenderConfig.for_agent(),
                                  retrieval=retrieval, flt=flt, agent=False) if room > 0 else None
        if task and task_item is not None and context is not None and task_item.text in context.text \
                and any(task_item.seq in p.seqs for p in context.parts if p.kind != "record"):
            task = _task_stub(task_item.id, shown=True)  # the render shows that item whole anyway
        body_text = "\n".join(t for t in (task, context.text if context else "") if t)
        if body_text:
            middle = [{"role": memory_role, "content": f"{header}\n{body_text}"}]
    out = [*msgs[:lead], *middle, *recent]
    tokens = sum(message_tokens(m) for m in out)
    if tokens > budget_tokens and middle:  # token merges at the header's seam: never over budget
        middle, context = [], None
    if not middle and place(start) > lead:
        # Messages were left out and no memory of them fits: the header alone still says how
        # many, so this list sent back keeps its messages' ids (nothing is stored twice), and
        # it names the task when that fits too.
        middle = [{"role": memory_role, "content": header}]
        if task_id:
            with_task = [{"role": memory_role, "content": f"{header}\n{_task_stub(task_id, shown=False)}"}]
            if sum(message_tokens(m) for m in [*msgs[:lead], *with_task, *recent]) <= budget_tokens:
                middle = with_task
    out = [*msgs[:lead], *middle, *recent]
    tokens = sum(message_tokens(m) for m in out)
    if tokens > budget_tokens:  # not even the header fits: the list is sent without it
        out = [*msgs[:lead], *recent]
        tokens = sum(message_tokens(m) for m in out)
    return FittedMessages(out, tokens, budget_tokens, len(recent), start - lead, context, written)


def _recent_window(msgs: Sequence[Mapping[str, Any]], costs: Sequence[int], lead: int, fixed: int,
                   budget: int, recent_share: float) -> tuple[int, int]:
    """(where the recent window starts, its tokens): the newest messages while they fit in
    ``recent_share`` of the budget (the newest one always, when it fits the budget at all).

    It never opens on a tool result cut off from the call that asked for it: it reaches back
    to that call when the whole budget allows, as an agent's pending call and its results are
    what its next step reads; else the cut-off results go (they are in memory)."""
    window = int(recent_share * budget)
    start, used = len(msgs), 0
    while start > lead and (used + costs[start - 1] <= window or start == len(msgs)):
        if fixed + used + costs[start - 1] > budget:
            break
        start -= 1
        used += costs[start]
    if start < len(msgs) and msgs[start]["role"] in RESULT_ROLES:
        call = _asking_call(msgs, start, lead)
        if call is not None and fixed + used + sum(costs[call:start]) <= budget:
            return call, used + sum(costs[call:start])
    while start < len(msgs) and msgs[start]["role"] in RESULT_ROLES:
        used -= costs[start]
        start += 1
    return start, used


def _asking_call(msgs: Sequence[Mapping[str, Any]], result: int, lead: int) -> int | None:
    """Where the assistant message is whose tool calls the result at ``result`` (and the
    results just before it) answer; None when no such message precedes them."""
    back = result
    while back > lead and msgs[back - 1]["role"] in RESULT_ROLES:
        back -= 1
    call = back - 1
    if call >= lead and msgs[call]["role"] == "assistant" and _calls(msgs[call]):
        return call
    return None


CUT_MARKER = "[... part of this message left out here to fit the budget; all of it is in memory ...]"


def _newest_cut(msgs: Sequence[Mapping[str, Any]], costs: Sequence[int], lead: int, room: int,
                reserve: int = 0) -> list[dict[str, Any]] | None:
    """The newest message cut (head and tail, marked) to half of ``room``, leaving the other
    half to memory, or when that is too little, to all of it but ``reserve`` (the memory
    header), after the tool call it answers: the model must still see the current turn, and a
    tool result may not come without its call. The call's other results are sent whole when
    they fit beside it, else every result of the call is cut to an equal share. None when that
    cannot be done (a newest message of tool calls, whose arguments cannot be cut, or a call
    too long itself)."""
    last = msgs[-1]
    shares = (room // 2, room - reserve)
    if _calls(last):
        return None
    if last["role"] not in RESULT_ROLES:
        return next(([cut] for share in shares if (cut := _cut_to(last, share)) is not None), None)
    call = _asking_call(msgs, len(msgs) - 1, lead)
    if call is None:
        return None
    siblings = list(range(call + 1, len(msgs) - 1))
    for share in shares:
        whole = _cut_to(last, share - sum(costs[call:len(msgs) - 1]))
        if whole is not None:
            return [*(dict(msgs[i]) for i in range(call, len(msgs) - 1)), whole]
        each = (share - costs[call]) // (len(siblings) + 1)
        results = [_cut_to(msgs[i], each) for i in [*siblings, len(msgs) - 1]]
        if all(r is not None for r in results):
            return [dict(msgs[call]), *(r for r in results if r is not None)]
    return None


def _cut_to(msg: Mapping[str, Any], room: int) -> dict[str, Any] | None:
    """``msg`` within ``room`` tokens, its text cut in the middle (marked); parts that are not
    text (an image) are kept, after the text. None when there is too little room."""
    if message_tokens(msg) <= room:
        return dict(msg)
    text, others = _text_of(msg)
    out = {k: v for k, v in msg.items() if k != "content"}
    share = room - message_tokens(out) - others * PART_TOKENS
    if share < 50 or not text:
        return None
    cut = cut_middle(text, share, CUT_MARKER)
    content = msg.get("content")
    if isinstance(content, list) and others:
        kept = [p for p in content if isinstance(p, Mapping) and p.get("type") not in TEXT_PARTS]
        out["content"] = [{"type": "text", "text": cut}, *kept]
    else:
        out["content"] = cut
    return out


def _calls(msg: Mapping[str, Any]) -> bool:
    """Whether the message asks for tool calls (OpenAI's tool_calls or the older function_call)."""
    return bool(msg.get("tool_calls") or msg.get("function_call"))


def _task_block(task: Item, room: int) -> str:
    """The run's task as the memory's first lines, named by its item (cut in the middle to fit
    ``room``), or "" when there is no room."""
    if room < 50:
        return ""
    head = f"The run's task (its first user message, item {json.dumps(task.id)}):"
    text = f"{head}\n{task.text}\n{TASK_END}"
    if count_tokens(text) > room:
        keep = room - count_tokens(f"{head}\n\n{TASK_END}") - 2
        text = f"{head}\n{cut_middle(task.text, keep, CUT_MARKER)}\n{TASK_END}"
    return text if count_tokens(text) <= room else ""


def _task_stub(item_id: str, *, shown: bool) -> str:
    """One line naming the run's task by its item, where the task itself is not repeated."""
    where = ", shown below" if shown else ""
    return f"The run's task: item {json.dumps(item_id)} (its first user message){where}."


def _pinned_task(memory: str) -> str:
    """The id of the task a memory message of :func:`fit_messages` named, "" when none."""
    found = _TASK_ID.search(memory)
    if found is None:
        return ""
    try:
        named = json.loads(found.group(1))
    except ValueError:
        return ""
    return named if isinstance(named, str) else ""


def _check_pairing(msgs: Sequence[Mapping[str, Any]], at: Sequence[int]) -> None:
    """InvalidItemError when tool results and the calls they answer are not paired as chat APIs
    require (they refuse the request): a tool result names the call it answers
    (``tool_call_id``), one made by the assistant message just before the results, and every
    call made has its result before the next turn. Calls still pending at the end of the list
    are fine (the agent runs them next). The older ``function`` role carries no ids, and nor do
    the calls of some servers (Ollama's): their results are paired by order."""
    open_calls: dict[str, int] = {}  # call id -> the message that made it
    anonymous, asked_at = 0, 0  # calls just made without an id, and where

    def unanswered(before: int) -> InvalidItemError:
        ids = ", ".join(map(repr, open_calls))
        return InvalidItemError(f"message {before}: the tool call(s) {ids} of message "
                                f"{next(iter(open_calls.values()))} have no result before it")

    for m, i in zip(msgs, at, strict=True):
        role = m["role"]
        if role == "tool":
            call_id = m.get("tool_call_id")
            if not call_id and anonymous:
                anonymous -= 1
                continue
            if not call_id:
                raise InvalidItemError(f"message {i}: a tool result needs the tool_call_id of "
                                       "the call it answers")
            if call_id not in open_calls:
                raise InvalidItemError(f"message {i}: it answers tool call {call_id!r}, which the "
                                       "assistant message before these results did not make")
            del open_calls[call_id]
            continue
        if role == "function":
            open_calls.clear()
            continue
        if open_calls:
            raise unanswered(i)
        if anonymous:
            raise InvalidItemError(f"message {i}: {anonymous} tool call(s) of message {asked_at} have "
                                   "no result before it")
        if role == "assistant":
            for call in m.get("tool_calls") or []:
                if isinstance(call, Mapping) and isinstance(call.get("id"), str) and call["id"]:
                    open_calls[call["id"]] = i
                else:
                    anonymous, asked_at = anonymous + 1, i


def _storable_copy(msg: dict[str, Any]) -> dict[str, Any]:
    """``msg`` as memory keeps it: NUL and lone surrogates (which no store takes) replaced by
    U+FFFD at any depth, and how many in its ``meta`` (``replaced_characters``); ``msg``
    itself when it has none."""
    replaced = 0

    def clean(value: Any) -> Any:
        nonlocal replaced
        if isinstance(value, str):
            new, n = _UNSTORABLE.subn("\ufffd", value)
            replaced += n
            return new
        if isinstance(value, Mapping):
            return {clean(k): clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    out = clean(msg)
    if not replaced:
        return msg
    meta = out.get("meta")
    if meta is None or isinstance(meta, Mapping):
        out["meta"] = {**(meta or {}), "replaced_characters": replaced}
    return dict(out)


def _last_text(msgs: Sequence[Mapping[str, Any]]) -> str:
    """What the next step is about: the newest message with text (a user turn first)."""
    for role in ("user", None):
        for m in reversed(msgs):
            text, _ = _text_of(m)
            if text.strip() and (role is None or m.get("role") == role):
                return text
    return ""
