"""The store interface every backend implements, and the checks shared by all of them.

A store keeps, per scope (a hard partition), an append-only log of items and the views derived
from them: pieces with a full-text index, item vectors, unit records and links. It knows
nothing of tokenizers or models: callers hand it rows already counted, cut and embedded.
``tests/store_contract.py`` is the specification: every backend must pass it.
"""

from __future__ import annotations

import hashlib
import json
import math
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .._errors import InvalidInputError, InvalidItemError, InvalidQueryError
from .._text import is_utf8
from .._types import AuditEntry, Filter, ForgetReport, Item, NewItem, StoreStats


@dataclass(frozen=True, slots=True)
class ItemRow:
    """An item ready to be written: text counted, cut into pieces, embedded, time parsed.

    Keeping that work out of the store keeps the storage layer free of tokenizers and models.
    ``observed_at`` is the caller's text (a datetime already turned into ISO text).
    """

    item: NewItem
    observed_at: str
    observed_ts: float | None
    tokens: int
    pieces: Sequence[tuple[int, int]]
    piece_bodies: Sequence[str]
    embedding: np.ndarray | None = None


Layout = list[tuple[int, str, int]]
"""(seq, session, tokens) of items, in seq order: all the views need."""


@runtime_checkable
class Store(Protocol):
    """An item log per scope with pieces, full-text index, vectors, records and links."""

    path: str
    """Where the store lives (a file path or a database URL without its password)."""
    config_poll_s: float
    """How often an open memory reads the saved config to take up another process's rebuild:
    0 on every call (a local read costs microseconds), more where a read is a round trip."""

    def close(self) -> None: ...

    # -- configuration and bookkeeping --------------------------------------------------------
    @property
    def schema_version(self) -> int: ...
    def load_config(self) -> dict[str, Any] | None:
        """The saved store config, or None for a store that has none yet."""
    def save_config(self, config: Mapping[str, Any], *, replace: bool = True) -> None:
        """Save the store config; with ``replace=False`` only when none is saved yet."""
    def generation(self) -> int:
        """A counter raised by every forget and rebuild: caches built at another value are stale."""
    def changes(self, scope: str) -> int:
        """How many times ``scope``'s items were renumbered or their views re-derived (a
        forget, a rebuild of its pieces or records): a read of the scope is still right while
        this has not moved, whatever other scopes' forgets did to :meth:`generation`."""
    def note_transfer(self, scope: str, note: Mapping[str, Any] | None) -> None:
        """Mark ``scope`` as being written by an import or migration (``note``: where from, how
        many items), or clear the mark (None). A mark left behind is a transfer that was killed."""
    def unfinished_transfers(self) -> dict[str, dict[str, Any]]:
        """The marks :meth:`note_transfer` left, by scope: transfers that never finished. A
        forget of the whole scope clears its mark."""

    # -- writes ---------------------------------------------------------------------------------
    def append(self, scope: str, rows: Sequence[ItemRow], *, encoder: str = "",
               created: list[bool] | None = None) -> list[Item]:
        """Write ``rows`` in one transaction; idempotent for client ids stored unchanged.
        ``created`` (when given) gets, per returned item, whether this call wrote it."""
    def check_ids(self, scope: str, items: Sequence[NewItem]) -> list[Item | None]:
        """Per item: the stored item when its client id is stored with the same content, else
        None; raises ConflictError (nothing written) when one is stored with other content."""
    def put_embeddings(self, scope: str, encoder: str, seqs: Sequence[int], vecs: np.ndarray, *,
                       generation: int | None = None) -> bool:
        """Store vectors by seq (those already stored are kept). With ``generation``: only while
        the store is still at it, since a forget in between renumbers the seqs they were made
        for; False when it had moved and nothing was written."""
    def put_record(self, scope: str, unit: int, first_seq: int, last_seq: int, text: str,
                   writer: str, links: Sequence[tuple[int, str, float]] = (), *,
                   generation: int | None = None) -> bool:
        """Write a unit's record and links once; False when the record already existed, or when
        ``generation`` is given and the store is no longer at it (a forget or rebuild ran since
        the record's items were read, so the record may quote forgotten text)."""
    def forget(self, scope: str, *, ids: Sequence[str] | None = None,
               session: str | None = None) -> ForgetReport:
        """Delete items (all of the scope, a session's, or by id) and every trace derived
        from them; later items move up to close the gap; one audit line is written."""
    def rebuild_pieces(self, scope: str, rows: Sequence[tuple[int, Sequence[tuple[int, int]],
                                                             Sequence[str]]]) -> None:
        """Replace the pieces of the given items (seq, spans, bodies); the items stay as they are."""
    def drop_records(self, scope: str) -> None:
        """Delete every record and link of ``scope`` (they are rebuilt from the items)."""
    def drop_embeddings(self) -> None:
        """Delete every vector of the store (before re-embedding with another encoder)."""
    def put_audit(self, entries: Sequence[AuditEntry]) -> None:
        """Append audit lines as given: a restored backup keeps the record of what was forgotten."""

    # -- reads ----------------------------------------------------------------------------------
    def scopes(self) -> list[str]: ...
    def has_scope(self, scope: str) -> bool: ...
    def max_seq(self, scope: str) -> int: ...
    def items(self, scope: str, seqs: Sequence[int] | None = None, *, start: int = 0,
              end: int | None = None) -> list[Item]: ...
    def get(self, scope: str, item_id: str) -> Item | None: ...
    def find(self, scope: str, flt: Filter | None = None, *, offset: int = 0, limit: int | None = None,
             newest_first: bool = False) -> list[Item]:
        """Items matching ``flt`` in seq order (or newest first), paged."""
    def filter_seqs(self, scope: str, flt: Filter) -> np.ndarray:
        """Sorted seqs of the items matching ``flt``."""
    def layout(self, scope: str, after_seq: int = -1) -> Layout: ...
    def pieces(self, scope: str, seqs: Sequence[int]) -> dict[int, list[tuple[int, int, int]]]: ...
    def piece_bodies(self, scope: str, seqs: Sequence[int]) -> dict[int, list[str]]:
        """The pieces' bodies exactly as indexed, in piece order (they may differ from the
        item's text: a header of speaker and date may be indexed with it)."""
    def bm25(self, scope: str, terms: Sequence[str], limit: int, flt: Filter | None = None
             ) -> list[tuple[int, int, float]]:
        """(seq, piece, score) of the best pieces, best first; larger scores are better."""
    def embeddings(self, scope: str, encoder: str, after_seq: int = -1, *,
                   before_seq: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(seqs, matrix) of the vectors of items ``after_seq < seq < before_seq``, in seq order."""
    def encoders(self, scope: str) -> list[str]:
        """Sorted names of the encoders whose vectors ``scope`` holds (an export keeps them all)."""
    def missing_embeddings(self, scope: str, encoder: str) -> list[int]: ...
    def records(self, scope: str, after_unit: int = -1) -> list[tuple[int, int, int, str, str]]: ...
    def links(self, scope: str, after_src: int = -1) -> list[tuple[int, int, str, float]]: ...
    def stats(self, scope: str | None = None) -> StoreStats: ...
    def audit(self) -> list[AuditEntry]: ...
    def check(self) -> list[str]:
        """Problems found in the store (integrity, indexes, derived tables); empty when sound."""


def changes_key(scope: str) -> str:
    """The meta key of ``scope``'s :meth:`Store.changes` count: named by the scope's digest, as
    the audit names it, so a forgotten scope leaves no name behind (the count must outlive the
    scope: a read in flight when a whole scope went compares against it)."""
    return "changes:" + hashlib.sha256(scope.encode("utf-8")).hexdigest()

TRANSFER_MARK = "transfer:"
"""Prefix of the meta keys that mark a scope a transfer is writing (the scope name follows)."""

MAX_SCOPE_CHARS = 200
_NOT_IN_NAMES = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")
"""Unicode categories refused in names: controls, format (bidi marks), surrogates, private
use, unassigned, line and paragraph separators."""


def normalize_scope(name: object, what: str = "scope") -> str:
    """The one form of a scope name (or an id that names one): Unicode NFC, surrounding
    whitespace removed, at most 200 characters, no control, format (bidi) or separator
    characters but the plain space. Case is kept: ``Ana`` and ``ana`` are two scopes, as most user ids are."""
    if not isinstance(name, str):
        raise InvalidInputError(f"{what} must be a string, got {type(name).__name__}")
    norm = unicodedata.normalize("NFC", name).strip()
    if not norm:
        raise InvalidInputError(f"{what} must not be empty")
    if len(norm) > MAX_SCOPE_CHARS:
        raise InvalidInputError(f"{what} is {len(norm)} characters long; at most {MAX_SCOPE_CHARS}")
    bad = next((c for c in norm if unicodedata.category(c) in _NOT_IN_NAMES), None)
    if bad is not None:
        raise InvalidInputError(f"{what} {norm!r} contains the control or format character U+{ord(bad):04X}")
    space = next((c for c in norm if c != " " and unicodedata.category(c) == "Zs"), None)
    if space is not None:  # "a\xa0b" would look like "a b" yet name another scope
        raise InvalidInputError(f"{what} {norm!r} contains the space character U+{ord(space):04X}; "
                                "only the plain space (U+0020) may separate words in a name")
    return norm


def validate_scope(scope: object) -> str:
    """``scope`` when it is in its normal form (see :func:`normalize_scope`), else an error
    naming that form: a store never holds two spellings of one scope."""
    norm = normalize_scope(scope)
    if norm != scope:
        raise InvalidInputError(f"scope {scope!r} is not in normal form; use {norm!r}")
    return norm


def validate_item(item: NewItem, index: int) -> None:
    """Raise InvalidItemError naming the item when it cannot be stored."""
    where = f"item {index}" + (f" (id {item.id!r})" if isinstance(item.id, str) and item.id else "")
    if not isinstance(item.text, str):
        raise InvalidItemError(f"{where}: text must be a string, got {type(item.text).__name__}")
    if not item.text.strip():
        raise InvalidItemError(f"{where}: text is empty")
    for name in ("text", "id", "session", "speaker", "role", "kind", "agent", "observed_at"):
        # One rule for every backend: PostgreSQL's text cannot hold NUL, so no store takes it.
        value = getattr(item, name)
        if isinstance(value, str) and "\x00" in value:
            raise InvalidItemError(f"{where}: {name} contains a NUL character")
    if item.id is not None and (not isinstance(item.id, str) or not item.id.strip()):
        raise InvalidItemError(f"{where}: id must be a non-empty string when given")
    for name in ("session", "speaker", "role", "kind", "agent"):
        if not isinstance(getattr(item, name), str):
            raise InvalidItemError(f"{where}: {name} must be a string")
    if not isinstance(item.observed_at, str) and not hasattr(item.observed_at, "isoformat"):
        raise InvalidItemError(f"{where}: observed_at must be text or a datetime")
    for name in ("text", "session", "speaker", "role", "kind", "observed_at", "id", "agent"):
        value = getattr(item, name)
        if isinstance(value, str) and not is_utf8(value):
            raise InvalidItemError(f"{where}: {name} is not valid unicode (lone surrogate)")
    if not isinstance(item.meta, Mapping):
        raise InvalidItemError(f"{where}: meta must be a mapping, got {type(item.meta).__name__}")
    shape = meta_shape(item.meta, META_MAX_DEPTH)
    if shape is not None:
        raise InvalidItemError(f"{where}: meta {shape}")
    try:
        # As the stores write it (sorted keys): keys of mixed kinds cannot be sorted.
        json.dumps(item.meta, allow_nan=False, ensure_ascii=False, sort_keys=True).encode("utf-8")
    except UnicodeEncodeError:  # the stores write meta as UTF-8: a lone surrogate cannot go
        raise InvalidItemError(f"{where}: meta is not valid unicode (lone surrogate)") from None
    except (TypeError, ValueError) as exc:
        raise InvalidItemError(f"{where}: meta is not JSON-serialisable ({exc})") from None
    if has_nul(item.meta):
        raise InvalidItemError(f"{where}: meta contains a NUL character")


META_MAX_DEPTH = 32
"""How deep ``meta`` may nest: far beyond any real use, and far below the depth where JSON
writers and readers (Python's, FastAPI's) give out, so every item that is stored can be read
back on every surface."""


def meta_shape(value: object, limit: int) -> str | None:
    """What is wrong with the shape of ``value``, else None: mappings and lists nested more
    than ``limit`` levels deep (said first), or a key that is not text anywhere (JSON would
    store ``{1: "a"}`` as ``{"1": "a"}``, so what came back would not be what was given).
    Walked with a stack, so a value nested thousands deep is answered, not a RecursionError."""
    stack: list[tuple[object, int]] = [(value, 1)]
    bad_key = False
    while stack:
        v, depth = stack.pop()
        if isinstance(v, Mapping):
            bad_key = bad_key or not all(isinstance(k, str) for k in v)
            children: Any = v.values()
        elif isinstance(v, (list, tuple)):
            children = v
        else:
            continue
        if depth > limit:
            return f"is nested more than {limit} levels deep"
        stack.extend((c, depth + 1) for c in children)
    return "keys must be text, at every depth" if bad_key else None


def has_nul(value: object) -> bool:
    """True when a NUL character is in ``value``'s strings or keys, at any depth (the text
    ``\\u0000``, a backslash and five characters, is no NUL)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(has_nul(v) for v in value)
    return False


