"""The deep path: reuse the prefix hits to pick blocks, read each block with a memory agent
(concurrently), and merge the agents' notes in time order.

No second retrieval runs here: blocks are chosen from the same hits the prefix found.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from ._config import EngineConfig
from ._errors import ProviderError
from ._llm.base import LLM, CallRecord, Ledger
from ._prompts import BLOCK_NONE, block_agent_messages
from ._store.base import Store
from ._text import STOPWORDS, words
from ._timeref import annotate
from ._times import said_day
from ._tokens import count_tokens, truncate
from ._types import Block, ContextPart, Evidence, Hit, Item
from ._views import ScopeViews


@dataclass(frozen=True, slots=True)
class ChosenBlock:
    block: Block
    why: str
    mass: float


@dataclass(frozen=True, slots=True)
class AgentNote:
    """What one memory agent made of its block."""

    block: int
    first_seq: int
    last_seq: int
    notes: str
    answer: str
    relevant: bool
    latency_ms: float
    ok: bool = True
    error: str = ""
    calls: tuple[CallRecord, ...] = ()
    """The model calls this agent made (filled in by :func:`run_agents`)."""
    seqs: tuple[int, ...] = ()
    """The items the notes quote, one per line of ``notes`` in the same order, when the agent
    quotes items (the default reader does); empty for free-form notes."""

    def quoted_lines(self) -> list[tuple[int, str]] | None:
        """(item seq, note line) for each line of a note that quotes items; None for free-form
        notes, or when a plugged-in agent's lines do not pair with its ``seqs``."""
        lines = self.notes.splitlines()
        if not self.seqs or len(lines) != len(self.seqs):
            return None
        return list(zip(self.seqs, lines, strict=True))

    @classmethod
    def quoting(cls, block: Block, items: Sequence[Item], latency_ms: float) -> AgentNote:
        """A note that quotes ``items`` verbatim, one line each (a multi-line item is joined),
        so its lines pair with ``seqs``."""
        return cls(block.index, block.first_seq, block.last_seq,
                   "\n".join(" ".join(it.render().split()) for it in items), "", bool(items),
                   latency_ms, seqs=tuple(it.seq for it in items))


def with_dates(notes: Sequence[AgentNote], items: dict[int, Item]) -> tuple[list[AgentNote], int]:
    """The notes with the relative time phrases of each quoted turn stated against the turn's
    own date (:mod:`suffice._timeref`), and how many lines gained a date. Free-form notes, and
    notes whose lines do not pair with their items, are left as they are."""
    out: list[AgentNote] = []
    changed = 0
    for n in notes:
        pairs = n.quoted_lines()
        if pairs is None or any(q not in items for q, _ in pairs):
            out.append(n)
            continue
        dated = [annotate(line, items[q].text, said_day(items[q].observed_at, items[q].observed_ts))
                 for q, line in pairs]
        changed += sum(a != line for a, (_, line) in zip(dated, pairs, strict=True))
        out.append(replace(n, notes="\n".join(dated)))
    return out, changed


def dated_context(text: str, parts: Sequence[ContextPart], known: Evidence, store: Store, scope: str,
                  cap: int) -> tuple[str, int]:
    """A rendered context whose turns also state their relative dates (:func:`with_dates` for
    retrieved evidence), and how many lines gained one; never more than ``cap`` tokens: when
    the dates do not all fit, the earliest lines keep theirs.

    A line is matched to the context's item whose text it holds (a long item shown by a piece:
    the item whose text holds the line's words after its header).
    """
    seqs = sorted({q for p in parts for q in p.seqs})
    have = {h.seq: h.item for h in known.hits}
    missing = [q for q in seqs if q not in have]
    if missing:
        have.update({it.seq: it for it in store.items(scope, missing)})
    items = [have[q] for q in seqs if q in have and have[q].observed_ts is not None]
    if not items or not text:
        return text, 0
    lines = text.split("\n")
    left = cap - count_tokens(text)
    changed = 0
    for i, line in enumerate(lines):
        it = _line_item(line, items)
        if it is None:
            continue
        dated = annotate(line, it.text, said_day(it.observed_at, it.observed_ts))
        if dated == line:
            continue
        extra = count_tokens(dated) - count_tokens(line)
        if extra > left:
            break
        lines[i] = dated
        left -= extra
        changed += 1
    return "\n".join(lines), changed


