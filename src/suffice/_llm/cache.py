"""A persistent cache of model calls, keyed by (model, prompt, decoding settings).

Benchmarks and training runs on a 2-core machine ask the same model the same thing many times:
a rerun after a crash, a new router over recorded paths, a deep-path variant whose fast path is
unchanged. :class:`CachedLLM` wraps any backend and answers a call it has seen from one SQLite
file, so such a call costs nothing.

A replayed call is still put on the ledger, with the tokens and latency the real call had, its
cost at the backend's current prices, and ``cached=True``: a receipt then says what the answer
would have cost, and a benchmark can add the replayed latency back (:func:`replayed_ms`) so its
times stay those of real calls. Only successful calls are stored; a failure is never replayed,
and a stored entry that cannot be read back (damaged, or written by another version) is a
miss that the new answer replaces. Writes are one transaction each, so a crash loses at most
the call in flight.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .base import LLM, CallRecord, Completion, Ledger, Message, Price

log = logging.getLogger("suffice.cache")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    key TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    kind TEXT NOT NULL,
    value TEXT NOT NULL,
    created REAL NOT NULL
)
"""

_MODELS = """
CREATE TABLE IF NOT EXISTS models (
    name TEXT PRIMARY KEY,
    identity TEXT NOT NULL
)
"""


