"""Progressive execution: fast stops after the prefix, deep reads blocks concurrently,
auto follows the router, and every receipt adds up."""

import pytest
from conftest import history_items

from suffice import EngineConfig, InvalidInputError, InvalidQueryError, Memory, ProviderError, StoreConfig
from suffice._deep import choose_blocks
from suffice._engine import split_aggregate
from suffice._llm import Price, ScriptedLLM
from suffice._route import LMRouter, ScoreRouter
from suffice._types import Item


def reader(delay_s: float = 0.0) -> ScriptedLLM:
    """Answers like a reader, a block agent or an aggregator depending on the prompt."""

    def respond(messages):
        system = messages[0]["content"]
        if "reading one excerpt" in system:
            return "[2025-04-11] Dana: We adopted a grey cat from the shelter last weekend. Her name is Figo."
        if "combine notes" in system:
            return "CONFLICTS: none\n<answer>Figo</answer>"
        return "<answer>Figo</answer>"

    return ScriptedLLM(respond, delay_s=delay_s, price=Price(1.0, 2.0))


def test_fast_path_reads_the_budgeted_render_by_default(memory):
    llm = reader()
    ans = memory.ask(
        llm=llm, question="What is the name of Dana's cat?", scope="dana", mode="fast", budget=300
    )
    r = ans.receipt
    assert ans.text == "Figo" and r.path == "fast"
    assert 0 < r.context_tokens <= int(0.95 * 300)
    assert "Figo" in llm.calls[0][1]["content"]
    assert any(p.kind in ("raw", "excerpt", "piece") for p in r.parts)


def test_an_agents_run_is_read_with_the_trajectory_prompt_and_a_chat_with_the_chat_one(memory, tmp_path):
    from suffice import NewItem
    from suffice._embed.hashing import HashEmbedder
    run = Memory(tmp_path / "run.db", embedder=HashEmbedder())
    run.add([NewItem("ls src/", kind="action", meta={"step": 1}),
             NewItem("main.py util.py", kind="observation", meta={"step": 1}),
             NewItem("cat util.py", kind="action", meta={"step": 2})], scope="r")
    for mem, scope, wanted in ((run, "r", "earlier run of an AI agent"), (memory, "dana", "conversations")):
        llm = reader()
        mem.ask(llm=llm, question="Which files did the listing show?", scope=scope, mode="fast", budget=300)
        assert wanted in llm.calls[0][0]["content"]
    run.close()


@pytest.mark.parametrize("mode", ["fast", "deep"])
def test_a_request_gets_room_for_a_few_sentences_and_a_question_a_phrase(memory, mode):
    caps: list[int] = []

    class Capturing(ScriptedLLM):
        def chat(self, messages, **kw):  # type: ignore[no-untyped-def]
            caps.append(kw["max_tokens"])
            return super().chat(messages, **kw)

    llm = Capturing("<answer>ok</answer>")
    memory.ask("Can you help me plan a vet visit for my cat?", scope="dana", llm=llm, mode=mode)
    memory.ask("What is the name of Dana's cat?", scope="dana", llm=llm, mode=mode)
    config = EngineConfig()
    assert caps == [config.request_max_tokens, config.answer_max_tokens]
    assert config.request_max_tokens > config.answer_max_tokens


def test_fast_path_answers_from_the_prefix_with_one_call(memory):
    ans = memory.ask(
        llm=reader(),
        engine=EngineConfig(context="prefix"),
        question="What is the name of Dana's cat?",
        scope="dana",
        mode="fast",
    )
    r = ans.receipt
    assert ans.text == "Figo"
    assert r.path == "fast" and len(r.calls) == 1 and r.calls[0].stage == "answer"
    assert r.hits and r.context_tokens > 0 and r.parts
    assert all(p.reason.startswith("prefix rank") for p in r.parts)


AGENTS = EngineConfig(deep_agents=True)
"""The block-agent lever, off by default (see EngineConfig.deep_agents), on for these tests."""


def test_deep_path_reads_blocks_and_aggregates(memory):
    ans = memory.ask("What is the name of Dana's cat?", scope="dana", llm=reader(), mode="deep",
                     engine=AGENTS)
    r = ans.receipt
    assert ans.text == "Figo" and r.path == "deep"
    assert r.blocks and all(b.ok for b in r.blocks)
    stages = [c.stage for c in r.calls]
    assert stages.count("block_agent") == len(r.blocks) and stages[-1] == "aggregate"
    assert any(b.why.startswith("anchor") for b in r.blocks)


