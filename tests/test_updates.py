"""A later message that revises an earlier one: the reader is asked for the latest value."""

from conftest import history_items

from suffice import EngineConfig, NewItem
from suffice._llm import ScriptedLLM
from suffice._types import Item
from suffice._updates import HINT, find_revision


def items(*texts: str, speaker: str = "Dana") -> list[Item]:
    return [Item(f"i{n}", "s", n, "", speaker, "user", "message", f"2025-0{n + 1}-01", t, {}, 10)
            for n, t in enumerate(texts)]


def test_a_moved_plan_revises_the_first_mention_of_it():
    found = find_revision("When is the Kyoto trip?", items(
        "Leo and I are planning a trip to Kyoto in October.",
        "We booked a ryokan near the river.",
        "Change of plans: the Kyoto trip moved to November.",
        "I started learning Japanese."))
    assert found is not None
    assert (found.earlier.seq, found.later.seq) == (0, 2) and found.topic == ("kyoto", "trip")
    assert "item 2 of 2025-03-01 revises item 0 of 2025-01-01" in found.describe()


def test_values_that_grew_or_stopped_count_as_revisions():
    assert find_revision("How many commits are on main?", items(
        "We have 150 commits on main.", "The commits on main have grown to 165.")) is not None
    assert find_revision("Does Dana still play tennis?", items(
        "I play tennis every Sunday.", "I no longer play tennis, my knee hurts.")) is not None


def test_nothing_fires_without_revision_wording_or_an_earlier_mention():
    assert find_revision("When is the Kyoto trip?", items(
        "We plan a trip to Kyoto in October.", "Kyoto in October is lovely.")) is None
    # The revision is there, but no earlier message speaks of the same thing.
    assert find_revision("When is the Kyoto trip?", items(
        "I adopted a cat.", "Change of plans: the Kyoto trip moved to November.")) is None
    # The question's topic is elsewhere.
    assert find_revision("What is the cat's name?", items(
        "We plan a trip to Kyoto in October.", "The Kyoto trip moved to November.")) is None


def test_the_speakers_name_is_not_a_topic():
    """Every message of Dana's holds 'Dana' as its speaker: sharing it says nothing."""
    assert find_revision("What did Dana cook?", items(
        "Dana here, I cooked pasta.", "Dana again: the meeting moved to Friday.")) is None


def prompts_of(memory, question: str, **kw) -> tuple[list[str], object]:
    llm = ScriptedLLM("<answer>November</answer>")
    ans = memory.ask(question, scope="dana", llm=llm, budget=1000, **kw)
    return [call[-1]["content"] for call in llm.calls], ans.receipt


def test_the_reader_is_asked_for_the_latest_value_on_both_paths(memory):
    assert any("moved to November" in it.text for it in history_items())
    for mode in ("fast", "deep"):
        prompts, r = prompts_of(memory, "When is the Kyoto trip?", mode=mode)
        assert f"Question: When is the Kyoto trip? {HINT}" in prompts[-1]
        assert any(n.startswith("asked for the latest value: item") for n in r.notes)
        assert [lv.name for lv in r.levers if lv.name == "updates"] == (["updates"] if mode == "deep" else [])


def test_no_hint_where_nothing_was_revised_or_when_switched_off(memory):
    prompts, r = prompts_of(memory, "What is the name of Dana's cat?", mode="deep")
    assert HINT not in prompts[-1] and not any("latest value" in n for n in r.notes)
    prompts, r = prompts_of(memory, "When is the Kyoto trip?", mode="deep",
                            engine=EngineConfig(state_updates=False))
    assert HINT not in prompts[-1] and not any(lv.name == "updates" for lv in r.levers)


def test_a_question_asked_as_of_a_date_gets_no_hint(memory):
    """The dated prompt answers as of its date: the latest value may not be known by then."""
    prompts, _ = prompts_of(memory, "As of 1 June 2025, when is the Kyoto trip?", mode="fast")
    assert HINT not in prompts[-1]


def test_revisions_outside_a_conversation_do_not_fire(tmp_path, embedder):
    from suffice import Memory
    mem = Memory(tmp_path / "run.db", embedder=embedder)
    mem.add([NewItem("deploy the service on port 80", kind="action", meta={"step": 1}),
             NewItem("the service port moved to 8080", kind="observation", meta={"step": 2})], scope="r")
    llm = ScriptedLLM("<answer>8080</answer>")
    mem.ask("Which port does the service use?", scope="r", llm=llm, mode="fast", budget=500)
    assert HINT not in llm.calls[-1][-1]["content"]
    mem.close()


def test_a_question_about_the_past_an_order_or_a_span_gets_no_hint():
    """'When did ...' asks for an event, not how it stands now: the newest value is not it."""
    moved = items("We plan the Kyoto trip for October.", "Change of plans: the Kyoto trip moved to November.")
    assert find_revision("When is the Kyoto trip?", moved) is not None
    for q in ("When did the Kyoto trip happen?", "When was the Kyoto trip first planned?",
              "How many days are there between the two Kyoto trip dates?",
              "Have I ever booked the Kyoto trip?"):
        assert find_revision(q, moved) is None, q
