"""The one small interface every language-model backend implements, and the cost ledger.

Two operations cover everything suffice asks of a model: a chat completion, and the
probabilities of a fixed set of answer-token groups at the next position (the sufficiency
router's single forward pass). Every call leaves a :class:`CallRecord` in a :class:`Ledger`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from .._errors import DeadlineError
from .._types import Message as Message  # re-exported: the chat message type of every backend
from .._types import Role as Role


@dataclass(frozen=True, slots=True)
class Price:
    """USD per one million tokens, input and output."""

    input_per_m: float = 0.0
    output_per_m: float = 0.0

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_m + output_tokens * self.output_per_m) / 1e6


@dataclass(frozen=True, slots=True)
class CallRecord:
    """What one model call cost: tokens, time and money, and which stage made it."""

    model: str
    stage: str
    input_tokens: int
    output_tokens: int
    latency_ms: float
    cost_usd: float
    ok: bool = True
    error: str = ""
    usage_counted: bool = False
    """True when the tokens were counted locally because the response carried no usage."""
    cached: bool = False
    """True when the reply was replayed from a call cache (:class:`~suffice._llm.cache.CachedLLM`):
    tokens and latency are those of the real call it repeats, the cost theirs at the backend's
    current prices."""


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    record: CallRecord
    finish_reason: str = ""


@dataclass
class Ledger:
    """Collects call records; ledgers add up per query and per run. Thread-safe."""

    records: list[CallRecord] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, record: CallRecord) -> None:
        with self._lock:
            self.records.append(record)

    def extend(self, other: Ledger) -> None:
        with self._lock:
            self.records.extend(other.records)

    @property
    def calls(self) -> int:
        return len(self.records)

    @property
    def input_tokens(self) -> int:
        return sum(r.input_tokens for r in self.records)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.records)

    @property
    def cost_usd(self) -> float:
        return sum(r.cost_usd for r in self.records)

    @property
    def latency_ms(self) -> float:
        return sum(r.latency_ms for r in self.records)

    def by_stage(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for r in self.records:
            s = out.setdefault(r.stage, {"calls": 0, "input_tokens": 0, "output_tokens": 0,
                                         "cost_usd": 0.0, "latency_ms": 0.0})
            s["calls"] += 1
            s["input_tokens"] += r.input_tokens
            s["output_tokens"] += r.output_tokens
            s["cost_usd"] += r.cost_usd
            s["latency_ms"] += r.latency_ms
        return out


def remaining_s(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (a ``time.monotonic()`` value); None when there is none."""
    return None if deadline is None else deadline - time.monotonic()


def check_deadline(deadline: float | None, what: str, endpoint: str = "") -> None:
    """Raise DeadlineError when ``deadline`` has passed, naming what could not start."""
    left = remaining_s(deadline)
    if left is not None and left <= 0:
        raise DeadlineError(f"the query's deadline passed before {what}", endpoint=endpoint)


def count_text_tokens(text: str) -> int:
    """o200k count of ``text``; a rough chars/4 estimate if the tokenizer cannot be loaded.

    Used only when a provider's response carries no usage, so an estimate beats failing.
    """
    if not text:
        return 0
    try:
        from .._tokens import count_tokens
    except Exception:  # pragma: no cover - the tokenizer ships with the package
        return max(1, len(text) // 4)
    try:
        return count_tokens(text)
    except Exception:  # pragma: no cover
        return max(1, len(text) // 4)


MESSAGE_OVERHEAD_TOKENS = 4
"""Tokens a chat format adds per message (role markers, separators); an estimate."""


def count_message_tokens(messages: Sequence[Message]) -> int:
    """Estimated prompt tokens of a chat: content tokens plus a small per-message overhead."""
    return sum(count_text_tokens(m["content"]) + MESSAGE_OVERHEAD_TOKENS for m in messages)


def record_call(ledger: Ledger | None, *, model: str, price: Price, stage: str, n_in: int,
                n_out: int, latency_ms: float, error: str | None = None,
                usage_counted: bool = False) -> CallRecord:
    """Build the record of one call, priced, and add it to ``ledger``: every backend's bookkeeping.

    ``error`` is None for a successful call, else the failure's text.
    """
    rec = CallRecord(model=model, stage=stage, input_tokens=n_in, output_tokens=n_out,
                     latency_ms=latency_ms, cost_usd=price.cost(n_in, n_out), ok=error is None,
                     error=error or "", usage_counted=usage_counted)
    if ledger is not None:
        ledger.add(rec)
    return rec


@runtime_checkable
class LLM(Protocol):
    """A chat model. Implementations: HTTP (OpenAI-compatible), local llama.cpp, scripted."""

    model: str

    def chat(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        stop: Sequence[str] | None = None,
        stage: str = "answer",
        ledger: Ledger | None = None,
        deadline: float | None = None,
    ) -> Completion:
        """One completion. Raises ProviderError on failure; records the call in ``ledger``.

        ``deadline`` (a ``time.monotonic()`` value) bounds the whole call, a reply still
        streaming in included; past it the call raises DeadlineError."""
        ...

    def choice_probs(
        self,
        messages: Sequence[Message],
        choices: Mapping[str, Sequence[str]],
        *,
        stage: str = "router",
        ledger: Ledger | None = None,
        deadline: float | None = None,
    ) -> dict[str, float]:
        """Probability of each named group of next-token variants, normalised over the groups.

        ``choices`` maps a label to its surface variants, e.g. ``{"yes": ["Yes", " yes"],
        "no": ["No", " no"]}``; one forward pass, nothing generated.
        """
        ...
