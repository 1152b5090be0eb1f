"""Running the tiered pipeline for one question: tiers chosen per module, every call costed.

Cost is what makes tiers worth choosing, so every module call is costed the same way whatever
it is: its tokens at the model's price plus its measured wall time at a CPU price
(``cpu_usd_per_hour``). On a CPU-only install the LLM's tokens are free, and time is the cost
that is real; rules cost microseconds, spaCy milliseconds, an LLM call seconds.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from cachetools import LRUCache

from .._embed.protocol import Embedder
from .._errors import ConfigError, OutputParseError, ProviderError, SufficeError
from .._llm.base import LLM, CallRecord, Ledger
from .._llm.parse import extract_answer
from .._prompts import REASONING_MAX_TOKENS, TIER_PROMPTS_VERSION, Reasoning, tier_messages
from .._tokens import count_tokens, truncate
from .chunks import Chunk
from .modules import (
    FACT_MODULES,
    MODULES,
    RULES_VERSION,
    SPACY_MODEL,
    TIERS,
    Module,
    Strategy,
    Tier,
    digest,
    keyword_filter,
    load_spacy,
    parse_facts,
    parse_picks,
    rule_facts,
    similarity_filter,
    spacy_facts,
    warm_dates,
)

__all__ = ["Chooser", "ModuleCache", "ModuleReceipt", "PipelineResult", "TierSettings", "TierSource",
           "TieredPipeline", "check_models"]

Chooser = Callable[[Module, np.ndarray, np.ndarray], int]
"""Picks a tier (0 Low, 1 Mid, 2 High) for a module from the question's vector and the
vector of what the module is about to read."""



class TierSource(Protocol):
    """Gives the tier chooser for one question (a trained policy, a rule, a fixed tier).

    A source whose choosers ignore the vectors they are handed may say so with a class
    attribute ``reads_vectors = False``; the tiered agent then skips embedding the facts for
    the summary's choice. Without it the vectors are computed.
    """

    name: str

    def chooser(self, question: str) -> Chooser: ...


@dataclass(frozen=True, slots=True)
class TierSettings:
    """How the pipeline reads: how many chunks, how much text, what a CPU second costs."""

    strategy: Strategy = "implementation"
    chunks: int = 10
    """K0: chunks cut around the prefix's best hits."""
    keep: int = 5
    """Chunks the filter keeps at most."""
    window: int = 1
    """Turns either side of a hit in its chunk."""
    budget: int = 2000
    """Tokens of the summary when a caller names no budget; ``Memory.ask`` and ``bench tiers``
    always name one (the deep evidence budget, the reader budget), so it rarely applies."""
    material_tokens: int = 350
    """Tokens of chunk text an LLM module reads at most."""
    cpu_usd_per_hour: float = 0.10
    """What an hour of this machine costs; about a 2-vCPU cloud VM's list price."""

    def __post_init__(self) -> None:
        if self.strategy not in ("implementation", "reasoning", "capacity"):
            raise ConfigError(f"unknown tier strategy {self.strategy!r}; expected "
                              "implementation, reasoning or capacity")
        if self.chunks < 1 or self.keep < 1 or self.budget < 50 or self.cpu_usd_per_hour < 0:
            raise ConfigError("tier settings: chunks and keep must be >= 1, budget >= 50, "
                              "cpu_usd_per_hour >= 0")


@dataclass(frozen=True, slots=True)
class ModuleReceipt:
    """One module call: the tier asked for, the tier that answered, and what it cost."""

    module: str
    tier: str
    asked: str
    model: str
    input_tokens: int
    output_tokens: int
    latency_ms: float
    cost_usd: float
    cached: bool = False
    note: str = ""
    """Why the tier that answered is not the one asked for, when it is not."""


