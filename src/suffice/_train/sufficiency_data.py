"""Evidence-sufficiency examples for the router: (query, context, does it hold all the gold?).

Every example is a context the engine could really have produced for a question, labelled by
looking: it holds all gold evidence when every annotated piece of evidence is shown in it (an
item shown whole, or, for an item too long to show whole, by a piece of it).

* **Natural** contexts are the engine's own: the render at each budget of ``budgets`` and the
  prefix's top ``k`` hits, from the query's real ranking.
* **Interventions** change the ranking, not the context, and render again, so the context
  looks exactly like one the engine makes; only what the retriever found differs:
  - ``drop_all``: the gold items are taken out of the ranking, so their places go to the next
    candidates the query matches: items that share its words, names, speakers, or that sit
    next to other hits in time (the render follows links to neighbours). Insufficient.
  - ``drop_part``: the same for part of the gold (questions with two or more pieces of
    evidence): relevant and partly right, still insufficient.
  - ``promote``: the gold items are moved into the ranking's top few places, as a retriever that
    found them would have put them; the render fills the rest of the budget with the usual
    distractors. Sufficient, when the render does show them (the label is checked, not assumed).
* **Verification** (optional, :func:`verify`): a negative is dropped when an answer model still
  answers it correctly from the context: the removed evidence was not needed after all.

Each example carries a rationale, the teacher's extra input in training. Without an LLM it is
built from the annotations: which pieces of evidence the context shows, which are missing
(quoted), and the verdict. :func:`llm_rationales` asks a model to write them instead.

Splits are made by ``group`` (conversation or episode), never by question.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from .._api import Memory
from .._errors import InvalidInputError
from .._llm.base import LLM, Ledger
from .._prompts import answer_messages
from .._retrieve import Ranking
from .._route.features import OUTSIDE, RouterFeatures, context_seqs, extract
from .._tokens import count_tokens
from .._types import Context, ContextPart, Item, NewItem
from .pairs import Question

KINDS = ("natural", "prefix", "drop_all", "drop_part", "promote")


@dataclass(frozen=True, slots=True)
class DataConfig:
    budgets: tuple[int, ...] = (500, 1000, 2000)
    """Natural renders are made at each of these budgets."""
    fast_budget: int = 1000
    """The budget interventions render at: the engine's reader budget, what the router judges."""
    prefix_k: int = 10
    interventions: bool = True
    promote_top: int = 3
    """Promoted gold items take random places among the ranking's first this many."""
    seed: int = 0


@dataclass(frozen=True, slots=True)
class SufficiencyExample:
    dataset: str
    group: str
    """Conversation or episode: the unit of every split."""
    key: str
    """``group#index`` of the question, to join examples of one question."""
    query: str
    answer: str
    category: int | str
    kind: str
    """One of :data:`KINDS`."""
    budget: int
    """Render budget (0 for the prefix's hits)."""
    label: bool
    """All gold evidence is shown in the context."""
    n_gold: int
    n_present: int
    rationale: str
    text: str
    tokens: int
    features: RouterFeatures
    gold: tuple[int, ...] = ()
    """The gold items (any item of a piece counts), for the per-item auxiliary target."""
    wider_adds: bool | None = None
    """Natural renders only, where the render at twice this budget was made too: does that
    wider render show more pieces of the evidence? (None: not known.)"""

    def item_labels(self) -> list[bool]:
        """For each item the router reads (``features.seqs``): is it gold evidence?"""
        gold = set(self.gold)
        return [q in gold for q in self.features.seqs]


def shown(ctx_text: str, seqs_shown: set[int], item: Item, whole_item_tokens: int) -> bool:
    """Is ``item`` in the context: its whole text, or (too long to show whole) a piece of it?"""
    if item.seq not in seqs_shown:
        return False
    return item.text in ctx_text or item.tokens > whole_item_tokens


def present_pieces(q: Question, ctx_text: str, parts: Sequence[ContextPart], items: dict[int, Item],
                   whole_item_tokens: int) -> list[bool]:
    """For each piece of ``q``'s evidence: does the context show one of its items?"""
    seen = set(context_seqs(parts))
    return [any(s in items and shown(ctx_text, seen, items[s], whole_item_tokens) for s in piece)
            for piece in q.gold]