@pytest.mark.parametrize("mode", ["fast", "deep"])
def test_receipts_add_up(memory, mode):
    r = memory.ask(llm=reader(), question="When is the Kyoto trip?", scope="dana", mode=mode).receipt
    assert sum(r.stages_ms.values()) <= r.t_e2e_ms
    assert r.t_mem_ms <= r.t_e2e_ms
    assert r.cost_usd == pytest.approx(sum(c.cost_usd for c in r.calls))
    assert r.cost_usd == pytest.approx(sum(r.cost_by_stage().values()))
    assert r.cost_usd > 0
    # T_mem is every stage but the one that writes the answer, on either path.
    writer = "answer" if r.path == "fast" else "aggregate"
    assert r.t_mem_ms == pytest.approx(sum(v for k, v in r.stages_ms.items() if k != writer))
    # Each block's agent calls are on its receipt, and together they are the agent stage.
    agent_calls = [c for c in r.calls if c.stage == "block_agent"]
    assert sum(b.calls for b in r.blocks) == len(agent_calls)
    assert sum(b.cost_usd for b in r.blocks) == pytest.approx(sum(c.cost_usd for c in agent_calls))
    assert sum(b.input_tokens for b in r.blocks) == sum(c.input_tokens for c in agent_calls)
    assert parts_account_for(r)


def parts_account_for(r) -> bool:  # type: ignore[no-untyped-def]
    """The parts account for the context the reader saw: none negative, and their sum within
    a newline a line of the exact count (ContextPart.tokens)."""
    total = sum(p.tokens for p in r.parts)
    return all(p.tokens >= 0 for p in r.parts) and abs(total - r.context_tokens) <= 0.1 * r.context_tokens + 5


def _note(block, lines):
    from suffice._deep import AgentNote

    return AgentNote(block, 10 * block, 10 * block + 9, "\n".join(lines), "", True, 1.0)


def test_notes_share_the_budget_and_keep_whole_lines():
    from suffice._deep import notes_text
    from suffice._tokens import count_tokens

    old = _note(0, [f"old line {i} about the first trip to Kyoto in spring" for i in range(12)])
    new = _note(1, [f"new line {i} about the second trip to Osaka in autumn" for i in range(12)])
    short = _note(2, ["Figo is the cat."])
    text, used = notes_text([old, new, short], 120)
    assert count_tokens(text) <= 120
    lines = text.splitlines()
    assert all(ln in old.notes or ln in new.notes or ln in short.notes for ln in lines)  # never cut
    olds = [ln for ln in lines if ln.startswith("old")]
    news = [ln for ln in lines if ln.startswith("new")]
    assert "Figo is the cat." in lines and abs(len(olds) - len(news)) <= 1  # every block heard
    assert lines == olds + news + ["Figo is the cat."]  # time order kept
    assert [ln for b in sorted(used) for ln in used[b]] == lines
    # Under budget: everything, repeated lines once.
    text, _ = notes_text([short, _note(3, ["Figo is the cat.", "Dana lives in Kyoto."])], 1000)
    assert text.splitlines() == ["Figo is the cat.", "Dana lives in Kyoto."]


def test_a_line_shared_by_overlapping_blocks_survives_a_tight_budget():
    from suffice._deep import notes_text
    from suffice._tokens import count_tokens

    shared = "Dana: we fly to Kyoto on the 3rd."
    a = _note(0, ["Dana: the cat is called Figo.", "Dana: I started a new job.", shared])
    b = _note(1, [shared, "Dana: the flight was delayed."])
    fits = (a.notes.splitlines()[0], shared, "Dana: the flight was delayed.")
    budget = sum(count_tokens(x) + 1 for x in fits)
    text, kept = notes_text([a, b], budget)
    assert shared in text.splitlines() and text.count(shared) == 1
    assert sum(shared in lines for lines in kept.values()) == 1  # credited to one block only


def test_a_long_note_line_does_not_block_the_others():
    from suffice._deep import notes_text

    long = _note(0, ["word " * 300])
    text, used = notes_text([long, _note(1, ["Figo is the cat."])], 50)
    assert text == "Figo is the cat." and list(used) == [1]
    assert notes_text([long], 50) == ("", {})


def test_auto_stops_early_when_the_router_says_enough(memory):
    llm = reader()
    llm_router = ScriptedLLM("unused", probs={"yes": 0.9, "no": 0.1})
    router = LMRouter(llm_router)
    r = memory.ask(
        "What is the name of Dana's cat?", scope="dana", llm=llm, router=router, mode="auto", tau=0.5
    ).receipt
    assert r.path == "fast" and r.router_score == pytest.approx(0.9) and r.tau == 0.5
    r = memory.ask(
        "What is the name of Dana's cat?", scope="dana", llm=llm, router=router, mode="auto", tau=0.95
    ).receipt
    assert r.path == "deep"


