"""Backup, restore and migration of a store: one line-per-record format, checked end to end.

A store's content is its item log plus what cannot always be derived again cheaply: the pieces
exactly as indexed, the vectors (a model may be needed to recompute them), the unit records (an
LLM may have written them) and links, the saved config and the audit lines of past forgets.
:func:`export_jsonl` writes all of it as JSON lines, :func:`import_jsonl` reads it back into a
store of any backend, and :func:`migrate` copies between two stores directly. Each ends with a
:class:`TransferReport`: counts and a content digest per scope, computed the same way on both
sides (the sha256 of the scope's item and record lines in canonical form), so a loss shows as a
mismatch and not as a silent gap.

The format (``suffice-jsonl`` version 1), one JSON object per line (``t`` first, then the other
keys sorted), UTF-8::

    {"t": "header", "format": "suffice-jsonl", "version": 1, "schema_version": 4, "config": {...}}
    {"t": "scope", "scope": "alice"}
    {"t": "item", "seq": 0, "id": ..., "text": ..., "pieces": [[start, end, body], ...],
     "vectors": {"encoder": "<base64 float32 little-endian>"}, ...every other item field...}
    {"t": "record", "unit": 0, "first_seq": 0, "last_seq": 3, "text": ..., "writer": ...,
     "links": [[dst, kind, weight], ...]}
    {"t": "scope_end", "scope": "alice", "items": n, "pieces": ..., "vectors": ..., "records": ...,
     "links": ..., "sha256": "<content digest>"}
    {"t": "audit", "at": ..., "action": ..., "scope_sha256": ..., "ids_sha256": [...], "counts": {...}}
    {"t": "end", "lines": N, "scopes": k, "items": n, "audit": a, "sha256": "<digest of the N lines before>"}

The same store always gives the same bytes (no timestamps, no paths, no generation counter), so
export, import into an empty store and export again is byte-identical. An import reads the
whole file once to check it (every field, the order, the digests, the end line: a truncated or
edited file is refused naming the line) before it writes anything, and it refuses to write into
a scope the destination already holds, so it never merges two logs into one. The one exception
is a scope holding the start of the file's own log (what an interrupted import of the same file
leaves): a re-run checks that start and completes it. Until a transfer has written everything,
each scope it writes carries a mark in the store (:meth:`Store.note_transfer`), so a killed
one is not left as a scope that looks whole: ``suffice check`` names it until a re-run
completes it or the scope is forgotten.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path
from typing import IO, Any

import numpy as np

from .._errors import (
    ConflictError,
    ImportFormatError,
    InvalidInputError,
    InvalidItemError,
    StoreConfigError,
    StoreError,
    UnknownScopeError,
)
from .._files import atomic_file
from .._text import is_utf8
from .._types import AuditEntry, Item, NewItem
from .base import ItemRow, Store, validate_item, validate_scope

FORMAT = "suffice-jsonl"
VERSION = 1
"""The format version this code writes and reads; a newer file is refused, not guessed at."""

BATCH = 1000
"""Items read or written per call: bounds memory (and one store transaction) on large stores."""

Progress = Callable[[str, int, int], None]
"""``(stage, done, total)``, called as work advances."""

_FLOAT32 = np.dtype("<f4")


def scope_digest_name(scope: str) -> str:
    """The scope's sha256 as audit lines name it (audit lines never hold a scope's name)."""
    return hashlib.sha256(scope.encode("utf-8")).hexdigest()


# -- what a scope holds ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _ItemDump:
    item: Item
    pieces: tuple[tuple[int, int, str], ...]
    vectors: Mapping[str, bytes]
    """Encoder name -> float32 little-endian bytes."""

    def obj(self) -> dict[str, Any]:
        it = self.item
        return {"t": "item", "seq": it.seq, "id": it.id, "session": it.session, "speaker": it.speaker,
                "role": it.role, "kind": it.kind, "observed_at": it.observed_at,
                "observed_ts": it.observed_ts, "text": it.text, "meta": it.meta, "agent": it.agent,
                "tokens": it.tokens, "pieces": [list(p) for p in self.pieces],
                "vectors": {k: base64.b64encode(v).decode("ascii") for k, v in self.vectors.items()}}


@dataclass(frozen=True, slots=True)
class _RecordDump:
    unit: int
    first_seq: int
    last_seq: int
    text: str
    writer: str
    links: tuple[tuple[int, str, float], ...]

    def obj(self) -> dict[str, Any]:
        return {"t": "record", "unit": self.unit, "first_seq": self.first_seq, "last_seq": self.last_seq,
                "text": self.text, "writer": self.writer, "links": [list(x) for x in self.links]}


_Dump = _ItemDump | _RecordDump


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _line(obj: Mapping[str, Any]) -> bytes:
    """One line of the format: canonical JSON (the type ``t`` first, then sorted keys, no
    spaces, UTF-8 as is), so equal content always gives equal bytes."""
    rest = {k: v for k, v in obj.items() if k != "t"}
    body = _json(rest)[1:] if rest else "}"
    return ('{"t":' + _json(obj["t"]) + ("," if rest else "") + body).encode("utf-8") + b"\n"


def _item_key(dump: _ItemDump) -> bytes:
    """An item and its pieces as one canonical line, without vectors (an interrupted transfer
    may have written an item, which comes with its pieces, but not yet its vectors)."""
    obj = dump.obj()
    del obj["vectors"]
    return _line(obj)


def _head(store: Store, scope: str, n: int, batch: int = BATCH) -> str:
    """The sha256 of the first ``n`` items of ``scope`` with their pieces: equal to the
    source's when the store holds the start of the same log. (Read as an export reads them;
    items come before records, so the first ``n`` dumps are those items.)"""
    digest = hashlib.sha256()
    for dump in islice(_read_scope(store, scope, batch), n):
        assert isinstance(dump, _ItemDump)
        digest.update(_item_key(dump))
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class ScopeSummary:
    """What one scope holds: counts, and the sha256 of its item and record lines."""

    scope: str
    items: int = 0
    pieces: int = 0
    vectors: int = 0
    records: int = 0
    links: int = 0
    sha256: str = ""

    def counts(self) -> dict[str, int]:
        return {"items": self.items, "pieces": self.pieces, "vectors": self.vectors,
                "records": self.records, "links": self.links}


class _Tally:
    """Counts and digest of one scope, fed the dumps in order; one definition for every side."""

    def __init__(self, scope: str) -> None:
        self.scope = scope
        self._hash = hashlib.sha256()
        self._n = {"items": 0, "pieces": 0, "vectors": 0, "records": 0, "links": 0}

    def add(self, dump: _Dump) -> bytes:
        line = _line(dump.obj())
        self._hash.update(line)
        if isinstance(dump, _ItemDump):
            self._n["items"] += 1
            self._n["pieces"] += len(dump.pieces)
            self._n["vectors"] += len(dump.vectors)
        else:
            self._n["records"] += 1
            self._n["links"] += len(dump.links)
        return line

    def summary(self) -> ScopeSummary:
        return ScopeSummary(self.scope, **self._n, sha256=self._hash.hexdigest())


def _read_scope(store: Store, scope: str, batch: int = BATCH) -> Iterator[_Dump]:
    """Everything ``scope`` holds, items in seq order then records in unit order, read in
    batches. The items present when it starts are read; records of later items are left out."""
    n = store.max_seq(scope) + 1
    encoders = store.encoders(scope)
    for start in range(0, n, batch):
        end = min(n, start + batch)
        items = store.items(scope, start=start, end=end)
        if [it.seq for it in items] != list(range(start, end)):
            raise StoreError(f"scope {scope!r} changed while it was read (seqs {start}..{end - 1} "
                             "are not all there); run again, or run suffice check")
        seqs = [it.seq for it in items]
        spans = store.pieces(scope, seqs)
        bodies = store.piece_bodies(scope, seqs)
        vectors: dict[int, dict[str, bytes]] = {}
        for enc in encoders:
            got, mat = store.embeddings(scope, enc, start - 1, before_seq=end)
            mat = np.ascontiguousarray(mat, dtype=_FLOAT32)
            for seq, row in zip(got.tolist(), mat, strict=True):
                vectors.setdefault(int(seq), {})[enc] = row.tobytes()
        for it in items:
            sp, bd = spans.get(it.seq, []), bodies.get(it.seq, [])
            if len(sp) != len(bd) or [p[0] for p in sp] != list(range(len(sp))):
                raise StoreError(f"scope {scope!r}, item {it.seq}: its pieces and their indexed bodies "
                                 "do not match; run suffice check")
            yield _ItemDump(it, tuple((s, e, b) for (_, s, e), b in zip(sp, bd, strict=True)),
                            vectors.get(it.seq, {}))
    records, orphans = _record_dumps(store, scope)
    yield from (r for r in records if r.last_seq < n)
    if orphans:
        raise StoreError(f"scope {scope!r} holds links of units that have no record "
                         f"({orphans[:5]}); run suffice check")


def _record_dumps(store: Store, scope: str) -> tuple[list[_RecordDump], list[int]]:
    """Every record of ``scope`` with its links, in unit order; and the units (sorted) whose
    links have no record."""
    links: dict[int, list[tuple[int, str, float]]] = {}
    for src, dst, kind, weight in store.links(scope):
        links.setdefault(src, []).append((dst, kind, weight))
    records = [_RecordDump(unit, first, last, text, writer, tuple(sorted(links.pop(unit, []))))
               for unit, first, last, text, writer in store.records(scope)]
    return records, sorted(links)


def summarize(store: Store, scope: str, batch: int = BATCH) -> ScopeSummary:
    """Counts and content digest of one scope, read from the store."""
    tally = _Tally(scope)
    for dump in _read_scope(store, scope, batch):
        tally.add(dump)
    return tally.summary()


# -- the report ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TransferReport:
    """What was expected against what was found, per scope; ``ok`` when nothing was lost.

    ``expected`` comes from the source (the store read, or the file's own summaries), ``found``
    from reading the destination back the same way.
    """

    source: str
    destination: str
    expected: tuple[ScopeSummary, ...]
    found: tuple[ScopeSummary, ...]
    audit_expected: int = 0
    audit_found: int = 0
    config_equal: bool = True
    issues: tuple[str, ...] = ()
    """Problems beyond the counts (the source changed while read, a file not read back)."""
    checked: bool = True
    """False when the destination could not be read back (an export to a stream)."""

    def problems(self) -> list[str]:
        found = {s.scope: s for s in self.found}
        out = list(self.issues)
        for want in self.expected:
            have = found.get(want.scope)
            if have is None:
                out.append(f"scope {want.scope!r} is missing from {self.destination}")
                continue
            for key, n in want.counts().items():
                if have.counts()[key] != n:
                    out.append(f"scope {want.scope!r}: {key} {n} in the source, {have.counts()[key]} "
                               "in the destination")
            if have.sha256 != want.sha256:
                out.append(f"scope {want.scope!r}: content digest differs")
        if self.audit_found != self.audit_expected:
            out.append(f"audit lines: {self.audit_expected} in the source, {self.audit_found} of them "
                       "in the destination")
        if not self.config_equal:
            out.append("the destination's store config differs from the source's")
        return out

    @property
    def ok(self) -> bool:
        return not self.problems()

    def lines(self) -> list[str]:
        """The report as a few lines of text (what the CLI prints)."""
        found = {s.scope: s for s in self.found}
        out = [f"{self.source} -> {self.destination}",
               f"{'scope':<24} {'items':>8} {'pieces':>8} {'vectors':>8} {'records':>8} {'links':>8}"
               "  sha256"]
        for s in self.expected:
            same = found.get(s.scope) == s
            mark = "same" if same and self.checked else ("not read back" if not self.checked else "DIFFERS")
            out.append(f"{s.scope[:24]:<24} {s.items:>8} {s.pieces:>8} {s.vectors:>8} {s.records:>8} "
                       f"{s.links:>8}  {s.sha256[:16]}  {mark}")
        total = sum(s.items for s in self.expected)
        out.append(f"{len(self.expected)} scope(s), {total} item(s), {self.audit_expected} audit line(s)")
        problems = self.problems()
        out += [f"problem: {p}" for p in problems]
        out.append("verified: counts and content digests are equal" if not problems and self.checked
                   else "written; not read back" if not problems else "VERIFICATION FAILED")
        return out


# -- reading the file ------------------------------------------------------------------------------


@dataclass
class _Scan:
    """What a check of the whole file found."""

    header: dict[str, Any] = field(default_factory=dict)
    summaries: list[ScopeSummary] = field(default_factory=list)
    audit: list[AuditEntry] = field(default_factory=list)
    items: int = 0
    held: dict[str, int] = field(default_factory=dict)
    """Items the destination already holds, per scope of the file it holds."""
    heads: dict[str, str] = field(default_factory=dict)
    """Per scope in ``held``: the sha256 (:func:`_head`) of the file's first that many items."""


def _entry_obj(e: AuditEntry) -> dict[str, Any]:
    return {"t": "audit", "at": e.at, "action": e.action, "scope_sha256": e.scope_sha256,
            "ids_sha256": list(e.ids_sha256), "counts": dict(e.counts)}


class _Reader:
    """Parses the file line by line into dumps, checking everything an import relies on."""

    def __init__(self, f: IO[bytes], name: str, progress: Progress | None = None,
                 size: int = 0) -> None:
        self.f, self.name, self.progress, self.size = f, name, progress, size
        self.n = 0

    def fail(self, what: str) -> ImportFormatError:
        return ImportFormatError(f"{self.name}: line {self.n}: {what}")

    def events(self) -> Iterator[tuple[str, Any]]:
        """(kind, value) per line: ("header", dict), ("scope", name), ("dump", _Dump),
        ("scope_end", ScopeSummary), ("audit", AuditEntry). The end line (and so the file's
        digest) is checked last: whoever writes must first have read the whole file once."""
        digest = hashlib.sha256()
        done = 0
        state = "start"
        scope = ""
        tally: _Tally | None = None
        n_items = 0
        last_unit = -1
        ids: set[str] = set()
        dims: dict[str, int] = {}
        seen: set[str] = set()
        counts = {"scopes": 0, "items": 0, "audit": 0}
        for raw in self.f:
            self.n += 1
            done += len(raw)
            if self.progress is not None and self.n % 1000 == 0:
                self.progress("checking", done, self.size)
            if state == "end":
                raise self.fail("content after the end line")
            obj = self._parse(raw)
            kind = obj.get("t")
            if state == "start":
                if kind != "header" or obj.get("format") != FORMAT:
                    raise self.fail(f"not a {FORMAT} file (the first line must be its header)")
                version = obj.get("version")
                if not isinstance(version, int) or isinstance(version, bool):
                    raise self.fail("the header has no format version")
                if version > VERSION:
                    raise self.fail(f"format version {version} is newer than this suffice reads "
                                    f"({VERSION}); upgrade suffice")
                if version != VERSION:
                    raise self.fail(f"unknown format version {version}")
                self._keys(obj, {"t", "format", "version", "schema_version", "config"})
                config = obj.get("config")
                if config is not None and not isinstance(config, dict):
                    raise self.fail("the header's config must be an object or null")
                state = "top"
                yield "header", obj
            elif kind == "scope" and state == "top":
                scope = self._scope(obj.get("scope"))
                if scope in seen:
                    raise self.fail(f"scope {scope!r} appears twice")
                seen.add(scope)
                tally, n_items, last_unit, ids = _Tally(scope), 0, -1, set()
                state = "scope"
                yield "scope", scope
            elif kind == "item" and state == "scope":
                assert tally is not None
                dump = self._item(obj, scope, n_items, ids, dims)
                tally.add(dump)
                n_items += 1
                yield "dump", dump
            elif kind == "record" and state in ("scope", "records"):
                assert tally is not None
                rec = self._record(obj, n_items, last_unit)
                last_unit = rec.unit
                tally.add(rec)
                state = "records"
                yield "dump", rec
            elif kind == "scope_end" and state in ("scope", "records"):
                assert tally is not None
                got = tally.summary()
                self._keys(obj, {"t", "scope", "sha256", *got.counts()})
                if obj.get("scope") != scope:
                    raise self.fail(f"scope_end names {obj.get('scope')!r}, not the open scope {scope!r}")
                for key, n in got.counts().items():
                    if type(obj.get(key)) is not int or obj.get(key) != n:
                        raise self.fail(f"scope {scope!r}: the file holds {n} {key}, its scope_end "
                                        f"says {obj.get(key)!r} (lines lost or added)")
                if obj.get("sha256") != got.sha256:
                    raise self.fail(f"scope {scope!r}: content digest differs from its scope_end "
                                    "(the file was changed)")
                counts["scopes"] += 1
                counts["items"] += n_items
                state = "top"
                yield "scope_end", got
            elif kind == "audit" and state in ("top", "audit"):
                entry = self._audit(obj)
                counts["audit"] += 1
                state = "audit"
                yield "audit", entry
            elif kind == "end" and state in ("top", "audit"):
                self._keys(obj, {"t", "lines", "scopes", "items", "audit", "sha256"})
                want = {"lines": self.n - 1, **counts, "sha256": digest.hexdigest()}
                for key, value in want.items():
                    if type(obj.get(key)) is not type(value) or obj.get(key) != value:
                        raise self.fail(f"the end line says {key} {obj.get(key)!r}, the file has {value!r}"
                                        + (" (the file was changed)" if key == "sha256" else ""))
                state = "end"
            else:
                where = {"start": "at the start", "top": "between scopes", "scope": "inside a scope",
                         "records": "after a scope's records began", "audit": "among the audit lines"}
                raise self.fail(f"unexpected {kind!r} line {where.get(state, '')}")
            digest.update(raw)
        if state != "end":
            raise ImportFormatError(f"{self.name}: truncated: no end line after line {self.n}"
                                    " (the file is incomplete)")
        if self.progress is not None:
            self.progress("checking", done, self.size)

    def _parse(self, raw: bytes) -> dict[str, Any]:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
        if not text.strip():
            raise self.fail("empty line")
        try:
            obj = json.loads(text, parse_constant=_no_constant)
        except (json.JSONDecodeError, ValueError) as exc:
            if not raw.endswith(b"\n"):  # every line of an export ends with one
                raise self.fail("truncated: the file ends inside a line (it is incomplete)") from None
            if self.n == 1:
                raise self.fail(f"not a {FORMAT} file (its first line is not JSON)") from None
            raise self.fail(f"not valid JSON ({exc})") from None
        if self.n == 1 and (not isinstance(obj, dict) or obj.get("t") != "header"):
            raise self.fail(f"not a {FORMAT} file (the first line must be its header)")
        if not isinstance(obj, dict) or not isinstance(obj.get("t"), str):
            raise self.fail('each line must be an object with a "t" field')
        return obj

    def _scope(self, value: object) -> str:
        try:
            return validate_scope(value)
        except InvalidInputError as exc:
            raise self.fail(str(exc)) from None

    def _keys(self, obj: Mapping[str, Any], keys: set[str]) -> None:
        if set(obj) != keys:
            missing, extra = sorted(keys - set(obj)), sorted(set(obj) - keys)
            raise self.fail(f"{obj.get('t')} line: " + "; ".join(
                ([f"missing {', '.join(missing)}"] if missing else [])
                + ([f"unknown {', '.join(extra)}"] if extra else [])))

    def _int(self, obj: Mapping[str, Any], key: str, lo: int = 0) -> int:
        value = obj[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < lo:
            raise self.fail(f"{key} must be an integer >= {lo}, got {value!r}")
        return value

    def _str(self, obj: Mapping[str, Any], key: str) -> str:
        value = obj[key]
        if not isinstance(value, str):
            raise self.fail(f"{key} must be a string, got {type(value).__name__}")
        if not is_utf8(value):
            raise self.fail(f"{key} is not valid unicode (a lone surrogate)")
        return value

    def _float(self, value: object, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(f"{key} must be a finite number, got {value!r}")
        return float(value)

    _ITEM_KEYS = {"t", "seq", "id", "session", "speaker", "role", "kind", "observed_at", "observed_ts",
                  "text", "meta", "agent", "tokens", "pieces", "vectors"}

    def _item(self, obj: Mapping[str, Any], scope: str, seq: int, ids: set[str],
              dims: dict[str, int]) -> _ItemDump:
        self._keys(obj, self._ITEM_KEYS)
        if self._int(obj, "seq") != seq:
            raise self.fail(f"item seq {obj['seq']} where {seq} comes next (items must be in order, "
                            "without gaps)")
        s = {k: self._str(obj, k) for k in ("id", "session", "speaker", "role", "kind", "observed_at",
                                             "text", "agent")}
        if not s["id"]:
            raise self.fail("item id is empty")
        if s["id"] in ids:
            raise self.fail(f"item id {s['id']!r} appears twice in scope {scope!r}")
        ids.add(s["id"])
        meta = obj["meta"]
        if not isinstance(meta, dict):
            raise self.fail("meta must be an object")
        ts = None if obj["observed_ts"] is None else self._float(obj["observed_ts"], "observed_ts")
        try:
            validate_item(NewItem(text=s["text"], session=s["session"], speaker=s["speaker"], role=s["role"],
                                  kind=s["kind"], observed_at=s["observed_at"], meta=meta, id=s["id"],
                                  agent=s["agent"]), seq)
        except InvalidItemError as exc:
            raise self.fail(str(exc)) from None
        pieces: list[tuple[int, int, str]] = []
        if not isinstance(obj["pieces"], list):
            raise self.fail("pieces must be a list")
        for p in obj["pieces"]:
            if (not isinstance(p, list) or len(p) != 3 or not all(
                    isinstance(x, int) and not isinstance(x, bool) for x in p[:2])
                    or not 0 <= p[0] <= p[1] <= len(s["text"])):
                raise self.fail(f"a piece must be [start, end, body] within the text, got {p!r}")
            pieces.append((p[0], p[1], self._str({"body": p[2]}, "body")))
        if not isinstance(obj["vectors"], dict):
            raise self.fail("vectors must be an object")
        vectors: dict[str, bytes] = {}
        for enc, b64 in obj["vectors"].items():
            try:
                blob = base64.b64decode(b64, validate=True) if isinstance(b64, str) else b""
            except (binascii.Error, ValueError):
                blob = b""
            if not blob or len(blob) % 4:
                raise self.fail(f"vector of {enc!r} is not base64 of float32 values")
            if not np.all(np.isfinite(np.frombuffer(blob, dtype=_FLOAT32))):
                raise self.fail(f"vector of {enc!r} holds a NaN or infinity")
            if dims.setdefault(enc, len(blob) // 4) != len(blob) // 4:
                raise self.fail(f"vector of {enc!r} has {len(blob) // 4} dimensions, earlier ones "
                                f"{dims[enc]}")
            vectors[self._str({"encoder": enc}, "encoder")] = blob
        item = Item(id=s["id"], scope=scope, seq=seq, session=s["session"], speaker=s["speaker"],
                    role=s["role"], kind=s["kind"], observed_at=s["observed_at"], text=s["text"],
                    meta=meta, tokens=self._int(obj, "tokens"), observed_ts=ts, agent=s["agent"])
        return _ItemDump(item, tuple(pieces), vectors)

    def _record(self, obj: Mapping[str, Any], n_items: int, last_unit: int) -> _RecordDump:
        self._keys(obj, {"t", "unit", "first_seq", "last_seq", "text", "writer", "links"})
        unit, first, last = self._int(obj, "unit"), self._int(obj, "first_seq"), self._int(obj, "last_seq")
        if unit <= last_unit:
            raise self.fail(f"record unit {unit} after unit {last_unit} (units must ascend)")
        if not first <= last < n_items:
            raise self.fail(f"record spans items {first}..{last}; the scope has {n_items}")
        links: list[tuple[int, str, float]] = []
        if not isinstance(obj["links"], list):
            raise self.fail("links must be a list")
        for x in obj["links"]:
            if not isinstance(x, list) or len(x) != 3 or not isinstance(x[1], str):
                raise self.fail(f"a link must be [dst, kind, weight], got {x!r}")
            links.append((self._int({"dst": x[0]}, "dst"), self._str({"kind": x[1]}, "kind"),
                          self._float(x[2], "link weight")))
        if links != sorted(links) or len({(d, k) for d, k, _ in links}) != len(links):
            raise self.fail("a record's links must be sorted and distinct")
        return _RecordDump(unit, first, last, self._str(obj, "text"), self._str(obj, "writer"), tuple(links))

    def _audit(self, obj: Mapping[str, Any]) -> AuditEntry:
        self._keys(obj, {"t", "at", "action", "scope_sha256", "ids_sha256", "counts"})
        ids, counts = obj["ids_sha256"], obj["counts"]
        if not isinstance(ids, list) or not all(isinstance(x, str) for x in ids):
            raise self.fail("ids_sha256 must be a list of strings")
        if not isinstance(counts, dict) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in counts.values()):
            raise self.fail("counts must map names to integers")
        return AuditEntry(self._float(obj["at"], "at"), self._str(obj, "action"),
                          self._str(obj, "scope_sha256"), tuple(ids), dict(counts))


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _seekable(src: str | os.PathLike[str] | IO[bytes], stack: ExitStack) -> tuple[IO[bytes], str, int]:
    """The input as a seekable binary file (a stream is copied to a temporary file first: the
    import reads it twice), its name for messages, and its size."""
    if isinstance(src, (str, os.PathLike)):
        path = Path(src)
        try:
            f: IO[bytes] = stack.enter_context(path.open("rb"))
        except OSError as exc:
            raise ImportFormatError(f"cannot read {path}: {exc.strerror or exc}") from None
        return f, str(path), path.stat().st_size
    name = str(getattr(src, "name", "<stream>"))
    if src.seekable():
        start = src.tell()
        size = src.seek(0, os.SEEK_END) - start
        src.seek(start)
        return src, name, size
    spool = stack.enter_context(tempfile.TemporaryFile())
    shutil.copyfileobj(src, spool)
    size = spool.tell()
    spool.seek(0)
    return spool, name, size


def check_jsonl(src: str | os.PathLike[str] | IO[bytes], *, progress: Progress | None = None) -> _Scan:
    """Read a whole export and check it (format, order, every field, digests, end line);
    ImportFormatError naming the line when anything is wrong. Writes nothing."""
    with ExitStack() as stack:
        f, name, size = _seekable(src, stack)
        return _scan(_Reader(f, name, progress, size))


def _scan(reader: _Reader, dst: Store | None = None) -> _Scan:
    """Check the whole file; with ``dst``, also digest the start of each scope ``dst`` holds
    (as many items as it holds there), so an import can tell its own interrupted log."""
    scan = _Scan()
    head: Any = None
    for kind, value in reader.events():
        if kind == "header":
            scan.header = value
        elif kind == "scope" and dst is not None and dst.has_scope(value):
            scan.held[value] = dst.max_seq(value) + 1
            head = hashlib.sha256()
        elif kind == "dump" and head is not None and isinstance(value, _ItemDump) \
                and value.item.seq < scan.held[value.item.scope]:
            head.update(_item_key(value))
        elif kind == "scope_end":
            if head is not None:
                scan.heads[value.scope], head = head.hexdigest(), None
            scan.summaries.append(value)
            scan.items += value.items
        elif kind == "audit":
            scan.audit.append(value)
    return scan


# -- writing into a store ---------------------------------------------------------------------------


class _ScopeWriter:
    """Writes one scope's dumps into a store in batches: items (with pieces, vectors), then records.

    The store has no lock that keeps other writers out of a scope across batches, so each batch
    is checked instead: its items must land at the seqs the source gives them, or another
    writer appended meanwhile and the transfer fails rather than merge two logs. ``written``
    holds the ids of the items this writer added (an item stored before its batch is not one),
    so a failed transfer removes exactly those and never another writer's. (An item another
    writer stores with the same id and content in the instant between that check and the
    append is, to the store, the same item: appends are idempotent.)

    ``held``: the scope's first items are already there, the start of this same log left by an
    interrupted transfer (checked by :func:`_prepare`); the run keeps them and writes what they
    lack (vectors, records), so a re-run completes what a killed one began.
    """

    def __init__(self, store: Store, scope: str, batch: int = BATCH,
                 advance: Callable[[int], None] | None = None, held: int = 0, *,
                 source: str = "", items: int = 0) -> None:
        self.store, self.scope, self.batch, self.advance, self.held = store, scope, batch, advance, held
        self.note = {"source": source, "items": items,
                     "started": datetime.now(UTC).isoformat(timespec="seconds")}
        store.note_transfer(scope, self.note)  # cleared when the whole transfer is done
        self.written: list[str] = []
        self._items: list[_ItemDump] = []
        self._next = 0
        self._records: dict[int, _RecordDump] | None = None

    def add(self, dump: _Dump) -> None:
        if isinstance(dump, _ItemDump):
            self._items.append(dump)
            if len(self._items) >= self.batch:
                self._flush()
            return
        self._flush()
        if self.held:
            if self._records is None:
                self._records = self._stored_records()
            have = self._records.get(dump.unit)
            if have == dump:
                return
            if have is not None:
                raise ConflictError(
                    f"scope {self.scope!r} holds another record of unit {dump.unit} than the source's: "
                    "it is not what an interrupted transfer of this source left; forget the scope and "
                    "transfer it again")
        if not self.store.put_record(self.scope, dump.unit, dump.first_seq, dump.last_seq, dump.text,
                                     dump.writer, dump.links):
            raise StoreError(f"scope {self.scope!r}: unit {dump.unit} already has a record")

    def close(self) -> None:
        self._flush()

    def _stored_records(self) -> dict[int, _RecordDump]:
        return {r.unit: r for r in _record_dumps(self.store, self.scope)[0]}

    def _flush(self) -> None:
        if not self._items:
            return
        news = [NewItem(text=it.text, session=it.session, speaker=it.speaker, role=it.role, kind=it.kind,
                        observed_at=it.observed_at, meta=it.meta, id=it.id, agent=it.agent)
                for d in self._items for it in (d.item,)]
        rows = [ItemRow(new, it.observed_at, it.observed_ts, it.tokens, [(s, e) for s, e, _ in d.pieces],
                        [b for _, _, b in d.pieces])
                for new, d in zip(news, self._items, strict=True) for it in (d.item,)]
        stored_before = self.store.check_ids(self.scope, news)
        stored = self.store.append(self.scope, rows)
        self.written += [d.item.id for d, old in zip(self._items, stored_before, strict=True) if not old]
        start, end = self._next, self._next + len(rows)
        if [it.seq for it in stored] != list(range(start, end)):
            raise StoreError(
                f"another writer added items to scope {self.scope!r} while it was transferred; a transfer "
                "never merges two logs, so it stops and removes what it wrote (the other writer's items "
                "stay): transfer into a store no one else writes to")
        by_encoder: dict[str, tuple[list[int], list[bytes]]] = {}
        for d in self._items:
            for enc, blob in d.vectors.items():
                seqs, blobs = by_encoder.setdefault(enc, ([], []))
                seqs.append(d.item.seq)
                blobs.append(blob)
        for enc, (seqs, blobs) in sorted(by_encoder.items()):
            if start < self.held:  # the items held may have their vectors already
                have = set(self.store.embeddings(self.scope, enc, start - 1, before_seq=end)[0].tolist())
                keep = [i for i, seq in enumerate(seqs) if seq not in have]
                seqs, blobs = [seqs[i] for i in keep], [blobs[i] for i in keep]
            if seqs:
                mat = np.frombuffer(b"".join(blobs), dtype=_FLOAT32).reshape(len(blobs), -1)
                self.store.put_embeddings(self.scope, enc, seqs, mat.astype(np.float32))
        self._next = end
        if self.advance is not None:
            self.advance(len(rows))
        self._items = []


def _names(scopes: Sequence[str]) -> str:
    more = f" and {len(scopes) - 5} more" if len(scopes) > 5 else ""
    return ", ".join(map(repr, scopes[:5])) + more


def _prepare(dst: Store, scopes: Sequence[str], config: Mapping[str, Any] | None, *,
             held: Mapping[str, int], heads: Mapping[str, str], sizes: Mapping[str, int],
             expected: Callable[[str], ScopeSummary], audit: Sequence[AuditEntry]) -> None:
    """Refuse before writing anything: a scope the destination holds other items in than the
    start of the source's (two logs are never merged), a transfer already done, another config.

    ``held``: items the destination holds per scope; ``heads``: the digest (:func:`_head`) of
    the source's first that many items; ``sizes``: the source's item counts.
    """
    foreign = [s for s in scopes
               if held.get(s, 0) and (held[s] > sizes[s] or _head(dst, s, held[s]) != heads[s])]
    if foreign:
        raise ConflictError(
            f"{dst.path} already holds scope(s) {_names(foreign)} with other items than the source's; "
            "a transfer never merges two logs of one scope: transfer into a new store, or forget those "
            "scopes first")
    if scopes and all(held.get(s, 0) == sizes[s] for s in scopes) \
            and all(summarize(dst, s) == expected(s) for s in scopes) \
            and _audit_found(dst, audit) == len(audit) \
            and (config is None or dst.load_config() == dict(config)):
        for scope in scopes:  # a run killed after its last write left marks on a complete copy
            dst.note_transfer(scope, None)
        raise ConflictError(
            f"{dst.path} already holds scope(s) {_names(list(scopes))} exactly as the source has them: "
            "it was transferred already; nothing written")
    if config is None:
        return
    have = dst.load_config()
    if have is None:
        if dst.scopes():
            raise StoreConfigError(
                f"{dst.path} holds items but no saved store config; open it once with suffice "
                "(which saves its config) or import into a new store")
        dst.save_config(config, replace=False)
        have = dst.load_config()
    if have != dict(config):
        diff = sorted(k for k in set(have or {}) | set(config) if (have or {}).get(k) != config.get(k))
        raise StoreConfigError(
            f"{dst.path} was built with other store settings ({', '.join(diff)}); its pieces and "
            "records would not match the imported ones: import into a new store")


def _undo(dst: Store, writers: Sequence[_ScopeWriter], exc: BaseException) -> None:
    """Forget, by id, the items this transfer added, and nothing else: another writer's items
    in the same scope stay (forgetting the whole scope would take them too). Items an earlier,
    interrupted run left stay as well: a re-run completes them."""
    for w in writers:
        try:
            if w.written:
                dst.forget(w.scope, ids=w.written)
        except Exception as again:  # noqa: BLE001 - the first error is the one to raise
            exc.add_note(f"and the {len(w.written)} item(s) it added to scope {w.scope!r} could not be "
                         f"removed again ({again}): run the same transfer again to complete the scope, "
                         "or forget it")
            continue  # the scope keeps its mark: `suffice check` names it
        if w.held:
            exc.add_note(f"scope {w.scope!r} still holds the first {w.held} item(s) of the source, "
                         "from an interrupted transfer: run the same transfer again to complete it")
        with suppress(Exception):  # the mark stays where the store cannot be written (check names it)
            dst.note_transfer(w.scope, w.note if w.held else None)


def _done(dst: Store, writers: Sequence[_ScopeWriter]) -> None:
    """Clear the marks of a transfer that wrote everything, its audit lines included."""
    for w in writers:
        dst.note_transfer(w.scope, None)


def _add_audit(dst: Store, entries: Sequence[AuditEntry]) -> None:
    have = set(map(_audit_key, dst.audit()))
    new = [e for e in entries if _audit_key(e) not in have]
    if new:
        dst.put_audit(new)


def _audit_key(e: AuditEntry) -> bytes:
    return _line(_entry_obj(e))


def _audit_found(dst: Store, entries: Sequence[AuditEntry]) -> int:
    have = set(map(_audit_key, dst.audit()))
    return sum(_audit_key(e) in have for e in entries)


def _verify(source: str, dst: Store, expected: Sequence[ScopeSummary], audit: Sequence[AuditEntry],
            config: Mapping[str, Any] | None, issues: Sequence[str] = (),
            progress: Progress | None = None) -> TransferReport:
    """Read the destination back, scope by scope, and compare with what was expected."""
    found = []
    total, done = sum(s.items for s in expected), 0
    for want in expected:
        found.append(summarize(dst, want.scope) if dst.has_scope(want.scope) else ScopeSummary(want.scope))
        done += want.items
        if progress is not None:
            progress("verifying", done, total)
    return TransferReport(source, dst.path, tuple(expected), tuple(found), len(audit),
                          _audit_found(dst, audit), config is None or dst.load_config() == dict(config),
                          tuple(issues))


# -- the three operations ------------------------------------------------------------------------------


def _selected(store: Store, scopes: Sequence[str] | None) -> list[str]:
    have = sorted(store.scopes())
    if scopes is None:
        return have
    wanted = sorted(dict.fromkeys(validate_scope(s) for s in scopes))
    missing = [s for s in wanted if not store.has_scope(s)]
    if missing:
        raise UnknownScopeError(f"{store.path} holds no scope {missing[0]!r}")
    return wanted


def _audit_of(store: Store, scopes: Sequence[str] | None, chosen: Sequence[str]) -> list[AuditEntry]:
    """The audit lines to carry: all of them, or those of the chosen scopes."""
    entries = store.audit()
    if scopes is None:
        return entries
    names = {scope_digest_name(s) for s in chosen}
    return [e for e in entries if e.scope_sha256 in names]


def _write_export(store: Store, out: IO[bytes], chosen: Sequence[str], audit: Sequence[AuditEntry],
                  progress: Progress | None, batch: int) -> list[ScopeSummary]:
    digest = hashlib.sha256()
    n_lines = 0

    def put(line: bytes) -> None:
        nonlocal n_lines
        out.write(line)
        digest.update(line)
        n_lines += 1

    put(_line({"t": "header", "format": FORMAT, "version": VERSION, "schema_version": store.schema_version,
               "config": store.load_config()}))
    summaries: list[ScopeSummary] = []
    total = sum(store.max_seq(s) + 1 for s in chosen)
    done = 0
    for scope in chosen:
        put(_line({"t": "scope", "scope": scope}))
        tally = _Tally(scope)
        for dump in _read_scope(store, scope, batch):
            put(tally.add(dump))
            if isinstance(dump, _ItemDump):
                done += 1
                if progress is not None and done % batch == 0:
                    progress("exporting", done, total)
        s = tally.summary()
        summaries.append(s)
        put(_line({"t": "scope_end", "scope": scope, **s.counts(), "sha256": s.sha256}))
    for entry in audit:
        put(_line(_entry_obj(entry)))
    out.write(_line({"t": "end", "lines": n_lines, "scopes": len(summaries),
                     "items": sum(s.items for s in summaries), "audit": len(audit),
                     "sha256": digest.hexdigest()}))
    if progress is not None:
        progress("exporting", done, total)
    return summaries


def export_jsonl(store: Store, out: str | os.PathLike[str] | IO[bytes], *,
                 scopes: Sequence[str] | None = None, progress: Progress | None = None,
                 batch: int = BATCH) -> TransferReport:
    """Write the store (or the named scopes, with their audit lines) as ``suffice-jsonl``.

    To a path: written beside it, read back and checked, then moved into place, so a failed
    export never replaces a good backup. To a stream: written as is (nothing to read back).
    A forget during the export fails it (the store's generation moved).
    """
    chosen = _selected(store, scopes)
    audit = _audit_of(store, scopes, chosen)
    generation = store.generation()
    issues = []
    if not isinstance(out, (str, os.PathLike)):
        summaries = _write_export(store, out, chosen, audit, progress, batch)
        out.flush()
        if store.generation() != generation:
            issues.append("a forget or rebuild changed the store while it was exported; export again")
        return TransferReport(store.path, str(getattr(out, "name", "<stream>")), tuple(summaries),
                              tuple(summaries), len(audit), len(audit), True, tuple(issues), checked=False)
    path = Path(out)
    if path.is_dir():
        raise InvalidInputError(f"cannot write {path}: it is a folder; name a file")
    if store.path != ":memory:" and _same_file(path, Path(store.path)):
        raise InvalidInputError(f"{path} is the store being exported; name another file")
    with ExitStack() as stack:  # a failure below removes the temporary file; the old one stays
        try:
            f = stack.enter_context(atomic_file(path))
        except OSError as exc:
            raise InvalidInputError(f"cannot write {path}: {exc.strerror or exc}") from None
        summaries = _write_export(store, f, chosen, audit, progress, batch)
        f.flush()
        if store.generation() != generation:
            raise StoreError("a forget or rebuild changed the store while it was exported; export again")
        scan = check_jsonl(Path(f.name), progress=progress)  # read back before it replaces a backup
    config = store.load_config()
    return TransferReport(store.path, str(path), tuple(summaries), tuple(scan.summaries), len(audit),
                          len(scan.audit) if scan.audit == audit else 0, scan.header.get("config") == config)


def _same_file(path: Path, store: Path) -> bool:
    """Whether writing ``path`` would replace the store's file or its WAL or shared-memory
    file (an export named like the database would leave it a JSONL file)."""
    targets = [store, store.with_name(store.name + "-wal"), store.with_name(store.name + "-shm")]
    try:
        mine = path.resolve()
        return any(mine == t.resolve() or (path.exists() and t.exists() and os.path.samefile(path, t))
                   for t in targets)
    except OSError:
        return False


def import_jsonl(store: Store, src: str | os.PathLike[str] | IO[bytes], *,
                 progress: Progress | None = None, batch: int = BATCH) -> TransferReport:
    """Restore an export into ``store``; the report compares the store, read back, with the file.

    The whole file is checked first (ImportFormatError naming the line; nothing written). The
    destination must not hold any of the file's scopes, save the start of one (what an import of
    this file that was killed left: this run completes it), and its saved config, if any, must
    equal the file's (a new store takes the file's). If a write fails midway, the items this
    run added are forgotten again by id (which leaves the usual audit line; items another writer
    added meanwhile stay) and the error is raised.
    """
    with ExitStack() as stack:
        f, name, size = _seekable(src, stack)
        start = f.tell()
        scan = _scan(_Reader(f, name, progress, size), store)
        config = scan.header.get("config")
        scopes = [s.scope for s in scan.summaries]
        summaries = {s.scope: s for s in scan.summaries}
        _prepare(store, scopes, config, held=scan.held, heads=scan.heads,
                 sizes={s.scope: s.items for s in scan.summaries}, expected=summaries.__getitem__,
                 audit=scan.audit)
        f.seek(start)
        writers: list[_ScopeWriter] = []
        done = 0

        def advance(n: int) -> None:
            nonlocal done
            done += n
            if progress is not None:
                progress("importing", done, scan.items)

        try:
            for kind, value in _Reader(f, name).events():
                if kind == "scope":
                    writers.append(_ScopeWriter(store, value, batch, advance, scan.held.get(value, 0),
                                                source=name, items=summaries[value].items))
                elif kind == "dump":
                    writers[-1].add(value)
                elif kind == "scope_end":
                    writers[-1].close()
            _add_audit(store, scan.audit)
            _done(store, writers)
        except BaseException as exc:
            _undo(store, writers, exc)
            raise
    return _verify(name, store, scan.summaries, scan.audit, config, progress=progress)


def migrate(src: Store, dst: Store, *, scopes: Sequence[str] | None = None,
            progress: Progress | None = None, batch: int = BATCH) -> TransferReport:
    """Copy a store (or the named scopes) into another, of any backend, then read both sides
    back the same way and compare. The destination is refused, a killed migration completed and
    a failed one undone as for :func:`import_jsonl`."""
    if src.path == dst.path and src.path != ":memory:":
        raise InvalidInputError(f"source and destination are the same store ({src.path})")
    chosen = _selected(src, scopes)
    audit = _audit_of(src, scopes, chosen)
    config = src.load_config()
    generation = src.generation()
    held = {s: dst.max_seq(s) + 1 for s in chosen if dst.has_scope(s)}
    sizes = {s: src.max_seq(s) + 1 for s in chosen}
    _prepare(dst, chosen, config, held=held, sizes=sizes,
             heads={s: _head(src, s, n, batch) for s, n in held.items() if n <= sizes[s]},
             expected=lambda s: summarize(src, s, batch), audit=audit)
    expected: list[ScopeSummary] = []
    writers: list[_ScopeWriter] = []
    total = sum(sizes.values())
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress("copying", done, total)

    try:
        for scope in chosen:
            tally = _Tally(scope)
            writers.append(writer := _ScopeWriter(dst, scope, batch, advance, held.get(scope, 0),
                                                  source=src.path, items=sizes[scope]))
            for dump in _read_scope(src, scope, batch):
                tally.add(dump)
                writer.add(dump)
            writer.close()
            expected.append(tally.summary())
        _add_audit(dst, audit)
        _done(dst, writers)
    except BaseException as exc:
        _undo(dst, writers, exc)
        raise
    issues = ([] if src.generation() == generation else
              ["a forget or rebuild changed the source while it was copied; migrate again"])
    return _verify(src.path, dst, expected, audit, config, issues, progress)