def _line_item(line: str, items: Sequence[Item]) -> Item | None:
    body = line.strip()
    if not body:
        return None
    for it in items:
        if it.text and it.text in line:
            return it
    tail = body.split(": ", 1)[-1].strip(" …")
    if len(tail) < 12:
        return None
    for it in items:
        if tail in it.text:
            return it
    return None


def choose_blocks(hits: Sequence[Hit], views: ScopeViews, settings: EngineConfig) -> list[ChosenBlock]:
    """Anchor blocks by hit mass, plus their temporal neighbours, capped and in time order.

    A hit weighs 1/(rank+1): fused scores are rank-based and nearly flat, so summing them would
    let a cluster of weak hits outweigh the block that holds the best one.
    """
    mass: dict[int, float] = {}
    count: dict[int, int] = {}
    for h in hits:
        for b in h.blocks:
            mass[b] = mass.get(b, 0.0) + 1.0 / (h.rank + 1)
            count[b] = count.get(b, 0) + 1
    anchors = sorted(mass, key=lambda b: (-mass[b], -b))[: settings.anchor_blocks]
    chosen: dict[int, str] = {b: f"anchor: {count[b]} hit(s), mass {mass[b]:.3f}" for b in anchors}
    for b in anchors:
        for nb in (b - 1, b + 1):
            if len(chosen) >= settings.max_blocks:
                break
            if nb not in chosen and 0 <= nb < views.n_blocks():
                chosen[nb] = f"temporal neighbour of block {b}"
    out = []
    for b in sorted(chosen)[: settings.max_blocks] if len(chosen) > settings.max_blocks else sorted(chosen):
        blk = views.block(b)
        if blk is not None:
            out.append(ChosenBlock(blk, chosen[b], mass.get(b, 0.0)))
    return out


@runtime_checkable
class MemoryAgent(Protocol):
    """Reads one block for a question. Pluggable: an LLM reader now, tiered pipelines later."""

    def read(self, question: str, block: Block, items: Sequence[Item], hit_seqs: set[int],
             *, ledger: Ledger | None = None, deadline: float | None = None) -> AgentNote:
        """Notes on ``block`` for ``question``; model calls must end by ``deadline``."""
        ...


class LLMBlockReader:
    """The default memory agent: one LLM call copies the block's relevant lines.

    The copies are not used as written: each is traced back to the block item it came from,
    and the note holds those items verbatim. A small model often "copies" a line it made up by
    restating the question with a guessed ending ("Her grandma is from Canada"); such a line
    traces back to no item and is dropped, so notes stay true to the store.
    """

    def __init__(self, llm: LLM, *, max_block_tokens: int = 1800, max_tokens: int = 160,
                 grounding: float = 0.7) -> None:
        self.llm = llm
        self.max_block_tokens = max_block_tokens
        self.max_tokens = max_tokens
        self.grounding = grounding

    def read(self, question: str, block: Block, items: Sequence[Item], hit_seqs: set[int],
             *, ledger: Ledger | None = None, deadline: float | None = None) -> AgentNote:
        t0 = time.perf_counter()
        lines = [("* " if it.seq in hit_seqs else "") + it.render() for it in items]
        text = truncate("\n".join(lines), self.max_block_tokens)
        try:
            out = self.llm.chat(block_agent_messages(question, text), max_tokens=self.max_tokens,
                                stage="block_agent", ledger=ledger, deadline=deadline).text
        except ProviderError as exc:
            return AgentNote(block.index, block.first_seq, block.last_seq, "", "", False,
                             (time.perf_counter() - t0) * 1e3, ok=False,
                             error=f"{type(exc).__name__}: {exc}")
        return AgentNote.quoting(block, cited_items(out, items, question, self.grounding),
                                 (time.perf_counter() - t0) * 1e3)