def rationale(q: Question, flags: Sequence[bool], items: dict[int, Item], words_per_item: int = 24) -> str:
    """Why the context does or does not suffice, from the annotations: the evidence it shows,
    the evidence it lacks (quoted, shortened), and the verdict."""
    def quote(piece: tuple[int, ...]) -> str:
        it = items.get(piece[0])
        if it is None:
            return "(an item not in the history)"
        text = " ".join(it.text.split()[:words_per_item])
        who = f"{it.speaker}: " if it.speaker else ""
        when = f" [{it.observed_at}]" if it.observed_at else ""
        return f'"{who}{text}"{when}'

    have = [quote(p) for p, f in zip(q.gold, flags, strict=True) if f]
    lack = [quote(p) for p, f in zip(q.gold, flags, strict=True) if not f]
    out = [f"The question needs {len(q.gold)} piece(s) of evidence."]
    if have:
        out.append("The context shows: " + "; ".join(have) + ".")
    if lack:
        out.append("It lacks: " + "; ".join(lack) + ".")
        out.append("Not enough to answer: the decisive evidence is missing.")
    else:
        out.append("Enough to answer: every piece is there.")
    return " ".join(out)


def without(ranking: Ranking, drop: set[int]) -> Ranking:
    """``ranking`` as if the retriever had never found the items ``drop``."""
    keep = [(q, s) for q, s in zip(ranking.seqs, ranking.scores, strict=True) if q not in drop]
    return replace(ranking, seqs=tuple(q for q, _ in keep), scores=tuple(s for _, s in keep),
                   pieces=tuple(p for p in ranking.pieces if p[0] not in drop),
                   dense=tuple(d for d in ranking.dense if d[0] not in drop))


def promoted(ranking: Ranking, lift: Sequence[int], cosines: dict[int, float], rnd: random.Random,
             top: int) -> Ranking:
    """``ranking`` as if the retriever had put the items ``lift`` among its first ``top`` places
    in every source (fused, BM25 pieces, dense); the items keep their own cosines."""
    def insert(order: list[Any], new: list[Any]) -> list[Any]:
        out = list(order)
        for x in new:
            out.insert(rnd.randrange(0, min(top, len(out)) + 1), x)
        return out

    lift_set = set(lift)
    base = without(ranking, lift_set)
    first_score = ranking.scores[0] if ranking.scores else 1.0
    seqs = insert([(q, s) for q, s in zip(base.seqs, base.scores, strict=True)],
                  [(q, first_score) for q in lift])
    best_piece = {q: p for q, p, _ in reversed(ranking.pieces)}  # each item's best piece
    top_bm25 = ranking.pieces[0][2] if ranking.pieces else 1.0
    pieces = insert(list(base.pieces), [(q, best_piece.get(q, 0), top_bm25) for q in lift])
    dense = insert(list(base.dense), [(q, cosines.get(q, 0.0)) for q in lift])
    return replace(ranking, seqs=tuple(q for q, _ in seqs), scores=tuple(s for _, s in seqs),
                   pieces=tuple(pieces), dense=tuple(dense))


