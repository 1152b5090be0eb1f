"""A model that replays a script, for unit tests of everything above the provider layer.

It makes tests of routing, the deep path and parsing deterministic and instant, while still
exercising the same interface, ledger records and error paths as a real backend. ``delay_s``
simulates a slow model; the sleep happens outside the lock so concurrent callers overlap the
way they would against a real server.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from .._errors import DeadlineError, ProviderError
from .._tokens import truncate
from .base import (
    CallRecord,
    Completion,
    Ledger,
    Message,
    Price,
    check_deadline,
    count_message_tokens,
    record_call,
    remaining_s,
)
from .base import count_text_tokens as _count

Output = str | BaseException
ChatScript = Callable[[Sequence[Message]], str]
ProbScript = Callable[[Sequence[Message], Mapping[str, Sequence[str]]], Mapping[str, float]]


def digest_answer(messages: Sequence[Message]) -> str:
    """A deterministic answer that depends on every character of the prompt: two surfaces that
    hand the model the same context get the same answer, and any difference shows."""
    prompt = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
    return f"digest {hashlib.sha256(prompt.encode('utf-8')).hexdigest()[:16]}"


def _copy(messages: Sequence[Message]) -> list[Message]:
    return [Message(role=m["role"], content=m["content"]) for m in messages]


class ScriptedLLM:
    """Replays ``outputs`` in order (a str always, or a list), or calls a function of the messages.

    An exception in the script (or raised by the function) is raised by that call. ``probs``
    gives ``choice_probs`` its answer: a fixed mapping, a function, or None for uniform.
    Calls are kept in ``calls`` (chat) and ``prob_calls`` (choice_probs), in arrival order.
    """

    def __init__(
        self,
        outputs: str | Sequence[Output] | ChatScript,
        delay_s: float = 0.0,
        model: str = "scripted",
        probs: Mapping[str, float] | ProbScript | None = None,
        price: Price | None = None,
    ) -> None:
        self.model = model
        self.delay_s = delay_s
        self.price = price or Price()
        self._fn: ChatScript | None = None
        self._script: list[Output] = []
        self._repeat: str | None = None
        if isinstance(outputs, str):
            self._repeat = outputs
        elif callable(outputs):
            self._fn = outputs
        else:
            self._script = list(outputs)
        self._probs = probs
        self._next = 0
        self._lock = threading.Lock()
        self.calls: list[list[Message]] = []
        self.prob_calls: list[list[Message]] = []

    @property
    def remaining(self) -> int:
        """Scripted outputs not yet used (0 for a function or a repeated string)."""
        return len(self._script) - self._next

    def _wait(self, deadline: float | None) -> None:
        """The scripted latency, cut short (with DeadlineError) where the deadline falls."""
        check_deadline(deadline, "the scripted call", "scripted")
        left = remaining_s(deadline)
        if left is not None and self.delay_s > left:
            time.sleep(max(left, 0.0))
            raise DeadlineError(f"the query's deadline passed {left:.2f} s into a {self.delay_s:g} s call",
                                endpoint="scripted")
        if self.delay_s > 0:
            time.sleep(self.delay_s)

    def _record(
        self, ledger: Ledger | None, stage: str, n_in: int, n_out: int, latency_s: float,
        error: BaseException | None = None,
    ) -> CallRecord:
        return record_call(ledger, model=self.model, price=self.price, stage=stage, n_in=n_in,
                           n_out=n_out, latency_ms=latency_s * 1000.0,
                           error=None if error is None else f"{type(error).__name__}: {error}",
                           usage_counted=True)

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
        t0 = time.perf_counter()
        try:
            self._wait(deadline)
        except DeadlineError as exc:
            self._record(ledger, stage, 0, 0, time.perf_counter() - t0, exc)
            raise
        with self._lock:
            self.calls.append(_copy(messages))
            out: Output | None
            if self._fn is not None or self._repeat is not None:
                out = None
            elif self._next < len(self._script):
                out = self._script[self._next]
                self._next += 1
            else:
                out = ProviderError(
                    f"ScriptedLLM ran out of outputs after {len(self._script)} calls",
                    endpoint="scripted",
                )
        try:
            if self._fn is not None:
                text = self._fn(messages)
            elif self._repeat is not None:
                text = self._repeat
            elif isinstance(out, BaseException):
                raise out
            else:
                assert out is not None
                text = out
        except BaseException as exc:
            self._record(ledger, stage, 0, 0, time.perf_counter() - t0, exc)
            raise
        if stop:
            cuts = [text.find(s) for s in stop if s and s in text]
            if cuts:
                text = text[: min(cuts)]
        finish = "stop"
        if _count(text) > max_tokens:  # as a real model does: cut at the cap, and say so
            text, finish = truncate(text, max_tokens), "length"
        elapsed = time.perf_counter() - t0  # the "model" time, before our own token counting
        rec = self._record(ledger, stage, count_message_tokens(messages), _count(text), elapsed)
        return Completion(text=text, record=rec, finish_reason=finish)

    def choice_probs(
        self,
        messages: Sequence[Message],
        choices: Mapping[str, Sequence[str]],
        *,
        stage: str = "router",
        ledger: Ledger | None = None,
        deadline: float | None = None,
    ) -> dict[str, float]:
        t0 = time.perf_counter()
        with self._lock:
            self.prob_calls.append(_copy(messages))
        try:
            self._wait(deadline)
            if self._probs is None:
                raw: Mapping[str, float] = {label: 1.0 for label in choices}
            elif callable(self._probs):
                raw = self._probs(messages, choices)
            else:
                raw = self._probs
            weights = {label: max(0.0, float(raw.get(label, 0.0))) for label in choices}
            total = sum(weights.values())
            if total <= 0:
                raise ProviderError(
                    f"scripted probabilities give no mass to any of {sorted(choices)}",
                    endpoint="scripted",
                )
        except BaseException as exc:
            self._record(ledger, stage, 0, 0, time.perf_counter() - t0, exc)
            raise
        elapsed = time.perf_counter() - t0
        self._record(ledger, stage, count_message_tokens(messages), 0, elapsed)
        return {label: w / total for label, w in weights.items()}


__all__ = ["ScriptedLLM"]