@dataclass(frozen=True, slots=True)
class PipelineResult:
    text: str
    modules: tuple[ModuleReceipt, ...]
    chunks: tuple[Chunk, ...]
    kept: tuple[int, ...]
    """Indices into ``chunks`` that the filter kept, best first."""
    facts: Mapping[str, tuple[str, ...]]
    states: tuple[tuple[str, np.ndarray], ...] = field(default=(), repr=False)
    """(module, vector of its input) in the order the tiers were chosen."""

    @property
    def cost_usd(self) -> float:
        return sum(m.cost_usd for m in self.modules)

    @property
    def latency_ms(self) -> float:
        return sum(m.latency_ms for m in self.modules)

    @property
    def tiers(self) -> dict[str, str]:
        """Each module's tier as asked."""
        return {m.module: m.asked for m in self.modules}


class ModuleCache:
    """Module outputs by (module, tier, strategy, model, input): a repeated call is replayed
    with the tokens, time and cost of the call it repeats, so cost signals stay real.

    In memory (the latest ``size`` outputs), or in a SQLite file when ``path`` is given
    (training and benchmarks share one; the memory then holds the latest read through).
    """

    def __init__(self, path: str | Path | None = None, size: int = 20_000) -> None:
        self._mem: LRUCache[str, dict[str, Any]] = LRUCache(maxsize=size)
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS modules (key TEXT PRIMARY KEY, value TEXT)")
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(*parts: str) -> str:
        return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            got = self._mem.get(key)
            if got is None and self._db is not None:
                row = self._db.execute("SELECT value FROM modules WHERE key = ?", (key,)).fetchone()
                if row is not None:
                    got = json.loads(row[0])
                    self._mem[key] = got
            if got is None:
                self.misses += 1
            else:
                self.hits += 1
            return got

    def put(self, key: str, value: dict[str, Any]) -> None:
        with self._lock:
            self._mem[key] = value
            if self._db is not None:
                self._db.execute("INSERT OR REPLACE INTO modules VALUES (?, ?)", (key, json.dumps(value)))

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


def check_models(settings: TierSettings, llms: Mapping[str, LLM]) -> None:
    """Refuse the capacity strategy without its three models; ``Memory.ask`` calls it before
    the reader loads, so a missing one is reported before seconds go into loading it."""
    if settings.strategy == "capacity" and not {"low", "mid", "high"} <= set(llms):
        raise ConfigError("the capacity strategy needs three models: low, mid and high")