def validate_filter(flt: Filter) -> None:
    """Raise InvalidQueryError for a filter no store could apply."""
    for name in ("session", "speaker", "kind", "role", "agent"):
        value = getattr(flt, name)
        if value is not None and not isinstance(value, str):
            raise InvalidQueryError(f"filter {name} must be a string, got {type(value).__name__}")
        if isinstance(value, str) and "\x00" in value:
            raise InvalidQueryError(f"filter {name} contains a NUL character: no item holds one")
        if isinstance(value, str) and not is_utf8(value):
            raise InvalidQueryError(f"filter {name} is not valid unicode (lone surrogate)")
    for name in ("since", "until"):
        value = getattr(flt, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise InvalidQueryError(f"filter {name} must be finite POSIX seconds, got {value!r}")
    if flt.since is not None and flt.until is not None and flt.since >= flt.until:
        raise InvalidQueryError("filter since must be earlier than until (the range would be empty)")
    if flt.meta is not None:
        if not isinstance(flt.meta, Mapping) or not all(isinstance(k, str) for k in flt.meta):
            raise InvalidQueryError("filter meta must map string keys to values")
        try:
            json.dumps(dict(flt.meta), allow_nan=False, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidQueryError("filter meta is not valid unicode (lone surrogate)") from None
        except (TypeError, ValueError) as exc:
            raise InvalidQueryError(f"filter meta values must be JSON values ({exc})") from None
        for key, value in flt.meta.items():
            if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
                raise InvalidQueryError(f"filter meta {key!r}: {value} is beyond a 64-bit integer")
    before = flt.before_seq
    if before is not None and (isinstance(before, bool) or not isinstance(before, int)):
        raise InvalidQueryError("filter before_seq must be an integer")


def content_key(item: Item | NewItem, observed_at: str | None = None) -> tuple[str, ...]:
    """Everything a client supplies about an item, for the idempotency check."""
    when = observed_at if observed_at is not None else str(item.observed_at)
    return (item.text, item.session, item.speaker, item.role, item.kind, when, item.agent,
            json.dumps(item.meta, ensure_ascii=False, sort_keys=True))
