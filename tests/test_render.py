"""Budgeted rendering: what a rendered memory holds, in what order, and why."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import history_items

from suffice import BudgetError, ConfigError, EngineConfig, Memory, RenderConfig, RetrievalConfig, StoreConfig
from suffice._route import ScoreRouter, router_tau
from suffice._tokens import count_tokens
from suffice._types import Context

SMALL_UNITS = StoreConfig(unit_tokens=200)
QUERY = "When is the rainfall model due?"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, embedder) -> Memory:  # type: ignore[no-untyped-def]
    """The 30-turn history packed into units of about 200 tokens (five units)."""
    mem = Memory(tmp_path_factory.mktemp("render") / "m.db", store_config=SMALL_UNITS, embedder=embedder)
    mem.add(history_items(), scope="dana")
    return mem


def record_units(ctx: Context) -> list[int]:
    return [p.unit for p in ctx.parts if p.kind == "record" and p.unit is not None]


def level(ctx: Context) -> int:
    """How much detail survived: 4 raw units, 3 excerpts, 2 pieces, 1 timeline only, 0 nothing."""
    kinds = {p.kind for p in ctx.parts}
    for lv, kind in ((4, "raw"), (3, "excerpt"), (2, "piece"), (1, "record")):
        if kind in kinds:
            return lv
    return 0


@pytest.mark.parametrize("mode", ["unit", "piece", "unit+piece", "timeline"])
def test_the_context_reports_its_exact_token_count_within_the_cap(small: Memory, mode: str) -> None:
    for budget in (0, 1, 20, 60, 150, 333, 700, 1500, 5000):
        ctx = small.render(QUERY, budget, scope="dana", mode=mode)  # type: ignore[arg-type]
        assert ctx.tokens == count_tokens(ctx.text)
        assert ctx.cap == int(budget * 0.95) and ctx.tokens <= ctx.cap
        assert ctx.budget == budget and ctx.mode == mode


def test_same_store_query_and_budget_give_the_same_context(small: Memory, embedder) -> None:  # type: ignore[no-untyped-def]
    a = small.render(QUERY, 700, scope="dana", mode="unit+piece")
    b = small.render(QUERY, 700, scope="dana", mode="unit+piece")
    assert (a.text, a.parts) == (b.text, b.parts)
    with Memory(small.path, store_config=SMALL_UNITS, embedder=embedder) as fresh:  # a new process
        c = fresh.render(QUERY, 700, scope="dana", mode="unit+piece")
    assert (c.text, c.parts) == (a.text, a.parts)


def test_a_negative_or_non_integer_budget_is_an_error(small: Memory) -> None:
    with pytest.raises(BudgetError, match="negative"):
        small.render(QUERY, -1, scope="dana")
    with pytest.raises(BudgetError, match="integer"):
        small.render(QUERY, 12.5, scope="dana")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="mode: Input should be .unit"):
        small.render(QUERY, 100, scope="dana", mode="everything")  # type: ignore[arg-type]


@pytest.mark.parametrize(("field", "value"), [("prompt_cap", 0.0), ("piece_unit_boost", float("inf")),
                                           ("piece_unit_boost", float("nan"))])
def test_a_render_setting_that_would_render_nothing_or_rank_by_infinity_is_refused(field, value) -> None:
    with pytest.raises(ConfigError, match=field):
        RenderConfig(**{field: value})


@pytest.mark.parametrize("budget", [0, 1, 10, 30])
def test_a_budget_too_small_for_anything_gives_an_empty_context_that_says_so(small: Memory,
                                                                             budget: int) -> None:
    ctx = small.render(QUERY, budget, scope="dana")
    assert ctx.empty and ctx.tokens == 0 and ctx.parts == ()
    assert "nothing rendered" in ctx.notice


def test_detail_degrades_raw_then_excerpt_then_pieces_then_timeline_only(small: Memory) -> None:
    # Whole unit when it fits, else an excerpt: never more detail on a smaller budget.
    cfg = RenderConfig(excerpt_tokens=60, raw_first=True)
    levels = [level(small.render(QUERY, b, scope="dana", render=cfg.replace(mode="unit+piece")))
              for b in range(1200, -1, -10)]
    assert levels == sorted(levels, reverse=True)
    assert set(levels) == {4, 3, 2, 1, 0}


def test_excerpts_first_degrade_in_the_same_order_of_stages(small: Memory) -> None:
    # Excerpts first, widened to whole units while they fit (the default): at middle budgets a
    # unit may be whole or an excerpt, but the stages still come in order as the budget shrinks.
    cfg = RenderConfig(excerpt_tokens=60)
    levels = [level(small.render(QUERY, b, scope="dana", render=cfg.replace(mode="unit+piece")))
              for b in range(1200, -1, -10)]
    first_seen = list(dict.fromkeys(levels))
    assert first_seen == [4, 3, 2, 1, 0]
    below = levels[levels.index(2):]
    assert below == sorted(below, reverse=True) and max(below) == 2  # no unit comes back


def test_records_and_detail_are_shown_in_chronological_order(small: Memory) -> None:
    ctx = small.render(QUERY, 900, scope="dana", mode="unit+piece")
    units = record_units(ctx)
    assert units == sorted(units) and len(units) == len(set(units))
    items = {it.seq: it for it in small.items(scope="dana")}
    shown = sorted({q for p in ctx.parts if p.kind in ("raw", "excerpt", "piece") for q in p.seqs})
    lines = ctx.text.splitlines()
    where = [next(i for i, ln in enumerate(lines) if items[q].text in ln) for q in shown]
    assert len(shown) > 3 and where == sorted(where)
    # Each detail line sits under the record header of its own unit.
    unit_of = small.retriever.index("dana").views.unit_of
    headers = [i for i, ln in enumerate(lines) if ln.startswith("# [")]
    for q, i in zip(shown, where, strict=True):
        above = max(h for h in headers if h < i)
        assert units[headers.index(above)] == unit_of[q]


def test_item_lines_do_not_repeat_the_time_their_record_header_states(small: Memory) -> None:
    ctx = small.render(QUERY, 900, scope="dana", mode="unit")
    assert re.search(r"^# \[2025-09-15\] ", ctx.text, flags=re.M)
    assert re.search(r"^Dana: The Lisbon conference went well", ctx.text, flags=re.M)
    cfg = RenderConfig(repeat_time=True)
    ctx = small.render(QUERY, 900, scope="dana", render=cfg.replace(mode="unit"))
    assert re.search(r"^\[2025-09-15\] Dana: The Lisbon conference went well", ctx.text, flags=re.M)


def test_every_part_says_why_it_is_there(small: Memory) -> None:
    ctx = small.render(QUERY, 900, scope="dana", mode="unit+piece")
    reasons = {p.kind: p.reason for p in ctx.parts}
    assert reasons["record"] in ("timeline", "header of recovered detail")
    detail = [p for p in ctx.parts if p.kind in ("raw", "excerpt", "piece")]
    assert detail
    for p in detail:
        assert re.match(r"seed \d\.\d\d|link \((previous|next|similar)\) from unit \d+"
                        r"|\d+ piece\(s\), best piece score", p.reason), p.reason
        assert p.seqs and p.tokens > 0 and p.unit is not None


def test_each_part_is_charged_its_own_lines_so_the_parts_add_up(small: Memory, tmp_path: Path,
                                                                  embedder) -> None:  # type: ignore[no-untyped-def]
    one = Memory(tmp_path / "one.db", embedder=embedder)  # a unit whose header is shorter than its record
    one.add([{"text": "ran the tests: 3 failures in test_io.py", "kind": "observation"}], scope="run")
    cases = [(one, "run", "which tests failed", m) for m in ("piece", "unit+piece")]
    cases += [(small, "dana", QUERY, m) for m in ("unit", "piece", "unit+piece", "timeline")]
    for mem, scope, query, mode in cases:
        for budget in (60, 150, 333, 700, 1500):
            ctx = mem.render(query, budget, scope=scope, mode=mode)  # type: ignore[arg-type]
            assert all(p.tokens >= 0 for p in ctx.parts), (mode, budget, ctx.parts)
            assert abs(sum(p.tokens for p in ctx.parts) - ctx.tokens) <= 0.1 * ctx.tokens + 3, (mode, budget)


def test_piece_recovery_brings_back_the_matching_turn_verbatim(small: Memory) -> None:
    ctx = small.render("peanut allergy dessert", 200, scope="dana", mode="piece")
    assert "It has no nuts at all, so it is safe with your peanut allergy." in ctx.text


def test_unit_recovery_shows_an_excerpt_around_the_best_piece_when_the_unit_does_not_fit(
        small: Memory) -> None:
    cfg = RenderConfig(excerpt_tokens=60, timeline_share=0.0, raw_first=True)
    ctx = small.render("Who is getting married in October?", 140, scope="dana",
                       render=cfg.replace(mode="unit"))
    kinds = [p.kind for p in ctx.parts if p.kind != "record"]
    assert kinds == ["excerpt"]
    assert "Leo's sister is getting married in October" in ctx.text


def test_the_timeline_mode_shows_records_only(small: Memory) -> None:
    ctx = small.render(QUERY, 2000, scope="dana", mode="timeline")
    assert {p.kind for p in ctx.parts} == {"record"}
    assert all(line.startswith("# [") for line in ctx.text.splitlines())
    # All five units fit: four stored records and the open unit's record, made on the fly.
    assert record_units(ctx) == [0, 1, 2, 3, 4] and len(small.store.records("dana")) == 4


def test_a_timeline_that_does_not_fit_keeps_the_seeds_and_marks_the_gaps(small: Memory) -> None:
    ctx = small.render(QUERY, 110, scope="dana", mode="timeline")
    assert 0 < len(record_units(ctx)) < 5
    assert re.search(r"^… \d+ records? omitted$", ctx.text, flags=re.M)


def test_unused_timeline_tokens_pass_on_to_detail(small: Memory) -> None:
    # rho = 0.9 reserves most of the budget for a timeline that needs far less.
    cfg = RenderConfig(timeline_share=0.9)
    ctx = small.render(QUERY, 1500, scope="dana", render=cfg.replace(mode="unit"))
    detail = sum(p.tokens for p in ctx.parts if p.kind in ("raw", "excerpt"))
    assert detail > 0.1 * ctx.cap


def test_agent_mode_keeps_the_newest_items_verbatim_at_the_end(small: Memory) -> None:
    budget = 800
    ctx = small.render("What should Dana do next?", budget, scope="dana", agent=True)
    recent = [p for p in ctx.parts if p.kind == "recent"]
    assert recent and all(p.reason == "recency" for p in recent)
    assert sum(p.tokens for p in recent) <= 0.25 * budget
    newest = small.items(scope="dana")[-1]
    assert ctx.text.endswith(newest.render())
    seqs = [p.seqs[0] for p in recent]
    assert seqs == list(range(seqs[0], newest.seq + 1))  # a contiguous run up to the newest
    # Items of the window are not repeated in the rendered memory above it.
    assert ctx.text.count(newest.render()) == 1


def test_the_cli_prints_the_context_with_its_token_accounting(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from suffice import _cli as cli

    db = tmp_path / "cli.db"
    with Memory(db, embedder=embedder) as mem:
        mem.add(history_items(), scope="dana")
    result = CliRunner().invoke(cli.app, ["render", QUERY, "--db", str(db), "--scope", "dana",
                                          "--budget", "300", "--mode", "piece"])
    assert result.exit_code == 0, result.output
    assert "tokens of cap 285 (budget 300)" in result.output


def test_on_a_large_scope_dense_scoring_looks_only_inside_the_best_units(small: Memory) -> None:
    # dense_scan_items=10: the 30 items are "many", so item vectors are scored only in the units
    # whose vectors are closest to the query; the matching turn is still found.
    ctx = small.render("peanut allergy dessert", 200, scope="dana", mode="piece",
                       retrieval=RetrievalConfig(dense_scan_items=10))
    assert "It has no nuts at all, so it is safe with your peanut allergy." in ctx.text
    assert ctx.tokens <= ctx.cap


def test_a_partly_shown_item_marks_every_cut_with_an_ellipsis() -> None:
    from suffice._render import _Lines, _ScopeCache
    from suffice._types import Item

    item = Item("a", "s", 0, "s1", "Ana", "", "message", "May", "One. Two. Three. Four.", {}, 8)
    lines = _Lines(_ScopeCache(None))  # type: ignore[arg-type]
    lines.items[0] = item
    lines.pieces[0] = [(0, 0, 5), (1, 5, 10), (2, 10, 17), (3, 17, 22)]
    assert lines.line(0, {0, 1}) == "[May] Ana: One. Two. …"
    assert lines.line(0, {1, 3}) == "[May] Ana: … Two. … Four."
    assert lines.line(0, {0, 1, 2, 3}) == item.render()


def test_every_knob_is_a_setting_with_the_papers_defaults_for_chat_and_agents() -> None:
    store, render, engine = StoreConfig(), RenderConfig(), EngineConfig()
    assert ((store.unit_tokens, render.timeline_share, render.link_discount, render.seeds)
            == (2000, 0.3, 0.5, 10))
    assert ((render.excerpt_tokens, render.prompt_cap, render.recent_share, render.mode)
            == (300, 0.95, 0.25, "piece"))
    agent_store, agent = StoreConfig.for_agent(), RenderConfig.for_agent()
    assert ((agent_store.unit_tokens, agent.timeline_share, agent.link_discount, agent.seeds)
            == (1000, 0.5, 0.9, 10))
    assert (agent.recent_share, agent.mode) == (0.25, "unit")
    assert (engine.tau, engine.anchor_blocks, engine.max_blocks, engine.reader_budget) == (None, 2, 4, 1000)
    assert router_tau(ScoreRouter()) == 0.5  # tau None: the router's own threshold, else 0.5
    with pytest.raises(ConfigError, match="mode"):
        RenderConfig(mode="everything")  # type: ignore[arg-type]


def test_a_huge_item_renders_and_searches_in_bounded_work(tmp_path: Path, embedder, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import random

    import suffice._render as render_module
    rnd = random.Random(1)
    words = "river gauge flood model rainfall forecast station weekend trip conference tea".split()
    sentences = [" ".join(rnd.choice(words) for _ in range(rnd.randint(6, 18))).capitalize() + "."
                 for _ in range(12_000)]
    sentences[7_000] = "Dana finally bought the red kayak for the wedding in October."
    text = " ".join(sentences)  # ~1 MB, thousands of pieces
    with Memory(tmp_path / "big.db", embedder=embedder) as mem:
        mem.add(text, scope="b")
        calls = {"n": 0}
        counting = render_module.count_tokens

        def counted(s: str) -> int:
            calls["n"] += 1
            return counting(s)
        monkeypatch.setattr(render_module, "count_tokens", counted)
        ctx = mem.render("red kayak wedding October", 500, scope="b")
        assert "Dana finally bought the red kayak for the wedding in October." in ctx.text
        assert ctx.tokens <= ctx.cap and calls["n"] < 500  # not once per piece of the item
        ev = mem.search("red kayak wedding", scope="b")
        assert ev.hits[0].item.text == text  # the hit carries the whole item...
        assert "red kayak" in ev.text and len(ev.text) < 2_000  # ...the evidence context its best piece


@pytest.mark.parametrize("mode", ["timeline", "unit", "piece"])
def test_a_render_as_of_a_seq_shows_nothing_said_after_it(tmp_path: Path, mode: str) -> None:
    """A unit that runs past the "as of" seq (an agent's checkpoint) is recorded from its
    earlier items only: its stored record may quote the later ones."""
    from suffice import HashEmbedder
    from suffice._types import Filter
    mem = Memory(tmp_path / "m.db", embedder=HashEmbedder(), store_config=StoreConfig(unit_tokens=2000))
    mem.add([{"text": f"agent opened drawer {i}", "meta": {"step": i}, "speaker": "agent"} for i in range(5)]
            + [{"text": "later the password turned out to be swordfish", "meta": {"step": 5},
                "speaker": "agent"}], scope="s")
    ctx = mem.renderer.render("s", "drawer", 2000, config=RenderConfig(mode=mode),
                              retrieval=RetrievalConfig(), flt=Filter(before_seq=5))
    assert "drawer" in ctx.text and "swordfish" not in ctx.text and "steps 0-5" not in ctx.text
    mem.close()


def test_dropping_a_part_to_fit_never_hides_what_a_kept_part_shows(tmp_path: Path) -> None:
    """A unit recovered whole claims the step a step part shows; when the cap forces the
    recovered unit out, the step's line stays (it vanished while its part stayed on the receipt)."""
    from suffice import HashEmbedder
    mem = Memory(tmp_path / "m.db", embedder=HashEmbedder())
    mem.add([{"text": f"ㅋㅋ drawer {i} opened, rain {i}", "meta": {"step": i}, "speaker": "agent"}
             for i in range(400)], scope="s")
    for budget in (3624, 3705, 3822):  # where an undercount of the whole units forced a drop
        ctx = mem.render("what happened at step 5", budget, scope="s",
                         render=RenderConfig(mode="unit", timeline_share=0.0))
        assert "[step 5] agent: ㅋㅋ drawer 5 opened" in ctx.text
        assert any(p.reason.startswith("step") for p in ctx.parts)
    mem.close()


def test_items_a_forget_renumbered_mid_render_are_the_retryable_store_error(tmp_path, monkeypatch):
    """A render racing a forget in its scope failed with a KeyError (a 500 on the server)."""
    from suffice import Memory, StoreError

    with Memory(tmp_path / "m.db", embedder=None) as mem:
        mem.add([f"alpha beta note {i}" for i in range(40)], scope="s")
        real = mem.store.items

        def renumbered(scope, seqs=None, **kw):  # type: ignore[no-untyped-def]
            got = real(scope, seqs, **kw)
            return got[:-1]  # the last one asked for moved down: a forget took an earlier item

        monkeypatch.setattr(mem.store, "items", renumbered)
        with pytest.raises(StoreError, match="run the query again"):
            mem.render("alpha beta", 400, scope="s")
