"""Step-aware memory: questions that name steps get those steps' items first, on both backends,
within the query's filters and "as of" bound; stores without steps are untouched."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from suffice import HashEmbedder, Memory, NewItem
from suffice._config import RenderConfig, RetrievalConfig, StoreConfig
from suffice._steps import acted_on, asks_latest, cited_steps, implied_steps, key_terms, step_bound
from suffice._types import Filter


def test_references_are_parsed_singly_in_lists_ranges_and_between() -> None:
    assert cited_steps("What did the agent do at step 78?") == [78]
    assert cited_steps("steps 34, 35 and 36, then turn 40") == [34, 35, 36, 40]
    assert cited_steps("from step 72 to 74") == [72, 73, 74]
    assert cited_steps("between step 73 and 76") == [73, 74, 75, 76]
    assert cited_steps("between step 73 and 76", between=False) == [73, 76]
    assert cited_steps("from step 1 to step 90") == [1, 90]  # too wide: its ends only
    assert cited_steps("steps 3-5 and step 500", 100) == [3, 4, 5]
    assert cited_steps("no numbers here, nor 12 alone") == []
    assert len(cited_steps("steps " + ", ".join(str(i) for i in range(0, 400, 2)))) == 64


def test_thousands_reversed_ranges_and_huge_numbers_are_read_as_meant() -> None:
    assert cited_steps("at step 1,200") == [1200]  # one step, not 1 and 200
    assert cited_steps("steps 1,2,3") == [1, 2, 3]
    assert cited_steps("between step 80 and 70") == list(range(70, 81))
    assert cited_steps("steps 80 to 77") == [80, 79, 78, 77]
    assert cited_steps("what happened at step 99999999999999999999") == []  # no store holds it


def test_every_reader_of_a_question_sees_step_1200_as_one_step() -> None:
    from suffice._steps import before_step
    assert step_bound("what was the value at step 1,200?") == 1200
    assert before_step("which files were open before step 1,050?") == 1050
    assert _implied("what followed step 1,200?")[:2] == [1201, 1202]
    # After the plural, digits and commas are a list of steps.
    assert cited_steps("steps 120,121,122") == [120, 121, 122]


def test_a_number_too_long_for_int_is_no_step_and_no_error() -> None:
    from suffice._steps import before_step
    huge = "9" * 5000
    assert cited_steps(f"at step {huge}") == [] and implied_steps(f"what followed step {huge}?") == []
    assert step_bound(f"the value at step {huge}") is None
    assert before_step(f"before step {huge}") is None


def _implied(text: str) -> list[int]:
    return [n for n, _why in implied_steps(text)]


def test_a_stretch_between_two_named_steps_is_filled_in() -> None:
    assert _implied("How many scroll-down actions occur after Cancel (Step 12) and before Add "
                    "Selected (Step 17)?") == [13, 14, 15, 16]
    assert _implied("Between the start of step 4 and the observation at step 8, what happened?") == [5, 6, 7]
    assert _implied("Count the steps from the first input (Step 1) to the restored state (Step 8).") == [
        2, 3, 4, 5, 6, 7]
    why = dict(implied_steps("between the click at step 2 and the one at step 4"))
    assert why == {3: "step 3 (between step 2 and step 4)"}
    assert _implied("between the click at step 1 and the one at step 22") == list(range(2, 22))  # MAX_SPAN
    assert _implied("between the click at step 1 and the one at step 23") == []  # one more: context
    assert _implied("between step 4 and 8") == []  # cited_steps' own range: nothing left to imply
    # Two steps in different clauses or sentences, reversed, or named without a stretch: no fill.
    assert _implied("From the start. What did step 3 show, and what did step 9 change?") == []
    assert _implied("What error did the agent get from the API at step 5, and what did it retry at "
                    "step 9?") == []
    assert _implied("between the end of step 8 and the start of step 4") == []
    assert _implied("What did the agent do at step 5 and at step 9?") == []


def test_a_question_about_what_came_after_a_step_gets_the_next_few() -> None:
    assert _implied("What action followed the expanded click at Step 10?") == [11, 12, 13, 14, 15]
    assert _implied("If at step 14 the agent had removed the filter, what would change?")[:3] == [15, 16, 17]
    assert _implied("Counterfactual: at step 2 the agent drops the join.") == [3, 4, 5, 6, 7]
    assert _implied("What did the agent see at step 10?") == []
    # The "after" of a stretch asks for the stretch, not for what followed its end.
    assert 18 not in _implied("What happened after step 12 and before step 17?")
    # The cue counts in the sentence that names the step, and never past "before step N".
    assert _implied("What did the agent do at step 3? What came next after step 9?") == [10, 11, 12, 13, 14]
    assert _implied("Before step 20, which item came first, and which followed it at step 17?") == [18, 19]
    many = "What followed steps " + ", ".join(str(n) for n in range(0, 140, 10)) + "?"
    assert len(implied_steps(many)) == 20
    assert _implied("What followed step 9223372036854775807?") == []  # past a store's integers


def test_step_references_read_long_queries_in_linear_time() -> None:
    for text in ("step" + " " * 100_000, "between step 1 and" + " " * 100_000, "step 1" + " and" * 30_000):
        cited_steps(text)
        implied_steps(text)  # would take minutes with a quadratic pattern


def test_state_questions_are_told_from_event_questions() -> None:
    assert asks_latest("What is the inventory now?")
    assert asks_latest("When was the last time config.py changed?")
    assert asks_latest("What was the value of x at step 50?")
    assert step_bound("the value of x at step 50") == 50
    assert not asks_latest("What did the agent do at step 78?")
    assert key_terms(["value", "x", "step", "50", "now"]) == ["value", "x"]


def test_enumeration_questions_name_the_object_acted_on() -> None:
    assert acted_on("Before step 49, which actions were performed on toiletpaper 2 and at which "
                    "steps?") == "toiletpaper 2"
    assert acted_on("What commands were run against setup.py before step 30?") == "setup.py"
    assert acted_on("which tool calls did the agent make on the file utils/io.py") == "utils/io.py"
    assert acted_on("List the commands run on main.py.") == "main.py"  # not "main.py."
    assert acted_on("Which action triggered it?") is None
    assert acted_on("How many actions occurred between step 6 and step 9?") is None
    # Chat questions that say "actions" ask for no enumeration of an identifier.
    assert acted_on("What actions did Melanie take to destress?") is None
    assert acted_on("What actions did Caroline take on the weekend?") is None
    assert acted_on("Which commands did the agent use to fix the bug?") is None


def _run(n: int = 30) -> list[NewItem]:
    """A small agent run: per step an action and its observation; step 7 sets the counter."""
    out = []
    for s in range(n):
        act = "echo counter=41 > state.txt" if s == 7 else f"ls dir_{s}"
        obs = "wrote state.txt" if s == 7 else f"file_{s}_a.py file_{s}_b.py"
        if s == 19:
            act, obs = "echo counter=42 > state.txt", "wrote state.txt again"
        out.append(NewItem(text=act, kind="action", speaker="agent", meta={"step": s}, id=f"r:{s}:action"))
        out.append(NewItem(text=obs, kind="observation", speaker="env", meta={"step": s},
                           id=f"r:{s}:observation"))
    return out


@pytest.fixture
def stepped(store_location: Callable[[str], str]) -> Iterator[Memory]:
    mem = Memory(store_location("steps"), embedder=HashEmbedder(), store_config=StoreConfig.for_agent())
    mem.add(_run(), scope="run")
    yield mem
    mem.close()


def _steps_of(mem: Memory, seqs: tuple[int, ...]) -> list[int]:
    by = {it.seq: it.meta["step"] for it in mem.items(scope="run", limit=None)}
    return [by[q] for q in seqs]


def test_named_steps_are_fetched_first_on_both_backends(stepped: Memory) -> None:
    r = stepped.retriever.rank("run", "What happened between step 11 and 12?", stepped.retrieval, depth=20)
    named = [ref for ref in r.refs if "before" not in ref.reason]
    assert [ref.step for ref in named] == [11, 11, 12, 12]
    assert _steps_of(stepped, r.seqs[:4]) == [11, 11, 12, 12]
    assert {ref.reason for ref in named} == {"step 11", "step 12"}
    before = [ref.step for ref in r.refs if "before" in ref.reason]
    assert before == [10, 10, 9, 9]  # then the steps just before the first named one
    ev = stepped.search("What happened at step 11?", scope="run", k=5)
    assert [h.source for h in ev.hits[:2]] == ["step", "step"]
    assert {h.item.meta["step"] for h in ev.hits[:2]} == {11}
    # k is what the caller asked for, however many steps the query names: named ones first
    for k in (0, 1, 3):
        hits = stepped.search("What happened between step 11 and 12?", scope="run", k=k).hits
        assert len(hits) == k and all(h.source == "step" for h in hits)


def test_implied_steps_follow_the_named_ones_and_precede_the_steps_before(stepped: Memory) -> None:
    r = stepped.retriever.rank("run", "Which action followed the listing at step 11?", stepped.retrieval)
    order = list(dict.fromkeys((ref.step, ref.reason) for ref in r.refs))
    assert order[0] == (11, "step 11")
    assert order[1:6] == [(n, f"step {n} (after step 11)") for n in range(12, 17)]
    assert [step for step, _ in order[6:]] == [10, 9]  # the steps before come last
    span = stepped.retriever.rank("run", "What happened after the listing (step 3) and before the write "
                                  "(step 7)?", stepped.retrieval)
    assert [ref.step for ref in span.refs if "between" in ref.reason] == [4, 4, 5, 5, 6, 6]
    # As of a point in the run, the steps after it do not exist.
    first_of_12 = min(it.seq for it in stepped.items(scope="run", limit=None) if it.meta["step"] == 12)
    bounded = stepped.retriever.rank("run", "Which action followed the listing at step 11?",
                                     stepped.retrieval, flt=Filter(before_seq=first_of_12))
    assert {ref.step for ref in bounded.refs} == {9, 10, 11}


def test_references_obey_the_filter_and_the_bound(stepped: Memory) -> None:
    q = "What happened at step 11 and step 25?"
    only_obs = stepped.retriever.rank("run", q, stepped.retrieval, flt=Filter(kind="observation"))
    assert {stepped.store.items("run", [ref.seq])[0].kind for ref in only_obs.refs} == {"observation"}
    bounded = stepped.retriever.rank("run", q, stepped.retrieval, flt=Filter(before_seq=40))
    assert bounded.refs and all(ref.seq < 40 for ref in bounded.refs)
    assert 25 not in {ref.step for ref in bounded.refs}  # step 25 happened after the bound
    off = stepped.retriever.rank("run", q, RetrievalConfig(step_refs=False))
    assert off.refs == ()


def test_a_state_question_gets_the_newest_setter_before_its_step(stepped: Memory) -> None:
    r = stepped.retriever.rank("run", "What was the counter value at step 15?", stepped.retrieval)
    latest = [ref for ref in r.refs if ref.reason.startswith("latest")]
    assert [ref.step for ref in latest] == [7]  # step 19 set it again, but after step 15
    now = stepped.retriever.rank("run", "What is the counter now?", stepped.retrieval)
    assert [ref.step for ref in now.refs if ref.reason.startswith("latest")] == [19]


def test_an_enumeration_question_gets_every_action_on_its_object(stepped: Memory) -> None:
    acts = {4: "take widget 1 from shelf 2", 9: "take widget 10 from shelf 1", 16: "put widget 1 in drawer 3",
            25: "clean widget 1 with sink 1"}
    stepped.add([NewItem(text=t, kind="action", speaker="agent", meta={"step": s}, id=f"shop:{s}:action")
                 for s, t in acts.items()]
                + [NewItem(text=f"You see widget 1 and widget 10 on shelf {s}.", kind="observation",
                           speaker="env", meta={"step": s}, id=f"shop:{s}:observation") for s in range(30)],
                scope="shop")
    r = stepped.retriever.rank("shop", "Before step 20, which actions were performed on widget 1?",
                               stepped.retrieval)
    acted = [ref for ref in r.refs if "an action on widget 1" in ref.reason]
    assert sorted({ref.step for ref in acted}) == [4, 16]  # not widget 10, not after step 20
    before_16 = stepped.retriever.rank("shop", "Before step 16, which actions were performed on widget 1?",
                                       stepped.retrieval)
    assert {ref.step for ref in before_16.refs if "an action on" in ref.reason} == {4}
    assert {stepped.store.items("shop", [ref.seq])[0].kind for ref in acted} == {"action", "observation"}


def test_named_steps_take_room_from_the_recent_window(tmp_path) -> None:  # type: ignore[no-untyped-def]
    mem = Memory(tmp_path / "w.db", embedder=HashEmbedder(), store_config=StoreConfig.for_agent())
    try:
        long_obs = " ".join(f"row {i}: value {i * 7}" for i in range(60))  # ~300 tokens
        run = [NewItem(text=long_obs if s == 2 else f"ok {s}", kind="observation", meta={"step": s},
                       id=f"w:{s}:observation") for s in range(40)]
        mem.add(run, scope="w")
        q = "What did the observation at step 2 show?"
        wide = RenderConfig.for_agent(recent_share=0.5)
        ctx = mem.render(q, 500, scope="w", agent=True, render=wide)
        kept = mem.render(q, 500, scope="w", agent=True, render=wide.replace(steps_over_recent=False))
        assert long_obs in ctx.text and long_obs not in kept.text
        assert ctx.tokens <= ctx.cap and kept.tokens <= kept.cap
        recent = [p for p in ctx.parts if p.kind == "recent"]
        assert recent and len(recent) < len([p for p in kept.parts if p.kind == "recent"])
    finally:
        mem.close()


def test_the_render_shows_named_steps_before_other_detail(stepped: Memory) -> None:
    items = {it.meta["step"]: it for it in stepped.items(scope="run", limit=None) if it.kind == "observation"}
    config = RenderConfig.for_agent()
    ctx = stepped.render("What did the observation at step 3 list?", 300, scope="run", agent=True,
                         render=config)
    assert items[3].text in ctx.text
    assert any(p.reason == "step 3" for p in ctx.parts)
    assert ctx.tokens <= ctx.cap
    # As of step 10 (items before seq 20): step 3 is still there, step 12 is not yet.
    asof = stepped.renderer.render("run", "What did steps 3 and 12 list?", 300, config=config,
                                   retrieval=stepped.retrieval, flt=Filter(before_seq=20), agent=True)
    assert items[3].text in asof.text and items[12].text not in asof.text
    assert all(q < 20 for p in asof.parts for q in p.seqs)


def test_only_a_question_that_names_steps_pulls_the_ranked_hits_whole(stepped: Memory) -> None:
    config = RenderConfig.for_agent()
    named = stepped.render("What did the observation at step 3 list?", 400, scope="run", agent=True,
                           render=config)
    assert any(p.reason.startswith("hit ") for p in named.parts)
    state = stepped.render("What is the counter now?", 400, scope="run", agent=True, render=config)
    assert any(p.reason.startswith("latest match") for p in state.parts)
    assert not any(p.reason.startswith("hit ") for p in state.parts)  # unit recovery follows instead


def test_no_effect_without_steps(tmp_path) -> None:  # type: ignore[no-untyped-def]
    mem = Memory(tmp_path / "chat.db", embedder=HashEmbedder())
    try:
        mem.add([f"At step {i} of the recipe, add {i} grams of salt." for i in range(12)], scope="chat")
        q = "What happens at step 3 of the recipe now?"
        on = mem.retriever.rank("chat", q, mem.retrieval)
        off = mem.retriever.rank("chat", q, RetrievalConfig(step_refs=False))
        assert on.refs == () and on.seqs == off.seqs
        assert mem.render(q, 200, scope="chat").text == mem.render(
            q, 200, scope="chat", retrieval=RetrievalConfig(step_refs=False)).text
    finally:
        mem.close()
