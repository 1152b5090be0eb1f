"""The trained sufficiency router: its examples are labelled by looking, its features are the
engine's, it exports to ONNX that scores like the network, and the engine uses it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from suffice import EngineConfig, Memory
from suffice._engine import Engine
from suffice._llm import ScriptedLLM
from suffice._route import RouterInput, TrainedRouter, default_router
from suffice._route.features import ELEMENT_FEATURES, GLOBAL_FEATURES, extract
from suffice._text import stem
from suffice._train.pairs import Question
from suffice._train.sufficiency_data import (
    DataConfig,
    build,
    present_pieces,
    promoted,
    rationale,
    summary,
    verify,
    width_examples,
    without,
)

QUESTIONS = [
    ("What is the name of Dana's cat?", "cat"),
    ("When is the Kyoto trip?", "Kyoto"),
    ("What can't Dana eat?", "eat"),
    ("Which shelter did the cat come from?", "shelter"),
]


def _questions(mem: Memory) -> list[Question]:
    """One question per phrase, its gold evidence the items whose text holds the word."""
    items = mem.items(scope="dana", limit=None)
    out = []
    for i, (q, word) in enumerate(QUESTIONS):
        gold = [it.seq for it in items if word.lower() in it.text.lower()][:2]
        out.append(Question("dana", "dana", q, tuple((s,) for s in gold), 4, i, "x"))
    return out


@pytest.fixture
def examples(memory):
    return build(memory, _questions(memory), "demo", DataConfig(budgets=(200, 400), fast_budget=400))


def test_every_label_is_what_the_context_shows(memory, examples):
    items = {it.seq: it for it in memory.items(scope="dana", limit=None)}
    for e in examples:
        shown = [items[s].text in e.text for s in e.gold]
        if e.n_gold == len(e.gold):  # one item per piece here
            assert e.label == all(shown)
        assert e.n_present <= e.n_gold


def test_the_width_label_says_whether_twice_the_budget_shows_more_evidence(memory):
    ex = build(memory, _questions(memory), "demo", DataConfig(budgets=(40, 80, 160, 300), fast_budget=80))
    by = {(e.key, e.budget): e for e in ex if e.kind == "natural"}
    for (key, b), e in by.items():
        double = by.get((key, 2 * b))
        assert e.wider_adds == (None if double is None else double.n_present > e.n_present)
    assert all(e.wider_adds is None for e in ex if e.kind != "natural")
    known = [e for e in by.values() if e.wider_adds is not None]
    assert {e.wider_adds for e in known} == {True, False}  # this history has both cases
    relabelled = width_examples(ex)
    assert len(relabelled) == len(known)
    assert all(r.label == (not r.wider_adds) and r.kind == "natural" for r in relabelled)
    assert all(("go deep" in r.rationale) == bool(r.wider_adds) for r in relabelled)


def test_dropping_the_gold_makes_every_context_insufficient(examples):
    dropped = [e for e in examples if e.kind in ("drop_all", "drop_part")]
    assert dropped and not any(e.label for e in dropped)
    assert all("lacks" in e.rationale for e in dropped)


def test_verification_drops_only_negatives_the_model_still_answers(examples):
    from suffice._bench.metrics import token_f1

    knows = ScriptedLLM(lambda messages: "<answer>x</answer>")  # every reference answer is "x"
    kept, dropped = verify(examples, knows, token_f1)
    negatives = [e for e in examples if not e.label and e.kind in ("drop_all", "drop_part")]
    assert negatives and dropped == len(negatives) and len(kept) == len(examples) - dropped
    assert all(e.label or e.kind not in ("drop_all", "drop_part") for e in kept)
    seen: list[tuple[int, int]] = []
    kept, dropped = verify(examples, ScriptedLLM(lambda messages: "<answer>no idea</answer>"), token_f1,
                           progress=lambda done, total: seen.append((done, total)))
    assert dropped == 0 and len(kept) == len(examples)
    # One tick per model call, each saying how many calls there are in all.
    assert seen == [(i + 1, len(negatives)) for i in range(len(negatives))]


def test_model_written_rationales_replace_the_built_ones_and_count_their_calls(examples):
    from suffice._train.sufficiency_data import llm_rationales

    some = examples[:3]
    seen: list[tuple[int, int]] = []
    out = llm_rationales(some, ScriptedLLM("The context shows the date but not the place."),
                         progress=lambda done, total: seen.append((done, total)))
    assert [e.rationale for e in out] == ["The context shows the date but not the place."] * 3
    assert seen == [(1, 3), (2, 3), (3, 3)]
    # An empty reply keeps the rationale built from the annotations.
    kept = llm_rationales(some, ScriptedLLM(" "))
    assert [e.rationale for e in kept] == [e.rationale for e in some]


def test_an_exclusion_that_names_no_history_is_refused(tmp_path):
    from types import SimpleNamespace

    from suffice import InvalidInputError
    from suffice._train.sufficiency_data import from_datasets

    one = SimpleNamespace(name="demo", histories=[("dana", [])], questions=lambda mem: [])
    with pytest.raises(InvalidInputError, match="conv-99"):
        from_datasets([one], ["conv-99"], tmp_path)  # a typo must not train on the acceptance set
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_promoting_the_gold_puts_it_in_the_context(examples):
    up = [e for e in examples if e.kind == "promote"]
    assert up and all(e.label for e in up)
    assert all("shows" in e.rationale and "Enough" in e.rationale for e in up)


def test_natural_contexts_come_at_every_budget_and_from_the_prefix(examples):
    s = summary(examples)
    assert s["by_kind"]["natural"]["n"] == 2 * len(QUESTIONS)
    assert s["by_kind"]["prefix"]["n"] == len(QUESTIONS)
    assert {e.budget for e in examples if e.kind == "natural"} == {200, 400}


def test_an_intervention_changes_the_ranking_only_where_asked(memory):
    rk = memory.retriever.rank("dana", "cat name", memory.retrieval, depth=50, piece_depth=300)
    drop = set(rk.seqs[:2])
    out = without(rk, drop)
    assert not drop & set(out.seqs) and out.seqs == tuple(q for q in rk.seqs if q not in drop)
    assert all(p[0] not in drop for p in out.pieces) and all(d[0] not in drop for d in out.dense)
    lift = [rk.seqs[-1]]
    up = promoted(rk, lift, dict(rk.dense), random.Random(0), top=3)
    assert up.seqs.index(lift[0]) < 4 and sorted(up.seqs) == sorted(rk.seqs)


def test_a_rationale_quotes_what_is_missing(memory):
    items = {it.seq: it for it in memory.items(scope="dana", limit=None)}
    q = Question("dana", "dana", "cat?", ((0,), (1,)), 4)
    text = rationale(q, [True, False], items)
    assert items[1].text.split()[0] in text and "lacks" in text and "Not enough" in text


def test_present_pieces_accepts_any_item_of_a_piece(memory):
    ctx = memory.render("cat", 400, scope="dana")
    shown = sorted({s for p in ctx.parts for s in p.seqs})
    items = {it.seq: it for it in memory.items(scope="dana", limit=None)}
    q = Question("dana", "dana", "cat", ((10_000, shown[0]),), 4)
    assert present_pieces(q, ctx.text, ctx.parts, items, 128) == [True]


def test_the_stem_folds_plurals_and_verb_endings():
    assert stem("paintings") == stem("painting") == stem("painted") == "paint"
    assert stem("stories") == "story" and stem("is") == "is"


def test_training_features_are_the_engines(memory):
    """The natural context at the reader's budget in training is, feature for feature, what
    the engine hands the router in auto mode."""
    q = _questions(memory)[0]
    ex = build(memory, [q], "demo", DataConfig(budgets=(1000,), fast_budget=1000, interventions=False))
    nat = next(e for e in ex if e.kind == "natural")
    eng = Engine(memory.store, memory.retriever, memory.renderer, ScriptedLLM("x"))
    inp = eng.route_input(q.query, scope="dana", config=memory.engine_config.replace(reader_budget=1000),
                          retrieval=memory.retrieval, render=memory.render_config)
    f = extract(inp.query, inp.ranking, inp.parts, inp.items, [h.seq for h in inp.evidence.hits], inp.tokens)
    assert inp.text == nat.text and f.seqs == nat.features.seqs
    np.testing.assert_allclose(f.elements, nat.features.elements, atol=1e-6)
    np.testing.assert_allclose(f.context, nat.features.context, atol=1e-6)
    np.testing.assert_allclose(f.vectors, nat.features.vectors, atol=1e-6)
    assert f.elements.shape[1] == len(ELEMENT_FEATURES) and f.context.shape[0] == len(GLOBAL_FEATURES)


# -- training and export ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory, embedder):
    pytest.importorskip("torch")
    from conftest import history_items

    from suffice._train.router import RouterTrainConfig, export_router, train

    tmp = tmp_path_factory.mktemp("router")
    mem = Memory(tmp / "mem.db", embedder=embedder)
    mem.add(history_items(), scope="dana")
    ex = build(mem, _questions(mem), "demo", DataConfig(budgets=(200, 400, 1000), fast_budget=1000))
    cfg = RouterTrainConfig(epochs=3, beta=0.5, eval_budget=1000, teacher_tokens=64)
    net, report = train(ex, ex, cfg)
    out = export_router(net, tmp / "router", {"encoder": embedder.name, "tau": report.tau})
    yield mem, ex, net, report, out
    mem.close()


def test_training_reports_its_checkpoint_and_threshold(trained):
    _mem, _ex, _net, report, _out = trained
    assert 0 <= report.best_epoch < 3 and len(report.history) == 3
    assert 0.0 <= report.tau <= 1.0 and report.s0 > 0
    assert report.teacher_seconds > 0  # the teacher read the rationales


def test_tau_meets_a_quality_floor_or_a_stop_rate_whichever_is_asked():
    from suffice._train.router import calibrate
    scores = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05]
    labels = [True, True, True, False, True, False, False, True, False, False]
    tau, rate, prec = calibrate(scores, labels, precision=1.0)
    assert (tau, rate, prec) == (0.7, 0.3, 1.0)  # the smallest tau whose stops are all right
    tau, rate, prec = calibrate(scores, labels, precision=1.0, stop_rate=0.6)
    assert tau == 0.4 and rate == 0.6 and prec == pytest.approx(4 / 6)  # the largest that stops 60%
    with pytest.raises(ValueError, match="stop_rate"):
        calibrate(scores, labels, precision=1.0, stop_rate=0.0)


def _routed(mem, router):
    """What ``router`` reads for the second demo question in auto mode, and the natural 1k
    training example built for the same question."""
    eng = Engine(mem.store, mem.retriever, mem.renderer, ScriptedLLM("x"), router=router)
    q = _questions(mem)[1]
    inp = eng.route_input(q.query, scope="dana", config=mem.engine_config, retrieval=mem.retrieval,
                          render=mem.render_config)
    nat = next(e for e in build(mem, [q], "demo", DataConfig(budgets=(1000,), interventions=False))
               if e.kind == "natural")
    return inp, nat


def test_the_onnx_router_scores_like_the_network(trained):
    from suffice._train.router import predict

    mem, ex, net, _report, out = trained
    router = TrainedRouter(out)
    inp, nat = _routed(mem, router)
    d = router.score(inp)
    assert d.ok and 0.0 <= d.score <= 1.0
    # The int8-stored weights cost a little precision, never a decision's worth.
    assert d.score == pytest.approx(float(predict(net, [nat])[0]), abs=0.02)


def test_tau_is_calibrated_on_the_scores_the_exported_model_gives(trained, tmp_path):
    import dataclasses
    import shutil

    from suffice._train.router import (
        RouterTrainConfig,
        calibrate_on,
        judged,
        predict_exported,
        recalibrate_exported,
    )

    mem, ex, _net, report, out = trained
    folder = Path(shutil.copytree(out, tmp_path / "router"))
    cfg = RouterTrainConfig(eval_budget=1000)
    val = judged(ex, 1000)  # what train() calibrates on: natural contexts at the reader's budget
    # Interventions beside them, labelled the other way round, must not move tau.
    flipped = [dataclasses.replace(e, kind="drop_all", label=not e.label) for e in val]
    card = recalibrate_exported(folder, list(ex) + flipped, cfg)
    onnx_scores = predict_exported(folder, val)
    assert card["tau"] == calibrate_on(onnx_scores.tolist(), val, cfg)[0]
    # int8 weights move a score by thousandths: tau moves little, if at all.
    assert card["tau"] == pytest.approx(report.tau, abs=0.02)
    assert card["tau_fp32"] == report.tau and TrainedRouter(folder).tau == card["tau"]
    assert recalibrate_exported(folder, ex, cfg)["tau_fp32"] == report.tau  # a rerun keeps it
    # predict_exported is the runtime's score: the same context scored by TrainedRouter agrees.
    router = TrainedRouter(folder)
    inp, nat = _routed(mem, router)
    assert router.score(inp).score == pytest.approx(float(predict_exported(folder, [nat])[0]), abs=1e-5)


def test_the_card_carries_tau_features_and_encoder(trained):
    _mem, _ex, _net, report, out = trained
    card = json.loads((out / "card.json").read_text())
    assert card["kind"] == "router" and card["tau"] == report.tau
    assert card["element_features"] == list(ELEMENT_FEATURES) and card["encoder"]
    router = TrainedRouter(out)
    assert router.tau == report.tau and router.name == "trained" and router.target == "evidence"


def test_a_width_router_says_what_its_score_means(trained, memory, tmp_path):
    _mem, _ex, _net, _report, out = trained
    wide = tmp_path / "wide"
    wide.mkdir()
    (wide / "model.onnx").write_bytes((out / "model.onnx").read_bytes())
    card = json.loads((out / "card.json").read_text())
    (wide / "card.json").write_text(json.dumps({**card, "target": "width"}))
    engine = Engine(memory.store, memory.retriever, memory.renderer, None)  # type: ignore[arg-type]
    inp = engine.route_input("What is the name of Dana's cat?", scope="dana", config=memory.engine_config,
                             retrieval=memory.retrieval, render=memory.render_config)
    d = TrainedRouter(wide).score(inp)
    assert TrainedRouter(wide).target == "width" and "no more evidence wider" in d.reason
    assert "all evidence here" in TrainedRouter(out).score(inp).reason


def test_a_router_fit_to_other_features_is_refused(trained, tmp_path):
    from suffice import ModelFileError

    _mem, _ex, _net, _report, out = trained
    bad = tmp_path / "old"
    bad.mkdir()
    (bad / "model.onnx").write_bytes((out / "model.onnx").read_bytes())
    card = json.loads((out / "card.json").read_text())
    card["features_version"] = 0
    (bad / "card.json").write_text(json.dumps(card))
    with pytest.raises(ModelFileError, match="train it again"):
        TrainedRouter(bad)


def test_auto_mode_uses_the_router_from_the_environment_and_its_tau(trained, monkeypatch):
    mem, _ex, _net, report, out = trained
    monkeypatch.setenv("SUFFICE_ROUTER", str(out))
    fresh = Memory(mem.path, embedder=mem.embedder)
    try:
        assert isinstance(fresh.router, TrainedRouter)
        llm = ScriptedLLM("<answer>Figo</answer>")
        r = fresh.ask("What is the name of Dana's cat?", scope="dana", llm=llm, mode="auto").receipt
        assert r.router == "trained" and r.tau == report.tau and r.router_score is not None
        assert r.path == ("fast" if r.router_score >= report.tau else "deep")
        # A caller's tau wins over the router's own.
        r2 = fresh.ask("What is the name of Dana's cat?", scope="dana", llm=llm, mode="auto", tau=0.0).receipt
        assert r2.tau == 0.0 and r2.path == "fast"
        r3 = fresh.ask("What is the name of Dana's cat?", scope="dana", llm=llm, mode="auto",
                       engine=EngineConfig(tau=1.0)).receipt
        assert r3.tau == 1.0
    finally:
        fresh.close()


def test_a_router_used_at_another_budget_than_it_was_trained_on_says_so(trained, tmp_path):
    import shutil
    mem, _ex, _net, _report, out = trained
    folder = Path(shutil.copytree(out, tmp_path / "router"))
    card = json.loads((folder / "card.json").read_text())
    (folder / "card.json").write_text(json.dumps({**card, "budget": 1000}))
    router = TrainedRouter(folder)
    assert router.trained_budget == 1000
    llm = ScriptedLLM("<answer>Figo</answer>")
    q = "What is the name of Dana's cat?"
    same = mem.ask(q, scope="dana", llm=llm, mode="auto", router=router,
                   engine=EngineConfig(reader_budget=1000)).receipt
    other = mem.ask(q, scope="dana", llm=llm, mode="auto", router=router,
                    engine=EngineConfig(reader_budget=500)).receipt
    assert not any("trained and calibrated on" in n for n in same.notes)
    assert any("1000-token contexts" in n and "made for 500" in n for n in other.notes)


def test_a_router_used_with_another_k_than_it_was_trained_with_says_so(trained, tmp_path):
    import shutil
    mem, _ex, _net, _report, out = trained
    folder = Path(shutil.copytree(out, tmp_path / "router"))
    card = {**json.loads((folder / "card.json").read_text()), "k": DataConfig().prefix_k}
    (folder / "card.json").write_text(json.dumps(card))  # as `train router` writes it
    router = TrainedRouter(folder)
    assert router.trained_k == card["k"]
    llm = ScriptedLLM("<answer>Figo</answer>")
    q = "What is the name of Dana's cat?"
    same = mem.ask(q, scope="dana", llm=llm, mode="auto", router=router,
                   retrieval=mem.retrieval.replace(k=card["k"])).receipt
    other = mem.ask(q, scope="dana", llm=llm, mode="auto", router=router,
                    retrieval=mem.retrieval.replace(k=3)).receipt
    assert not any("top hits" in n for n in same.notes)
    assert any(f"top {card['k']} hits" in n and "k=3" in n for n in other.notes)


def test_a_router_trained_on_another_encoder_is_not_the_default(trained, monkeypatch):
    _mem, _ex, _net, _report, out = trained
    monkeypatch.setenv("SUFFICE_ROUTER", str(out))
    with pytest.warns(UserWarning, match="trained on vectors of .* this memory has some-other-encoder"):
        assert default_router("some-other-encoder") is None  # named on purpose: said, not silent
    assert default_router("") is None  # a memory without an embedder has no vectors to read
    assert isinstance(default_router(_mem.embedder.name), TrainedRouter)


def test_a_memory_without_vectors_is_sent_deep_not_scored_on_zeros(trained, tmp_path):
    from conftest import history_items
    _mem, _ex, _net, _report, out = trained
    bare = Memory(tmp_path / "bare.db", embedder=None)
    bare.add(history_items(), scope="dana")
    from dataclasses import replace
    ev = bare.search("cat", scope="dana")
    ranking = bare.retriever.rank("dana", "cat", bare.retrieval)
    d = TrainedRouter(out).score(replace(RouterInput.of_evidence("cat", ev), ranking=ranking))
    assert not d.ok and "vectors" in d.reason
    bare.close()


@pytest.mark.parametrize("field,value", [("tau", None), ("tau", "0.6x"), ("tau", 7), ("dim", "384d"),
                                         ("element_features", None), ("budget", "1k"), ("budget", 0),
                                         ("k", "ten"), ("k", 0), ("dim", 384.9), ("target", "bogus"),
                                         ("dim", 1000)])  # a whole number, not the graph's width
def test_a_card_with_a_bad_value_is_a_model_file_error(trained, tmp_path, field, value):
    from suffice import ModelFileError
    _mem, _ex, _net, _report, out = trained
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.onnx").write_bytes((out / "model.onnx").read_bytes())
    card = json.loads((out / "card.json").read_text())
    card[field] = value
    (bad / "card.json").write_text(json.dumps(card))
    with pytest.raises(ModelFileError):
        TrainedRouter(bad)


def test_without_a_ranking_the_trained_router_sends_the_query_deep(trained, memory):
    _mem, _ex, _net, _report, out = trained
    ev = memory.search("cat", scope="dana")
    d = TrainedRouter(out).score(RouterInput.of_evidence("cat", ev))
    assert not d.ok and "ranking" in d.reason


def test_cross_validation_holds_out_whole_groups(trained):
    from suffice._train.router import RouterTrainConfig, cross_validate, split_groups

    _mem, ex, _net, _report, _out = trained
    renamed = [e.__class__(**{**{f: getattr(e, f) for f in e.__dataclass_fields__},
                              "group": f"g{i % 3}"}) for i, e in enumerate(ex)]
    cv = cross_validate(renamed, 3, RouterTrainConfig(epochs=1, beta=0.0))
    assert len(cv["folds"]) == 3
    for f in cv["folds"]:
        assert not set(f["held_out"]) & set(f["validation"])
    train_g, val_g = split_groups(["a", "b", "c", "d", "e", "f", "g"])
    assert val_g and not set(train_g) & set(val_g) and sorted(train_g + val_g) == list("abcdefg")


def test_several_validation_histories_are_spread_and_one_always_trains():
    from suffice._train.router import split_groups

    assert split_groups(list("abcdefg"), n_val=1) == split_groups(list("abcdefg"))
    train_g, val_g = split_groups(list("gfedcba"), n_val=2)
    assert val_g == ["b", "f"] and train_g == list("acdeg")
    assert split_groups(["a", "b"], n_val=5) == (["a"], ["b"])


def test_tau_can_be_set_by_what_width_would_add_while_the_router_learns_the_evidence_label(memory):
    from suffice._train.router import RouterTrainConfig, calibrate, judged, predict, train

    ex = build(memory, _questions(memory), "demo", DataConfig(budgets=(100, 200, 400), fast_budget=200))
    config = RouterTrainConfig(epochs=1, beta=0.0, eval_budget=200, calibrate_on="width")
    net, report = train(ex, ex, config)
    val = judged(ex, 200)
    scores = predict(net, val).tolist()
    expected = calibrate(scores, [not e.wider_adds for e in val], config.precision)
    assert (report.tau, report.val_early_rate, report.val_precision) == expected
    with pytest.raises(ValueError, match="twice the budget"):  # no render at 800 to compare with
        train(ex, ex, RouterTrainConfig(epochs=1, beta=0.0, eval_budget=400, calibrate_on="width"))


def test_distillation_adds_to_the_evidence_level_losses_it_does_not_replace_them(trained):
    """With beta > 0 the item and multi-evidence terms still train the network: weighting them
    differently gives a different network (training is deterministic)."""
    from suffice._train.router import RouterTrainConfig, train

    _mem, ex, _net, _report, _out = trained
    nets = [train(ex, ex, RouterTrainConfig(epochs=1, beta=0.5, item_weight=w, multi_weight=w,
                                            eval_budget=1000, teacher_tokens=64))[0]
            for w in (0.0, 2.0)]
    a, b = (dict(n.state_dict()) for n in nets)
    assert any(not np.allclose(a[k].numpy(), b[k].numpy()) for k in a)


def test_a_history_left_half_stored_by_an_interrupted_run_is_completed(tmp_path, embedder):
    from types import SimpleNamespace

    from conftest import history_items

    from suffice._train.sufficiency_data import histories

    items = history_items()
    evset = SimpleNamespace(name="demo", histories=[("dana", items)], questions=lambda mem: [])
    first = Memory(tmp_path / "demo.db", embedder=embedder)
    first.add(items[:5], scope="dana")  # the run stopped here
    first.close()
    mem, _ = histories(evset, [], tmp_path, embedder=embedder)
    assert len(mem.items(scope="dana", limit=None)) == len(items)
    mem.close()
