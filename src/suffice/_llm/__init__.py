"""Language-model providers behind one small interface (:class:`LLM`).

``make_llm`` picks a backend by name so configuration can stay a string: ``local`` (in-process
llama.cpp, the default, no network), ``http``/``openai`` (any OpenAI-compatible server) and
``scripted`` (tests). llama.cpp itself is imported only when a local model is built, so the
``[local]`` extra matters only to those who ask for it.
"""

from __future__ import annotations

from typing import Any

from .._errors import ConfigError
from .base import (
    LLM,
    CallRecord,
    Completion,
    Ledger,
    Message,
    Price,
    count_message_tokens,
    count_text_tokens,
)
from .http import OpenAIHTTP
from .local import LocalLlama
from .parse import ask_parsed, extract_answer, extract_json, strip_fences
from .pricing import DEFAULT_PRICES, price_for
from .scripted import ScriptedLLM

PROVIDERS = ("local", "http", "openai", "scripted")


def make_llm(provider: str = "local", **kw: Any) -> LLM:
    """Build a backend by name; keyword arguments go to its constructor.

    ``local`` -> :class:`~suffice._llm.local.LocalLlama` (``model_path``, ``n_ctx``, ...);
    ``http``/``openai`` -> :class:`~suffice._llm.http.OpenAIHTTP` (``base_url``, ``model``, ...);
    ``scripted`` -> :class:`ScriptedLLM` (``outputs``, ...).
    """
    if not isinstance(provider, str):
        raise ConfigError(f"provider must be a name ({', '.join(PROVIDERS)}), got {type(provider).__name__}")
    name = provider.strip().lower()
    if name == "local":
        return LocalLlama(**kw)
    if name in ("http", "openai"):
        return OpenAIHTTP(**kw)
    if name == "scripted":
        kw.setdefault("outputs", [])
        return ScriptedLLM(**kw)
    raise ConfigError(f"unknown LLM provider {provider!r}; expected one of {', '.join(PROVIDERS)}")


__all__ = [
    "DEFAULT_PRICES",
    "LLM",
    "PROVIDERS",
    "CallRecord",
    "Completion",
    "Ledger",
    "LocalLlama",
    "Message",
    "OpenAIHTTP",
    "Price",
    "ScriptedLLM",
    "ask_parsed",
    "count_message_tokens",
    "count_text_tokens",
    "extract_answer",
    "extract_json",
    "make_llm",
    "price_for",
    "strip_fences",
]
