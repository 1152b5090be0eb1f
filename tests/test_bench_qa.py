"""The QA benchmark picks questions in file order, resumes, and summarises per category."""

import json

from suffice._bench import qa
from suffice._datasets.locomo import LocomoConversation, LocomoQuestion
from suffice._llm import ScriptedLLM


def conv(sample_id, cats):
    qs = tuple(LocomoQuestion(f"q{i}?", "Figo", c, ()) for i, c in enumerate(cats))
    return LocomoConversation(sample_id, (), qs)


def test_select_takes_the_first_n_of_categories_1_to_4_in_order():
    convs = [conv("a", [5, 1, 2]), conv("b", [4, 5, 3])]
    keys = [i.key for i in qa.select(convs, 3)]
    assert keys == ["a#1", "a#2", "b#0"]
    assert len(qa.select(convs, None)) == 4


def test_run_resumes_and_scores(tmp_path, memory):
    item = qa.QAItem("dana#0", "dana", 0, LocomoQuestion("What is the cat's name?", "Figo", 4, ()))
    out = tmp_path / "r.jsonl"
    llm = ScriptedLLM("<answer>Figo</answer>")
    qa.run(memory, llm, [item], ["fast", "no-memory"], 500, out)
    first = len(llm.calls)
    qa.run(memory, llm, [item], ["fast", "no-memory"], 500, out)  # nothing left to do
    assert len(llm.calls) == first == 2
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert {r["variant"] for r in recs} == {"fast", "no-memory"}
    assert all(r["f1"] == 1.0 for r in recs)
    s = qa.summarize(out)
    assert s["fast"]["overall"]["n"] == 1 and s["fast"]["4"]["f1"] == 100.0
    assert s["no-memory"]["overall"]["input_tokens"] < s["fast"]["overall"]["input_tokens"]


def test_a_line_cut_by_a_kill_is_redone_and_does_not_swallow_the_next(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text('{"variant": "fast", "key": "a#1"}\n{"variant": "fa')
    assert qa.load_done(out) == {("fast", "a#1")}
    with qa.open_append(out) as fh:
        fh.write('{"variant": "fast", "key": "a#2"}\n')
    assert qa.load_done(out) == {("fast", "a#1"), ("fast", "a#2")}


def test_a_record_made_under_other_settings_is_answered_again_and_not_summarised(tmp_path, memory):
    item = qa.QAItem("dana#0", "dana", 0, LocomoQuestion("What is the cat's name?", "Figo", 4, ()))
    out = tmp_path / "r.jsonl"
    qa.run(memory, ScriptedLLM("<answer>Luna</answer>", model="small"), [item], ["fast"], 500, out)
    bigger = ScriptedLLM("<answer>Figo</answer>", model="large")
    qa.run(memory, bigger, [item], ["fast"], 500, out)  # another reader: not a reuse
    assert len(bigger.calls) == 1
    now = qa.fingerprints(memory, bigger, 500, ["fast"])
    counted = qa.summarize(out, fingerprints=now)["fast"]["overall"]
    assert counted["n"] == 1 and counted["f1"] == 100.0  # the new reader's record alone
    assert len(out.read_text().splitlines()) == 2  # the old record stays in the file, unused
    qa.run(memory, bigger, [item], ["fast"], 600, out)  # another budget: answered again
    assert len(bigger.calls) == 2


def test_a_record_counts_only_for_the_question_and_gold_its_key_holds_now(tmp_path, memory):
    """Keys are positions in the data file: another copy of the data (or a corrected gold)
    puts another question under "dana#0", which must be answered, not matched by key."""
    item = qa.QAItem("dana#0", "dana", 0, LocomoQuestion("What is the cat's name?", "Figo", 4, ()))
    out = tmp_path / "r.jsonl"
    llm = ScriptedLLM("<answer>Figo</answer>")
    qa.run(memory, llm, [item], ["no-memory"], 500, out)
    regolded = qa.QAItem("dana#0", "dana", 0, LocomoQuestion("What is the cat's name?", "Luna", 4, ()))
    qa.run(memory, llm, [regolded], ["no-memory"], 500, out)
    assert len(llm.calls) == 2
    s = qa.summarize(out, qa.questions_of([regolded]))["no-memory"]["overall"]
    assert s["n"] == 1 and s["f1"] == 0.0  # scored against the gold it has now


def test_a_store_made_from_other_data_is_refused_not_answered_from(tmp_path):
    import pytest

    from suffice import Memory
    from suffice._errors import ConfigError, ConflictError
    from suffice._types import NewItem

    def turns(*texts):
        return tuple(NewItem(t, session="s1", speaker="Ann", id=f"c:{i}") for i, t in enumerate(texts))

    mem = Memory(tmp_path / "m.db", embedder=None)
    try:
        c = LocomoConversation("c", turns("I adopted a cat.", "Her name is Figo."), ())
        qa.ingest(mem, [c], {c.scope})
        qa.ingest(mem, [c], {c.scope})  # stored already: read back, nothing added
        assert mem.store.max_seq(c.scope) == 1
        other = LocomoConversation("c", turns("I adopted a dog.", "Her name is Figo."), ())
        with pytest.raises(ConflictError):
            qa.ingest(mem, [other], {c.scope})
        shorter = LocomoConversation("c", turns("I adopted a cat."), ())
        with pytest.raises(ConfigError, match="not made from this data"):
            qa.ingest(mem, [shorter], {c.scope})
    finally:
        mem.close()


def test_a_judge_mean_over_part_of_the_answers_says_over_how_many(tmp_path):
    out = tmp_path / "r.jsonl"
    base = {"variant": "fast", "category": 4, "f1": 1.0, "em": 1.0, "receipt": {
        "t_e2e_ms": 1.0, "input_tokens": 1, "output_tokens": 1, "cost_usd": 0.0}}
    out.write_text("".join(json.dumps({**base, "key": f"a#{i}", "judge": j}) + "\n"
                           for i, j in enumerate([1.0, None, 0.0])))
    s = qa.summarize(out)["fast"]["overall"]
    assert s["judge"] == 50.0 and s["judged"] == 2 and s["n"] == 3
    assert "50.0 (2 of 3)" in qa.format_summary(qa.summarize(out))