def test_evidence_over_the_router_budget_goes_deep_and_says_why(memory):
    router = LMRouter(ScriptedLLM("x", probs={"yes": 1.0}), input_budget=5)
    r = memory.ask("Kyoto trip", scope="dana", llm=reader(), router=router, mode="auto").receipt
    assert r.path == "deep"
    assert any("exceeds the router's input budget" in n for n in r.notes)
    # The engine enforces the budget for every router, not only routers that check it.
    r = memory.ask(
        llm=reader(),
        router=ScoreRouter(input_budget=5),
        question="Kyoto trip",
        scope="dana",
        mode="auto",
        tau=0.0,
    ).receipt
    assert r.path == "deep" and any("input budget" in n for n in r.notes)


@pytest.mark.parametrize("bad", [float("nan"), 1.5, -0.1])
def test_a_router_score_outside_0_1_sends_the_query_deep(memory, bad):
    from suffice._route import RouterDecision

    class Odd:
        name, input_budget = "odd", 10_000

        def score(self, inp, *, ledger=None, deadline=None):
            return RouterDecision(bad, "odd", 0.0)

    r = memory.ask(llm=reader(), router=Odd(), question="Kyoto trip", scope="dana", mode="auto").receipt
    assert r.path == "deep" and any("not a score in [0, 1]" in n for n in r.notes)
    assert r.router_score is None  # no score was given: none is shown (0.0 read as a real one)


def test_a_crashing_router_sends_the_query_deep(memory):
    class Broken:
        name, input_budget = "broken", 10_000

        def score(self, inp, *, ledger=None, deadline=None):
            raise KeyError("feature")

    r = memory.ask(llm=reader(), router=Broken(), question="Kyoto trip", scope="dana", mode="auto").receipt
    assert r.path == "deep" and any("router broken failed (KeyError" in n for n in r.notes)
    assert r.router_score is None and r.router == "broken"


def test_score_router_is_a_probability_with_reasons(memory):
    from suffice._route import RouterInput

    ev = memory.search("What is the name of Dana's cat?", scope="dana")
    d = ScoreRouter().score(RouterInput.of_evidence("What is the name of Dana's cat?", ev))
    assert 0.0 <= d.score <= 1.0 and "coverage" in d.reason


def test_auto_without_a_router_uses_the_retrieval_signal_router(memory):
    r = memory.ask(
        llm=reader(), question="What is the name of Dana's cat?", scope="dana", mode="auto"
    ).receipt
    assert r.router == "retrieval-signals" and r.router_score is not None
    assert r.path == ("fast" if r.router_score >= r.tau else "deep")


def test_an_unknown_mode_is_a_bad_argument_and_so_a_value_error(memory):
    with pytest.raises(InvalidInputError, match="unknown mode 'quick'") as err:
        memory.ask(llm=reader(), question="x y", scope="dana", mode="quick")  # type: ignore[arg-type]
    assert isinstance(err.value, ValueError)


@pytest.fixture
def small_blocks(tmp_path, embedder):
    mem = Memory(
        tmp_path / "b.db", embedder=embedder, store_config=StoreConfig(block_tokens=128, block_stride=64)
    )
    mem.add(history_items(), scope="dana")
    yield mem
    mem.close()


def test_agents_run_concurrently(small_blocks):
    slow = reader(delay_s=0.4)
    config = EngineConfig(anchor_blocks=4, max_blocks=4, concurrency=4, deep_agents=True)
    r = small_blocks.ask(
        "Dana cat Kyoto rainfall model conference", scope="dana", llm=slow, mode="deep", engine=config
    ).receipt
    agent_calls = [c for c in r.calls if c.stage == "block_agent"]
    assert len(agent_calls) == 4
    assert sum(c.latency_ms for c in agent_calls) >= 1500
    assert r.stages_ms["agents"] < 0.6 * sum(c.latency_ms for c in agent_calls)


def test_a_failing_reader_degrades_and_says_so(memory):
    broken = ScriptedLLM([ProviderError("connection refused", endpoint="http://127.0.0.1:9")] * 3)
    ans = memory.ask(llm=broken, question="What is the name of Dana's cat?", scope="dana", mode="fast")
    assert ans.receipt.degraded
    assert any("answer call failed" in n for n in ans.receipt.notes)
    assert ans.text  # the top evidence stands in for the answer


