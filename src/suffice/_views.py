"""Views derived from the item log: pieces, units and overlapping blocks.

Views hold no state of their own that could drift from the items: they are rebuilt from
``(seq, session, tokens)`` of each item and extended in place when items are appended.
Packing is greedy and only ever touches the newest unit, so closed units never change.
"""

from __future__ import annotations

import bisect
import threading
import unicodedata
from collections.abc import Callable, Sequence

import numpy as np

from ._config import StoreConfig
from ._errors import StoreError
from ._text import sentence_spans
from ._tokens import count_many, count_tokens
from ._types import Block, Unit


def piece_spans(text: str, max_tokens: int, count: Callable[[str], int] = count_tokens
                ) -> list[tuple[int, int]]:
    """Cut ``text`` into verbatim pieces of at most about ``max_tokens`` tokens.

    A short item is one piece; a long one is cut at sentence and line ends, with consecutive
    short sentences merged. A single over-long sentence is cut at spaces.
    """
    if count(text) <= max_tokens:
        return [(0, len(text))]
    out: list[tuple[int, int]] = []
    cur_start, cur_tokens = -1, 0
    cur_end = 0
    sentences = sentence_spans(text)
    # One batch call for every sentence: a long item has tens of thousands of them.
    sizes = (count_many([text[a:b] for a, b in sentences]) if count is count_tokens
             else [count(text[a:b]) for a, b in sentences])
    for (start, end), n in zip(sentences, sizes, strict=True):
        if n > max_tokens:
            if cur_start >= 0:
                out.append((cur_start, cur_end))
                cur_start, cur_tokens = -1, 0
            out.extend(_split_long(text, start, end, max_tokens, count))
            continue
        if cur_start >= 0 and cur_tokens + n <= max_tokens:
            cur_end, cur_tokens = end, cur_tokens + n
        else:
            if cur_start >= 0:
                out.append((cur_start, cur_end))
            cur_start, cur_end, cur_tokens = start, end, n
    if cur_start >= 0:
        out.append((cur_start, cur_end))
    return [(s, e) for s, e in out if text[s:e].strip()] or [(0, len(text))]


def _split_long(text: str, start: int, end: int, max_tokens: int,
                count: Callable[[str], int]) -> list[tuple[int, int]]:
    """Cut one long sentence at spaces into windows that fit ``max_tokens``."""
    out: list[tuple[int, int]] = []
    pos = start
    approx = max(16, max_tokens * 3)
    while pos < end:
        stop = min(end, pos + approx)
        if stop < end:
            space = text.rfind(" ", pos + 1, stop)
            stop = space + 1 if space > pos else _cluster_edge(text, pos, stop)
        while stop - pos > 8 and count(text[pos:stop]) > max_tokens:
            stop = _cluster_edge(text, pos, pos + (stop - pos) * 3 // 4)
        out.append((pos, stop))
        pos = stop
    return out


_JOINERS = frozenset("\u200d\ufe0e\ufe0f")  # zero-width joiner, text / emoji presentation


def _is_flag_half(c: str) -> bool:
    return 0x1F1E6 <= ord(c) <= 0x1F1FF  # regional indicators pair up into flags


def _splits_cluster(text: str, i: int) -> bool:
    """Whether a cut just before ``text[i]`` splits what a reader sees as one character: an
    accent from its letter, an emoji sequence joined by ZWJ or a modifier, a flag's halves."""
    c, prev = text[i], text[i - 1]
    if unicodedata.category(c).startswith("M") or c in _JOINERS or prev == "\u200d":
        return True
    if 0x1F3FB <= ord(c) <= 0x1F3FF:  # skin-tone modifier
        return True
    if _is_flag_half(c) and _is_flag_half(prev):
        run = 0
        while i - 1 - run >= 0 and _is_flag_half(text[i - 1 - run]):
            run += 1
        return run % 2 == 1
    return False


def _cluster_edge(text: str, pos: int, stop: int) -> int:
    """``stop``, moved back out of any character cluster it would split (never to ``pos``)."""
    for cut in range(stop, pos, -1):
        if not _splits_cluster(text, cut):
            return cut
    return stop  # one cluster longer than the window: cut it where asked


class ScopeViews:
    """Units and blocks of one scope, extended incrementally as items arrive."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.sessions: list[str] = []
        self.tokens: list[int] = []
        self.starts: list[int] = []  # cumulative token offset of each item
        self.units: list[Unit] = []
        self.unit_of: list[int] = []
        self._unit_array = np.zeros(0, dtype=np.int64)
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def total_tokens(self) -> int:
        return (self.starts[-1] + self.tokens[-1]) if self.tokens else 0

    def extend(self, layout: Sequence[tuple[int, str, int]]) -> None:
        """Append items given as (seq, session, tokens); seqs must continue the log."""
        with self._lock:
            for seq, session, tokens in layout:
                if seq < len(self.tokens):
                    continue  # already known (another reader extended first)
                if seq != len(self.tokens):
                    raise StoreError(f"the log changed under the views (expected seq {len(self.tokens)}, "
                                     f"got {seq}); retry the call")
                self.starts.append(self.total_tokens)
                self.sessions.append(session)
                self.tokens.append(tokens)
                self._pack(seq, session, tokens)

    def _pack(self, seq: int, session: str, tokens: int) -> None:
        u_max = self.config.unit_tokens
        if self.units:
            last = self.units[-1]
            if last.session == session and last.tokens + tokens <= u_max:
                self.units[-1] = Unit(last.index, last.first_seq, seq, session,
                                      last.tokens + tokens, False)
                self.unit_of.append(last.index)
                return
            self.units[-1] = Unit(last.index, last.first_seq, last.last_seq, last.session,
                                  last.tokens, True)
        idx = len(self.units)
        self.units.append(Unit(idx, seq, seq, session, tokens, False))
        self.unit_of.append(idx)

    # -- blocks ---------------------------------------------------------------------------

    def blocks_of(self, seq: int) -> tuple[int, ...]:
        """Indices of the blocks holding item ``seq`` (one or two with stride = size/2)."""
        size, stride = self.config.block_tokens, self.config.block_stride
        o = self.starts[seq]
        first = max(0, -(-(o - size + 1) // stride))
        return tuple(range(first, o // stride + 1))

    def n_blocks(self) -> int:
        if not self.tokens:
            return 0
        return self.starts[-1] // self.config.block_stride + 1

    def block(self, b: int) -> Block | None:
        """Block ``b``: items whose start offset lies in [b*stride, b*stride + size)."""
        size, stride = self.config.block_tokens, self.config.block_stride
        lo, hi = b * stride, b * stride + size
        first = bisect.bisect_left(self.starts, lo)
        last = bisect.bisect_left(self.starts, hi) - 1
        if first > last or first >= len(self.starts):
            return None
        return Block(b, first, last, sum(self.tokens[first:last + 1]))

    def units_array(self) -> np.ndarray:
        """``unit_of`` as an array, for mapping many seqs at once. An item's unit never changes
        once assigned, so the array is only extended as the log grows, never rebuilt."""
        arr = self._unit_array
        n = len(self.unit_of)
        if arr.shape[0] < n:
            arr = self._unit_array = np.concatenate(
                [arr, np.asarray(self.unit_of[arr.shape[0]:n], dtype=np.int64)])
        return arr
