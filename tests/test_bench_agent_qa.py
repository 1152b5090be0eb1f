"""The agent QA benchmark on tiny hand-made episodes, with a scripted reader and judge."""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from suffice import Memory
from suffice._bench import agent_qa
from suffice._config import StoreConfig
from suffice._datasets.ama import load_ama
from suffice._datasets.beam import load_beam
from suffice._llm.base import Message
from suffice._llm.scripted import ScriptedLLM
from suffice._route.sufficiency import ScoreRouter
from suffice._tokens import count_tokens

GOLD = {f"What did the agent do at step {s} of {d}?": f"it opened drawer {s} in {d}"
        for d in ("kitchen", "garage") for s in range(8)}


def _episode(folder: Path, name: str, domain: str, room: str) -> None:
    traj = [{"turn_idx": s, "action": f"open drawer {s} in {room}",
             "observation": f"You open drawer {s}. It holds item {s} of the {room}."} for s in range(8)]
    qa = [{"question": f"What did the agent do at step {s} of {room}?", "answer": GOLD[
        f"What did the agent do at step {s} of {room}?"], "type": "ABCD"[s % 4]} for s in range(8)]
    raw = {"episode_id": name, "task": "tidy", "domain": domain, "trajectory": traj, "qa_pairs": qa,
           "state": "success"}
    (folder / f"{name}.json").write_text(json.dumps(raw), encoding="utf-8")


@pytest.fixture
def ama_dir(tmp_path: Path) -> Path:
    d = tmp_path / "ama"
    d.mkdir()
    for i, (domain, room) in enumerate([("Gaming", "kitchen"), ("Gaming", "garage"),
                                        ("Embodied AI", "kitchen"), ("Embodied AI", "garage")]):
        _episode(d, f"task-{i}", domain, room)
    return d


def _reader(messages: Sequence[Message]) -> str:
    """Answers with the gold when the prompt holds the question; grades every answer 1, and a
    rubric requirement 1 only when it mentions 'alpha'."""
    text = "\n".join(m["content"] for m in messages)
    if "Requirement:" in text:
        req = re.search(r"Requirement: (.*)", text)
        return '{"score": 1, "reason": "ok"}' if req and "alpha" in req.group(1) else '{"score": 0}'
    if "Reference answer" in text:
        return '{"score": 1, "reason": "same"}'
    for q, a in GOLD.items():
        if q in text:
            return a
    return "alpha"


def test_the_ama_sample_is_deterministic_and_balanced(ama_dir: Path) -> None:
    eps = load_ama(ama_dir)
    a = agent_qa.sample_ama(eps, n_episodes=4, per_episode=2)
    b = agent_qa.sample_ama(list(reversed(eps)), n_episodes=4, per_episode=2)
    keys = [q.key for _, qs in a for q in qs]
    assert keys == [q.key for _, qs in b for q in qs] and len(keys) == len(set(keys)) == 8
    for domain in ("Gaming", "Embodied AI"):
        types = Counter(q.group for _, qs in a for q in qs if q.domain == domain)
        assert types == Counter("ABCD")
    # Round-robin over the domains: the first two episodes come from different domains.
    assert a[0][0].domain != a[1][0].domain
    assert len(agent_qa.sample_ama(eps, n_episodes=3, per_episode=1)) == 3
    assert sum(len(qs) for _, qs in agent_qa.limited(a, 3)) == 3


def test_truncation_keeps_the_newest_items_and_cuts_the_next_at_its_front(tmp_path: Path) -> None:
    mem = Memory(tmp_path / "t.db", embedder=None, store_config=StoreConfig.for_agent())
    mem.add([f"item {i} " + "word " * 40 for i in range(10)], scope="s")
    budget = 200
    ctx = agent_qa.truncation_context(mem, "s", budget)
    assert "item 9" in ctx and "item 8" in ctx and "item 0" not in ctx
    assert count_tokens(ctx) <= int(mem.render_config.prompt_cap * budget) + 2
    assert ctx.splitlines()[0].startswith("… word")  # the oldest line shown is an item's end, marked cut
    # A cut item keeps its head, as the render shows it: the reader still sees whose step it was.
    steps = [{"text": "step text " + "word " * 60, "speaker": "agent", "meta": {"step": s}} for s in range(5)]
    mem.add(steps, scope="steps")
    stepped = agent_qa.truncation_context(mem, "steps", 180)
    assert stepped.splitlines()[0].startswith("[step ") and " agent: … word" in stepped.splitlines()[0]
    assert count_tokens(stepped) <= int(mem.render_config.prompt_cap * 180) + 2
    # One item larger than the whole budget: its end is shown, not nothing.
    mem.add(["huge " * 2000 + "the very end"], scope="big")
    big = agent_qa.truncation_context(mem, "big", budget)
    assert big.endswith("the very end") and 0 < count_tokens(big) <= budget


