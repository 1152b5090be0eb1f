"""o200k counts are computed offline and equal tiktoken's own encoding."""

import gzip
import hashlib
from importlib import resources

import pytest

from suffice import _tokens as tokens

TEXT = (
    "Caroline said, \"I went to a LGBTQ support group yesterday!\" 1:56 pm on 8 May, 2023.\n"
    "Ünïcödé, emoji 🎉, code `def f(x): return x**2`, numbers 1234567 and <|endoftext|>."
)


def test_matches_tiktoken_loaded_through_its_own_cache(tmp_path, monkeypatch):
    import tiktoken
    import tiktoken.registry

    url = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
    raw = gzip.decompress(
        resources.files("suffice").joinpath("data/o200k_base.tiktoken.gz").read_bytes())
    (tmp_path / hashlib.sha1(url.encode()).hexdigest()).write_bytes(raw)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    reference = tiktoken.get_encoding("o200k_base")
    assert tokens.encode(TEXT) == reference.encode_ordinary(TEXT)
    assert tokens.count_tokens(TEXT) == len(reference.encode_ordinary(TEXT))


def test_known_ids_and_counts():
    assert tokens.encode("hello world") == [24912, 2375]
    assert tokens.count_tokens("") == 0


@pytest.mark.parametrize("n", [0, 1, 5, 50])
def test_truncate_never_exceeds(n):
    cut = tokens.truncate(TEXT, n)
    assert tokens.count_tokens(cut) <= n
    assert TEXT.startswith(cut) or n == 0


def test_fill_in_order_skips_what_does_not_fit_and_keeps_going() -> None:
    from suffice._tokens import fill_in_order

    assert fill_in_order([4, 7, 3, 2], 9) == [0, 2, 3]  # 7 is skipped, later ones still fit
    assert fill_in_order([4, 7, 3, 2], 0) == []
    assert fill_in_order([], 10) == []
    # min_cost ends the scan once nothing can fit; the answer is the same, only cheaper.
    assert fill_in_order([5, 5, 1], 10, min_cost=1) == [0, 1]
    assert fill_in_order(iter([2, 2, 2]), 5) == [0, 1]