def test_failing_block_agents_fall_back_to_the_fast_path(memory):
    def respond(messages):
        if "reading one excerpt" in messages[0]["content"]:
            raise ProviderError("HTTP 500", endpoint="x", status=500)
        return "<answer>Figo</answer>"

    narrow = EngineConfig(deep_agents=True, deep_scale=1.0)  # no wider evidence to fall back on
    ans = memory.ask(llm=ScriptedLLM(respond), question="cat name?", scope="dana", mode="deep",
                     engine=narrow)
    r = ans.receipt
    assert ans.text == "Figo" and r.path == "fast" and r.degraded
    assert any("agent failed" in n for n in r.notes)
    assert sum(r.stages_ms.values()) <= r.t_e2e_ms
    # The blocks that were tried stay on the receipt, each with its failure.
    assert r.blocks and all(not b.ok and "HTTP 500" in b.error for b in r.blocks)
    assert sum(c.stage == "block_agent" for c in r.calls) == len(r.blocks)


def test_blocks_are_anchors_plus_neighbours_capped(small_blocks):
    ev = small_blocks.search("Kyoto trip November", scope="dana", k=10)
    views = small_blocks.retriever.index("dana").views
    chosen = choose_blocks(ev.hits, views, EngineConfig(anchor_blocks=2, max_blocks=4))
    assert 1 <= len(chosen) <= 4
    assert [c.block.index for c in chosen] == sorted(c.block.index for c in chosen)
    assert sum(c.why.startswith("anchor") for c in chosen) <= 2


def test_llm_aggregator_flags_conflicts(memory):
    def respond(messages):
        system = messages[0]["content"]
        if "reading one excerpt" in system:
            return "[2025-05-20] Dana: Big news: Leo and I are planning a trip to Kyoto in October"
        if "combine notes" in system:
            return "CONFLICTS: October became November\n<answer>November</answer>"
        return "<answer>October</answer>"

    ans = memory.ask(
        "When is the Kyoto trip?",
        scope="dana",
        llm=ScriptedLLM(respond),
        mode="deep",
        engine=EngineConfig(aggregator="llm", deep_agents=True),
    )
    assert ans.text == "November"
    assert any("October became November" in n for n in ans.receipt.notes)


def _items(*texts: str) -> list[Item]:
    return [
        Item(f"i{n}", "s", n, "s1", "Dana", "user", "message", "2025-04-11", t, {}, 10)
        for n, t in enumerate(texts)
    ]


def test_agent_notes_quote_the_items_they_were_copied_from():
    from suffice._deep import cited_items

    items = _items("Work was long today.", "We adopted a grey cat from the shelter. Her name is Figo.")
    out = "- [2025-04-11] Dana: Her name is Figo.\nYou help answer a question about a long history\nNONE"
    assert cited_items(out, items, "What is the cat called?", 0.7) == [items[1]]


def test_the_deep_receipt_names_the_items_the_notes_quote(memory):
    r = memory.ask(
        llm=reader(), question="What is the name of Dana's cat?", scope="dana", mode="deep", engine=AGENTS
    ).receipt
    figo = [it.seq for it in memory.items(scope="dana") if "Her name is Figo" in it.text]
    notes = [p for p in r.parts if p.reason.startswith("notes of block")]
    assert notes and all(p.seqs == tuple(figo) for p in notes)


def test_a_line_that_restates_the_question_with_a_guess_is_not_a_note():
    from suffice._deep import cited_items

    items = _items("My grandma gave me this necklace in my home country, Sweden.")
    guesses = "Dana's grandma is from Canada.\nThe country Dana's grandma is from is the United States."
    assert cited_items(guesses, items, "What country is Dana's grandma from?", 0.7) == []
    assert cited_items("my home country, Sweden", items, "What country is Dana's grandma from?", 0.7) == items
    # A copied date and speaker do not make a guess a quote: every turn of the day has them.
    assert (
        cited_items(
            "[2025-04-11] Dana: Dana's grandma is from Canada.",
            items,
            "What country is Dana's grandma from?",
            0.7,
        )
        == []
    )


def test_llm_aggregator_receipt_adds_up(memory):
    def respond(messages):
        if "reading one excerpt" in messages[0]["content"]:
            return "[2025-04-11] Dana: We adopted a grey cat from the shelter last weekend. Her name is Figo."
        return "CONFLICTS: none\n<answer>Figo</answer>"

    r = memory.ask(
        llm=ScriptedLLM(respond),
        engine=EngineConfig(aggregator="llm"),
        question="What is the name of Dana's cat?",
        scope="dana",
        mode="deep",
    ).receipt
    assert r.path == "deep" and r.parts
    assert parts_account_for(r)
    assert r.t_mem_ms == pytest.approx(sum(v for k, v in r.stages_ms.items() if k != "aggregate"))