def test_a_reader_that_gives_nothing_scores_nothing_on_every_variant(ama_dir: Path, tmp_path: Path) -> None:
    """The engine answers with its top hit when the reader fails; truncation has no such
    fallback, so the benchmark scores that answer as empty too (and keeps its text)."""
    mem = Memory(tmp_path / "a.db", embedder=None, store_config=StoreConfig.for_agent(), router=None)
    picked = agent_qa.sample_ama(load_ama(ama_dir), n_episodes=1, per_episode=1)
    agent_qa.ingest(mem, picked)
    q = picked[0][1][0]
    silent = ScriptedLLM("   ")  # an empty reply: no answer
    fast = agent_qa.answer_one("fast", mem, silent, q, 300)
    trunc = agent_qa.answer_one("truncation", mem, silent, q, 300)
    assert fast["receipt"]["degraded"] and fast["answer"] == "" and fast["receipt"]["fallback_answer"]
    assert trunc["answer"] == ""


def test_a_run_records_every_variant_scores_and_resumes(ama_dir: Path, tmp_path: Path) -> None:
    mem = Memory(tmp_path / "a.db", embedder=None, store_config=StoreConfig.for_agent(), router=None)
    llm = ScriptedLLM(_reader)
    picked = agent_qa.sample_ama(load_ama(ama_dir), n_episodes=2, per_episode=2)
    agent_qa.ingest(mem, picked)
    qs = [q for _, q2 in picked for q in q2]
    out = tmp_path / "r.jsonl"
    counts = agent_qa.run(mem, llm, qs, out, budget=300, judge_llm=llm)
    assert counts["ran"] == 5 * len(qs) and counts["reused"] == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert {(r["variant"], r["key"]) for r in recs} == {(v, q.key) for v in agent_qa.VARIANTS for q in qs}
    s = agent_qa.summarize(out)
    assert s["n_questions"] == len(qs) and set(s["overall"]) == set(agent_qa.VARIANTS)
    # The reader answers with the gold whenever the question reaches it, and every path sends it.
    assert s["overall"]["fast"]["f1"] == pytest.approx(100.0)
    assert s["overall"]["truncation"]["judge"] == pytest.approx(100.0)
    early = s["overall"]["auto"]["early_rate"]
    assert early is not None and 0.0 <= early <= 100.0
    assert s["overall"]["fast"]["early_rate"] is None
    assert set(s["by_group"]) <= set("ABCD") and set(s["by_domain"]) <= {"Gaming", "Embodied AI"}
    assert "F1" in agent_qa.format_summary(s)
    calls = len(llm.calls)
    again = agent_qa.run(mem, llm, qs, out, budget=300, judge_llm=llm)
    assert again == {"ran": 0, "reused": 5 * len(qs), "judged": 0} and len(llm.calls) == calls
    # Another budget is another setting: answered again, not reused.
    assert agent_qa.run(mem, llm, qs[:1], out, budget=400, variants=["fast"])["ran"] == 1
    # Recorded twice, counted once (the newest); or only the records of one setting.
    assert agent_qa.summarize(out)["overall"]["fast"]["n"] == len(qs)
    other = agent_qa.summarize(out, fingerprints=agent_qa.fingerprints(mem, llm, 400))
    assert other["n_questions"] == 1 and other["variants"] == ["fast"]


def test_a_record_counts_only_for_its_own_question_and_auto_for_its_own_router(
        ama_dir: Path, tmp_path: Path) -> None:
    mem = Memory(tmp_path / "a.db", embedder=None, store_config=StoreConfig.for_agent(), router=None)
    llm = ScriptedLLM(_reader)
    picked = agent_qa.sample_ama(load_ama(ama_dir), n_episodes=1, per_episode=1)
    agent_qa.ingest(mem, picked)
    q = picked[0][1][0]
    out = tmp_path / "r.jsonl"
    agent_qa.run(mem, llm, [q], out, budget=300, variants=["fast", "auto"])
    # The same key asking something else (another copy of the data): answered again, and the
    # old record is not summed under the new question.
    reworded = dataclasses.replace(q, question=q.question + " Answer briefly.")
    assert agent_qa.run(mem, llm, [reworded], out, budget=300, variants=["fast"])["ran"] == 1
    s = agent_qa.summarize(out, agent_qa.questions_of([reworded]))
    assert s["overall"]["fast"]["n"] == 1 and "auto" not in s["overall"]
    # auto decides by its router: another router is another setting for auto only.
    routed = Memory(tmp_path / "a.db", embedder=None, store_config=StoreConfig.for_agent(),
                    router=ScoreRouter(bias=5.0))
    counts = agent_qa.run(routed, llm, [q], out, budget=300, variants=["fast", "auto"])
    assert counts["reused"] == 1 and counts["ran"] == 1


