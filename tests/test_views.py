"""Units and blocks are derived from items, map back to them, and grow only at the tail."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from suffice import StoreConfig
from suffice._tokens import count_tokens
from suffice._views import ScopeViews, piece_spans


def layout_from(sessions_and_tokens):
    return [(i, s, t) for i, (s, t) in enumerate(sessions_and_tokens)]


log_strategy = st.lists(st.tuples(st.sampled_from(["s1", "s2", "s3"]), st.integers(1, 900)),
                        min_size=1, max_size=120).map(
    lambda xs: sorted(xs, key=lambda x: x[0]))  # sessions arrive in order


@settings(max_examples=150, deadline=None)
@given(log_strategy, st.integers(1, 119))
def test_units_never_cross_sessions_and_extend_like_a_rebuild(log, cut):
    cfg = StoreConfig(unit_tokens=1000)
    whole = ScopeViews(cfg)
    whole.extend(layout_from(log))
    grown = ScopeViews(cfg)
    lay = layout_from(log)
    grown.extend(lay[:cut])
    closed_before = [u for u in grown.units if u.closed]
    grown.extend(lay[cut:])
    assert grown.units == whole.units
    # Units closed earlier are never changed by later appends.
    assert all(u in grown.units for u in closed_before)
    for u in whole.units:
        assert {log[s][0] for s in range(u.first_seq, u.last_seq + 1)} == {u.session}
        # A unit is only over U when it holds one oversized item.
        assert u.tokens <= cfg.unit_tokens or u.first_seq == u.last_seq
    # Every item is in exactly one unit, in order.
    assert whole.unit_of == sorted(whole.unit_of)
    assert len(whole.unit_of) == len(log)


@settings(max_examples=150, deadline=None)
@given(log_strategy)
def test_blocks_overlap_and_every_item_maps_to_a_block_that_holds_it(log):
    cfg = StoreConfig(block_tokens=1024, block_stride=512)
    v = ScopeViews(cfg)
    v.extend(layout_from(log))
    for seq in range(len(log)):
        bs = v.blocks_of(seq)
        assert 1 <= len(bs) <= 2
        for b in bs:
            blk = v.block(b)
            assert blk is not None and blk.first_seq <= seq <= blk.last_seq


def test_pieces_are_verbatim_and_bounded():
    random.seed(3)
    sentences = [" ".join(random.choice(["river", "gauge", "model", "rain", "peak"])
                          for _ in range(random.randint(3, 30))) + "." for _ in range(40)]
    text = " ".join(sentences)
    spans = piece_spans(text, 64)
    assert len(spans) > 1
    assert "".join(text[s:e] for s, e in spans).replace(" ", "") == text.replace(" ", "")
    assert all(count_tokens(text[s:e]) <= 64 for s, e in spans)
    assert piece_spans("short one", 64) == [(0, 9)]


@pytest.mark.parametrize("text", [
    "family photo " + "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466" * 80 + " picnic",
    "Flags: " + "\U0001F1F5\U0001F1F9\U0001F1EF\U0001F1F5\U0001F1EB\U0001F1F7" * 60 + " travel",
    "Cafe\u0301 " * 3 + "e\u0301" * 400,
])
def test_pieces_never_split_what_reads_as_one_character(text):
    """A piece cut inside an emoji sequence, between a flag's halves or before an accent
    shows other characters (two halves of different flags read as other flags)."""
    from suffice._views import _splits_cluster
    spans = piece_spans(text, 64)
    assert "".join(text[a:b] for a, b in spans) == text and len(spans) > 1
    assert not [a for a, _ in spans if 0 < a < len(text) and _splits_cluster(text, a)]

