"""``Memory``: the one core that the library, the CLI and the servers share.

Writes are cheap and verbatim: count tokens, cut pieces, embed, append in one transaction.
Reads start with the shared retrieval prefix; answering and rendering build on it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .config import Settings
from .embed.protocol import Embedder
from .errors import InvalidItemError, StoreError
from .llm.base import LLM
from .retrieve import Method, Retriever
from .route.sufficiency import SufficiencyRouter
from .store.sqlite import ItemRow, SQLiteStore, validate_item, validate_scope
from .text import embedding_text
from .tokens import count_tokens
from .types import Context, Evidence, Item, NewItem, RenderMode, StoreStats
from .views import piece_spans

if TYPE_CHECKING:
    from .datasets.locomo import LocomoConversation
    from .engine import Answer, Mode
    from .records import RecordWriter

DEFAULT_SCOPE = "default"
ItemLike = str | NewItem | Mapping[str, Any]
Progress = Callable[[int], None]


def default_db_path() -> str:
    """``$SUFFICE_DB`` or ``./suffice.db``."""
    return os.environ.get("SUFFICE_DB", "suffice.db")


def _coerce(item: ItemLike, defaults: dict[str, Any], index: int) -> NewItem:
    if isinstance(item, NewItem):
        return item
    if isinstance(item, str):
        return NewItem(text=item, **defaults)
    if isinstance(item, Mapping):
        known = set(NewItem.__dataclass_fields__)
        unknown = sorted(set(item) - known)
        if unknown:
            raise InvalidItemError(f"item {index}: unknown field(s) {', '.join(unknown)}")
        if "text" not in item:
            raise InvalidItemError(f"item {index}: missing 'text'")
        merged = {**defaults, **item}
        if merged.get("meta") is None:
            merged["meta"] = {}
        return NewItem(**merged)
    raise InvalidItemError(f"item {index}: expected str, NewItem or mapping, got {type(item).__name__}")


class Memory:
    """Long-term memory over one store.

    >>> mem = Memory(":memory:")
    >>> mem.add("I moved to Lisbon in May.", scope="alice")  # doctest: +SKIP
    >>> mem.search("Where does she live?", scope="alice")      # doctest: +SKIP
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 settings: Settings | None = None,
                 embedder: Embedder | Literal["default"] | None = "default",
                 record_writer: RecordWriter | None = None) -> None:
        self.settings = settings or Settings()
        self.record_writer = record_writer
        """Writes a unit's timeline line once when it closes; None uses the fixed rule."""
        self.store = SQLiteStore(path if path is not None else default_db_path())
        if embedder == "default":
            from .embed.minilm import MiniLMEmbedder
            self.embedder: Embedder | None = MiniLMEmbedder()
        else:
            self.embedder = embedder
        self.retriever = Retriever(self.store, self.embedder, self.settings)
        self._llm: LLM | None = None

    @property
    def path(self) -> str:
        return self.store.path

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes -----------------------------------------------------------------------------

    def add(self, items: ItemLike | Sequence[ItemLike], *, scope: str = DEFAULT_SCOPE,
            session: str = "", speaker: str = "", role: str = "", kind: str = "message",
            observed_at: str = "", batch_size: int = 512,
            progress: Progress | None = None) -> list[Item]:
        """Store turns or steps verbatim; return them as stored (with ``seq`` and ``id``).

        Each batch of ``batch_size`` items is one transaction. Every item is validated before
        anything is written, so bad input leaves the store untouched. Items with client ids
        already stored are returned as they were (idempotent).
        """
        validate_scope(scope)
        if isinstance(items, (str, NewItem, Mapping)):
            items = [items]
        defaults = {"session": session, "speaker": speaker, "role": role, "kind": kind,
                    "observed_at": observed_at}
        if batch_size <= 0:
            raise InvalidItemError(f"batch_size must be positive, got {batch_size}")
        new = [_coerce(it, defaults, i) for i, it in enumerate(items)]
        for i, it in enumerate(new):
            validate_item(it, i)
        ids = [it.id for it in new if it.id is not None]
        if len(ids) != len(set(ids)):
            dup = next(x for x in ids if ids.count(x) > 1)
            raise InvalidItemError(f"id {dup!r} appears twice in one add")
        # Conflicting client ids are refused before any batch is written; items already
        # stored unchanged are not embedded again.
        known = self.store.check_ids(scope, new)
        out: list[Item] = []
        for b in range(0, len(new), batch_size):
            batch = new[b:b + batch_size]
            stored = known[b:b + batch_size]
            prepared = iter(self._prepare([it for it, k in zip(batch, stored, strict=True) if not k]))
            # An already-stored item needs no row: the store returns it as it is.
            rows = [ItemRow(it, 0, [], []) if k else next(prepared)
                    for it, k in zip(batch, stored, strict=True)]
            out.extend(self.store.append(scope, rows,
                                         embed_model=self.embedder.name if self.embedder else ""))
            if progress is not None:
                progress(len(batch))
        if out:
            try:
                self._close_units(scope)
            except StoreError as exc:
                # The items are stored; records are derived and are written on the next add.
                warnings.warn(f"records not written yet ({exc}); they follow on the next add",
                              stacklevel=2)
        return out

    def _close_units(self, scope: str) -> None:
        """Write the record and links of every unit that the append closed (once each)."""
        from .records import write_new_records

        write_new_records(self, scope)

    def _prepare(self, batch: Sequence[NewItem]) -> list[ItemRow]:
        vecs = (self.embedder.embed([embedding_text(it.speaker, it.text) for it in batch])
                if self.embedder is not None else None)
        rows = []
        for i, it in enumerate(batch):
            spans = piece_spans(it.text, self.settings.piece_max_tokens)
            head = f"{it.speaker} {it.observed_at}".strip() if self.settings.index_header else ""
            bodies = [f"{head} {it.text[s:e]}" if head else it.text[s:e] for s, e in spans]
            rows.append(ItemRow(it, count_tokens(it.text), spans, bodies,
                                None if vecs is None else vecs[i]))
        return rows

    # -- reads ------------------------------------------------------------------------------

    def search(self, query: str, *, scope: str = DEFAULT_SCOPE, k: int | None = None,
               method: Method = "fused") -> Evidence:
        """Run the shared retrieval prefix: hits plus the evidence context in time order."""
        if not isinstance(query, str) or not query.strip():
            raise InvalidItemError("query is empty")
        self.store.require_scope(scope)
        return self.retriever.prefix(scope, query, k=k, method=method)

    def render(self, query: str, budget_tokens: int, *, scope: str = DEFAULT_SCOPE,
               mode: RenderMode | None = None, agent: bool = False) -> Context:
        """A fresh memory for ``query`` that fits ``budget_tokens`` (o200k), with reasons.

        Deterministic for the same store, query and budget; never over budget; no LLM call.
        """
        from .render import render_context

        if not isinstance(query, str):
            raise InvalidItemError("query must be a string")
        self.store.require_scope(scope)
        return render_context(self, query, budget_tokens, scope=scope, mode=mode, agent=agent)

    def ask(self, question: str, *, scope: str = DEFAULT_SCOPE, llm: LLM | None = None,
            mode: Mode = "fast", router: SufficiencyRouter | None = None, tau: float | None = None,
            budget: int | None = None, context: Literal["prefix", "render"] = "render",
            settings: Settings | None = None) -> Answer:
        """Answer ``question`` from memory; the Answer carries a receipt of how it was made.

        The reader's context is the budgeted render (``context="render"``, timeline + detail)
        or the prefix hits in rank order (``"prefix"``). ``mode``: ``fast`` answers at once,
        ``deep`` reads blocks with memory agents, ``auto`` lets ``router`` decide with
        threshold ``tau`` (default router: :class:`ScoreRouter`, retrieval signals only).
        Without ``llm`` the local shipped model is loaded once and reused. ``settings``
        overrides the memory's settings for this query only (blocks, concurrency, render knobs).
        """
        from .engine import Engine

        if not isinstance(question, str) or not question.strip():
            raise InvalidItemError("question is empty")
        self.store.require_scope(scope)
        engine = Engine(self, llm or self.default_llm(), router=router, context=context)
        return engine.ask(question, scope=scope, mode=mode, tau=tau, budget=budget,
                          settings=settings)

    def default_llm(self) -> LLM:
        """The local shipped model (``[local]`` extra), loaded on first use and then kept."""
        if self._llm is None:
            from .llm import make_llm
            self._llm = make_llm("local")
        return self._llm

    def items(self, scope: str = DEFAULT_SCOPE, seqs: Iterable[int] | None = None) -> list[Item]:
        self.store.require_scope(scope)
        return self.store.items(scope, list(seqs) if seqs is not None else None)

    def scopes(self) -> list[str]:
        return self.store.scopes()

    def stats(self, scope: str | None = None) -> StoreStats:
        if scope is not None:
            self.store.require_scope(scope)
        return self.store.stats(scope, embed_model=self.embedder.name if self.embedder else "")

    def import_locomo(self, source: str | Path | Sequence[LocomoConversation] | None = None,
                      progress: Progress | None = None) -> dict[str, int]:
        """Import LoCoMo, one scope per conversation; the number of items added per scope.

        Re-importing adds nothing (and reports 0): turns carry their dialogue ids as client ids.

        ``source`` is a file (default: the shared copy) or conversations already loaded with
        :func:`suffice.datasets.locomo.load_locomo`, e.g. to size a progress bar first.
        """
        from .datasets.locomo import load_locomo

        # A file is parsed and validated whole before any write.
        convs = load_locomo(source) if source is None or isinstance(source, (str, Path)) else source
        counts = {}
        for conv in convs:
            before = self.store.max_seq(conv.scope)
            stored = self.add(list(conv.items), scope=conv.scope, progress=progress)
            counts[conv.scope] = sum(1 for it in stored if it.seq > before)
        return counts