def test_a_failed_aggregation_counts_as_memory_work(memory):
    calls = {"n": 0}

    def respond(messages):
        if "reading one excerpt" in messages[0]["content"]:
            return "[2025-04-11] Dana: We adopted a grey cat from the shelter last weekend. Her name is Figo."
        calls["n"] += 1
        if calls["n"] == 1:  # the deep path's answer call
            raise ProviderError("HTTP 500", endpoint="x", status=500)
        return "<answer>Figo</answer>"

    r = memory.ask(
        llm=ScriptedLLM(respond), question="What is the name of Dana's cat?", scope="dana", mode="deep"
    ).receipt
    assert r.path == "fast" and r.degraded and "aggregate" in r.stages_ms
    assert r.t_mem_ms == pytest.approx(sum(v for k, v in r.stages_ms.items() if k != "answer"))


def test_aggregate_parsing_is_lenient():
    assert split_aggregate("CONFLICTS: none\n<answer>Lisbon</answer>") == ("Lisbon", "")
    assert split_aggregate("CONFLICTS: moved from Porto to Lisbon\nLisbon") == (
        "Lisbon",
        "moved from Porto to Lisbon",
    )
    listed = "CONFLICTS:\n\n- lived in Porto, then Lisbon\n- cat was Miso, now Figo\n<answer>Lisbon</answer>"
    assert split_aggregate(listed) == ("Lisbon", "lived in Porto, then Lisbon; cat was Miso, now Figo")
    assert split_aggregate("CONFLICTS: none\n- Lisbon") == ("- Lisbon", "")


@pytest.mark.parametrize("budget", [0, 1, 10, 20])
def test_the_tiered_agent_and_the_block_agents_keep_tiny_budgets(memory, budget):
    """A budget of 0 gave the tiered summary its 2,000-token default; the notes' heading was
    not charged when no evidence fitted."""
    cap = int(0.95 * budget * EngineConfig().deep_scale)
    tiered = memory.ask(llm=reader(), question="Dana cat name?", scope="dana", mode="deep",
                        agent="tiered", budget=budget)
    assert tiered.receipt.context_tokens <= budget * EngineConfig().deep_scale
    agents = memory.ask(llm=reader(), question="Dana cat name?", scope="dana", mode="deep", budget=budget,
                        engine=EngineConfig(deep_agents=True, notes_share=1.0))
    assert agents.receipt.context_tokens <= cap


@pytest.mark.parametrize("budget", [0, 60, 120])
def test_tiny_budgets_never_crash_either_path(memory, budget):
    for mode in ("fast", "deep"):
        ans = memory.ask(llm=reader(), question="Dana cat name?", scope="dana", mode=mode, budget=budget)
        cap = budget * (EngineConfig().deep_scale if mode == "deep" else 1.0)  # deep reads wider
        assert ans.receipt.context_tokens <= int(0.95 * cap)


def test_a_per_query_engine_config_bounds_the_deep_path(memory):
    one = EngineConfig(anchor_blocks=1, max_blocks=1, deep_agents=True)
    r = memory.ask(
        llm=reader(), question="When is the Kyoto trip?", scope="dana", mode="deep", engine=one
    ).receipt
    assert len(r.blocks) == 1
    r = memory.ask(llm=reader(), question="When is the Kyoto trip?", scope="dana", mode="deep").receipt
    assert not r.blocks  # the memory's own config (no agents) is untouched


def test_deep_notes_state_relative_dates_against_the_turns_date(memory):
    llm = reader()
    r = memory.ask(llm=llm, question="When did Dana adopt Figo?", scope="dana", mode="deep").receipt
    prompt = llm.calls[-1][-1]["content"]
    assert "last weekend = the weekend before 11 April 2025" in prompt
    assert any("relative dates stated" in n for n in r.notes) and "dates" in r.stages_ms
    assert [lv.latency_ms for lv in r.levers if lv.name == "dates"] == [r.stages_ms["dates"]]
    off = memory.ask(
        llm=reader(),
        question="When did Dana adopt Figo?",
        scope="dana",
        mode="deep",
        engine=EngineConfig(resolve_dates=False),
    )
    assert not any("relative dates" in n for n in off.receipt.notes)