class TieredPipeline:
    """filter -> entity, temporal, topic -> summary, each at the tier ``choose`` picks.

    ``llms``: the model of each LLM tier. Under the implementation and reasoning strategies
    one model serves (its ``high`` entry, or the single LLM given); under the capacity strategy
    ``low`` / ``mid`` / ``high`` name a small, a medium and a large model. A module whose tier
    fails falls back one tier down, to rules at the bottom, and its receipt says why.
    """

    def __init__(self, llms: LLM | Mapping[str, LLM] | None, embedder: Embedder | None,
                 settings: TierSettings | None = None, cache: ModuleCache | None = None) -> None:
        self.settings = settings or TierSettings()
        if llms is None:
            self.llms: dict[str, LLM] = {}
        elif isinstance(llms, Mapping):
            self.llms = dict(llms)
        else:
            self.llms = {"low": llms, "mid": llms, "high": llms}
        check_models(self.settings, self.llms)
        self.embedder = embedder
        self.cache = cache or ModuleCache()
        self._context = json.dumps({  # what changes a module's output besides its input and model
            "keep": self.settings.keep, "material_tokens": self.settings.material_tokens,
            "embedder": embedder.name if embedder is not None else "", "rules": RULES_VERSION,
            "prompts": TIER_PROMPTS_VERSION, "libraries": _library_versions()}, sort_keys=True)
        self._rate = self.settings.cpu_usd_per_hour / 3.6e6  # USD per millisecond
        self._vectors: LRUCache[str, np.ndarray] = LRUCache(maxsize=4096)
        self._lock = threading.Lock()
        self._calls = threading.local()
        """The model calls of the rung running on this thread (a failed rung is paid for too)."""

    # -- one question ---------------------------------------------------------------------------

    def run(self, question: str, chunks: Sequence[Chunk], choose: Chooser, *,
            qvec: np.ndarray | None, cap: Tier | None = None, budget: int | None = None,
            ledger: Ledger | None = None, deadline: float | None = None,
            vectors: bool = True) -> PipelineResult:
        """The pipeline's summary of ``chunks`` for ``question`` in at most ``budget`` tokens
        (default: the settings' budget), with a receipt per module.

        ``vectors=False`` says ``choose`` ignores the vectors it is given (a fixed or rule
        chooser), so the facts are not embedded for the summary's choice: that embedder call
        would be paid for nothing."""
        dim = qvec.shape[0] if qvec is not None else 384
        q = qvec if qvec is not None else np.zeros(dim, np.float32)
        top = TIERS.index(cap) if cap is not None else 2
        receipts: list[ModuleReceipt] = []
        states: list[tuple[str, np.ndarray]] = []

        def pick(module: Module, x: np.ndarray) -> Tier:
            states.append((module, x))
            a = int(choose(module, q, x))
            if not 0 <= a < len(TIERS):  # -1 would index High and pass any cap
                raise ConfigError(f"the tier source chose {a} for {module}; tiers are 0 (low) to "
                                  f"{len(TIERS) - 1} (high)")
            return TIERS[min(a, top)]

        if not chunks:  # nothing to read: a model asked about nothing makes its facts up
            return PipelineResult("", (), (), (), {m: () for m in FACT_MODULES}, ())
        x_all = _mean([c.vector for c in chunks], dim)
        kept, rec = self._filter(question, chunks, pick("filter", x_all), qvec, ledger, deadline)
        receipts.append(rec)
        if not kept:
            return PipelineResult("", tuple(receipts), tuple(chunks), (), {m: () for m in FACT_MODULES},
                                  tuple(states))
        chosen = [chunks[i] for i in kept]
        x_kept = _mean([c.vector for c in chosen], dim)
        tiers = {m: pick(m, x_kept) for m in FACT_MODULES}
        facts: dict[str, list[str]] = {}
        for m in FACT_MODULES:
            facts[m], rec = self._facts(m, question, chosen, tiers[m], qvec, ledger, deadline)
            receipts.append(rec)
        x_sum = x_kept
        if vectors and self.embedder is not None and any(facts.values()):
            # The tier chooser's view of the facts: embedding them is the pipeline's own work,
            # done outside every module, so it goes on the ledger under a stage of its own.
            t0 = time.perf_counter()
            try:
                x_sum = _mean([self._vector("\n".join(v)) for v in facts.values() if v], dim)
            except Exception:  # a fact the encoder cannot take (a lone surrogate): the kept chunks' view
                x_sum = x_kept
            ms = (time.perf_counter() - t0) * 1e3
            if ledger is not None:
                ledger.add(CallRecord(self.embedder.name, "tier_state", 0, 0, ms, ms * self._rate))
        text, rec = self._summary(question, chosen, facts, pick("summary", x_sum), qvec,
                                  self.settings.budget if budget is None else budget, ledger, deadline)
        receipts.append(rec)
        return PipelineResult(text, tuple(receipts), tuple(chunks), tuple(kept),
                              {m: tuple(v) for m, v in facts.items()}, tuple(states))

    # -- modules --------------------------------------------------------------------------------

    def _filter(self, question: str, chunks: Sequence[Chunk], tier: Tier, qvec: np.ndarray | None,
                ledger: Ledger | None, deadline: float | None) -> tuple[list[int], ModuleReceipt]:
        k = self.settings.keep

        def low() -> list[int]:
            return keyword_filter(question, chunks, k)

        def mid() -> list[int]:
            return similarity_filter(question, qvec, chunks, k)

        def llm(model: LLM, style: Reasoning) -> tuple[list[int], CallRecord]:
            # Turns without their date headers: a small model otherwise copies a date back.
            material = "\n\n".join(
                f"Excerpt {i + 1}:\n" + truncate("\n".join(f"{it.speaker}: {it.text}" for it in c.items), 60)
                for i, c in enumerate(chunks))
            reply, record = self._chat("filter", model, style, question, material, deadline)
            return parse_picks(reply, len(chunks))[:k], record

        key_in = question + "\x1f" + "|".join(c.key() for c in chunks)
        out, rec = self._module("filter", tier, key_in, low, mid, llm, ledger)
        return [int(i) for i in out], rec

    def _facts(self, module: Module, question: str, chunks: Sequence[Chunk], tier: Tier,
               qvec: np.ndarray | None, ledger: Ledger | None,
               deadline: float | None) -> tuple[list[str], ModuleReceipt]:
        embed = self.embedder.embed if self.embedder is not None else None

        def low() -> list[str]:
            return rule_facts(module, question, chunks)

        def mid() -> list[str]:
            return spacy_facts(module, question, chunks, qvec, embed)

        def llm(model: LLM, style: Reasoning) -> tuple[list[str], CallRecord]:
            material = truncate("\n---\n".join(c.text() for c in chunks), self.settings.material_tokens)
            reply, record = self._chat(module, model, style, question, material, deadline)
            return parse_facts(reply), record

        def warm(model: str) -> None:
            if model == "learned":
                load_spacy()
            if module == "temporal" and model in ("rules", "learned"):
                warm_dates()

        key_in = question + "\x1f" + "|".join(c.key() for c in chunks)
        out, rec = self._module(module, tier, key_in, low, mid, llm, ledger, warm=warm)
        return [str(x) for x in out], rec

    def _summary(self, question: str, chunks: Sequence[Chunk], facts: dict[str, list[str]],
                 tier: Tier, qvec: np.ndarray | None, budget: int, ledger: Ledger | None,
                 deadline: float | None) -> tuple[str, ModuleReceipt]:
        def low() -> str:
            return digest(question, chunks, facts, budget, structured=False)

        def mid_facts() -> dict[str, list[str]]:
            if self.embedder is None or qvec is None:
                return facts
            ranked: dict[str, list[str]] = {}
            for m, lines in facts.items():
                sims = self.embedder.embed(lines) @ qvec if lines else np.zeros(0)
                ranked[m] = [lines[i] for i in np.argsort(-sims, kind="stable")]
            return ranked

        def mid() -> str:
            return digest(question, chunks, mid_facts(), budget, structured=True)

        def llm(model: LLM, style: Reasoning) -> tuple[str, CallRecord]:
            # The briefing reads the kept turns, not the fact lists (which follow it in the
            # summary anyway): one call per set of kept chunks, whatever tiers made the facts.
            material = truncate("\n---\n".join(c.text() for c in chunks), self.settings.material_tokens)
            reply, record = self._chat("summary", model, style, question, material, deadline)
            brief = extract_answer(reply).strip()
            if not brief:
                raise OutputParseError("the summary model wrote nothing")
            return digest(question, chunks, mid_facts(), budget, structured=True,
                          briefing=truncate(brief, 160)), record

        key_in = (question + "\x1f" + "|".join(c.key() for c in chunks) + "\x1f"
                  + json.dumps(facts, sort_keys=True) + f"\x1f{budget}")
        out, rec = self._module("summary", tier, key_in, low, mid, llm, ledger)
        return str(out), rec

    # -- one module call: tier, fallback, cache, cost ------------------------------------------

    def _module(self, module: Module, tier: Tier, key_in: str, low: Callable[[], Any],
                mid: Callable[[], Any], llm: Callable[[LLM, Reasoning], tuple[Any, CallRecord]],
                ledger: Ledger | None, warm: Callable[[str], object] | None = None
                ) -> tuple[Any, ModuleReceipt]:
        """Run the module at ``tier``, falling down the ladder on failure. A failed rung is
        paid for too: its tokens and time go on the receipt of the rung that answered. A failure
        that would repeat (unusable model output, bad input) is cached, so a replay costs what
        the first attempt cost; one that may not (a server down, a deadline, a missing extra or
        model) is not, so the next run tries the tier again.
        ``warm``: start-up a rung needs once per process (given the rung's model: loading
        spaCy, importing dateparser), run before its clock starts so the first question does
        not pay for every later one."""
        s = self.settings
        ladder = self._ladder(tier)
        notes: list[str] = []
        spent = {"in": 0, "out": 0, "ms": 0.0, "usd": 0.0}
        for step, (name, model_name, run) in enumerate(ladder):
            key = ModuleCache.key(module, name, s.strategy, model_name, self._context, key_in)
            hit = self.cache.get(key)
            cached = hit is not None
            if hit is None:
                if warm is not None:
                    try:
                        warm(model_name)
                    except ConfigError:
                        pass  # the rung fails below, and its receipt says why
                self._calls.records = []
                t0 = time.perf_counter()
                try:
                    value, _ = run(low, mid, llm)
                except Exception as exc:  # the rung fails, the next one down runs: said on the receipt
                    hit = self._spent(t0, {"failed": f"{type(exc).__name__}: {str(exc)[:80]}"})
                    if _repeats(exc):
                        self.cache.put(key, hit)
                else:
                    hit = self._spent(t0, {"value": value})
                    self.cache.put(key, hit)
            # A rung whose model calls a call cache replayed is a replay too (its time is the
            # recorded one, as replayed_ms expects), not only one the module cache answered.
            cached = cached or bool(hit.get("replayed"))
            for k in spent:
                spent[k] += hit[k]
            self._ledger(ledger, module, model_name, hit, cached)  # each rung as itself
            if "failed" in hit:
                if step == len(ladder) - 1:
                    raise ProviderError(f"every tier of the {module} module failed; last: {hit['failed']}")
                notes.append(f"{name} tier failed ({hit['failed']}); fell back to {ladder[step + 1][0]}")
                continue
            rec = ModuleReceipt(module, name, tier, model_name, int(spent["in"]), int(spent["out"]),
                                spent["ms"], spent["usd"], cached=cached, note="; ".join(notes))
            return hit["value"], rec
        raise AssertionError("unreachable: the last rung raises")

    def _spent(self, t0: float, out: dict[str, Any]) -> dict[str, Any]:
        """What a rung cost: the tokens, time and price of the model calls it made (each goes
        through :meth:`_chat`; a replayed call keeps its recorded time), else its wall time;
        time at the CPU price."""
        calls = list(self._calls.records)
        ms = sum(c.latency_ms for c in calls) if calls else (time.perf_counter() - t0) * 1e3
        usd = sum(c.cost_usd for c in calls) + ms * self._rate
        return {**out, "in": sum(c.input_tokens for c in calls), "out": sum(c.output_tokens for c in calls),
                "ms": ms, "usd": usd, "replayed": any(c.cached for c in calls)}

    def _ladder(self, tier: Tier) -> list[tuple[str, str, Callable[..., tuple[Any, CallRecord | None]]]]:
        """The rungs a module tries, starting at ``tier`` and going down: (tier that answers,
        model, how to run it)."""
        s = self.settings

        def rules(low: Callable[[], Any], mid: Any, llm: Any) -> tuple[Any, None]:
            return low(), None

        def learned(low: Any, mid: Callable[[], Any], llm: Any) -> tuple[Any, None]:
            return mid(), None

        def model_rung(t: Tier, style: Reasoning) -> Callable[..., tuple[Any, CallRecord]]:
            def run(low: Any, mid: Any, llm: Callable[[LLM, Reasoning], tuple[Any, CallRecord]]
                    ) -> tuple[Any, CallRecord]:
                model = self.llms.get(t) or self.llms.get("high")
                if model is None:
                    raise ConfigError("this tier needs a model and the pipeline has none")
                return llm(model, style)
            return run

        def model_name(t: Tier) -> str:
            m = self.llms.get(t) or self.llms.get("high")
            return m.model if m is not None else "none"

        rungs: list[tuple[str, str, Callable[..., tuple[Any, CallRecord | None]]]]
        if s.strategy == "implementation":
            rungs = [("low", "rules", rules), ("mid", "learned", learned),
                     ("high", model_name("high"), model_rung("high", "direct"))]
        elif s.strategy == "reasoning":
            rungs = [("low", model_name("high"), model_rung("high", "direct")),
                     ("mid", model_name("high"), model_rung("high", "step")),
                     ("high", model_name("high"), model_rung("high", "plan"))]
        else:
            rungs = [(t, model_name(t), model_rung(t, "direct")) for t in TIERS]
        top = TIERS.index(tier)
        ladder = rungs[: top + 1][::-1]
        if s.strategy != "implementation":
            ladder.append(("rules", "rules", rules))  # the floor under every model tier
        return ladder

    def _chat(self, module: Module, model: LLM, style: Reasoning, question: str, material: str,
              deadline: float | None) -> tuple[str, CallRecord]:
        own = Ledger()
        try:
            try:
                reply = model.chat(tier_messages(module, style, question, material),
                                   max_tokens=REASONING_MAX_TOKENS[style], stage=f"tier_{module}",
                                   ledger=own, deadline=deadline).text
            except SufficeError:
                raise
            except Exception as exc:
                # A model class of the caller's failing its own way (a KeyError on a rate-limit
                # body) is a failed call, not unusable output: it must not be remembered as
                # the module's answer for this input.
                raise ProviderError(f"{model.model} failed: {type(exc).__name__}: {exc}") from exc
        except BaseException:
            # A failed rung is paid for too: what the call billed goes into the rung's cost.
            self._calls.records = [*getattr(self._calls, "records", []), *own.records]
            raise
        record = own.records[-1] if own.records else CallRecord(
            model.model, f"tier_{module}", count_tokens(material), count_tokens(reply), 0.0, 0.0)
        self._calls.records = [*getattr(self._calls, "records", []), record]
        return reply, record

    def _vector(self, text: str) -> np.ndarray:
        """The embedder's vector of ``text``, remembered: the summary's state repeats often."""
        with self._lock:
            got = self._vectors.get(text)
        if got is None:
            assert self.embedder is not None
            got = np.asarray(self.embedder.embed([text])[0], dtype=np.float32)
            with self._lock:
                self._vectors[text] = got
        return got

    @staticmethod
    def _ledger(ledger: Ledger | None, module: str, model: str, hit: Mapping[str, Any], cached: bool) -> None:
        """One ledger line per rung tried: a failed rung under its own model, marked failed
        (the module's receipt adds up all of them under the rung that answered)."""
        if ledger is not None:
            ledger.add(CallRecord(model, f"tier_{module}", int(hit["in"]), int(hit["out"]), hit["ms"],
                                  hit["usd"], ok="failed" not in hit, error=str(hit.get("failed", "")),
                                  cached=cached))