def build(mem: Memory, questions: Sequence[Question], dataset: str, config: DataConfig = DataConfig(),
          progress: Callable[[int], None] | None = None) -> list[SufficiencyExample]:
    """Natural and intervened contexts for every question; ``mem`` holds the histories."""
    rnd = random.Random(config.seed)
    whole = mem.render_config.piece_whole_item_tokens
    render_depth = mem.render_config.depth(max((*config.budgets, config.fast_budget)))
    retrieval = mem.retrieval
    out: list[SufficiencyExample] = []
    cache: dict[str, dict[int, Item]] = {}
    for q in questions:
        if q.scope not in cache:
            cache = {q.scope: {it.seq: it for it in mem.items(scope=q.scope, limit=None)}}
        items = cache[q.scope]
        ranking = mem.retriever.rank(q.scope, q.query, retrieval,
                                     depth=max(retrieval.k, retrieval.candidate_k), piece_depth=render_depth)
        top = list(ranking.seqs[:config.prefix_k])
        gold = sorted({s for piece in q.gold for s in piece if s in items})

        def add(kind: str, budget: int, ctx: Context | None, rk: Ranking, q: Question = q,
                top: list[int] = top, items: dict[int, Item] = items) -> None:
            if ctx is None:  # the prefix's hits, one line each, in time order
                hits = sorted(rk.seqs[:config.prefix_k])
                text = "\n".join(items[s].render() for s in hits)
                parts: tuple[ContextPart, ...] = tuple(ContextPart("raw", None, (s,), 0, "prefix hit")
                                                       for s in hits)
                tokens = count_tokens(text)
            else:
                text, parts, tokens = ctx.text, ctx.parts, ctx.tokens
            flags = present_pieces(q, text, parts, items, whole)
            seen = {s for p in parts for s in p.seqs} | set(rk.seqs[:OUTSIDE])
            feats = extract(q.query, rk, parts, {s: items[s] for s in seen if s in items},
                            list(rk.seqs[:config.prefix_k]), tokens)
            out.append(SufficiencyExample(
                dataset, q.group, f"{q.group}#{q.index}", q.query, q.answer, q.category, kind, budget,
                all(flags), len(flags), sum(flags), rationale(q, flags, items), text, tokens, feats,
                tuple(sorted({s for piece in q.gold for s in piece}))))

        def render(rk: Ranking, budget: int, q: Question = q) -> Context:
            return mem.renderer.render(q.scope, q.query, budget, config=mem.render_config,
                                       retrieval=retrieval, ranking=rk)

        first = len(out)
        for b in config.budgets:
            add("natural", b, render(ranking, b), ranking)
        naturals = {e.budget: i for i, e in enumerate(out[first:], first)}
        for b, i in naturals.items():
            if 2 * b in naturals:
                out[i] = replace(out[i], wider_adds=out[naturals[2 * b]].n_present > out[i].n_present)
        add("prefix", 0, None, ranking)
        if config.interventions and gold:
            fb = config.fast_budget
            dropped = without(ranking, set(gold))
            add("drop_all", fb, render(dropped, fb), dropped)
            if len(q.gold) > 1:
                pieces = list(q.gold)
                rnd.shuffle(pieces)
                part = pieces[: rnd.randint(1, len(pieces) - 1)]
                drop = {s for p in part for s in p}
                partial = without(ranking, drop)
                add("drop_part", fb, render(partial, fb), partial)
            cos = dict(ranking.dense)
            lift = [p[0] for p in q.gold if p and p[0] in items]
            if lift:
                up = promoted(ranking, lift, cos, rnd, config.promote_top)
                add("promote", fb, render(up, fb), up)
        if progress is not None:
            progress(1)
    return out


def width_examples(examples: Sequence[SufficiencyExample]) -> list[SufficiencyExample]:
    """The natural contexts whose double was rendered, relabelled for the *width* target:
    ``label`` is true when reading twice as wide would show no more of the evidence, so a stop
    there loses nothing a wider deep read would have found (docs/benchmarks.md section 7).

    Where the deep model answers a stop from the same budget, the only thing a stop gives up is
    that width: a question whose gold is missing from both contexts gains nothing from going
    deep, and the evidence label would still send it there."""
    out = []
    for e in examples:
        if e.kind != "natural" or e.wider_adds is None:
            continue
        verdict = ("Reading twice as wide shows more of the evidence: go deep." if e.wider_adds
                   else "Reading twice as wide shows no more of the evidence: stop here.")
        out.append(replace(e, label=not e.wider_adds, rationale=f"{e.rationale} {verdict}"))
    return out


def verify(examples: Sequence[SufficiencyExample], llm: LLM, score: Callable[[str, str], float], *,
           threshold: float = 0.5, kinds: Iterable[str] = ("drop_all", "drop_part"),
           max_tokens: int = 48,
           progress: Callable[[int, int], None] | None = None) -> tuple[list[SufficiencyExample], int]:
    """The examples without the intervened negatives ``llm`` still answers correctly
    (``score(answer, reference)``, e.g. token F1, at least ``threshold``), and how many were
    dropped. ``progress(done, total)`` counts the model calls."""
    from .._llm.parse import extract_answer

    wanted = set(kinds)
    asked = [not ex.label and ex.kind in wanted and bool(ex.answer) for ex in examples]
    total, done = sum(asked), 0
    kept: list[SufficiencyExample] = []
    dropped = 0
    for ex, ask in zip(examples, asked, strict=True):
        if not ask:
            kept.append(ex)
            continue
        reply = llm.chat(answer_messages(ex.query, ex.text), max_tokens=max_tokens, stage="verify",
                         ledger=Ledger()).text
        if score(extract_answer(reply), ex.answer) >= threshold:
            dropped += 1
        else:
            kept.append(ex)
        done += 1
        if progress is not None:
            progress(done, total)
    return kept, dropped


