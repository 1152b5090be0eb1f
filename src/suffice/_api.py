"""``Memory`` and ``AsyncMemory``: the one core that the library, the CLI and the servers share.

``Memory`` composes the parts once (store, embedder, retriever, record index, renderer) and
then only checks arguments and delegates: writes are cheap and verbatim (count tokens, cut
pieces, parse the time, embed, append in one transaction); reads start with the shared
retrieval prefix, which every later stage reuses.

Scopes are hard partitions. A scope is named directly (``scope="alice"``) or by identity, the
way Mem0 users address memory (see :func:`identity`): ``user_id`` names the scope, ``agent_id``
and ``run_id`` narrow within it.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import hashlib
import json
import numbers
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

from ._access import Grant
from ._adapter import SHARED_SESSION, FittedMessages, fit_messages
from ._config import EngineConfig, RenderConfig, RenderMode, RetrievalConfig, StoreConfig
from ._deep import MemoryAgent
from ._embed.protocol import Embedder, Reranker
from ._engine import Answer, Engine, Mode
from ._errors import (
    AccessDeniedError,
    ConfigError,
    InvalidItemError,
    InvalidQueryError,
    ModelFileError,
    NotFoundError,
    StoreConfigError,
    StoreError,
    SufficeError,
    UnknownScopeError,
)
from ._llm.base import LLM
from ._messages import is_message, message_items
from ._pipeline import (
    TIERS,
    ModuleCache,
    Tier,
    TieredAgent,
    TieredPipeline,
    TierSettings,
    TierSource,
    check_models,
)
from ._records import RecordIndex, RecordWriter
from ._render import Renderer
from ._retrieve import Method, Retriever
from ._route.sufficiency import SufficiencyRouter
from ._route.tiers import TierPolicy, default_tiers
from ._store.base import ItemRow, Store, normalize_scope, validate_filter, validate_item
from ._store.open import open_store
from ._store.sqlite import observed_text
from ._text import embedding_text, is_utf8
from ._times import TimeLike, as_timestamp, observed_time
from ._tokens import count_tokens
from ._types import AuditEntry, Context, Evidence, Filter, ForgetReport, Item, NewItem, StoreStats
from ._views import piece_spans

if TYPE_CHECKING:
    from ._datasets.locomo import LocomoConversation
    from ._datasets.trajectories import Trajectory

DEFAULT_SCOPE = "default"
ItemLike = str | NewItem | Mapping[str, Any]
Progress = Callable[[int], None]
P = ParamSpec("P")
R = TypeVar("R")


def default_db_path() -> str:
    """``$SUFFICE_DB`` or ``./suffice.db``."""
    return os.environ.get("SUFFICE_DB", "suffice.db")


@dataclass(frozen=True, slots=True)
class Identity:
    """Where a call reads or writes: a hard scope, plus the agent and run it narrows to."""

    scope: str
    agent: str | None = None
    run: str | None = None


def identity(scope: str | None = None, user_id: str | None = None, agent_id: str | None = None,
             run_id: str | None = None) -> Identity:
    """Map Mem0-style ids onto a hard scope.

    Names and ids are normalised first (:func:`suffice._store.base.normalize_scope`: NFC,
    trimmed, bounded, no control characters). ``user_id`` → scope ``user:<id>``; without
    one, ``agent_id`` → ``agent:<id>``; with neither, ``run_id`` → ``run:<id>``. Within a
    user's scope ``agent_id`` narrows to that agent's items (stored in ``Item.agent``), and
    ``run_id`` is the session (a run is a session: units and blocks never cross it). So
    ``user_id="alice"`` reads all of Alice's runs, and ``user_id="alice", run_id="r7"`` one
    of them. A scope named directly cannot be combined with ids.
    """
    scope, user_id, agent_id, run_id = (
        None if v is None else normalize_scope(v, name)
        for v, name in ((scope, "scope"), (user_id, "user_id"), (agent_id, "agent_id"), (run_id, "run_id")))
    if scope is not None:
        if user_id is not None or agent_id is not None or run_id is not None:
            raise InvalidQueryError("give scope or user_id / agent_id / run_id, not both")
        return Identity(scope)
    if user_id is not None:
        return Identity(f"user:{user_id}", agent_id, run_id)
    if agent_id is not None:
        return Identity(f"agent:{agent_id}", None, run_id)
    if run_id is not None:
        return Identity(f"run:{run_id}")
    return Identity(DEFAULT_SCOPE)


_NEW_ITEM_DEFAULTS = {"session": "", "speaker": "", "role": "", "kind": "message", "observed_at": "",
                      "meta": {}, "agent": ""}


def _coerce(item: ItemLike, defaults: dict[str, Any], index: int) -> list[NewItem]:
    """The items one entry of ``add`` stands for (a chat message may stand for several)."""
    if isinstance(item, NewItem):
        # Fields the item leaves at their defaults take the call's (identity included).
        unset = {k: v for k, v in defaults.items() if getattr(item, k) == _NEW_ITEM_DEFAULTS[k] and v}
        return [dataclasses.replace(item, **unset)] if unset else [item]
    if isinstance(item, str):
        return [NewItem(text=item, **defaults)]
    if is_message(item):
        assert isinstance(item, Mapping)
        base = {k: defaults[k] for k in ("session", "observed_at", "agent", "meta")}
        return message_items(item, index, base)
    if isinstance(item, Mapping):
        known = set(NewItem.__dataclass_fields__)
        unknown = sorted(set(item) - known)
        if unknown:
            raise InvalidItemError(f"item {index}: unknown field(s) {', '.join(map(str, unknown))}")
        if "text" not in item:
            raise InvalidItemError(f"item {index}: missing 'text' (or 'role' and 'content' for a message)")
        merged = {**defaults, **item}
        if merged.get("meta") is None:
            merged["meta"] = {}
        return [NewItem(**merged)]
    raise InvalidItemError(f"item {index}: expected str, NewItem, a mapping or a chat message, "
                           f"got {type(item).__name__}")


def _filter(ident: Identity, session: str | None, speaker: str | None, kind: str | None,
            role: str | None, since: TimeLike | None, until: TimeLike | None,
            meta: Mapping[str, Any] | None) -> Filter | None:
    if ident.run is not None and session is not None and session != ident.run:
        raise InvalidQueryError("run_id is the session: give one of them, or the same value")
    if meta is not None and not isinstance(meta, Mapping):
        raise InvalidQueryError(f"meta must map keys to values, got {type(meta).__name__}")
    flt = Filter(session=session if session is not None else ident.run, speaker=speaker, kind=kind,
                 role=role, agent=ident.agent,
                 since=None if since is None else as_timestamp(since, "since"),
                 until=None if until is None else as_timestamp(until, "until"),
                 meta=dict(meta) if meta is not None else None)
    validate_filter(flt)
    return None if flt.empty else flt


MAX_COUNT = 1_000_000
"""Largest k, limit or offset a read takes: far above any real need, far below overflow."""


def _check_tiered(mode: str, lam: float | None, cap: str | None) -> None:
    if mode == "fast":
        raise InvalidQueryError("agent='tiered' runs on the deep path: use mode='deep' or 'auto'")
    if lam is not None and (not isinstance(lam, numbers.Real) or isinstance(lam, bool)
                            or not 0.0 <= float(lam) <= 100.0):
        raise InvalidQueryError(f"lam must be a number from 0 to 100, got {lam!r}")
    if cap is not None and cap not in TIERS:
        raise InvalidQueryError(f"tier_cap must be one of {', '.join(TIERS)}, got {cap!r}")


def _check_query(query: object, what: str = "query", *, empty_ok: bool = False) -> str:
    if not isinstance(query, str):
        raise InvalidQueryError(f"{what} must be a string, got {type(query).__name__}")
    if not empty_ok and not query.strip():
        raise InvalidQueryError(f"{what} is empty")
    if not is_utf8(query):
        raise InvalidQueryError(f"{what} is not valid text (invalid UTF-8 or a lone surrogate)")
    return query


def _check_count(value: object, name: str, *, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidQueryError(f"{name} must be a whole number, got {value!r}")
    if value < 0:
        raise InvalidQueryError(f"{name} must not be negative, got {value}")
    if value > MAX_COUNT:
        raise InvalidQueryError(f"{name} is {value}; at most {MAX_COUNT:,}")
    return value


@dataclass(frozen=True, slots=True)
class _Composed:
    """What a memory builds from its store config."""

    config: StoreConfig
    retriever: Retriever
    records: RecordIndex
    renderer: Renderer


class _Shared:
    """The composed parts of one memory and its views (:meth:`Memory.restrict` copies the
    memory, not this), replaced as a whole when the store config changes."""

    __slots__ = ("lock", "parts", "polled", "seen")

    def __init__(self, parts: _Composed) -> None:
        self.parts = parts
        self.lock = threading.RLock()
        self.seen: tuple[_Composed, dict[str, Any]] | None = None
        """(parts, the saved config as read) when that config was found to match those parts:
        the next call that reads the same config for the same parts skips parsing it."""
        self.polled = float("-inf")
        """When the saved config was last read (``time.monotonic``)."""


class Memory:
    """Long-term memory over one store: write once, verbatim; read what each query needs.

    >>> mem = Memory(":memory:")
    >>> mem.add("I moved to Lisbon in May.", user_id="ana")  # doctest: +SKIP
    >>> mem.search("Where does she live?", user_id="ana")     # doctest: +SKIP

    ``path`` is a file, a ``postgresql://`` URL, or a store opened with options of its own
    (``SQLiteStore(path, vacuum_on_forget=False)``), which the memory then owns and closes.
    ``reranker`` (``load_reranker(DIR)``) puts the prefix's first ``retrieval.rerank`` items in
    order by a cross-encoder on every read. ``store_config`` must match the store's saved one (a
    new store saves it); ``rebuild=True`` re-derives the views instead of refusing. ``retrieval``,
    ``render`` and ``engine`` are the defaults of every read; a call may pass its own, which then
    applies whole.
    """

    def __init__(self, path: str | os.PathLike[str] | Store | None = None, *,
                 store_config: StoreConfig | None = None,
                 embedder: Embedder | Literal["default"] | None = "default",
                 reranker: Reranker | None = None,
                 record_writer: RecordWriter | None = None,
                 retrieval: RetrievalConfig | None = None, render: RenderConfig | None = None,
                 engine: EngineConfig | None = None, llm: LLM | None = None,
                 deep_llm: LLM | None = None,
                 router: SufficiencyRouter | Literal["default"] | None = "default",
                 create: bool = True, rebuild: bool = False) -> None:
        self.retrieval = _config(retrieval, RetrievalConfig, "retrieval")
        self.render_config = _config(render, RenderConfig, "render")
        self.engine_config = _config(engine, EngineConfig, "engine")
        _check_parts(store_config=store_config, embedder=embedder, reranker=reranker,
                     record_writer=record_writer, llm=llm, deep_llm=deep_llm, router=router)
        self._store: Store = open_store(path if path is not None else default_db_path(), create=create)
        try:
            if embedder == "default":
                from ._embed.minilm import MiniLMEmbedder
                self.embedder: Embedder | None = MiniLMEmbedder()
            else:
                self.embedder = embedder
            config = self._open_config(store_config, rebuild)
        except BaseException:
            self._store.close()
            raise
        self._record_writer = record_writer
        self.reranker = reranker
        self._compose(config)
        self._llm = llm
        self.deep_llm = deep_llm
        """The model that writes deep-path answers (capacity escalation); None: the memory's model."""
        self._router: SufficiencyRouter | Literal["default"] | None = router
        """``"default"`` until the first use resolves it (see :attr:`router`)."""
        self.tier_settings = TierSettings()
        """How ``agent="tiered"`` reads: chunks, kept chunks, summary budget, CPU price."""
        self.tier_cache: ModuleCache | None = None
        """Module outputs kept across ``agent="tiered"`` calls (None: each call starts empty)."""
        self.tier_models: Mapping[str, LLM] | None = None
        """The ``low`` / ``mid`` / ``high`` models of the capacity strategy (None: the call's model
        serves every LLM tier)."""
        self._llm_lock = threading.Lock()
        self._own_llm = False
        """True once ``default_llm`` loaded a model this memory must close."""
        self._grant: Grant | None = None
        """The scopes this memory may touch (None: all); set on the views :meth:`restrict` makes."""
        self._view_of: Memory | None = None
        """The memory a restricted view shares its store, models and threads with."""
        self._records_rewritten: int | None = None
        """How many records :meth:`rebuild` last wrote when it wrote every record again (None:
        it has not): the CLI's ``--records`` then need not write them a second time."""
        if rebuild:
            try:
                self.rebuild(config)
            except BaseException:  # a memory that failed to open holds no file open
                self.close()
                raise

    def _open_config(self, wanted: StoreConfig | None, rebuild: bool) -> StoreConfig:
        """The store config to run with: the saved one, checked against what was asked for."""
        if wanted is not None and not isinstance(wanted, StoreConfig):
            raise ConfigError(f"store_config must be a StoreConfig, got {type(wanted).__name__}")
        encoder = {"encoder": self.embedder.name, "encoder_dim": self.embedder.dim} if self.embedder else {}
        raw = self._store.load_config()
        if raw is None:  # a new store, or one from before configs were saved
            if self.embedder is not None:  # a broken encoder must not be saved as the store's
                self._probe_embedder()
            config = (wanted or StoreConfig()).replace(**encoder)
            self._store.save_config(config.model_dump(), replace=False)  # a racing opener may win
            raw = self._store.load_config() or config.model_dump()
            if raw == config.model_dump() and any(self._store.records(s) for s in self._store.scopes()):
                # Records of a store that saved no config may come from another unit size:
                # derive them again under the config now saved.
                for scope in self._store.scopes():
                    self._store.drop_records(scope)
        try:
            saved = StoreConfig(**raw)
        except ConfigError as exc:
            raise StoreConfigError(f"store {self._store.path} holds an unreadable config ({exc})") from None
        target = (wanted or saved).replace(**(encoder or {"encoder": saved.encoder,
                                                          "encoder_dim": saved.encoder_dim}))
        if not saved.encoder and encoder:  # vectors were never written: adopt this encoder
            saved = saved.replace(**encoder)
            if not saved.changed(target):
                self._store.save_config(saved.model_dump())
        diff = saved.changed(target)
        if diff and not rebuild:
            what = ", ".join(f"{k} {old!r} (asked for {new!r})" for k, (old, new) in sorted(diff.items()))
            sets = " ".join(f"--set {k}={new}" for k, (_, new) in sorted(diff.items())
                            if k not in ("encoder", "encoder_dim"))
            # A trained encoder is named by its folder (--encoder), not by a setting.
            enc = " [--encoder FOLDER]" if "encoder" in diff else ""
            raise StoreConfigError(
                f"store {self._store.path} was built with {what}; open it with those settings, or "
                f"re-derive its views from the items (no re-ingest) with Memory(..., rebuild=True) "
                f"or: suffice --db {self._store.path}{enc} rebuild {sets}".rstrip())
        return saved if not diff else target

    def _compose(self, config: StoreConfig) -> None:
        """The parts built from the store config, replaced in the one holder this memory and
        every view of it share, so a rebuild reaches them all. The retired retriever is not
        closed: a call that began before may still be ranking with it, and its worker thread
        ends when it is collected (rows its dense index gained since its last save are not
        saved; the next retriever extends the saved index with them on first use)."""
        retriever = Retriever(self._store, self.embedder, config, self.reranker)
        records = RecordIndex(self._store, retriever, config, self._record_writer)
        parts = _Composed(config, retriever, records, Renderer(self._store, retriever, records))
        holder = getattr(self, "_shared", None)
        if holder is None:
            self._shared = _Shared(parts)
        else:
            holder.parts = parts

    def _parsed(self, raw: dict[str, Any]) -> StoreConfig:
        try:
            return StoreConfig(**raw)
        except ConfigError as exc:
            raise StoreConfigError(f"store {self._store.path} holds an unreadable config ({exc})") from None

    def _sync(self) -> None:
        """Take up a store config that another process saved (its ``rebuild``) since this
        memory composed its parts: without it a long-running server would keep cutting pieces,
        units and records under the old settings. One small read per call (at most one per
        ``store.config_poll_s`` where a read is a round trip)."""
        holder = self._shared
        poll = self._store.config_poll_s
        if poll > 0:
            now = time.monotonic()
            if now - holder.polled < poll:
                return
            holder.polled = now
        parts = holder.parts
        raw = self._store.load_config()
        seen = holder.seen
        if raw is None or (seen is not None and seen[0] is parts and seen[1] == raw):
            return
        if not self._parsed(raw).changed(parts.config):
            holder.seen = (parts, raw)
            return
        with holder.lock:  # read again inside: a rebuild here may have saved while we waited
            raw = self._store.load_config()
            if raw is None:
                return
            saved = self._parsed(raw)
            if saved.changed(holder.parts.config):
                if self.embedder is not None and saved.encoder and saved.encoder != self.embedder.name:
                    raise StoreConfigError(
                        f"store {self._store.path} was rebuilt for encoder {saved.encoder!r} since "
                        f"this memory opened it with {self.embedder.name!r}; open it again with "
                        "that encoder")
                self._compose(saved)
            holder.seen = (holder.parts, raw)

    @property
    def store_config(self) -> StoreConfig:
        """The settings the store's views were derived with (saved in the store)."""
        return self._shared.parts.config

    @property
    def _retriever(self) -> Retriever:
        return self._shared.parts.retriever

    @property
    def _records(self) -> RecordIndex:
        return self._shared.parts.records

    @property
    def _renderer(self) -> Renderer:
        return self._shared.parts.renderer

    @property
    def path(self) -> str:
        return self._store.path

    @property
    def store(self) -> Store:
        """The storage backend (for tools and tests; use the methods here to read and write)."""
        return self._store

    @property
    def retriever(self) -> Retriever:
        return self._retriever

    @property
    def records(self) -> RecordIndex:
        return self._records

    @property
    def renderer(self) -> Renderer:
        return self._renderer

    def restrict(self, scopes: Iterable[str]) -> Memory:
        """A view of this memory that may only touch ``scopes``: exact names (``"user:ana"``),
        prefixes ending in ``*`` (``"team:red:*"``), or ``"*"``.

        The view shares the store, models and threads (closing it closes nothing); every call
        on it that names another scope raises :class:`AccessDeniedError` before anything is
        read, ``scopes()`` and ``stats()`` show only granted scopes, and store-wide operations
        (``rebuild``, ``check``, ``import_locomo``) need ``"*"``. The servers give each API key
        such a view, so the check lives here, in the core, not in the HTTP layer. A view of a
        view may only narrow it.
        """
        grant = Grant.of(scopes)
        if self._grant is not None and not self._grant.covers(grant):
            raise AccessDeniedError("a restricted memory cannot be widened: "
                                    f"{', '.join(grant.patterns)} is not within its grant")
        view = copy.copy(self)
        view._grant = grant
        view._view_of = self._view_of or self
        return view

    @property
    def grant(self) -> Grant | None:
        """The scopes this memory may touch; None when it is not restricted."""
        return self._grant

    def _ident(self, scope: str | None, user_id: str | None, agent_id: str | None,
               run_id: str | None) -> Identity:
        """The scope a call names, checked against the grant; every call on a scope passes
        here first, so it is also where a rebuild by another process is taken up."""
        ident = identity(scope, user_id, agent_id, run_id)
        if self._grant is not None:
            self._grant.check(ident.scope)
        self._sync()
        return ident

    def _need_all(self, what: str, *, sync: bool = True) -> None:
        if self._grant is not None and not self._grant.everything:
            raise AccessDeniedError(f"{what} touches every scope of the store; this memory is "
                                    "restricted to some of them")
        if sync:
            self._sync()

    def close(self) -> None:
        """Stop worker threads and close the store; the object is unusable afterwards.

        On a view made by :meth:`restrict` this does nothing: the memory it came from owns
        the store."""
        if self._view_of is not None:
            return
        self._retriever.close()
        self._store.close()
        closer = getattr(self._llm, "close", None) if self._own_llm else None
        if callable(closer):
            closer()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes -------------------------------------------------------------------------------------

    def _checked(self, scope: str, new: list[NewItem],
                 origin: Sequence[int] | None = None) -> list[Item | None]:
        """Every check an add makes before it writes: each item valid, no id twice, no client
        id stored with other content. The stored item for each id already there, else None.
        ``origin``: the caller's entry each item came from (a message may make several), so an
        error names the entry the caller wrote."""
        for i, it in enumerate(new):
            validate_item(it, origin[i] if origin is not None else i)
            if it.meta:  # as it will be read back (a tuple is a list in JSON): add returns that
                new[i] = dataclasses.replace(it, meta=json.loads(json.dumps(it.meta, ensure_ascii=False)))
        ids = [it.id for it in new if it.id is not None]
        if len(ids) != len(set(ids)):
            dup = next(x for x in ids if ids.count(x) > 1)
            raise InvalidItemError(f"id {dup!r} appears twice in one add")
        # Conflicting client ids are refused before any batch is written; items already
        # stored unchanged are not embedded again.
        return self._store.check_ids(scope, new)

    def _add_scopes(self, parts: Sequence[tuple[str, Sequence[NewItem]]],
                    progress: Progress | None = None, source: str = "") -> dict[str, int]:
        """Add items to several scopes (an import: one per conversation or run), every scope
        checked before the first is written, so a bad or conflicting item anywhere leaves the
        store as it was; the number of items added per scope. A failure while writing (a model
        error, Ctrl-C) leaves what was written (every item of an import carries an id), and
        importing again adds only the rest."""
        # As the store names them: two names of one scope in another Unicode form are one.
        parts = [(self._ident(scope, None, None, None).scope, items) for scope, items in parts]
        names = [scope for scope, _ in parts]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:  # the second would be checked against a store without the first, then clash
            raise InvalidItemError(f"the import holds scope {twice[0]!r} twice (two conversations or "
                                   "runs with one id); nothing of this import was written")
        for scope, items in parts:
            try:
                self._checked(scope, list(items))  # named as the store names it, above
            except SufficeError as exc:
                exc.add_note(f"in scope {scope!r}; nothing of this import was written")
                raise
        counts: dict[str, int] = {}
        marks = self._store.unfinished_transfers()
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            for scope, items in parts:
                before = self._store.max_seq(scope)
                # Marked while it is written: a kill halfway (power, OOM) leaves a scope that
                # `check` names, where it looked like a finished import. A rebuild's mark is kept
                # beside it; another transfer's unfinished mark is left as it is, before and
                # after (the scope is flagged already, and that transfer is still to complete).
                old = marks.get(scope) or {}
                others = old.get("source") not in (source or "an import", None)
                if not others:
                    self._store.note_transfer(scope, {**old, "source": source or "an import",
                                                      "started": started, "items": len(items)})
                stored = self.add(list(items), scope=scope, progress=progress)
                counts[scope] = counts.get(scope, 0) + sum(1 for it in stored if it.seq > before)
                if not others:  # this import's own mark (or a stopped run's of it) goes; a rebuild's stays
                    rest = {k: v for k, v in old.items() if k in ("rebuild", "rebuild_started")}
                    self._store.note_transfer(scope, rest or None)
        except BaseException as exc:
            if counts:
                named = ", ".join(list(counts)[:3]) + (", ..." if len(counts) > 3 else "")
                exc.add_note(f"{len(counts)} scope(s) before it were imported whole ({named}); "
                             "importing again adds only the rest (stored items are known by their ids)")
            raise
        return counts

    def add(self, items: ItemLike | Sequence[ItemLike], *, scope: str | None = None,
            user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None,
            session: str = "", speaker: str = "", role: str = "", kind: str = "message",
            observed_at: str = "", meta: Mapping[str, Any] | None = None, batch_size: int = 512,
            progress: Progress | None = None) -> list[Item]:
        """Store turns, steps or chat messages verbatim; return them as stored.

        ``items``: text, :class:`NewItem`, a mapping of NewItem fields, or OpenAI-style chat
        messages (``role``, ``content``, ``name``, ``tool_calls``; tool calls and results
        become items of kinds ``tool_call`` and ``tool_result``). Keyword fields apply to
        entries that do not set their own. Each batch of ``batch_size`` items is one
        transaction; everything is checked before anything is written, a batch that fails
        takes the items without ids of the batches before it out again (so a retry stores
        nothing twice; items with ids stay, and the retry completes them), and items whose
        client ids are stored unchanged are returned as they were (idempotent).
        """
        ident = self._ident(scope, user_id, agent_id, run_id)
        if ident.run is not None and session and session != ident.run:
            raise InvalidItemError("run_id is the session: give one of them, or the same value")
        if isinstance(items, (str, NewItem, Mapping)):
            items = [items]
        if not isinstance(items, Sequence):
            raise InvalidItemError(f"items must be an item or a list of them, got {type(items).__name__}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise InvalidItemError(f"batch_size must be a positive whole number, got {batch_size!r}")
        if meta is not None and not isinstance(meta, Mapping):
            raise InvalidItemError(f"meta must be a mapping, got {type(meta).__name__}")
        defaults = {"session": ident.run or session, "speaker": speaker, "role": role, "kind": kind,
                    "observed_at": observed_at, "meta": dict(meta or {}), "agent": ident.agent or ""}
        new: list[NewItem] = []
        origin: list[int] = []
        for i, it in enumerate(items):
            for x in _coerce(it, defaults, i):
                if ident.run is not None and x.session == "":  # an item's empty session is unset
                    x = dataclasses.replace(x, session=ident.run)
                if ident.run is not None and x.session != ident.run:
                    # Stored under another session, the item would be out of reach of every
                    # read and forget by this run_id.
                    raise InvalidItemError(f"item {i}: session {x.session!r} is not run_id {ident.run!r}; "
                                           "run_id is the session: leave the item's session out, or "
                                           "give the same value")
                new.append(x)
                origin.append(i)
        known = self._checked(ident.scope, new, origin)
        out: list[Item] = []
        encoder = self.embedder.name if self.embedder else ""
        added: list[str] = []  # ids this call stored, taken out again if a later batch fails
        try:
            for b in range(0, len(new), batch_size):
                batch, stored = new[b:b + batch_size], known[b:b + batch_size]
                # Items already stored unchanged are read back, not prepared again: an agent loop
                # re-sends its whole list each step, and cutting every message into pieces again
                # made each step cost more than the one before.
                have = {i: got for i, got in enumerate(stored) if got is not None}
                todo = [i for i in range(len(batch)) if i not in have]
                rows = self._prepare([batch[i] for i in todo])
                made: list[bool] = []
                fresh = self._store.append(ident.scope, rows, encoder=encoder, created=made) if rows else []
                # Only rows this call wrote, and only those without a client id: an id'd item
                # another writer stored (or was told was stored: a client's retry) is theirs to
                # keep, and a retry of id'd items completes them without storing any twice.
                added.extend(it.id for it, new_row, row in zip(fresh, made, rows, strict=True)
                             if new_row and row.item.id is None)
                written = iter(fresh)
                out.extend(have[i] if i in have else next(written) for i in range(len(batch)))
                if progress is not None:
                    progress(len(batch))
        except BaseException as exc:
            self._take_back(ident.scope, added, exc)
            raise
        if out:
            try:
                self._records.write_new(ident.scope)
            except StoreError as exc:
                # The items are stored; records are derived and are written on the next add.
                warnings.warn(f"records not written yet ({exc}); they follow on the next add", stacklevel=2)
        return out

    def _take_back(self, scope: str, ids: Sequence[str], exc: BaseException) -> None:
        """Forget, by id, the items without client ids that an add stored before one of its
        later batches failed (an embedder that gave out, a full disk, Ctrl-C): a retry would
        otherwise store them twice. Items with client ids stay (a retry completes them, and
        another writer may have been told they are stored); other readers could see the
        taken-back rows meanwhile (each batch commits)."""
        if not ids:
            return
        try:
            self._store.forget(scope, ids=list(ids))
        except Exception as again:  # noqa: BLE001 - the add's own error is the one to raise
            exc.add_note(f"and the {len(ids)} item(s) it had stored could not be taken out again "
                         f"({again}); forget them by id (the first: {ids[0]!r}) before adding again")
        finally:
            self._retriever.reset()

    def _prepare(self, batch: Sequence[NewItem]) -> list[ItemRow]:
        """New items as rows to store: pieces, tokens, parsed time and (with an embedder) vectors."""
        vecs = (self.embedder.embed([embedding_text(it.speaker, it.text) for it in batch])
                if self.embedder is not None and batch else None)
        rows = []
        undated: dict[str, tuple[str, ...]] = {}
        for i, it in enumerate(batch):
            when = observed_text(it.observed_at)
            ts, left = observed_time(when)
            if left:
                undated[when] = left
            spans, bodies = self._pieces(it.text, it.speaker, when)
            rows.append(ItemRow(it, when, ts, count_tokens(it.text), spans, bodies,
                                vecs[i] if vecs is not None else None))
        if undated:
            when, left = next(iter(undated.items()))
            more = f" (and {len(undated) - 1} other time text(s))" if len(undated) > 1 else ""
            warnings.warn(f"observed_at {when[:60]!r}{more}: {' '.join(left)!r} is not part of a date that "
                          "can be read, so the item is stored without a timestamp (its text is kept); "
                          "write the date, e.g. 2023-10-01", stacklevel=3)
        return rows

    def _pieces(self, text: str, speaker: str, when: str) -> tuple[list[tuple[int, int]], list[str]]:
        """Piece spans of ``text`` and the bodies BM25 indexes (with speaker and date when set)."""
        spans = piece_spans(text, self.store_config.piece_max_tokens)
        head = f"{speaker} {when}".strip() if self.store_config.index_header else ""
        return spans, [f"{head} {text[s:e]}" if head else text[s:e] for s, e in spans]

    def forget(self, scope: str | None = None, ids: Iterable[str] | None = None,
               session: str | None = None, *, user_id: str | None = None, agent_id: str | None = None,
               run_id: str | None = None, everything: bool = False) -> ForgetReport:
        """Delete items and every trace derived from them, for privacy; the one exception to
        immutability.

        ``ids``, a ``session``, or a run (``run_id``) say what goes; the whole scope (all of a
        user's memory with ``user_id=...``) takes ``everything=True``, so that a call whose
        ``ids`` came back None cannot wipe a memory. Pieces, full-text entries, vectors,
        records, links and caches go too; freed pages are overwritten and the write-ahead
        log is emptied, so the text is gone from the files. An audit line keeps digests and
        counts, never the text. Returns what was removed (0 items when nothing matched).
        """
        ident = self._ident(scope, user_id, agent_id, run_id)
        if ident.agent is not None:
            raise InvalidQueryError("forget takes a scope, ids or a session; agent_id cannot narrow "
                                    "a forget (forget its ids, or its own scope)")
        if session is not None and (not isinstance(session, str) or not session.strip()):
            # "" is what an item without a session holds: a forget by it could take a scope's
            # every item without the everything=True that a whole scope needs.
            raise InvalidQueryError("session must name a session; items without one are forgotten by "
                                    "their ids (or the whole scope with everything=True)")
        named_session = session  # the caller's, before run_id fills it in
        session = _pick_session(ident, session)
        if not isinstance(everything, bool):
            raise InvalidQueryError(f"everything must be True or False, got {everything!r}")
        if ids is None and session is None and run_id is None and not everything:
            raise InvalidQueryError("say what to forget: ids, a session or run_id, or everything=True "
                                    "for the whole scope")
        if everything and (ids is not None or named_session is not None):
            raise InvalidQueryError("everything=True forgets the whole scope or run; do not combine it "
                                    "with ids or a session")
        if ids is not None:
            if isinstance(ids, str):
                ids = [ids]
            ids = list(ids)
            if not all(isinstance(x, str) and x for x in ids):
                raise InvalidQueryError("ids must be non-empty strings")
            if session is not None:
                raise InvalidQueryError("forget takes ids or a session, not both")
        report = self._store.forget(ident.scope, ids=ids, session=session)
        if report.items:
            self._retriever.reset()  # no copy of the forgotten items stays in this process
            self._records.write_new(ident.scope)  # records of the units that remain
        return report

    def rebuild(self, store_config: StoreConfig | None = None, *, records: bool = False) -> dict[str, int]:
        """Re-derive the views of every scope under ``store_config`` (default: the current one)
        without re-ingesting: pieces and full-text entries, records and links, and vectors when
        the encoder changed. Returns how many items each part was rebuilt for.

        Records are written once, when a unit closes, so a store keeps the timeline lines of the
        version that wrote them. ``records=True`` writes every closed unit's record and links
        again (a newer record format, or a record writer set since); with an LLM writer set,
        that is one model call per unit.

        Other memories open on the store (another process's, a server's) take the new config
        up on their next call; with another encoder they refuse until opened again with it."""
        self._need_all("rebuild", sync=False)  # it imposes its own config
        # Under the parts' lock: a call on this memory that finds the saved config changed
        # waits for the rebuild to end instead of composing the old config again meanwhile
        # (calls that find nothing changed go on, and may read views halfway rebuilt).
        with self._shared.lock:
            return self._rebuild(store_config, records)

    def _probe_embedder(self) -> None:
        """Embed one text with the memory's encoder, as a check that it works at all."""
        assert self.embedder is not None
        try:
            vecs = self.embedder.embed(["probe"])
        except SufficeError:
            raise
        except Exception as exc:  # a model that loads but cannot run
            raise ModelFileError(f"the encoder {self.embedder.name} cannot embed text "
                                 f"({type(exc).__name__}: {str(exc)[:160]})") from None
        if getattr(vecs, "shape", None) != (1, self.embedder.dim):
            raise ModelFileError(f"the encoder {self.embedder.name} gave vectors of shape "
                                 f"{getattr(vecs, 'shape', None)}, not (1, {self.embedder.dim})")

    def _rebuild(self, store_config: StoreConfig | None, records: bool) -> dict[str, int]:
        saved_raw = self._store.load_config()
        # The current config is the saved one, which another process may have rebuilt to.
        new = store_config or (StoreConfig(**saved_raw) if saved_raw else self.store_config)
        if self.embedder is not None:
            new = new.replace(encoder=self.embedder.name, encoder_dim=self.embedder.dim)
        old = StoreConfig(**saved_raw) if saved_raw else new
        diff = old.changed(new)
        if "encoder" in diff and self.embedder is not None:
            self._probe_embedder()  # before the old vectors go: a broken encoder changes nothing
        self._compose(new)
        counts = {"pieces": 0, "records": 0, "vectors": 0}
        scopes = self._store.scopes()
        marked: list[str] = []
        # Unfinished imports' marks (a mark a stopped rebuild left is this rebuild's to clear)
        transfers = {scope: {k: v for k, v in note.items() if k not in ("rebuild", "rebuild_started")}
                     for scope, note in self._store.unfinished_transfers().items() if "items" in note}
        if {"piece_max_tokens", "index_header"} & diff.keys():
            for scope in scopes:
                # A mark for the pieces rewritten chunk by chunk: a rebuild killed halfway
                # leaves items indexed two ways under the old saved config, which `check`
                # names from this mark (and a rebuild run again completes). It shares the
                # transfer mark's slot, so an unfinished import's mark is kept within it.
                self._store.note_transfer(scope, {
                    **transfers.get(scope, {}), "rebuild": sorted(diff),
                    "rebuild_started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
                marked.append(scope)
                for start in range(0, self._store.max_seq(scope) + 1, 512):
                    items = self._store.items(scope, start=start, end=start + 512)
                    rows = [(it.seq, *self._pieces(it.text, it.speaker, it.observed_at)) for it in items]
                    self._store.rebuild_pieces(scope, rows)
                    counts["pieces"] += len(rows)
        if "encoder" in diff and self.embedder is not None:
            self._store.drop_embeddings()
        rewrite = records or bool({"unit_tokens", "links_per_unit", "record_tokens", "encoder"} & diff.keys())
        if rewrite:
            for scope in scopes:
                self._store.drop_records(scope)
        self._store.save_config(new.model_dump())
        for scope in marked:
            self._store.note_transfer(scope, transfers.get(scope))  # an import's mark stays
        for scope in scopes:
            before = self._store.stats(scope).embedded
            self._retriever.index(scope)  # embeds what has no vector (all of it after a new encoder)
            counts["vectors"] += self._store.stats(scope).embedded - before
            counts["records"] += self._records.write_new(scope)
        if rewrite:
            self._records_rewritten = counts["records"]
        return counts

    # -- reads --------------------------------------------------------------------------------------

    def get(self, item_id: str, *, scope: str | None = None, user_id: str | None = None,
            agent_id: str | None = None, run_id: str | None = None) -> Item:
        """The item with this id; NotFoundError when the scope does not hold it."""
        ident = self._ident(scope, user_id, agent_id, run_id)
        if not isinstance(item_id, str) or not item_id:
            raise InvalidQueryError("item_id must be a non-empty string")
        item = self._store.get(ident.scope, item_id)
        if item is None or (ident.agent is not None and item.agent != ident.agent) or (
                ident.run is not None and item.session != ident.run):
            raise NotFoundError(f"no item {item_id!r} in this scope")
        return item

    def items(self, *, scope: str | None = None, user_id: str | None = None,
              agent_id: str | None = None, run_id: str | None = None, session: str | None = None,
              speaker: str | None = None, kind: str | None = None, role: str | None = None,
              since: TimeLike | None = None, until: TimeLike | None = None,
              meta: Mapping[str, Any] | None = None, offset: int = 0, limit: int | None = None,
              newest_first: bool = False) -> list[Item]:
        """Items of a scope in log order (or newest first), filtered and paged.

        An unknown scope lists nothing (it may simply hold no items yet).
        """
        ident = self._ident(scope, user_id, agent_id, run_id)
        flt = _filter(ident, session, speaker, kind, role, since, until, meta)
        offset = _check_count(offset, "offset", allow_none=False) or 0
        limit = _check_count(limit, "limit")
        return self._store.find(ident.scope, flt, offset=offset, limit=limit, newest_first=newest_first)

    def search(self, query: str, *, scope: str | None = None, user_id: str | None = None,
               agent_id: str | None = None, run_id: str | None = None, k: int | None = None,
               method: Method = "fused", retrieval: RetrievalConfig | None = None,
               session: str | None = None, speaker: str | None = None, kind: str | None = None,
               role: str | None = None, since: TimeLike | None = None, until: TimeLike | None = None,
               meta: Mapping[str, Any] | None = None) -> Evidence:
        """Run the shared retrieval prefix: the best ``k`` hits, each carrying its item."""
        query = _check_query(query)
        ident = self._ident(scope, user_id, agent_id, run_id)
        flt = _filter(ident, session, speaker, kind, role, since, until, meta)
        config = _config(retrieval, RetrievalConfig, "retrieval", self.retrieval)
        k = _check_count(k, "k")
        self._require(ident.scope)
        depth = config.k if k is None else k
        ranking = self._retriever.rank(ident.scope, query, config, method=method, depth=depth, flt=flt)
        # The ranking may run deeper (it holds every step the query names); k is what was asked.
        return self._retriever.evidence(ranking, depth)

    def render(self, query: str, budget_tokens: int, *, scope: str | None = None,
               user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None,
               mode: RenderMode | None = None, agent: bool = False, render: RenderConfig | None = None,
               retrieval: RetrievalConfig | None = None, session: str | None = None,
               speaker: str | None = None, kind: str | None = None, role: str | None = None,
               since: TimeLike | None = None, until: TimeLike | None = None,
               meta: Mapping[str, Any] | None = None) -> Context:
        """A fresh memory for ``query`` that fits ``budget_tokens`` (o200k), with reasons.

        Deterministic for the same store, query and budget; never over budget; no LLM call.
        ``agent=True`` keeps the newest items verbatim first (agent mode). An empty query
        renders the timeline alone.
        """
        query = _check_query(query, empty_ok=True)
        ident = self._ident(scope, user_id, agent_id, run_id)
        flt = _filter(ident, session, speaker, kind, role, since, until, meta)
        config = _config(render, RenderConfig, "render", self.render_config)
        if mode is not None:
            config = config.replace(mode=mode)
        self._require(ident.scope)
        return self._renderer.render(ident.scope, query, budget_tokens, config=config,
                                     retrieval=_config(retrieval, RetrievalConfig, "retrieval",
                                                       self.retrieval),
                                     flt=flt, agent=agent)

    def fit(self, messages: Sequence[Mapping[str, Any]], budget_tokens: int, *, scope: str | None = None,
            user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None,
            session: str | None = None, recent_share: float = 0.25, query: str | None = None,
            render: RenderConfig | None = None, memory_role: str = "system") -> FittedMessages:
        """The messages to send an agent's model next: ``messages`` (OpenAI format, the whole
        running list) fitted into ``budget_tokens``.

        Leading system messages and the newest messages (up to ``recent_share`` of the budget)
        stay verbatim; the dropped middle is replaced by one ``memory_role`` message holding the
        memory rendered for ``query`` (default: the newest user text) under the tokens left,
        from the items older than the recent window, led by the run's first user message (its
        task) when the window left that out. Every message is stored once (ids from agent,
        session and position: sending the grown list again stores only what is new), so a
        list that fits is returned as it is, and nothing dropped is lost; an empty assistant
        turn is sent on but not stored, and an empty tool result is stored as "(no output)".

        Messages are stored under ``agent_id`` and the session (``run_id``, else ``session``,
        else ``"agent"``). The memory draws on the scope's earlier items of that agent: with
        ``run_id`` on that run's only; with ``session`` on all of them, earlier runs included.
        Tool results must answer the calls just before them, as chat APIs require
        (``InvalidItemError`` otherwise, before anything is stored).
        """
        ident = self._ident(scope, user_id, agent_id, run_id)
        sess = _pick_session(ident, session) or SHARED_SESSION
        config = _config(render, RenderConfig, "render", RenderConfig.for_agent())
        # Written under the call's agent; drawn from that agent's items, and with run_id from
        # that run only (session= names where to write and reads the whole scope).
        flt = _filter(ident, None, None, None, None, None, None, None)
        return fit_messages(lambda msgs, _scope, sess_: self.add(
                                msgs, scope=scope, user_id=user_id, agent_id=agent_id, run_id=run_id,
                                session=sess_),
                            self._renderer, self.retrieval, ident.scope, messages, budget_tokens,
                            session=sess, recent_share=recent_share, query=query, render=config,
                            memory_role=memory_role, flt=flt, agent=ident.agent)

    def ask(self, question: str, *, scope: str | None = None, user_id: str | None = None,
            agent_id: str | None = None, run_id: str | None = None, llm: LLM | None = None,
            mode: Mode = "fast", router: SufficiencyRouter | None = None, tau: float | None = None,
            deep_llm: LLM | None = None,
            budget: int | None = None, timeout: float | None = None, engine: EngineConfig | None = None,
            retrieval: RetrievalConfig | None = None, render: RenderConfig | None = None,
            agent: MemoryAgent | Literal["tiered"] | None = None, lam: float | None = None,
            tier_cap: Tier | None = None, tiers: TierSource | None = None,
            session: str | None = None, speaker: str | None = None,
            kind: str | None = None, role: str | None = None, since: TimeLike | None = None,
            until: TimeLike | None = None, meta: Mapping[str, Any] | None = None) -> Answer:
        """Answer ``question`` from memory; the Answer carries a receipt of how it was made.

        ``mode``: ``fast`` answers from the prefix's context at once, ``deep`` reads blocks with
        memory agents, ``auto`` lets ``router`` decide with threshold ``tau`` (default router:
        retrieval signals, no model call). Without ``llm`` the memory's model is used (the
        local shipped model when none was given, loaded once). ``tau``, ``budget`` and
        ``timeout`` (seconds for the whole query, every model call included) override those
        fields of the engine config for this call.

        ``agent="tiered"`` makes the deep path run the tiered pipeline (filter, entity /
        temporal / topic, summary; ``docs/engine.md``) at the tiers ``tiers`` picks: by default
        the trained policy nearest cost weight ``lam`` when one is installed
        (``$SUFFICE_TIERS``; without ``lam``, its λ = 0 policy), else the heuristic default,
        which reads the question's words and never calls the model for a module; never above
        ``tier_cap``. ``lam`` with ``tiers``, or with no policy installed, is an error: it
        would pick nothing.
        """
        question = _check_query(question, "question")
        ident = self._ident(scope, user_id, agent_id, run_id)
        flt = _filter(ident, session, speaker, kind, role, since, until, meta)
        config = _config(engine, EngineConfig, "engine", self.engine_config)
        changes: dict[str, Any] = {}
        if tau is not None:
            changes["tau"] = tau
        if budget is not None:
            changes["reader_budget"] = budget
        if timeout is not None:  # whole seconds are seconds too
            is_int = isinstance(timeout, int) and not isinstance(timeout, bool)
            changes["timeout_s"] = float(timeout) if is_int else timeout
        if changes:
            config = config.replace(**changes)
        self._require(ident.scope)
        for name, given in (("llm", llm), ("deep_llm", deep_llm), ("router", router)):
            wrong = _wrong_part(name, given)
            if wrong:
                raise InvalidQueryError(wrong)
        if mode != "auto" and (tau is not None or router is not None):
            # Read only by auto mode's routing: silently ignored, it would look like it worked.
            raise InvalidQueryError(f"tau and router apply to mode='auto' only (this call asks "
                                    f"mode={mode!r})")
        if agent == "tiered":
            _check_tiered(mode, lam, tier_cap)  # before a model is loaded for nothing
        elif isinstance(agent, str):
            raise InvalidQueryError(f"unknown agent {agent!r}: give 'tiered' or a MemoryAgent")
        elif lam is not None or tier_cap is not None or tiers is not None:
            raise InvalidQueryError("lam, tier_cap and tiers apply to agent='tiered' only")
        source: TierSource | None = None
        if agent == "tiered":  # resolved before a model loads: a bad policy fails at once
            encoder = self.embedder.name if self.embedder else ""
            if tiers is not None and lam is not None:
                raise InvalidQueryError("lam picks one of the installed trained policies; with "
                                        "tiers= it would pick nothing: give one or the other")
            if tiers is not None and (isinstance(tiers, type) or not callable(getattr(tiers, "chooser", None))
                                      or not isinstance(getattr(tiers, "name", None), str)):
                raise InvalidQueryError(f"tiers must be a tier source (FixedTiers(...), HeuristicTiers(), "
                                        f"a TierPolicy), got {tiers!r:.60}")
            if isinstance(tiers, TierPolicy):  # default_tiers checks the one it installs
                tiers.check_fits(encoder, self.embedder.dim if self.embedder else None)
            source = tiers or default_tiers(lam, encoder, self.embedder.dim if self.embedder else None)
            if self.tier_models is not None:  # else the call's one model serves every tier
                check_models(self.tier_settings, self.tier_models)
        if router is None and mode == "auto":  # only auto routes: a broken default fails only it
            router = self.router
        model = llm or self.default_llm()
        tiered = None
        if agent == "tiered":
            assert source is not None  # resolved above
            pipeline = TieredPipeline(self.tier_models or model, self.embedder, self.tier_settings,
                                      self.tier_cache)
            tiered = TieredAgent(pipeline, source, tier_cap)
            agent = None
        eng = Engine(self._store, self._retriever, self._renderer, model,
                     router=router, agent=agent, deep_llm=deep_llm or self.deep_llm, tiered=tiered)
        return eng.ask(question, scope=ident.scope, mode=mode, config=config,
                       retrieval=_config(retrieval, RetrievalConfig, "retrieval", self.retrieval),
                       render=_config(render, RenderConfig, "render", self.render_config), flt=flt)

    @property
    def router(self) -> SufficiencyRouter | None:
        """The router ``mode="auto"`` uses when a call names none: the one given to the
        constructor; by default the trained router when one is installed and was trained on
        this memory's encoder (``suffice.data/router``, or the folder ``$SUFFICE_ROUTER``
        names), else None (the engine then uses the retrieval-signal router)."""
        if self._view_of is not None and self._router == "default":
            return self._view_of.router  # resolved once, on the memory the views share
        with self._llm_lock:
            if self._router == "default":
                from ._route.trained import default_router
                self._router = default_router(self.embedder.name if self.embedder else "")
            return self._router

    def default_llm(self) -> LLM:
        """The memory's model: the one given, else the local shipped model (``[local]`` extra),
        loaded on first use and then kept."""
        if self._view_of is not None and self._llm is None:
            return self._view_of.default_llm()  # views share the memory's one model
        with self._llm_lock:  # concurrent first asks load the model once
            if self._llm is None:
                from ._llm import make_llm
                self._llm = make_llm("local")
                self._own_llm = True
            return self._llm

    def _require(self, scope: str) -> None:
        if not self._store.has_scope(scope):
            # Other scopes are not named: they may belong to other tenants.
            raise UnknownScopeError(f"unknown scope {scope!r}: it holds no items")

    def scopes(self) -> list[str]:
        """Scopes that hold items (on a restricted view: the granted ones among them)."""
        names = self._store.scopes()
        return names if self._grant is None else [s for s in names if self._grant.allows(s)]

    def stats(self, scope: str | None = None, *, user_id: str | None = None,
              agent_id: str | None = None, run_id: str | None = None) -> StoreStats:
        """Counts of one scope (named, or by Mem0-style ids as elsewhere: ``agent_id`` or
        ``run_id`` beside ``user_id`` pick the user's scope, whole), or of the whole store (of
        the granted scopes on a view) when none is named."""
        if scope is not None or user_id is not None or agent_id is not None or run_id is not None:
            scope = self._ident(scope, user_id, agent_id, run_id).scope
            self._require(scope)
            return self._store.stats(scope)
        if self._grant is None or self._grant.everything:
            return self._store.stats(None)
        parts = [self._store.stats(s) for s in self.scopes()]
        whole = self._store.stats(None)
        return dataclasses.replace(whole, items=sum(p.items for p in parts), scopes=len(parts),
                                   sessions=sum(p.sessions for p in parts),
                                   embedded=sum(p.embedded for p in parts),
                                   tokens=sum(p.tokens for p in parts))

    def audit(self) -> list[AuditEntry]:
        """The audit lines of every forget, oldest first (digests and counts only); on a
        restricted view, the lines of granted scopes named exactly or still holding items."""
        lines = self._store.audit()
        if self._grant is None or self._grant.everything:
            return lines
        names = set(self.scopes()) | {p for p in self._grant.patterns if not p.endswith("*")}
        digests = {hashlib.sha256(n.encode("utf-8")).hexdigest() for n in names}
        return [a for a in lines if a.scope_sha256 in digests]

    def check(self) -> list[str]:
        """Problems found in the store and its views; an empty list when everything is sound.

        The store's own checks (integrity, full-text index, pieces, vectors, records), transfers
        that were killed before they finished (a partial scope), then per
        scope: every stored record covers exactly the items of its unit under this store config,
        records the fixed rule wrote read as the rule writes them now (an older version's lines
        stay until ``rebuild --records``), and every item has a vector of this memory's encoder
        once the scope has been read.
        """
        self._need_all("check")
        problems = self._store.check()
        try:
            self._check_views(problems)
        except StoreError as exc:  # a file too damaged to read: say so, do not raise from check
            problems.append(f"the views could not be checked: {exc}")
        return problems

    def _check_views(self, problems: list[str]) -> None:
        for scope, note in self._store.unfinished_transfers().items():
            if "rebuild" in note:
                what = ", ".join(note["rebuild"])
                problems.append(
                    f"scope {scope!r}: a rebuild of {what} began {note.get('rebuild_started', '')} and did "
                    "not finish, so its items are indexed two ways: run `suffice rebuild` again")
                if "items" not in note:  # no unfinished transfer under the rebuild's mark
                    continue
            held = self._store.max_seq(scope) + 1 if self._store.has_scope(scope) else 0
            problems.append(
                f"scope {scope!r}: a transfer from {note.get('source') or 'another store'} began "
                f"{note.get('started', '')} and did not finish ({held} of {note.get('items', '?')} items "
                "are here): run the same import or migrate again to complete it, or forget the scope")
        for scope in self._store.scopes():
            units = self._retriever.index(scope).views.units
            records = self._store.records(scope)
            for unit, first, last, _text, _writer in records:
                if unit >= len(units) or (units[unit].first_seq, units[unit].last_seq) != (first, last):
                    problems.append(f"scope {scope!r}: record of unit {unit} covers items {first}-{last}, "
                                    "not the unit's (rebuild the views: suffice rebuild)")
                    break
            else:
                old = self._records.stale(scope, records)
                if old:
                    problems.append(f"scope {scope!r}: {old} of {len(records)} records are lines an older "
                                    "version wrote (write them again: suffice rebuild --records)")
            if self.embedder is not None and self._store.missing_embeddings(scope, self.embedder.name):
                problems.append(f"scope {scope!r}: items without a vector after a read")

    def import_agent(self, source: str | Path | Sequence[Trajectory], fmt: str = "auto",
                     progress: Progress | None = None) -> dict[str, int]:
        """Import agent runs from a trajectory file or a folder of them (``fmt``: ama, swe,
        tau, tau2, or auto) or runs already loaded, one scope per run; the number of items
        added per scope.

        Every file is read and every run checked before anything is written, so a bad file or
        an item stored before with other content leaves the store as it was. Re-importing adds
        nothing: each step's items carry stable ids.
        """
        from ._datasets.trajectories import load_agent

        trajs = load_agent(source, fmt) if isinstance(source, (str, Path)) else source
        return self._add_scopes([(t.scope, t.items) for t in trajs], progress,
                                str(source) if isinstance(source, (str, Path)) else "")

    def import_locomo(self, source: str | Path | Sequence[LocomoConversation] | None = None,
                      progress: Progress | None = None) -> dict[str, int]:
        """Import LoCoMo, one scope per conversation; the number of items added per scope.

        Re-importing adds nothing (and reports 0): turns carry their dialogue ids as client ids.
        ``source`` is a file (default: the shared copy) or conversations already loaded.
        """
        from ._datasets.locomo import load_locomo

        self._need_all("import_locomo")
        # A file is parsed and validated whole before any write.
        convs = load_locomo(source) if source is None or isinstance(source, (str, Path)) else source
        return self._add_scopes([(c.scope, c.items) for c in convs], progress,
                                str(source) if isinstance(source, (str, Path)) else "")


_PARTS = {  # what each pluggable part must have (its methods last), and what gives one
    "embedder": (("name", "dim", "embed", "embed_query"), 2,
                 "an Embedder (MiniLMEmbedder(), load_encoder(DIR))"),
    "reranker": (("name", "score"), 1, "a Reranker (load_reranker(DIR))"),
    "llm": (("model", "chat"), 1, "a model (make_llm(...))"),
    "deep_llm": (("model", "chat"), 1, "a model (make_llm(...))"),
    "router": (("name", "score"), 1, "a router (TrainedRouter(DIR), ScoreRouter())"),
}


def _wrong_part(name: str, value: Any) -> str | None:
    """Why ``value`` cannot serve as the part ``name`` (a model's name where the model goes,
    say), or None: given to ``Memory(...)`` or to one call, it would fail later with an
    AttributeError."""
    if value is None:
        return None
    needs, methods, what = _PARTS[name]
    if all(hasattr(value, a) for a in needs) and all(callable(getattr(value, m)) for m in needs[-methods:]):
        return None
    return f"{name} must be {what}, got {type(value).__name__} {value!r:.40}"


def _check_parts(**parts: Any) -> None:
    """Refuse, before the store opens, a part of the wrong kind."""
    if parts["store_config"] is not None and not isinstance(parts["store_config"], StoreConfig):
        raise ConfigError(f"store_config must be a StoreConfig, got {type(parts['store_config']).__name__}")
    if parts["record_writer"] is not None and not callable(parts["record_writer"]):
        raise ConfigError("record_writer must be a function of the items that returns a record's text, "
                          f"got {type(parts['record_writer']).__name__}")
    for name in _PARTS:
        if isinstance(parts[name], str) and parts[name] == "default" and name in ("embedder", "router"):
            continue
        wrong = _wrong_part(name, parts[name])
        if wrong:
            raise ConfigError(wrong)


def _pick_session(ident: Identity, session: str | None) -> str | None:
    if ident.run is not None and session is not None and session != ident.run:
        raise InvalidQueryError("run_id is the session: give one of them, or the same value")
    return session if session is not None else ident.run


C = TypeVar("C", RetrievalConfig, RenderConfig, EngineConfig)


def _config(value: C | None, kind: type[C], name: str, default: C | None = None) -> C:
    """A per-call config, whole, or the default; anything else is refused by name."""
    if value is None:
        return default if default is not None else kind()
    if not isinstance(value, kind):
        raise ConfigError(f"{name} must be a {kind.__name__}, got {type(value).__name__}")
    return value


class AsyncMemory:
    """:class:`Memory` for asyncio code: the same methods and results, awaited.

    Each call runs on a worker thread this object owns (SQLite and the models block), so the
    event loop stays free; ``aclose()`` (or ``async with``) stops the threads and the store.
    ``ask`` has threads of its own (``ask_workers``): a model answer takes seconds to minutes,
    and asks filling every thread would hold up adds, reads and forgets behind them (a
    server's other callers among them).
    """

    def __init__(self, path: str | os.PathLike[str] | Memory | None = None, *, workers: int = 4,
                 ask_workers: int = 2, **kwargs: Any) -> None:
        for name, n in (("workers", workers), ("ask_workers", ask_workers)):
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise ConfigError(f"{name} must be a positive whole number, got {n!r}")
        if isinstance(path, Memory):
            if kwargs:
                raise ConfigError("AsyncMemory(memory) takes no other settings: the memory has them")
            self._memory = path
        else:
            self._memory = Memory(path, **kwargs)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="suffice-async")
        self._ask_pool = ThreadPoolExecutor(max_workers=ask_workers, thread_name_prefix="suffice-ask")
        self._owns = True
        """False on a view made by :meth:`restrict`: the pool and memory are the parent's."""

    def restrict(self, scopes: Iterable[str]) -> AsyncMemory:
        """The async face of :meth:`Memory.restrict`: same threads, fewer scopes."""
        view = copy.copy(self)
        view._memory = self._memory.restrict(scopes)
        view._owns = False
        return view

    @property
    def memory(self) -> Memory:
        """The synchronous memory underneath."""
        return self._memory

    @property
    def path(self) -> str:
        return self._memory.path

    async def _run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        return await self._run_on(self._pool, functools.partial(fn, *args, **kwargs))

    async def _run_on(self, pool: ThreadPoolExecutor, call: Callable[[], R]) -> R:
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(pool, call)
        except RuntimeError:  # the pool is shut down: say it as a closed Memory would
            raise StoreError(f"this AsyncMemory ({self.path}) is closed") from None
        return await future

    async def add(self, items: ItemLike | Sequence[ItemLike], **kwargs: Any) -> list[Item]:
        return await self._run(self._memory.add, items, **kwargs)

    async def get(self, item_id: str, **kwargs: Any) -> Item:
        return await self._run(self._memory.get, item_id, **kwargs)

    async def items(self, **kwargs: Any) -> list[Item]:
        return await self._run(self._memory.items, **kwargs)

    async def search(self, query: str, **kwargs: Any) -> Evidence:
        return await self._run(self._memory.search, query, **kwargs)

    async def render(self, query: str, budget_tokens: int, **kwargs: Any) -> Context:
        return await self._run(self._memory.render, query, budget_tokens, **kwargs)

    async def fit(self, messages: Sequence[Mapping[str, Any]], budget_tokens: int,
                  **kwargs: Any) -> FittedMessages:
        return await self._run(self._memory.fit, messages, budget_tokens, **kwargs)

    async def ask(self, question: str, **kwargs: Any) -> Answer:
        return await self._run_on(self._ask_pool, functools.partial(self._memory.ask, question, **kwargs))

    async def forget(self, scope: str | None = None, ids: Iterable[str] | None = None,
                     session: str | None = None, **kwargs: Any) -> ForgetReport:
        return await self._run(self._memory.forget, scope, ids, session, **kwargs)

    async def rebuild(self, store_config: StoreConfig | None = None, *,
                      records: bool = False) -> dict[str, int]:
        return await self._run(self._memory.rebuild, store_config, records=records)

    async def scopes(self) -> list[str]:
        return await self._run(self._memory.scopes)

    async def stats(self, scope: str | None = None, **kwargs: Any) -> StoreStats:
        return await self._run(self._memory.stats, scope, **kwargs)

    async def audit(self) -> list[AuditEntry]:
        return await self._run(self._memory.audit)

    async def aclose(self) -> None:
        """Wait for running calls, then stop the worker threads and close the memory."""
        if not self._owns:
            return
        for pool in (self._ask_pool, self._pool):  # the loop keeps running meanwhile
            await asyncio.to_thread(pool.shutdown, wait=True)
        self._memory.close()

    async def __aenter__(self) -> AsyncMemory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