def cited_items(output: str, items: Sequence[Item], question: str,
                threshold: float) -> list[Item]:
    """The items of a block that an agent's output lines were copied from, in block order.

    A line is traced to the item whose text holds the largest share of its content words,
    counting only words that neither the question nor the items' headers supply: a restated
    question matches any item that names the same people, and a copied ``[date] Speaker:``
    header matches every turn of that session. It counts when that share reaches
    ``threshold``; a line with no words of its own (``NONE``, an echo of the question, a bare
    header) traces to nothing.
    """
    asked = set(words(question)) | {w for it in items for w in words(it.header())}
    vocab = [(it, set(words(it.text))) for it in items]
    picked: dict[int, Item] = {}
    for raw in output.splitlines():
        line = raw.strip().lstrip("-*• ").strip()
        if not line or line.upper().strip(".") == BLOCK_NONE:
            continue
        own = [t for t in words(line) if t not in asked and t not in STOPWORDS]
        if not own or not vocab:
            continue
        best, share = max(((it, sum(t in v for t in own) / len(own)) for it, v in vocab),
                          key=lambda x: x[1])
        if share >= threshold:
            picked[best.seq] = best
    return [picked[q] for q in sorted(picked)]


def run_agents(agent: MemoryAgent, question: str, blocks: Sequence[ChosenBlock],
               block_items: dict[int, list[Item]], hit_seqs: set[int], *, concurrency: int,
               ledger: Ledger | None = None, deadline: float | None = None) -> list[AgentNote]:
    """One agent per block, at most ``concurrency`` at once; notes come back in time order.

    Each agent gets a ledger of its own, so every note carries the calls that made it; they
    join ``ledger`` in block order once all agents are done.
    """

    def one(cb: ChosenBlock) -> AgentNote:
        own = Ledger()
        t0 = time.perf_counter()
        try:
            note = agent.read(question, cb.block, block_items[cb.block.index], hit_seqs, ledger=own,
                              deadline=deadline)
        except Exception as exc:  # an agent bug must not sink the query: degrade to no note
            note = AgentNote(cb.block.index, cb.block.first_seq, cb.block.last_seq, "", "", False,
                             (time.perf_counter() - t0) * 1e3, ok=False,
                             error=f"{type(exc).__name__}: {exc}")
        return replace(note, calls=tuple(own.records))

    if not blocks:
        return []
    pool = ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(blocks))),
                              thread_name_prefix="suffice-agent")
    futures = {pool.submit(one, cb): cb for cb in blocks}
    left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
    done, late = wait(futures, timeout=left)
    # An agent still reading at the deadline is not waited for: its block counts as failed.
    pool.shutdown(wait=not late, cancel_futures=True)
    notes = [f.result() for f in done]
    for f in late:
        cb = futures[f]
        notes.append(AgentNote(cb.block.index, cb.block.first_seq, cb.block.last_seq, "", "", False,
                               (left or 0.0) * 1e3, ok=False,
                               error="DeadlineError: the query's deadline passed while the agent "
                                     "read (a model call it had started may finish later; its "
                                     "tokens and cost are not on this receipt)"))
    notes.sort(key=lambda n: n.first_seq)
    if ledger is not None:
        for n in notes:
            for call in n.calls:
                ledger.add(call)
    return notes


def notes_text(notes: Sequence[AgentNote], budget: int) -> tuple[str, dict[int, tuple[str, ...]]]:
    """Relevant notes in time order within ``budget`` tokens, and the lines each block got
    (blocks that got none are left out).

    Lines are dealt out round by round: each block, oldest first, gets its next line while it
    fits what is left, so every block is heard before any block's later lines and no line is
    cut. A line copied by two overlapping blocks is kept once, where it is first taken.
    """
    queues: list[tuple[int, list[str]]] = []
    for n in notes:
        if not n.relevant:
            continue
        lines = [ln for ln in n.notes.splitlines() if ln.strip()]
        if n.answer:
            lines.append(f"(reader of items {n.first_seq}-{n.last_seq} suggests: {n.answer})")
        queues.append((n.block, lines))
    kept: dict[int, list[str]] = {b: [] for b, _ in queues}
    taken: set[str] = set()
    left = budget
    pos = {b: 0 for b, _ in queues}
    progress = True
    while progress:
        progress = False
        for b, lines in queues:
            while pos[b] < len(lines):
                line = lines[pos[b]]
                pos[b] += 1
                progress = True
                if line in taken:
                    continue  # the same turn, copied by an overlapping block
                cost = count_tokens(line) + 1
                if cost <= left:  # else it never will fit: ``left`` only shrinks
                    kept[b].append(line)
                    taken.add(line)
                    left -= cost
                break  # one line per block per round
    text = "\n".join(line for b, _ in queues for line in kept[b])
    return text, {b: tuple(kept[b]) for b, _ in queues if kept[b]}