def test_a_deep_model_writes_the_deep_answer_over_a_wider_context(memory):
    fast_model, strong = reader(), ScriptedLLM("<answer>Figo, a grey cat</answer>", model="strong")
    r = memory.ask("What is the name of Dana's cat?", scope="dana", llm=fast_model, deep_llm=strong,
                   mode="deep", budget=300).receipt
    assert r.path == "deep" and not fast_model.calls and len(strong.calls) == 1
    assert r.model == strong.model  # the receipt names the model that wrote the answer
    assert 0.95 * 300 < r.context_tokens <= int(0.95 * 300 * EngineConfig().deep_scale)
    levers = {lv.name: lv for lv in r.levers}
    assert set(levers) >= {"evidence", "model"} and "blocks" not in levers
    assert levers["model"].tokens == sum(c.input_tokens + c.output_tokens for c in r.calls)
    assert "strong" in levers["model"].detail


def test_a_failing_deep_model_degrades_to_the_fast_model_and_says_so(memory):
    down = ScriptedLLM([ProviderError("connection refused", endpoint="http://127.0.0.1:9")] * 3)
    ans = memory.ask("What is the name of Dana's cat?", scope="dana", llm=reader(), deep_llm=down,
                     mode="deep")
    r = ans.receipt
    assert ans.text == "Figo" and r.path == "fast" and r.degraded
    assert any("aggregation failed" in n for n in r.notes)
    assert [c.stage for c in r.calls][-1] == "answer"  # the fast model answered in the end
    model = next(lv for lv in r.levers if lv.name == "model")  # the lever says it failed, not that it wrote
    assert "failed" in model.detail and "wrote the answer" not in model.detail


def test_an_early_stop_can_be_answered_by_the_deep_model_over_the_fast_budget(memory):
    always = ScoreRouter()
    fast_model, strong = reader(), ScriptedLLM("<answer>Figo, a grey cat</answer>", model="strong")
    ask = dict(question="What is the name of Dana's cat?", scope="dana", llm=fast_model, deep_llm=strong,
               router=always, mode="auto", tau=0.0, budget=300)
    r = memory.ask(**ask).receipt  # stop_reader="deep", the default
    assert r.path == "fast" and r.model == "strong" and not fast_model.calls and len(strong.calls) == 1
    assert r.context_tokens <= int(0.95 * 300)  # the fast budget, not the deep one
    assert "model" in {lv.name for lv in r.levers} and "evidence" not in {lv.name for lv in r.levers}
    assert r.t_mem_ms < r.t_e2e_ms - r.stages_ms["aggregate"] + 1e-6  # writing the answer is not memory time
    cheap = memory.ask(**ask, engine=EngineConfig(stop_reader="fast")).receipt  # the fast reader answers
    assert cheap.path == "fast" and cheap.model == fast_model.model and len(strong.calls) == 1


def test_an_early_stop_answered_by_the_deep_model_renders_its_context_once(memory, monkeypatch):
    """The router read the fast context; the deep model's stop reads the same one, not a re-render."""
    from suffice._engine import Engine

    renders: list[int] = []
    original = Engine.fast_context

    def counted(self, question, budget, *args, **kwargs):  # type: ignore[no-untyped-def]
        renders.append(budget)
        return original(self, question, budget, *args, **kwargs)

    monkeypatch.setattr(Engine, "fast_context", counted)
    strong = ScriptedLLM("<answer>Figo</answer>", model="strong")
    ask = dict(question="What is the name of Dana's cat?", scope="dana", llm=reader(), deep_llm=strong,
               router=ScoreRouter(), mode="auto", tau=0.0, budget=300)
    r = memory.ask(**ask).receipt
    assert r.path == "fast" and r.model == "strong" and renders == [300]
    stop_prompt = strong.calls[-1]
    renders.clear()
    del ask["router"], ask["tau"]  # auto mode's own
    deep = memory.ask(**{**ask, "mode": "deep", "engine": EngineConfig(deep_scale=1.0, deep_agents=False)})
    assert deep.receipt.path == "deep" and renders == [300]  # rendered afresh when nothing was made
    assert strong.calls[-1] == stop_prompt  # and the same prompt either way


def test_an_early_stop_whose_deep_model_fails_is_answered_by_the_fast_reader(memory):
    down = ScriptedLLM([ProviderError("connection refused", endpoint="http://127.0.0.1:9")] * 3)
    ans = memory.ask("What is the name of Dana's cat?", scope="dana", llm=reader(), deep_llm=down,
                     router=ScoreRouter(), mode="auto", tau=0.0, engine=EngineConfig(stop_reader="deep"))
    r = ans.receipt
    assert ans.text == "Figo" and r.path == "fast" and r.degraded
    assert any("aggregation failed" in n for n in r.notes)
    assert [c.stage for c in r.calls][-1] == "answer"
    assert all("wrote the answer" not in lv.detail for lv in r.levers)