def llm_rationales(examples: Sequence[SufficiencyExample], llm: LLM, *, max_tokens: int = 80,
                   progress: Callable[[int, int], None] | None = None) -> list[SufficiencyExample]:
    """The examples with rationales written by ``llm``: told the verdict and the annotated
    evidence, it explains in two sentences what the context shows and what is missing.
    ``progress(done, total)`` counts the model calls."""
    from .._prompts import rationale_messages

    out = []
    for ex in examples:
        reply = llm.chat(rationale_messages(ex.query, ex.text, ex.rationale, ex.label),
                         max_tokens=max_tokens, stage="rationale", ledger=Ledger()).text.strip()
        out.append(replace(ex, rationale=reply or ex.rationale))
        if progress is not None:
            progress(len(out), len(examples))
    return out


def summary(examples: Sequence[SufficiencyExample]) -> dict[str, Any]:
    """Counts per kind and dataset, and the share labelled sufficient."""
    out: dict[str, Any] = {"examples": len(examples), "groups": len({e.group for e in examples}),
                           "questions": len({e.key for e in examples}), "by_kind": {}}
    for kind in KINDS:
        xs = [e for e in examples if e.kind == kind]
        if xs:
            share = round(100 * sum(e.label for e in xs) / len(xs), 1)
            out["by_kind"][kind] = {"n": len(xs), "sufficient": share}
    return out


class AnnotatedSet(Protocol):
    """A dataset as histories to ingest and its evidence-annotated questions (the shape of
    ``suffice._bench.retrieval.load_set``'s result; the caller loads it)."""

    @property
    def name(self) -> str: ...
    @property
    def histories(self) -> list[tuple[str, list[NewItem]]]: ...
    @property
    def questions(self) -> Callable[[Memory], list[Question]]: ...


def histories(evset: AnnotatedSet, exclude: Sequence[str], work: Path,
              progress: Callable[[str, int, int], None] | None = None,
              embedder: Any = "default") -> tuple[Memory, list[Question]]:
    """A store at ``work/<dataset>.db`` holding the dataset's histories (all but ``exclude``;
    a store left by an earlier run is reused, and completed) and their annotated questions."""
    dataset = evset.name
    work.mkdir(parents=True, exist_ok=True)
    mem = Memory(work / f"{dataset}.db", embedder=embedder)
    # Every history is added again: the add is idempotent by client id (every dataset sets
    # them), so a store left half-written by an interrupted run is completed, not trusted.
    todo = [(scope, items) for scope, items in evset.histories if scope not in exclude]
    total = sum(len(items) for _, items in todo)
    done = 0
    for scope, items in todo:
        mem.add(items, scope=scope)
        done += len(items)
        if progress is not None:
            progress(f"ingesting {dataset}", done, total)
    questions = [q for q in evset.questions(mem) if q.group not in exclude]
    return mem, questions


def from_datasets(sets: Sequence[AnnotatedSet], exclude: Sequence[str], work: Path,
                  config: DataConfig = DataConfig(),
                  progress: Callable[[str, int, int], None] | None = None,
                  embedder: Any = "default") -> list[SufficiencyExample]:
    """Examples from every dataset in ``sets`` (histories in ``exclude`` left out; an
    exclusion that names no history of any of them is refused, since a mistyped acceptance set
    would otherwise be trained on without a word)."""
    known = {scope for evset in sets for scope, _ in evset.histories}
    unknown = sorted(set(exclude) - known)
    if unknown:
        names = ", ".join(evset.name for evset in sets)
        raise InvalidInputError(f"--exclude names no history of {names}: {', '.join(unknown)}")
    out: list[SufficiencyExample] = []
    for evset in sets:
        mem, questions = histories(evset, exclude, work, progress, embedder)
        done = [0]

        def tick(n: int, name: str = evset.name, total: int = len(questions),
                 done: list[int] = done) -> None:
            done[0] += n
            if progress is not None:
                progress(f"contexts ({name})", done[0], total)
        out += build(mem, questions, evset.name, config, tick)
        mem.close()
    return out