def call_key(model: str, kind: str, payload: Mapping[str, Any]) -> str:
    """sha256 of the model, the kind of call and everything that shapes its output."""
    text = json.dumps({"model": model, "kind": kind, **payload}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class CachedLLM:
    """Any :class:`LLM`, with its successful calls kept in ``path`` and replayed when asked again.

    ``hits`` and ``misses`` count this object's lookups.
    """

    def __init__(self, llm: LLM, path: str | Path) -> None:
        self.llm = llm
        self.model = llm.model
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        try:
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None,
                                       timeout=30.0)
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute(_SCHEMA)
                self._db.execute(_MODELS)
                self._keyed_as = self._name_in_keys(str(getattr(llm, "identity", "") or llm.model))
            except BaseException:
                self._db.close()
                raise
        except sqlite3.Error as exc:  # not a database, another program's, locked for 30 s
            raise ConfigError(f"model call cache {self.path}: {exc}; name another file "
                              "(or none, to call the model every time)") from None

    def _name_in_keys(self, identity: str) -> str:
        """The model's name in this file's keys. The first backend to use a name owns it (a
        file made before identities were kept gives its calls to the first backend that opens
        it); another backend under the same name (another server, another model file) is
        keyed apart, so it never replays the first one's answers."""
        self._db.execute("INSERT OR IGNORE INTO models VALUES (?, ?)", (self.model, identity))
        owner = self._db.execute("SELECT identity FROM models WHERE name = ?", (self.model,)).fetchone()
        return self.model if owner[0] == identity else f"{self.model}@{identity}"

    def __getattr__(self, name: str) -> Any:  # speed hints, model paths... of the wrapped backend
        return getattr(self.llm, name)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _get(self, key: str) -> dict[str, Any] | None:
        try:
            with self._lock:
                row = self._db.execute("SELECT value FROM calls WHERE key = ?", (key,)).fetchone()
        except sqlite3.Error as exc:  # a cache that cannot be read is a miss, not a failed call
            log.warning("model call cache %s unreadable (%s); calling the model", self.path, exc)
            row = None
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        try:
            value = json.loads(row[0])
        except (ValueError, TypeError, RecursionError) as exc:
            self._unreadable(key, exc)
            return None
        if not isinstance(value, dict):
            self._unreadable(key, TypeError(f"an entry of type {type(value).__name__}"))
            return None
        return value

    def _put(self, key: str, kind: str, value: Mapping[str, Any]) -> None:
        """Keep a call's result; when the file cannot take it (locked, full, read-only) the
        answer, already paid for, is still returned, and the loss of its copy is logged."""
        try:
            with self._lock:
                self._db.execute("INSERT OR REPLACE INTO calls VALUES (?, ?, ?, ?, ?)",
                                 (key, self.model, kind, json.dumps(value, ensure_ascii=False), time.time()))
        except sqlite3.Error as exc:
            log.warning("model call cache %s could not keep a call (%s); the answer is used "
                        "but will not be replayed", self.path, exc)

    def _replay(self, ledger: Ledger | None, record: Mapping[str, Any], stage: str) -> CallRecord:
        """The stored call's record as replayed: its tokens and time, the cost at the backend's
        current prices (prices set since the call was made count), flagged ``cached``. Raises
        (KeyError, TypeError, ValueError) on a record that is not one; the caller counts a miss."""
        rec = CallRecord(**{f: record[f] for f in _RECORD_FIELDS if f in record})
        price = getattr(self.llm, "price", None)
        cost = price.cost(rec.input_tokens, rec.output_tokens) if isinstance(price, Price) else rec.cost_usd
        rec = replace(rec, stage=stage, cached=True, cost_usd=float(cost))
        if ledger is not None:
            ledger.add(rec)
        return rec

    def _unreadable(self, key: str, exc: Exception) -> None:
        """A stored entry that cannot be replayed: counted as a miss, and replaced by the call
        about to be made."""
        self.hits -= 1
        self.misses += 1
        log.warning("model call cache %s: entry %s cannot be replayed (%s: %s); calling the model",
                    self.path, key[:12], type(exc).__name__, exc)

    def chat(self, messages: Sequence[Message], *, max_tokens: int = 256, temperature: float = 0.0,
             stop: Sequence[str] | None = None, stage: str = "answer", ledger: Ledger | None = None,
             deadline: float | None = None) -> Completion:
        key = call_key(self._keyed_as, "chat", {"messages": [dict(m) for m in messages],
                                                "max_tokens": max_tokens, "temperature": temperature,
                                                "stop": list(stop or [])})
        hit = self._get(key) if temperature == 0.0 else None  # sampled replies are not replayed
        if hit is not None:
            try:
                text, finish = str(hit["text"]), str(hit.get("finish_reason", ""))
                return Completion(text, self._replay(ledger, hit["record"], stage), finish)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                self._unreadable(key, exc)
        own = Ledger()
        try:  # a failed call's record (what it billed) reaches the caller's ledger too
            out = self.llm.chat(messages, max_tokens=max_tokens, temperature=temperature, stop=stop,
                                stage=stage, ledger=own, deadline=deadline)
        finally:
            _forward(own, ledger)
        if temperature == 0.0 and out.record.ok:
            self._put(key, "chat", {"text": out.text, "finish_reason": out.finish_reason,
                                    "record": _record_dict(out.record)})
        return out

    def choice_probs(self, messages: Sequence[Message], choices: Mapping[str, Sequence[str]], *,
                     stage: str = "router", ledger: Ledger | None = None,
                     deadline: float | None = None) -> dict[str, float]:
        key = call_key(self._keyed_as, "choice_probs", {"messages": [dict(m) for m in messages],
                                                    "choices": {k: list(v) for k, v in choices.items()}})
        hit = self._get(key)
        if hit is not None:
            try:
                probs = {str(k): float(v) for k, v in hit["probs"].items()}
                self._replay(ledger, hit["record"], stage)
                return probs
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                self._unreadable(key, exc)
        own = Ledger()
        try:
            probs = self.llm.choice_probs(messages, choices, stage=stage, ledger=own, deadline=deadline)
        finally:
            _forward(own, ledger)
        if own.records and own.records[-1].ok:
            self._put(key, "choice_probs", {"probs": probs, "record": _record_dict(own.records[-1])})
        return probs


def _forward(own: Ledger, ledger: Ledger | None) -> None:
    if ledger is not None:
        ledger.extend(own)


_RECORD_FIELDS = tuple(f for f in CallRecord.__dataclass_fields__ if f != "cached")


def _record_dict(rec: CallRecord) -> dict[str, Any]:
    return {f: getattr(rec, f) for f in CallRecord.__dataclass_fields__ if f != "cached"}


def replayed_ms(calls: Iterable[CallRecord]) -> float:
    """Latency of the replayed calls among ``calls``: add it to a wall-clock time measured over
    cached calls to get the time the same work takes when every call is real."""
    return sum(c.latency_ms for c in calls if c.cached)
