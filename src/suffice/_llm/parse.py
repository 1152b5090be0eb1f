"""Lenient reading of model output, and one re-ask when it cannot be read.

Small local models wrap answers in tags, code fences or chatter unpredictably; rejecting such
replies wastes calls, so the extractors here accept every common shape. When a reply still
cannot be read, :func:`ask_parsed` asks once more with a corrective turn, then gives up with
:class:`OutputParseError` so the caller can degrade (e.g. fall back to the cheap path).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .._errors import OutputParseError
from .._prompts import DEFAULT_FORMAT, reask_message
from .base import LLM, Ledger, Message

T = TypeVar("T")

_ANSWER_SPAN = re.compile(r"<answer>(.*?)</answer>", re.I | re.S)
_ANSWER_OPEN = re.compile(r"<answer>", re.I)
_FENCE = re.compile(r"```(?:[ \t]*[\w+-]*[ \t]*\n)?(.*?)(?:```|\Z)", re.S)


def strip_fences(text: str) -> str:
    """The inside of the first fenced code block, or ``text`` unchanged when there is none."""
    m = _FENCE.search(text)
    if m is None:
        return text.strip()
    return m.group(1).strip()


def _unfenced(text: str) -> str:
    """``text`` without its fence when the fence is all there is (after at most a short lead-in
    such as "The answer:"); a fence inside prose is part of the answer and stays."""
    m = _FENCE.search(text)
    if m is None:
        return text.strip()
    before, after = text[:m.start()].strip(), text[m.end():].strip()
    if not after and (not before or (before.endswith(":") and len(before) <= 80)):
        return m.group(1).strip()
    return text.strip()


def extract_answer(text: str) -> str:
    """The answer in a reply: the last ``<answer>`` span, else the plain text (de-fenced when
    it is a fenced block alone; a block inside prose, say a command in a plan, stays whole).

    The *last* span is taken because models sometimes echo the format example before answering.
    An unclosed ``<answer>`` takes the rest of the reply.
    """
    spans = _ANSWER_SPAN.findall(text)
    if spans:
        return _unfenced(spans[-1])
    opens = list(_ANSWER_OPEN.finditer(text))
    if opens:
        return _unfenced(text[opens[-1].end():])
    return _unfenced(text)


def _balanced_object(text: str, start: int) -> str | None:
    """The ``{...}`` starting at ``start``, matching braces outside JSON strings."""
    depth = 0
    in_str = False
    escaped = False
    for i in range(start, len(text)):
        ch = text[i]
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def extract_json(text: str) -> dict[str, Any]:
    """The first balanced JSON object in ``text`` (fences and surrounding prose ignored).

    Raises OutputParseError when no candidate parses as a JSON object.
    """
    for source in (strip_fences(text), text):
        pos = source.find("{")
        while pos != -1:
            candidate = _balanced_object(source, pos)
            if candidate is not None:
                try:
                    value = json.loads(candidate)
                except json.JSONDecodeError:
                    value = None
                if isinstance(value, dict):
                    return value
            pos = source.find("{", pos + 1)
    raise OutputParseError(f"no JSON object found in model output: {text[:200]!r}")


_UNREADABLE = (ValueError, KeyError, TypeError, OutputParseError)


def ask_parsed(
    llm: LLM,
    messages: Sequence[Message],
    parser: Callable[[str], T],
    *,
    expected: str = DEFAULT_FORMAT,
    max_tokens: int = 256,
    temperature: float = 0.0,
    stage: str = "answer",
    ledger: Ledger | None = None,
) -> T:
    """Call ``llm``, parse the reply with ``parser``; on failure re-ask once, then raise.

    ``parser`` signals an unreadable reply by raising ``ValueError`` (``OutputParseError`` and
    ``json.JSONDecodeError`` included) or ``KeyError``/``TypeError``. ``expected`` describes
    the wanted shape in the corrective turn. Provider failures propagate unchanged.
    """
    first = llm.chat(messages, max_tokens=max_tokens, temperature=temperature, stage=stage,
                     ledger=ledger)
    try:
        return parser(first.text)
    except _UNREADABLE as exc:
        first_error = exc
    retry: list[Message] = [
        *messages,
        {"role": "assistant", "content": first.text},
        reask_message(expected),
    ]
    second = llm.chat(retry, max_tokens=max_tokens, temperature=temperature, stage=stage,
                      ledger=ledger)
    try:
        return parser(second.text)
    except _UNREADABLE as exc:
        raise OutputParseError(
            f"model {llm.model!r} gave unreadable output twice at stage {stage!r}: "
            f"first: {first_error}; second: {exc}",
            endpoint=llm.model,
        ) from exc


__all__ = ["ask_parsed", "extract_answer", "extract_json", "strip_fences"]
