"""An approximate nearest-neighbour index (HNSW, from faiss) over one scope's item vectors.

Why: the exact scan reads every vector on every query, so its cost grows with the log
(measured in ``docs/benchmarks.md`` section 2); HNSW visits a few thousand vectors whatever the
size. The index is a cache of the store's vectors like the rest of a scope's in-memory state:
row ``r`` of the scope's vector matrix is id ``r``, rows are added in log order as the scope
grows, and the index is dropped with that state when the store's generation changes (a forget
or a rebuild), so it never holds an item the store no longer has. Callers rescore the rows it
returns against the exact vectors, so only the choice of candidates is approximate.

Same store state, same results: rows go in one at a time, in row order, with faiss's fixed
seed, so the graph is the same whether the rows arrived one by one or all at once (a batch add
would insert them level by level, in an order that depends on the batch). A row repeating an
earlier row's vector shares that row's node (see :class:`DenseIndex`).

A large index can be saved beside the store (:func:`save` / :func:`load`): a header names the
store generation, the encoder, the row count and a digest of the vectors it was built from,
and a file whose header does not match what the caller holds is rebuilt instead of used.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import math
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ._files import atomic_file

log = logging.getLogger("suffice")

CONNECTIVITY = 16
"""HNSW M: links per node; 16 is the usual default and gave recall@10 0.97-0.99 here at ef 100-128."""
EXPANSION_ADD = 128
"""Candidates kept while inserting (efConstruction); larger builds slower for little recall."""
FORMAT = 2
"""Version of the saved files; an index saved in another version is rebuilt."""

_available: bool | None = None


def _faiss() -> Any:
    """The faiss module, typed loosely: its bindings are generated and carry no usable types."""
    return importlib.import_module("faiss")


def available() -> bool:
    """True when faiss can be imported; warns once (and callers scan every vector) when not."""
    global _available
    if _available is None:
        try:
            _faiss()
            _available = True
        except ImportError:
            _available = False
            log.warning("faiss is not installed: dense search scans every vector (pip install faiss-cpu)")
    return _available


def search_width(ef: int, count: int, share: float) -> int:
    """How many candidates a search keeps: ``ef``, at least ``count``, widened when a filter
    keeps only ``share`` of the rows (a filtered search passes over the rows it drops)."""
    return math.ceil(max(ef, count) / math.sqrt(min(1.0, max(share, 1e-9))))


class DenseIndex:
    """HNSW over the rows of one scope's vector matrix, one node per distinct vector.

    Rows whose vector equals an earlier row's (the same text stored twice) join that row's
    node instead of getting their own: HNSW links a new node to its nearest, so a copy at
    distance 0 takes the links it should have shared out and the graph splits (recall@10 fell
    from 0.93 to 0.81 on 100k real items of which 5% were repeats). A search returns every
    row of each node it finds. Vectors are kept inside as float16 (half the memory of float32,
    the same candidates within noise); the caller rescores the rows found with the float32
    rows. A lock keeps adds apart from searches: faiss allows concurrent searches, not a
    search beside an add.
    """

    def __init__(self, dim: int, *, _index: Any = None, node_rows: np.ndarray | None = None,
                 copies: dict[int, list[int]] | None = None, count: int = 0) -> None:
        faiss = _faiss()
        self.dim = dim
        if _index is None:
            _index = faiss.IndexHNSWSQ(dim, faiss.ScalarQuantizer.QT_fp16, CONNECTIVITY,
                                       faiss.METRIC_INNER_PRODUCT)
            _index.hnsw.efConstruction = EXPANSION_ADD
        self._index: Any = _index
        self._nodes = 0 if node_rows is None else int(node_rows.shape[0])
        self._node_arr = np.zeros(max(1024, self._nodes), dtype=np.int64)
        """Row of each node (the first row with that vector), in its first ``_nodes`` slots."""
        if node_rows is not None:
            self._node_arr[:self._nodes] = node_rows
        self._copies: dict[int, list[int]] = copies or {}
        """Node -> later rows with the same vector."""
        self._copy_arrays: tuple[np.ndarray, np.ndarray] | None = None
        """(node, row) of every copy as arrays, made when a filtered search first needs them."""
        self._seen: dict[bytes, int] = {}
        self.count = count
        """Rows covered so far: rows ``0 .. count-1`` of the matrix."""
        self.saved = count
        """Rows in the copy on disk (0 when none)."""
        self.lock = threading.RLock()

    def _remember(self, matrix: np.ndarray) -> None:
        """Rebuild the vector -> node map of a loaded index from the rows it was built from."""
        for node, row in enumerate(self._node_arr[:self._nodes].tolist()):
            self._seen.setdefault(_key(matrix[row]), node)

    def extend(self, matrix: np.ndarray) -> int:
        """Add the rows of ``matrix`` past :attr:`count`, one at a time; how many were added.
        The lock is taken per row, so a search of the rows already in waits one insert at most."""
        added = 0
        for r in range(self.count, matrix.shape[0]):
            row = np.ascontiguousarray(matrix[r:r + 1], dtype=np.float32)
            key = _key(row[0])
            with self.lock:
                if self.count != r:  # another thread added this row meanwhile
                    continue
                node = self._seen.get(key)
                if node is None:
                    if self._nodes == self._node_arr.shape[0]:
                        self._node_arr = np.concatenate([self._node_arr, np.zeros_like(self._node_arr)])
                    self._seen[key] = self._nodes
                    self._node_arr[self._nodes] = r
                    self._nodes += 1
                    self._index.add(row)
                else:
                    self._copies.setdefault(node, []).append(r)
                    self._copy_arrays = None
                self.count = r + 1
                added += 1
        return added

    def search(self, qvec: np.ndarray, count: int, ef: int, allowed: np.ndarray | None = None) -> np.ndarray:
        """Rows near ``qvec``: those of the (about) ``count`` nearest nodes, searching ``ef``
        candidates wide (at least ``count``), nearest node first. With ``allowed`` (a boolean
        mask over the rows) only nodes holding an allowed row are searched for, widening the
        search as the share kept drops; the caller drops the rows of such a node it does not allow."""
        faiss = _faiss()
        with self.lock:
            nodes = self._nodes
            if not nodes or count <= 0:
                return np.zeros(0, dtype=np.int64)
            node_rows = self._node_arr[:nodes]
            params = faiss.SearchParametersHNSW()
            share = 1.0
            if allowed is not None:
                ok = np.zeros(self.count, dtype=bool)
                m = min(self.count, allowed.shape[0])
                ok[:m] = allowed[:m]
                mask = ok[node_rows]
                copy_nodes, copy_rows = self._copies_as_arrays()
                mask[copy_nodes[ok[copy_rows]]] = True  # a node is allowed when any copy is
                share = max(int(mask.sum()), 1) / nodes
                bits = np.packbits(mask, bitorder="little")
                params.sel = faiss.IDSelectorBitmap(nodes, faiss.swig_ptr(bits))
            params.efSearch = search_width(ef, count, share)
            q = np.ascontiguousarray(qvec, dtype=np.float32).reshape(1, -1)
            _, ids = self._index.search(q, min(count, nodes), params=params)
            found = ids[0][ids[0] >= 0]
            if not self._copies:
                return np.asarray(node_rows[found], dtype=np.int64)
            rows = [r for i in found.tolist() for r in (int(node_rows[i]), *self._copies.get(i, ()))]
            return np.asarray(rows, dtype=np.int64)

    def _copies_as_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self._copy_arrays is None:
            nodes = sorted(self._copies)
            self._copy_arrays = (
                np.asarray([n for n in nodes for _ in self._copies[n]], dtype=np.int64),
                np.asarray([r for n in nodes for r in self._copies[n]], dtype=np.int64))
        return self._copy_arrays

    def state(self) -> dict[str, np.ndarray]:
        """The row bookkeeping saved beside the faiss index."""
        with self.lock:
            copy_nodes, copy_rows = self._copies_as_arrays()
            return {"node_rows": self._node_arr[:self._nodes].copy(), "copy_nodes": copy_nodes,
                    "copy_rows": copy_rows, "count": np.asarray([self.count], dtype=np.int64)}


def _key(row: np.ndarray) -> bytes:
    """A vector's identity for spotting repeats: a 16-byte digest of its float32 bytes."""
    return hashlib.blake2b(np.ascontiguousarray(row, dtype=np.float32).data, digest_size=16).digest()


