"""No render ever exceeds its cap: a property test over random stores, queries and budgets.

The stores use a small hashing embedder (bag of words into 64 dimensions) so that hundreds of
stores can be built in seconds; the budget guarantee does not depend on the embedding model.
"""

from __future__ import annotations

from conftest import history_items
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suffice import Memory, NewItem, RenderConfig, StoreConfig
from suffice._config import RenderMode
from suffice._embed.hashing import HashEmbedder
from suffice._tokens import count_tokens

WORDS = ("river flood model rainfall Porto Lisbon cat Figo Kyoto trip sister wedding cake nuts "
         "peanut radar team hire conference budget forecast Douro autumn leaves train Japanese "
         "— é 東京 🙂 \n\n  ,. ! ? ... <|endoftext|> 2025-03-02").split(" ")
MODES: tuple[RenderMode, ...] = ("unit", "piece", "unit+piece", "timeline")


text_st = st.lists(st.sampled_from(WORDS), min_size=1, max_size=120).map(" ".join).filter(
    lambda t: bool(t.strip()))
item_st = st.tuples(text_st, st.sampled_from(["s1", "s2", "s3"]), st.sampled_from(["Ana", "Bo", ""]),
                    st.sampled_from(["", "2025-01-01", "1:56 pm on 8 May, 2023"]))
store_st = st.lists(item_st, min_size=1, max_size=40).map(lambda xs: sorted(xs, key=lambda x: x[1]))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(store=store_st, query=st.lists(st.sampled_from(WORDS), max_size=6).map(" ".join),
       budgets=st.lists(st.integers(0, 2500), min_size=1, max_size=4),
       unit_tokens=st.sampled_from([40, 150, 600]), rho=st.sampled_from([0.0, 0.3, 0.5, 1.0]),
       agent=st.booleans())
def test_no_render_exceeds_its_cap(store: list[tuple[str, str, str, str]], query: str,
                                   budgets: list[int], unit_tokens: int, rho: float,
                                   agent: bool) -> None:
    cfg = StoreConfig(unit_tokens=unit_tokens, piece_max_tokens=16)
    render = RenderConfig(timeline_share=rho, excerpt_tokens=50)
    with Memory(":memory:", store_config=cfg, render=render, embedder=HashEmbedder()) as mem:
        mem.add([NewItem(text=t, session=s, speaker=who, observed_at=at) for t, s, who, at in store],
                scope="x")
        for budget in budgets:
            for mode in MODES:
                ctx = mem.render(query, budget, scope="x", mode=mode, agent=agent)
                assert ctx.tokens == count_tokens(ctx.text) <= int(budget * 0.95)
                assert ctx.text or ctx.notice
                again = mem.render(query, budget, scope="x", mode=mode, agent=agent)
                assert again.text == ctx.text


def test_a_dense_sweep_of_budgets_on_the_real_stack(memory: Memory) -> None:
    """Every budget from 0 to 1500 in steps of 7, every mode, with the MiniLM embeddings."""
    for mode in MODES:
        for budget in range(0, 1500, 7):
            ctx = memory.render("What did Dana say about the Kyoto trip?", budget, scope="dana", mode=mode)
            assert ctx.tokens == count_tokens(ctx.text) <= int(budget * 0.95)


def test_more_budget_never_shows_less_of_the_history(memory: Memory) -> None:
    sizes = [memory.render("rainfall model", b, scope="dana", mode="unit+piece").tokens
             for b in (200, 400, 800, 1600, 3200)]
    assert sizes == sorted(sizes)
    assert len(history_items()) == 30
