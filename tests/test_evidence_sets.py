"""Evidence-annotated datasets beyond LoCoMo: AMA-Bench episodes keep each step's action and
reply verbatim and read the steps a question cites, HotpotQA reads both of its file shapes, and
every dataset yields questions whose evidence the retrieval bench and the trainer share."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from suffice import ImportFormatError, InvalidInputError, Memory, NewItem
from suffice._bench.retrieval import load_set, measure, run_set
from suffice._datasets.ama import cited_steps, load_ama, load_episode
from suffice._datasets.hotpotqa import items_of, load_hotpotqa
from suffice._embed.hashing import HashEmbedder
from suffice._train.pairs import ama_questions, hotpot_questions, mine


def episode(path: Path, name: str = "alfworld-7") -> Path:
    raw = {"episode_id": "7", "task": "put a mug in the sink", "domain": "Embodied AI", "state": "success",
           "trajectory": [{"turn_idx": 0, "action": "look", "observation": "You see a mug and a sink."},
                          {"turn_idx": 1, "action": "take mug 1", "observation": "You pick up the mug."},
                          {"turn_idx": 2, "action": "go to sinkbasin 1", "observation": ""},
                          {"turn_idx": 3, "action": "put mug 1 in sinkbasin 1", "observation": "Done.\x00"}],
           "qa_pairs": [{"question": "What did the agent pick up at step 1?", "answer": "the mug",
                         "type": "A"},
                        {"question": "Which moves, from step 2 to 3, finished the task?", "answer": "x",
                         "type": "C"},
                        {"question": "Summarise the run.", "answer": "It put the mug away.", "type": "D"},
                        {"question": "What happened at step 40?", "answer": "nothing", "type": "A"}]}
    f = path / f"{name}.json.gz"
    with gzip.open(f, "wt", encoding="utf-8") as fh:
        json.dump(raw, fh)
    return f


def test_cited_steps_read_single_steps_lists_ranges_and_turns() -> None:
    text = "From step 72 to 74 the agent moved; steps 34, 35 and 36 failed; see turn 40 and Step 12."
    assert cited_steps(text, 100) == [72, 73, 74, 34, 35, 36, 40, 12]
    assert cited_steps("steps 3-5 and step 500", 100) == [3, 4, 5]  # no such step 500
    assert cited_steps("from step 1 to step 90", 100) == [1, 90]  # too wide to be evidence


def test_an_ama_episode_keeps_each_step_verbatim_as_action_and_reply(tmp_path: Path) -> None:
    ep = load_episode(episode(tmp_path))
    assert ep.scope == "ama-alfworld-7" and ep.success and ep.domain == "Embodied AI"
    assert [(it.kind, it.speaker, it.meta["step"]) for it in ep.items[:3]] == [
        ("action", "agent", 0), ("observation", "environment", 0), ("action", "agent", 1)]
    assert len(ep.items) == 7  # step 2's empty reply is skipped
    assert ep.items[-1].text == "Done.\u2400"  # a NUL byte, which no store takes, made visible
    assert [q.steps for q in ep.questions] == [(1,), (2, 3), (), ()]
    assert load_ama(tmp_path)[0] == ep


def test_a_broken_ama_file_is_named_in_the_error(tmp_path: Path) -> None:
    bad = tmp_path / "x-1.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(ImportFormatError, match="x-1.json.gz"):
        load_episode(bad)
    with gzip.open(bad, "wt") as fh:
        json.dump({"trajectory": [{"action": "a"}], "qa_pairs": []}, fh)
    with pytest.raises(ImportFormatError, match="trajectory 0: needs 'turn_idx'"):
        load_episode(bad)


def test_ama_questions_take_either_half_of_a_cited_step_as_its_evidence(tmp_path: Path) -> None:
    ep = load_episode(episode(tmp_path))
    mem = Memory(tmp_path / "m.db", embedder=HashEmbedder())
    mem.add(list(ep.items), scope=ep.scope)
    qs = ama_questions(mem, [ep])
    assert [(q.index, q.category, q.gold) for q in qs] == [(0, "A", ((2, 3),)), (1, "C", ((4,), (5, 6)))]
    pairs = mine(mem, qs, hard=2, depth=7)
    assert pairs[0].positives == ("agent: take mug 1", "environment: You pick up the mug.")
    assert all(p.group == ep.scope for p in pairs)


def test_a_piece_of_evidence_counts_when_any_of_its_items_is_in_context() -> None:
    cost = [10] * 6
    got = measure([3, 0, 1, 2, 4, 5], [(2, 3), (5,)], cost)
    assert got["recall_at"][5] == 0.5 and got["recall_at"][10] == 1.0
    assert got["all_in"][1000] and got["recall_in"][1000] == 1.0


def test_hotpotqa_reads_the_official_lists_and_the_literal_strings_of_the_train_sample(
        tmp_path: Path) -> None:
    entry = {"question": "Who?", "answer": "x", "type": "bridge",
             "context": [["Ann", ["Ann was born in Oslo.", " She sings."]], ["Oslo", ["Oslo is cold."]]],
             "supporting_facts": [["Ann", 0], ["Oslo", 0]]}
    official, literal = tmp_path / "a.json", tmp_path / "b.json"
    official.write_text(json.dumps([entry]))
    literal.write_text(json.dumps([{**entry, "context": repr(entry["context"]),
                                    "supporting_facts": repr(entry["supporting_facts"])}]))
    assert load_hotpotqa(official) == load_hotpotqa(literal)
    items = items_of(load_hotpotqa(official)[0])
    assert [(i.speaker, i.text) for i in items] == [("Ann", "Ann was born in Oslo."), ("Ann", "She sings."),
                                                    ("Oslo", "Oslo is cold.")]
    mem = Memory(tmp_path / "m.db", embedder=HashEmbedder())
    mem.add(items, scope="hotpot-0")
    assert hotpot_questions(mem, load_hotpotqa(official))[0].gold == ((0,), (2,))
    literal.write_text(json.dumps([{**entry, "context": "[[unclosed"}]))
    with pytest.raises(ImportFormatError, match="b.json item 0: 'context'"):
        load_hotpotqa(literal)


def test_the_bench_compares_a_trained_encoder_on_the_same_questions(tmp_path: Path) -> None:
    ep_file = episode(tmp_path)
    evset = load_set("ama", ep_file)
    mems = []
    for name in ("a", "b"):
        mem = Memory(tmp_path / f"{name}.db", embedder=HashEmbedder())
        for scope, items in evset.histories:
            mem.add(items, scope=scope)
        mems.append(mem)
    res = run_set(mems[0], evset.questions(mems[0]), mems[1])
    assert res["questions"] == 2 and set(res["methods"]) >= {"fused", "fused-tuned", "dense-tuned"}
    assert set(res["methods"]["fused"]) == {"overall", "A", "C"}
    assert "overall all@2000" in res["paired"]["fused-tuned vs fused"]
    with pytest.raises(InvalidInputError, match="unknown dataset 'nope'"):
        load_set("nope")


def test_new_items_are_plain_data() -> None:  # the loaders hand the store nothing else
    assert isinstance(items_of({"context": [["T", ["a"]]]})[0], NewItem)


def test_training_refuses_an_exclusion_that_names_no_history(locomo_path: Path) -> None:
    from typer.testing import CliRunner

    from suffice._cli import app
    out = CliRunner().invoke(app, ["train", "retriever", "--out", "never-written", "--exclude", "conv-99"])
    assert out.exit_code != 0 and "--exclude names no history of locomo: conv-99" in out.output


def test_the_router_leaves_the_acceptance_conversation_out_unless_told(locomo_path: Path,
                                                                       monkeypatch) -> None:
    from typer.testing import CliRunner

    from suffice._cli import app
    from suffice._train import sufficiency_data

    seen: list[list[str]] = []

    def stop(sets, exclude, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(list(exclude))
        raise InvalidInputError("stopped here")

    monkeypatch.setattr(sufficiency_data, "from_datasets", stop)
    cases = (([], ["conv-26"]), (["--exclude", "none"], []), (["--exclude", "conv-30"], ["conv-30"]))
    for extra, wanted in cases:
        out = CliRunner().invoke(app, ["train", "router", "--out", "never-written", *extra])
        assert "stopped here" in out.output and seen[-1] == wanted
    assert "leaving out conv-26" in CliRunner().invoke(app, ["train", "router", "--out", "x"]).output


def test_every_trainer_leaves_the_acceptance_conversation_out_unless_told(locomo_path: Path,
                                                                          monkeypatch) -> None:
    from typer.testing import CliRunner

    from suffice import _cli

    seen: list[list[str]] = []

    def stop(datasets, data, exclude, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(list(exclude))
        raise InvalidInputError("stopped here")

    monkeypatch.setattr(_cli, "training_pairs", stop)
    for command in ("retriever", "reranker"):
        for extra, wanted in (([], ["conv-26"]), (["--exclude", "none"], [])):
            out = CliRunner().invoke(_cli.app, ["train", command, "--out", "never-written", *extra])
            assert "stopped here" in out.output and seen[-1] == wanted


def test_a_trainer_refuses_an_out_folder_holding_anything_but_its_own_kind_of_model(
        locomo_path: Path, tmp_path: Path, monkeypatch) -> None:
    """Checked before training, not an hour later when the export would empty the folder."""
    from typer.testing import CliRunner

    from suffice import _cli

    monkeypatch.setattr(_cli, "training_pairs", lambda *a, **k: (_ for _ in ()).throw(
        InvalidInputError("training started")))
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "thesis.tex").write_text("mine")
    out = CliRunner().invoke(_cli.app, ["train", "retriever", "--out", str(notes)])
    assert out.exit_code != 0 and "not a trained encoder" in out.output
    assert "training started" not in out.output and (notes / "thesis.tex").exists()
    router = tmp_path / "router"
    router.mkdir()
    (router / "card.json").write_text(json.dumps({"kind": "router"}))
    (router / "model.onnx").write_bytes(b"x")
    out = CliRunner().invoke(_cli.app, ["train", "reranker", "--out", str(router)])
    assert "not a trained reranker" in out.output
    reranker = tmp_path / "rr"
    reranker.mkdir()
    (reranker / "card.json").write_text(json.dumps({"kind": "reranker"}))
    out = CliRunner().invoke(_cli.app, ["train", "reranker", "--out", str(reranker)])
    assert "is replaced when the new one is written" in out.output and "training started" in out.output
