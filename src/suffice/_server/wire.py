"""The one JSON shape of every core result, shared by the REST and MCP servers.

Both surfaces send ``to_json(result)``, so a client sees the same payload whichever way it
came in, and the end-to-end test can compare them field by field. The shape is the
dataclass fields, recursively, plus the few computed properties a client needs (an
evidence's context text, a receipt's token and cost totals). Floats that are not finite
become null: JSON has no NaN.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import BeforeValidator

from .._engine import Answer, Receipt
from .._errors import (
    AccessDeniedError,
    AuthenticationError,
    ConfigError,
    ConflictError,
    DeadlineError,
    InvalidInputError,
    MissingExtraError,
    NotFoundError,
    ProviderError,
    StoreError,
    SufficeError,
    UnknownScopeError,
)
from .._types import Evidence

_EXTRA: dict[type, tuple[str, ...]] = {
    Evidence: ("text",),
    Receipt: ("input_tokens", "output_tokens", "cost_usd"),
}

TIMING_FIELDS = frozenset({"timings_ms", "stages_ms", "t_mem_ms", "t_e2e_ms", "latency_ms"})
"""Fields that hold measured time: the only ones two runs of the same call may differ in."""


def to_json(value: Any) -> Any:
    """``value`` as plain JSON data (dicts, lists, str, int, float, bool, None)."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.generic):
        return to_json(value.item())
    if isinstance(value, np.ndarray):
        return [to_json(v) for v in value.tolist()]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
        for name in _EXTRA.get(type(value), ()):
            out[name] = to_json(getattr(value, name))
        return out
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_json(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"no JSON form for {type(value).__name__}")


def answer_json(answer: Answer) -> dict[str, Any]:
    """An answer as sent: text, the evidence items, and the whole receipt."""
    out = to_json(answer)
    assert isinstance(out, dict)
    return out


def without_timings(value: Any) -> Any:
    """``value`` (JSON data) with every measured-time field removed, for comparing runs."""
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMING_FIELDS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


_STATUS: tuple[tuple[type[SufficeError], int, str], ...] = (
    (AuthenticationError, 401, "unauthenticated"),
    (AccessDeniedError, 403, "forbidden"),
    (NotFoundError, 404, "not_found"),
    (UnknownScopeError, 404, "unknown_scope"),
    (ConflictError, 409, "conflict"),
    (InvalidInputError, 422, "invalid_input"),
    (DeadlineError, 504, "deadline"),
    (ProviderError, 502, "provider_error"),
    (MissingExtraError, 501, "missing_extra"),
    (ConfigError, 500, "config_error"),
    (StoreError, 503, "store_error"),
    (SufficeError, 500, "error"),
)


def error_status(exc: SufficeError) -> tuple[int, str]:
    """(HTTP status, stable error code) of a suffice error: the first class it is an instance
    of, most specific first. The code names the kind; ``type`` in the body names the class."""
    for cls, status, code in _STATUS:
        if isinstance(exc, cls):
            return status, code
    return 500, "error"


def hidden(text: str, secrets: Sequence[str | tuple[str, str]]) -> str:
    """``text`` with each of ``secrets`` (the store's file path or URL, or ``(path, label)``)
    written ``<store>`` (or ``<label>``): callers of a server have no business knowing where
    its files are. Longer secrets first, so a path inside another is not half replaced."""
    pairs = [(x, "store") if isinstance(x, str) else x for x in secrets]
    for secret, label in sorted(pairs, key=lambda p: -len(p[0])):
        if secret:
            text = text.replace(secret, f"<{label}>")
    return text


def error_json(exc: SufficeError, hide: Sequence[str | tuple[str, str]] = ()) -> dict[str, Any]:
    """The error body; ``hide``: strings (the store's location) not to show the caller."""
    status, code = error_status(exc)
    body: dict[str, Any] = {"code": code, "type": type(exc).__name__, "message": hidden(str(exc), hide)}
    notes = getattr(exc, "__notes__", None)
    if notes:  # what the error left behind, or what to do next
        body["notes"] = [hidden(str(n), hide) for n in notes]
    return {"error": body}


def _whole(value: object) -> object:
    return int(value) if isinstance(value, float) and value.is_integer() else value


WHOLE = BeforeValidator(_whole)
"""Put after an integer field's ``Field(...)``: the field takes 5.0 as 5, as JSON Schema reads
an integer (strict mode refused it); true and "5" stay refused. (Before the ``Field``, its
bounds would leave the JSON schema as unknown keys.)"""