@lru_cache(maxsize=1)
def _library_versions() -> str:
    """Versions of the libraries the rule and learned tiers run on (dateparser, spaCy and its
    English model): an upgrade may change their output, so cached outputs key on them."""
    from importlib.metadata import PackageNotFoundError, version

    got = []
    for name in ("dateparser", "spacy", SPACY_MODEL.replace("_", "-")):
        try:
            got.append(f"{name}={version(name)}")
        except PackageNotFoundError:
            got.append(f"{name}=none")
    return ",".join(got)


def _mean(vecs: Sequence[np.ndarray | None], dim: int) -> np.ndarray:
    got = [v for v in vecs if v is not None]
    if not got:
        return np.zeros(dim, np.float32)
    m: np.ndarray = np.mean(np.stack(got), axis=0).astype(np.float32)
    n = float(np.linalg.norm(m))
    return m / n if n > 0 else m


assert MODULES == ("filter", *FACT_MODULES, "summary")


def _repeats(exc: Exception) -> bool:
    """Whether a module failure would happen again on the same input: unusable output or bad
    input would; a provider or configuration failure (server down, deadline, no model, a
    missing extra) is about the environment and may be gone on the next run."""
    if isinstance(exc, (OutputParseError, ValueError, KeyError, IndexError)):
        return True
    # Another suffice error is about the input; anything else (a caller's own model class
    # failing its own way) may not recur, so it is not remembered.
    return isinstance(exc, SufficeError) and not isinstance(exc, (ConfigError, ProviderError))