def test_a_when_question_gets_room_for_every_date_its_evidence_states(tmp_path, embedder):
    """A render fills its budget, so dates stated afterwards found no room: for a question that
    asks when, the deep path renders its evidence smaller by what the dates take."""
    from suffice import NewItem
    from suffice._timeref import asks_time

    mem = Memory(tmp_path / "m.db", embedder=embedder)
    days = [f"2025-0{m}-{d:02d}" for m in (3, 4, 5) for d in (2, 9, 16, 23)]
    mem.add([NewItem(text=f"Yesterday I went kayaking on the river near the old mill, trip {i}.",
                     speaker="Dana", session=f"s{i}", observed_at=day) for i, day in enumerate(days)],
            scope="dana")
    question = "When did Dana go kayaking near the old mill?"
    assert asks_time(question) and not asks_time("Where did Dana go kayaking?")
    stated = {}
    for room in (True, False):
        llm = reader()
        r = mem.ask(question, scope="dana", llm=llm, mode="deep", budget=200,
                    engine=EngineConfig(deep_scale=1.0, date_room=room)).receipt
        prompt = llm.calls[-1][-1]["content"]
        turns = [ln for ln in prompt.splitlines() if "kayaking" in ln and "Question" not in ln]
        stated[room] = (sum("yesterday = " in ln.lower() for ln in turns), len(turns))
        assert r.context_tokens <= int(0.95 * 200)
    assert stated[True][0] == stated[True][1] > 0  # every turn shown has its date
    assert stated[False][0] < stated[False][1]  # filled to the budget, most went without
    mem.close()


def test_the_deep_path_dates_yesterday_from_the_day_the_speaker_wrote(memory):
    from suffice._llm.scripted import ScriptedLLM
    memory.add([{"text": "We met Rui at the harbour yesterday.", "speaker": "Ana",
                 "observed_at": "2023-07-20T21:30:00-04:00"}], scope="ana")  # 21 July in UTC
    llm = ScriptedLLM("19 July 2023")
    memory.ask("When did Ana meet Rui?", scope="ana", llm=llm, mode="deep")
    prompt = str(llm.calls[-1])
    assert "19 July 2023" in prompt and "20 July 2023" in prompt and "21 July" not in prompt


def test_the_aggregator_answer_is_its_last_tag_not_the_echoed_example(memory):
    assert split_aggregate("CONFLICTS: none\n<answer>short answer</answer>\n<answer>Figo</answer>") == (
        "Figo", "")


def test_an_empty_answer_is_a_failed_call_not_an_answer(memory):
    ans = memory.ask(llm=ScriptedLLM("<answer> </answer>"), question="What is the name of Dana's cat?",
                     scope="dana", mode="fast")
    r = ans.receipt
    assert r.degraded and ans.text and any("empty answer" in n for n in r.notes)


def test_a_reply_cut_at_its_token_cap_is_kept_and_the_receipt_says_so(memory):
    long = "<answer>" + "Dana adopted a grey cat from the shelter, and " * 20
    ans = memory.ask(llm=ScriptedLLM(long), question="Tell me about Dana's cat.", scope="dana", mode="fast")
    assert ans.text.startswith("Dana adopted") and not ans.receipt.degraded
    assert any("token cap and may be cut off" in n for n in ans.receipt.notes)


def test_block_agents_that_failed_mark_the_deep_answer_degraded(memory):
    def respond(messages):
        if "reading one excerpt" in messages[0]["content"]:
            raise ProviderError("HTTP 500", endpoint="x", status=500)
        return "<answer>Figo</answer>"

    ans = memory.ask(llm=ScriptedLLM(respond), question="cat name?", scope="dana", mode="deep",
                     engine=EngineConfig(deep_agents=True))  # the wider evidence still answers
    r = ans.receipt
    assert r.path == "deep" and ans.text == "Figo" and r.degraded


@pytest.mark.parametrize(("kwargs", "why"), [({"session": "no-such-session"}, "no item"),
                                             ({"budget": 0}, "budget")])
def test_an_empty_context_says_why_on_the_receipt(memory, kwargs, why):
    """The reader is still asked (it may say the memory has nothing), but the receipt says the
    memory it read was empty, and why."""
    ans = memory.ask("What is the name of Dana's cat?", scope="dana", llm=reader(), mode="fast", **kwargs)
    assert ans.receipt.context_tokens == 0
    assert any(why in n for n in ans.receipt.notes), ans.receipt.notes