def digest(matrix: np.ndarray, count: int) -> str:
    """A fingerprint of the first ``count`` rows: a saved index built from other vectors (a
    store replaced at the same path, a re-embedded one) must not be taken for this one."""
    h = hashlib.blake2b(digest_size=16)
    h.update(np.int64(count).tobytes())
    h.update(np.ascontiguousarray(matrix[:count]).data)
    return h.hexdigest()


def save(index: DenseIndex, path: Path, header: dict[str, Any], matrix: np.ndarray) -> None:
    """Write the index and its row bookkeeping, then its header (with the digest of the rows
    it covers); each file is replaced atomically, and a header only ever follows its index."""
    faiss = _faiss()
    tag = _tag(header.get("generation"))
    rows_path, meta = path.with_suffix(".rows.npz"), path.with_suffix(".json")
    # Renamed into place in this order: the index, its rows, and last the header naming both.
    with atomic_file(rows_path, tag=tag) as rows_fh, atomic_file(path, tag=tag) as index_fh:
        with index.lock:
            faiss.write_index(index._index, index_fh.name)  # faiss writes by name; fsync'd on exit
            state = index.state()
            count = index.count
        np.savez(rows_fh, node_rows=state["node_rows"], copy_nodes=state["copy_nodes"],
                 copy_rows=state["copy_rows"], count=state["count"])
    with atomic_file(meta, tag=tag) as fh:
        fh.write(json.dumps({**header, "format": FORMAT, "count": count,
                             "digest": digest(matrix, count)}).encode("utf-8"))
    index.saved = count


