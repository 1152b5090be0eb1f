"""OpenAI-style chat messages as items: what an agent framework already holds, stored verbatim.

One message becomes one item, except an assistant message with tool calls: its text (if any)
is one item and each tool call is an item of kind ``tool_call``; a ``tool`` message is an item
of kind ``tool_result`` (one with no output is stored as :data:`NO_OUTPUT`, marked
``meta["empty"]``: a command that printed nothing still ran). Text parts of a multi-part
content (and a refusal) are joined; any
other part (an image, audio, a file) is kept whole in ``meta["parts"]`` and marked in the text
as ``[image_url]``, so nothing the caller sent is lost. A message may also carry item fields of
its own (``observed_at``, ``session``, ``meta``, ``id``), which win over the call's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ._errors import InvalidItemError
from ._types import NewItem

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
_KNOWN = {"role", "content", "name", "tool_calls", "tool_call_id", "function_call", "id", "refusal",
          "observed_at", "session", "meta"}
NO_OUTPUT = "(no output)"
"""The text stored for a tool result whose content is empty."""
TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}
"""Content part types that carry text, and the key that holds it."""


def is_message(obj: object) -> bool:
    """A mapping shaped like a chat message (``role`` with ``content``, tool calls or a
    refusal, no ``text``): an SDK reply dumped without its nulls may hold only a refusal."""
    return (isinstance(obj, Mapping) and "role" in obj and "text" not in obj
            and ("content" in obj or "tool_calls" in obj or "function_call" in obj or "refusal" in obj))


def check_message(msg: Mapping[str, Any], index: int) -> None:
    """InvalidItemError naming the message when its fields have shapes no chat API takes
    (checked for every message, stored or not: an empty assistant turn is fine)."""
    where = f"message {index}"
    role = msg.get("role")
    if role not in ROLES:
        raise InvalidItemError(f"{where}: role must be one of {', '.join(ROLES)}, got {role!r}")
    for key in ("name", "refusal", "tool_call_id"):
        if msg.get(key) is not None and not isinstance(msg[key], str):
            raise InvalidItemError(f"{where}: {key} must be a string")
    if msg.get("tool_calls") is not None and not isinstance(msg["tool_calls"], list):
        raise InvalidItemError(f"{where}: tool_calls must be a list")
    if msg.get("function_call") is not None and not isinstance(msg["function_call"], Mapping):
        raise InvalidItemError(f"{where}: function_call must be an object")
    _content(msg.get("content"), where)


def message_items(msg: Mapping[str, Any], index: int, base: dict[str, Any]) -> list[NewItem]:
    """The items of one chat message; ``base`` supplies session, time, meta and agent."""
    check_message(msg, index)
    role: str = msg["role"]
    where = f"message {index}"
    name: str | None = msg.get("name")
    extra = {k: v for k, v in msg.items() if k not in _KNOWN}
    own_meta = msg.get("meta")
    if own_meta is not None and not isinstance(own_meta, Mapping):
        raise InvalidItemError(f"{where}: meta must be a mapping")
    meta: dict[str, Any] = {**(base.get("meta") or {}), **(own_meta or {})}
    if extra:
        meta["message"] = extra
    common = {k: v for k, v in base.items() if k != "meta"}
    for key in ("observed_at", "session"):
        if key in msg:
            common[key] = msg[key]
    speaker = name or role
    msg_id = msg.get("id")
    if msg_id is not None and not isinstance(msg_id, str):
        raise InvalidItemError(f"{where}: id must be a string")
    text, parts = _content(msg.get("content"), where)
    refusal = msg.get("refusal")
    if isinstance(refusal, str) and refusal.strip():
        text = f"{text}\n{refusal}" if text.strip() else refusal
    if parts:
        meta["parts"] = parts
    out: list[NewItem] = []
    if role in ("tool", "function"):
        call_id = msg.get("tool_call_id")
        result_meta = {**meta, **({"tool_call_id": call_id} if call_id else {})}
        if not text.strip():
            result_meta["empty"] = True
            if text:  # whitespace only: kept, so nothing the caller sent is lost
                result_meta["content"] = text
            text = NO_OUTPUT
        return [NewItem(text=text, speaker=name or "tool", role=role, kind="tool_result",
                        meta=result_meta, id=msg_id, **common)]
    if text.strip():
        out.append(NewItem(text=text, speaker=speaker, role=role, kind="message", meta=meta,
                           id=msg_id, **common))
    calls = list(msg.get("tool_calls") or [])
    if msg.get("function_call"):
        calls.append({"type": "function", "function": msg["function_call"]})
    for k, call in enumerate(calls):
        # A function call carries JSON arguments; a custom tool call (OpenAI's free-form tools)
        # carries its input as plain text.
        kind = "custom" if isinstance(call, Mapping) and call.get("type") == "custom" else "function"
        if not isinstance(call, Mapping) or not isinstance(call.get(kind), Mapping):
            raise InvalidItemError(f"{where}: tool call {k} must have a '{kind}' object")
        fn = call[kind]
        fname = fn.get("name")
        args = fn.get("arguments" if kind == "function" else "input", "")
        if not isinstance(fname, str) or not fname:
            raise InvalidItemError(f"{where}: tool call {k} has no function name")
        if not isinstance(args, str):  # some clients pass parsed arguments; keep them as JSON
            args = json.dumps(args, ensure_ascii=False, sort_keys=True)
        call_meta = {**{k2: v for k2, v in meta.items() if k2 != "parts"}, "tool": fname}
        if call.get("id"):
            call_meta["tool_call_id"] = call["id"]
        out.append(NewItem(text=f"{fname}({args})", speaker=speaker, role=role, kind="tool_call",
                           meta=call_meta, id=f"{msg_id}#call{k}" if msg_id else None, **common))
    if not out:
        raise InvalidItemError(f"{where}: the message has neither content nor tool calls")
    return out


def _content(content: object, where: str) -> tuple[str, list[Any]]:
    """(text, non-text parts) of a message's content: a string, None, or a list of parts."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise InvalidItemError(f"{where}: content must be a string, null or a list of parts")
    texts: list[str] = []
    others: list[Any] = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and not isinstance(part.get("type"), str):
            raise InvalidItemError(f"{where}: a content part's 'type' must be a string")
        elif (isinstance(part, Mapping) and part.get("type") in TEXT_PARTS
              and isinstance(part.get(TEXT_PARTS[part["type"]]), str)):
            texts.append(part[TEXT_PARTS[part["type"]]])
        elif isinstance(part, Mapping) and isinstance(part.get("type"), str):
            others.append(dict(part))
            texts.append(f"[{part['type']}]")
        else:
            raise InvalidItemError(f"{where}: a content part must be a string or an object with a 'type'")
    return "\n".join(texts), others