def test_a_run_without_judge_is_judged_by_a_later_run(ama_dir: Path, tmp_path: Path) -> None:
    mem = Memory(tmp_path / "a.db", embedder=None, store_config=StoreConfig.for_agent(), router=None)
    llm = ScriptedLLM(_reader)
    picked = agent_qa.sample_ama(load_ama(ama_dir), n_episodes=1, per_episode=1)
    agent_qa.ingest(mem, picked)
    qs = [q for _, q2 in picked for q in q2]
    out = tmp_path / "r.jsonl"
    agent_qa.run(mem, llm, qs, out, budget=300, variants=["fast", "truncation"])
    assert agent_qa.summarize(out)["overall"]["fast"]["judge"] is None
    counts = agent_qa.run(mem, llm, qs, out, budget=300, variants=["fast", "truncation"], judge_llm=llm)
    assert counts == {"ran": 0, "reused": 2, "judged": 2}
    assert agent_qa.summarize(out)["overall"]["fast"]["judge"] == pytest.approx(100.0)


def _beam(folder: Path) -> None:
    folder.mkdir(parents=True)
    chat = [{"batch_number": 1, "turns": [[
        {"role": "user", "content": "My project alpha ships on March 29.", "id": 1},
        {"role": "assistant", "content": "Noted: alpha ships on March 29.", "id": 2}]]}]
    probing = {
        "information_extraction": [
            {"question": "When does alpha ship?", "answer": "March 29", "source_chat_ids": [1],
             "rubric": ["LLM response should state: alpha", "LLM response should state: March 29"]},
            {"question": "Second one?", "answer": "x", "rubric": ["alpha"]}],
        "abstention": [{"question": "What is my dog's name?", "ideal_response": "Not mentioned.",
                        "rubric": ["alpha says there is no information"]}],
        "summarization": [{"question": "Summarize.", "ideal_summary": "Alpha."}],  # no rubric: left out
    }
    (folder / "chat.json").write_text(json.dumps(chat), encoding="utf-8")
    (folder / "probing_questions.json").write_text(json.dumps(probing), encoding="utf-8")


def test_beam_is_scored_per_rubric_item(tmp_path: Path) -> None:
    root = tmp_path / "beam"
    _beam(root / "1")
    picked = agent_qa.sample_beam(load_beam(root), root, n_convs=1, per_ability=1)
    qs = picked[0][1]
    assert [q.group for q in qs] == ["information_extraction", "abstention"]
    assert qs[0].rubric == ("LLM response should state: alpha", "LLM response should state: March 29")
    llm = ScriptedLLM(_reader)
    score, items = agent_qa.rubric_score(llm, qs[0], "alpha ships")
    assert items == [1.0, 0.0] and score == 0.5
    mem = Memory(tmp_path / "b.db", embedder=None, store_config=StoreConfig.for_agent(), router=None)
    agent_qa.ingest(mem, picked)
    out = tmp_path / "b.jsonl"
    agent_qa.run(mem, llm, qs, out, budget=300, variants=["fast", "deep", "auto"], judge_llm=llm)
    s = agent_qa.summarize(out)
    assert s["overall"]["fast"]["judge"] == pytest.approx(75.0)  # 0.5 and 1.0
    assert set(s["by_group"]) == {"information_extraction", "abstention"}
    assert all(r["t_e2e_ms"] >= r["t_mem_ms"] >= 0 for r in s["overall"].values())


def test_the_cli_runs_resumes_and_writes_the_figures(ama_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from suffice._cli import app
    out, figures = tmp_path / "q.jsonl", tmp_path / "q.json"
    args = ["bench", "agent", "qa", "--data", str(ama_dir), "--episodes", "2", "--per-episode", "1",
            "--provider", "scripted", "--model", "drawer 3", "--no-judge", "--variants", "fast,truncation",
            "--store", str(tmp_path / "s.db"), "--out", str(out), "--cache", str(tmp_path / "c.db"),
            "--json", str(figures)]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "answers: 4 run, 0 reused" in first.output
    doc = json.loads(figures.read_text())
    assert doc["results"]["n_questions"] == 2 and set(doc["results"]["overall"]) == {"fast", "truncation"}
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "answers: 0 run, 4 reused" in again.output
    bad = CliRunner().invoke(app, [*args[:-2], "--variants", "fast,nope"])
    assert bad.exit_code != 0 and "nope" in bad.output