def _tag(generation: object) -> str:
    """What a temporary file's name says of the generation it was written for, so a
    half-written file of an older generation is recognised and deleted like a whole one."""
    return f"g{generation}"


def remove(path: Path) -> None:
    """Delete a saved index, its row bookkeeping and its header (missing files are fine)."""
    for f in (path.with_suffix(".json"), path, path.with_suffix(".rows.npz")):
        f.unlink(missing_ok=True)


def remove_stale(folder: Path, generation: int) -> None:
    """Delete the saved indexes in ``folder`` whose header names another generation (or none
    readable): after a forget they are the only copies of the forgotten items' vectors."""
    for path in folder.glob("*.hnsw"):
        try:
            saved = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
            current = saved.get("generation") == generation
        except (OSError, ValueError, AttributeError):
            current = False
        if not current:
            remove(path)
    for tmp in folder.glob("*.tmp"):  # half-written by a process of another generation
        if f".{_tag(generation)}." not in tmp.name:
            tmp.unlink(missing_ok=True)


def load(path: Path, header: dict[str, Any], matrix: np.ndarray) -> DenseIndex | None:
    """The saved index at ``path`` when its header matches ``header`` (generation, encoder,
    dimension) and the digest of ``matrix``'s first rows; None otherwise."""
    meta = path.with_suffix(".json")
    try:
        saved = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    count = saved.get("count")
    if (saved.get("format") != FORMAT or not isinstance(count, int) or not 0 < count <= matrix.shape[0]
            or any(saved.get(k) != v for k, v in header.items())
            or saved.get("digest") != digest(matrix, count)):
        return None
    try:
        raw = _faiss().read_index(str(path))
        with np.load(path.with_suffix(".rows.npz")) as z:
            node_rows, copy_nodes, copy_rows = z["node_rows"], z["copy_nodes"], z["copy_rows"]
            saved_count = int(z["count"][0])
    except Exception:  # a truncated, missing or foreign file: rebuild
        return None
    if raw.ntotal != node_rows.shape[0] or raw.d != matrix.shape[1] or saved_count != count:
        return None
    copies: dict[int, list[int]] = {}
    for node, row in zip(copy_nodes.tolist(), copy_rows.tolist(), strict=True):
        copies.setdefault(node, []).append(row)
    index = DenseIndex(matrix.shape[1], _index=raw, node_rows=node_rows, copies=copies, count=count)
    index._remember(matrix)
    return index
