"""o200k_base token counts, offline.

tiktoken normally downloads its BPE file; we ship the file inside the package and check it
against the sha256 tiktoken itself pins for o200k_base, so counts match tiktoken exactly and
nothing is fetched at run time.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterable
from functools import lru_cache
from importlib import resources

import tiktoken
from tiktoken.load import load_tiktoken_bpe

from ._errors import ModelFileError

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
"""sha256 of the decompressed o200k_base.tiktoken, the value tiktoken pins."""

_lock = threading.Lock()


@lru_cache(maxsize=1)
def encoding() -> tiktoken.Encoding:
    """The o200k_base encoding, built from the vendored BPE file."""
    import hashlib
    import os
    import tempfile

    import tiktoken_ext.openai_public as openai_public

    with _lock:
        data = resources.files("suffice").joinpath("data/o200k_base.tiktoken.gz")
        raw = gzip.decompress(data.read_bytes())
        if hashlib.sha256(raw).hexdigest() != O200K_SHA256:
            raise ModelFileError("the shipped o200k_base BPE file does not match its pinned sha256")
        fd, path = tempfile.mkstemp(suffix=".tiktoken")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(raw)
            ranks = load_tiktoken_bpe(path, expected_hash=O200K_SHA256)
        finally:
            os.unlink(path)

        # tiktoken's own constructor knows the split pattern and special tokens but would fetch
        # the BPE file from the network; hand it the ranks we just loaded and checked instead.
        def _local_loader(_url: str, expected_hash: str | None = None) -> dict[bytes, int]:
            if expected_hash not in (None, O200K_SHA256):
                raise ModelFileError("unexpected o200k_base hash requested")
            return ranks

        original = openai_public.load_tiktoken_bpe
        openai_public.load_tiktoken_bpe = _local_loader
        try:
            spec = openai_public.o200k_base()
        finally:
            openai_public.load_tiktoken_bpe = original
        return tiktoken.Encoding(**spec)


def encode(text: str) -> list[int]:
    """Token ids of ``text``; special-token strings are treated as plain text."""
    return encoding().encode_ordinary(text)


def count_tokens(text: str) -> int:
    """Number of o200k tokens in ``text``."""
    if not text:
        return 0
    return len(encoding().encode_ordinary(text))


def count_many(texts: list[str]) -> list[int]:
    return [len(ids) for ids in encoding().encode_ordinary_batch(texts, num_threads=1)]


def truncate(text: str, max_tokens: int) -> str:
    """The longest prefix of ``text`` with at most ``max_tokens`` tokens, cut on a token edge."""
    if max_tokens <= 0:
        return ""
    ids = encode(text)
    if len(ids) <= max_tokens:
        return text
    # Cut on a character edge too: a token boundary can fall inside a UTF-8 character.
    return encoding().decode_bytes(ids[:max_tokens]).decode("utf-8", "ignore")


def cut_middle(text: str, max_tokens: int, marker: str) -> str:
    """``text`` within about ``max_tokens``: its head and its tail, ``marker`` between them
    (the ends of a long message say the most: what is asked, and how a log or output ends)."""
    ids = encode(text)
    if len(ids) <= max_tokens:
        return text
    keep = max(max_tokens - count_tokens(marker) - 2, 0)
    head, tail = ids[: keep - keep // 2], ids[len(ids) - keep // 2:] if keep // 2 else []
    dec = encoding()
    return (dec.decode_bytes(head).decode("utf-8", "ignore") + "\n" + marker + "\n"
            + dec.decode_bytes(tail).decode("utf-8", "ignore"))


def fill_in_order(costs: Iterable[int], budget: int, *, min_cost: int = 0) -> list[int]:
    """Indices of ``costs`` taken in order while they fit within ``budget``.

    The baseline packing every context builder compares against: an entry too large for what
    is left is skipped, not a stop. With ``min_cost`` (the smallest cost that can appear) the
    scan ends as soon as nothing more can fit, which matters for rankings of a whole scope.
    """
    taken: list[int] = []
    used = 0
    for i, c in enumerate(costs):
        if used + c <= budget:
            taken.append(i)
            used += c
            if budget - used < min_cost:
                break
    return taken