class _Broken:
    """A caller's own model class that fails its own way (not a ProviderError)."""

    model = "homemade"

    def chat(self, messages, **kwargs):  # noqa: ANN001, ANN003
        raise RuntimeError("socket closed by the proxy")


@pytest.mark.parametrize("mode", ["fast", "deep"])
def test_a_model_that_raises_any_error_degrades_instead_of_sinking_the_query(memory, mode):
    ans = memory.ask("What is the name of Dana's cat?", scope="dana", llm=_Broken(), mode=mode)  # type: ignore[arg-type]
    r = ans.receipt
    assert r.degraded and "Figo" in ans.text  # the top prefix hit, as for a provider failure
    assert any("RuntimeError: socket closed by the proxy" in n for n in r.notes), r.notes


@pytest.mark.parametrize("mode", ["fast", "deep"])
def test_tau_or_a_router_outside_auto_mode_is_refused_not_ignored(memory, mode):
    for extra in ({"tau": 0.9}, {"router": ScoreRouter()}):
        with pytest.raises(InvalidQueryError, match="mode='auto' only"):
            memory.ask("What is the name of Dana's cat?", scope="dana", llm=reader(), mode=mode, **extra)


def test_a_failed_answer_with_no_hit_to_fall_back_on_says_the_answer_is_empty(memory):
    from suffice import RetrievalConfig

    down = ScriptedLLM([ProviderError("down")])
    ans = memory.ask("What is the name of Dana's cat?", scope="dana", llm=down, mode="fast",
                     retrieval=RetrievalConfig(k=0))
    assert ans.text == "" and ans.receipt.degraded
    assert any("no prefix hit to return" in n for n in ans.receipt.notes), ans.receipt.notes


def test_a_model_whose_chat_does_not_take_the_engines_arguments_is_a_setup_error_not_a_degrade(memory):
    class OldStyle:
        model = "old-style"

        def chat(self, messages, max_tokens):  # no stage, ledger or deadline: a TypeError
            return "<answer>Figo</answer>"

    with pytest.raises(TypeError):
        memory.ask("What is the name of Dana's cat?", scope="dana", llm=OldStyle(), mode="fast")  # type: ignore[arg-type]


def test_a_models_own_deadline_error_without_a_query_deadline_degrades_and_blames_no_deadline(memory):
    """A DeadlineError with no timeout crashed ask() formatting the missing deadline."""
    from suffice import DeadlineError

    late = ScriptedLLM([DeadlineError("the provider's own timeout", endpoint="x")] * 5)
    ans = memory.ask("Dana cat name?", scope="dana", llm=late)
    assert ans.receipt.degraded and not any("query's deadline" in n for n in ans.receipt.notes)


def test_tier_calls_a_call_cache_replays_are_marked_replayed(memory, tmp_path):
    """They read as real calls: cached=False with their old latency, so replayed time was
    undercounted."""
    from suffice._llm.cache import CachedLLM, replayed_ms
    from suffice._route.tiers import FixedTiers

    cache = tmp_path / "calls.db"
    for run in range(2):
        llm = CachedLLM(reader(), cache)
        ans = memory.ask("When is the Kyoto trip?", scope="dana", llm=llm, mode="deep", agent="tiered",
                         tiers=FixedTiers.all("high"))
        if run == 1:
            # the model's rungs (rule and small-model rungs are computed again, as they should)
            tier_rows = [c for c in ans.receipt.calls if c.stage.startswith("tier_") and c.model == llm.model]
            assert tier_rows and all(c.cached for c in tier_rows)
            assert all(m.cached for m in ans.receipt.modules if m.model == llm.model)
            assert replayed_ms(ans.receipt.calls) >= sum(c.latency_ms for c in tier_rows)


def test_levers_that_shaped_a_deep_context_the_answer_did_not_use_say_so(memory):
    """After a fallback to the fast path the receipt still showed the deep context's levers
    as though the answer had read it."""
    broken = ScriptedLLM([ProviderError("down", endpoint="x")] * 5, model="deep-m")
    ans = memory.ask("When is the Kyoto trip?", scope="dana", llm=reader(), deep_llm=broken, mode="deep")
    assert ans.receipt.path == "fast" and ans.receipt.degraded
    evidence = [lv for lv in ans.receipt.levers if lv.name == "evidence"]
    assert evidence and all("not used" in lv.detail for lv in evidence)
