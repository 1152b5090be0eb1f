"""The progressive benchmark's arithmetic: AUC, and auto(tau) composed from fast and deep."""

import json

import pytest

from suffice._bench.progressive import auc, summarize


def test_auc_is_mann_whitney_with_half_ties():
    assert auc([0.9, 0.8, 0.1], [True, True, False]) == 1.0
    assert auc([0.1, 0.9], [True, False]) == 0.0
    assert auc([0.5, 0.5], [True, False]) == 0.5
    assert auc([0.3], [True]) is None


def _rec(key, fast_f1, deep_f1, score):
    def res(f1, ms):
        return {"f1": f1, "receipt": {"t_mem_ms": ms / 2, "t_e2e_ms": ms, "input_tokens": 100,
                                      "output_tokens": 5, "cost_usd": 0.001}}
    return {"key": key, "variant": "progressive", "fast": res(fast_f1, 1000), "deep": res(deep_f1, 5000),
            "prefix_has_all_gold": fast_f1 > 0.5,
            "routers": {"r": {"score": score, "ok": True, "ms": 100.0, "cost_usd": 0.0, "tokens": 50}}}


def test_auto_takes_fast_at_or_above_tau_and_adds_router_time(tmp_path):
    path = tmp_path / "p.jsonl"
    recs = [_rec("a", 1.0, 1.0, 0.9), _rec("b", 0.0, 1.0, 0.2)]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    s = summarize(path, taus=(0.5, 0.95))
    fast, deep = s["rows"]["fast"], s["rows"]["deep"]
    assert fast["f1"] == 50.0 and deep["f1"] == 100.0
    auto = s["rows"]["auto[r] tau=0.5"]
    assert auto["early_rate"] == 50.0 and auto["f1"] == 100.0
    assert auto["t_e2e_ms"] == pytest.approx((1000 + 100 + 5000 + 100) / 2)
    assert auto["tokens"] == fast["tokens"] + 50  # the router's tokens count too
    assert s["rows"]["auto[r] tau=0.95"]["early_rate"] == 0.0
    assert s["auc"]["r"]["fast_correct_f1>=0.5"] == 1.0


def test_router_auc_leaves_out_unknown_labels(tmp_path):
    path = tmp_path / "p.jsonl"
    recs = [_rec("a", 1.0, 1.0, 0.9), _rec("b", 0.0, 1.0, 0.2), _rec("c", 1.0, 1.0, 0.1)]
    recs[0]["fast"]["judge"], recs[1]["fast"]["judge"] = 1.0, 0.0
    recs[2]["fast"]["judge"] = None  # the judge failed on c: no label
    recs[2]["n_gold"] = 0  # c has no gold evidence in the store: no label either
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    a = summarize(path, taus=(0.5,))["auc"]["r"]
    assert a["fast_judged_correct"] == 1.0 and a["prefix_has_all_gold"] == 1.0
    assert a["fast_correct_f1>=0.5"] == 0.5  # c counts here: its F1 is known


def test_the_plot_draws_one_line_per_router(tmp_path):
    pytest.importorskip("matplotlib")
    from suffice._bench.progressive import plot
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(_rec("a", 1.0, 1.0, 0.9)) + "\n")
    png = tmp_path / "p.png"
    plot(summarize(path, taus=(0.5,)), png)
    assert png.stat().st_size > 1000


def test_acceptance_names_a_routed_run_and_not_just_the_fast_path(tmp_path):
    # Deep wins question b by far; the router sends exactly b deep at tau=0.5.
    path = tmp_path / "p.jsonl"
    recs = [_rec(str(i), 1.0, 1.0, 0.9) for i in range(8)] + [_rec("b", 0.0, 1.0, 0.2)]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    s = summarize(path, taus=(0.1, 0.5, 0.95))
    acc = s["acceptance"]["r"]
    # tau=0.1 is the fast path (loses 11 F1); tau=0.95 is deep plus router time (not faster).
    assert acc["passed"] and acc["best"] == acc["routed"] == "auto[r] tau=0.5"
    assert s["rows"]["oracle (best path per question)"]["f1"] == 100.0
    deep_vs_fast = next(c for c in s["compare"] if (c["a"], c["b"]) == ("deep", "fast"))
    assert deep_vs_fast["f1_diff"] == pytest.approx(100 / 9)
    lo, hi = deep_vs_fast["ci95"]
    assert 0.0 <= lo <= deep_vs_fast["f1_diff"] <= hi


def test_acceptance_reports_how_far_off_a_failing_router_is(tmp_path):
    # The router's scores are backwards: it stops early exactly where deep was needed.
    path = tmp_path / "p.jsonl"
    recs = [_rec(str(i), 1.0, 1.0, 0.2) for i in range(3)] + [_rec("b", 0.0, 1.0, 0.9)]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    acc = summarize(path, taus=(0.5, 0.95))["acceptance"]["r"]
    assert not acc["passed"] and acc["best"] is None
    assert acc["closest_in_time"] is None  # nothing is 20% faster than deep
    assert acc["closest_in_f1"]["run"] == "auto[r] tau=0.95"


def test_a_router_perfect_on_the_evidence_label_is_scored_against_the_target(tmp_path):
    # The fast context holds all gold on a and b, yet deep's stronger reader still wins b:
    # stopping exactly where the evidence is present loses b's points.
    path = tmp_path / "p.jsonl"
    recs = [_rec("a", 1.0, 1.0, 0.9), _rec("b", 0.0, 1.0, 0.9), _rec("c", 0.0, 1.0, 0.1)]
    for r, has in zip(recs, (True, True, False), strict=True):
        r["fast_has_all_gold"] = has
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    s = summarize(path, taus=(0.5,))
    name = "oracle on the evidence label (stop where the fast context holds all gold)"
    row = s["rows"][name]
    assert row["early_rate"] == pytest.approx(200 / 3) and row["f1"] == pytest.approx(200 / 3)
    assert s["acceptance"][name]["passed"] is False  # 33 F1 below deep: no router on this label passes
    assert any(c["a"] == name and c["b"] == "deep" for c in s["compare"])
    legacy = tmp_path / "old.jsonl"  # records from before the label was kept: no such row
    legacy.write_text(json.dumps(_rec("a", 1.0, 1.0, 0.9)) + "\n")
    assert name not in summarize(legacy, taus=(0.5,))["rows"]


def test_a_router_perfect_on_the_width_label_goes_deep_only_where_twice_the_budget_shows_more(tmp_path):
    path = tmp_path / "p.jsonl"
    recs = [_rec("a", 1.0, 1.0, 0.9), _rec("b", 0.0, 1.0, 0.1), _rec("c", 0.0, 0.0, 0.8)]
    for r, wider in zip(recs, (False, True, False), strict=True):
        r["wider_adds"], r["fast_has_all_gold"] = wider, r["key"] == "a"
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    s = summarize(path, taus=(0.5,))
    row = s["rows"]["oracle on the width label (stop unless twice the budget shows more gold)"]
    assert row["early_rate"] == pytest.approx(200 / 3) and row["f1"] == pytest.approx(200 / 3)
    assert s["auc"]["r"]["wider_adds_nothing"] == 1.0  # b, the one width helps, scores lowest
    legacy = tmp_path / "old.jsonl"
    legacy.write_text(json.dumps(_rec("a", 1.0, 1.0, 0.9)) + "\n")
    assert "wider_adds_nothing" not in summarize(legacy, taus=(0.5,))["auc"]["r"]


def test_auto_whose_stops_the_deep_model_answers_is_composed_from_the_stop_path(tmp_path):
    # a: the fast reader misses what the deep model reads in the same fast context.
    path = tmp_path / "p.jsonl"
    recs = [_rec("a", 0.0, 1.0, 0.9), _rec("b", 0.0, 1.0, 0.2)]
    for r, f1 in zip(recs, (1.0, 0.0), strict=True):
        r["stop"] = {"f1": f1, "receipt": {"t_mem_ms": 10, "t_e2e_ms": 1000, "input_tokens": 100,
                                           "output_tokens": 5, "cost_usd": 0.0}}
        r["context_ms"], r["fast_has_all_gold"] = 40.0, r["key"] == "a"
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    s = summarize(path, taus=(0.5,))
    plain, by_deep = s["rows"]["auto[r] tau=0.5"], s["rows"]["auto[r] tau=0.5 stop=deep"]
    assert plain["f1"] == 50.0 and by_deep["f1"] == 100.0 and by_deep["early_rate"] == 50.0
    # a stop pays the router, the fast context it read, then the deep model's answer
    assert by_deep["t_e2e_ms"] == pytest.approx((1000 + 100 + 40 + 5000 + 100 + 40) / 2)
    assert not s["acceptance"]["r"]["passed"] and s["acceptance"]["r stop=deep"]["passed"]
    oracle = "oracle on the evidence label (stop where the fast context holds all gold) stop=deep"
    assert s["rows"][oracle]["f1"] == 100.0


def test_paired_bootstrap_brackets_the_mean_difference():
    from suffice._bench.report import paired_bootstrap
    diff, lo, hi = paired_bootstrap([1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0])
    assert diff == pytest.approx(1.5) and lo <= diff <= hi and lo >= 0.0
    assert paired_bootstrap([2.0] * 5, [1.0] * 5) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [1.0, 2.0])


def test_verify_runs_auto_for_real_and_matches_the_composed_records(tmp_path, memory):
    """run() records fast and deep; verify() runs auto and must agree with them."""
    from suffice._bench.progressive import run, verify
    from suffice._bench.qa import QAItem
    from suffice._datasets.locomo import LocomoQuestion
    from suffice._llm import ScriptedLLM

    def respond(messages):
        if "reading one excerpt" in messages[0]["content"]:
            return "[2025-04-11] Dana: We adopted a grey cat from the shelter last weekend. Her name is Figo."
        return "<answer>Figo</answer>" if "Figo" in messages[-1]["content"] else "<answer>no idea</answer>"
    llm = ScriptedLLM(respond, probs={"yes": 0.5, "no": 0.5})
    items = [QAItem(f"dana#{i}", "dana", i, LocomoQuestion(q, "Figo", 4, ()))
             for i, q in enumerate(["What is the name of Dana's cat?", "Kyoto trip when?",
                                    "Where did Dana go in November?"])]
    out = tmp_path / "p.jsonl"
    run(memory, llm, items, out, budget=600, gold_seqs=lambda item: set())
    v = verify(memory, llm, items, out, n=3, tau=0.5, budget=600)
    assert v["n"] == 3 and v["same_path"] == 3 and v["same_answer"] == 3 and not v["mismatches"]
    # A record that no longer matches what the code does is reported.
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    for r in recs:
        r["fast"]["answer"] = r["deep"]["answer"] = "stale"
    out.write_text("".join(json.dumps(r) + "\n" for r in recs))
    v = verify(memory, llm, items, out, n=3, tau=0.5, budget=600)
    assert v["same_answer"] == 0 and len(v["mismatches"]) == 3


def test_verify_expects_the_fast_path_where_a_recorded_deep_run_fell_back_to_it(tmp_path, memory):
    """Agents that find nothing, with no wider evidence to read instead, send deep to the fast
    path; verify compares with that path."""
    from suffice import EngineConfig
    from suffice._bench.progressive import run, verify
    from suffice._bench.qa import QAItem
    from suffice._datasets.locomo import LocomoQuestion
    from suffice._llm import ScriptedLLM

    def respond(messages):
        if "reading one excerpt" in messages[0]["content"]:
            return "NONE"
        return "<answer>Figo</answer>"
    llm = ScriptedLLM(respond, probs={"yes": 0.5, "no": 0.5})
    memory.engine_config = EngineConfig(deep_agents=True, deep_scale=1.0)
    items = [QAItem("dana#0", "dana", 0, LocomoQuestion("What is the name of Dana's cat?", "Figo", 4, ()))]
    out = tmp_path / "p.jsonl"
    run(memory, llm, items, out, budget=600, gold_seqs=lambda item: set())
    rec = json.loads(out.read_text())
    assert rec["deep"]["receipt"]["path"] == "fast" and rec["deep"]["receipt"]["degraded"]
    v = verify(memory, llm, items, out, n=1, tau=1.0, budget=600)  # auto goes deep, falls back
    assert v["same_path"] == 1 and v["same_answer"] == 1 and not v["mismatches"]


def test_a_result_names_the_command_that_produced_it():
    from suffice._bench.report import _command
    assert _command(["/venv/bin/suffice", "bench", "qa", "--limit", "5"]) == "suffice bench qa --limit 5"
    assert _command(["benchmarks/deep_variant.py", "--out", "x.jsonl"]) == \
        "python benchmarks/deep_variant.py --out x.jsonl"


def test_benchmark_records_name_shared_data_as_a_checkout_does() -> None:
    from suffice._bench.report import portable
    from suffice._datasets.paths import shared_data_dir
    inside = str(shared_data_dir().resolve() / "locomo" / "locomo_shared.json")
    assert portable(inside) == "../shared/data/locomo/locomo_shared.json"
    assert portable("/somewhere/on/this/machine/pypi.tsv") == "pypi.tsv"
    assert portable("docs/results/x.json") == "docs/results/x.json"


def test_the_stop_path_is_what_auto_answers_an_early_stop_with_under_stop_reader_deep(tmp_path, memory):
    from suffice import EngineConfig
    from suffice._bench.progressive import run
    from suffice._bench.qa import QAItem
    from suffice._datasets.locomo import LocomoQuestion
    from suffice._llm import ScriptedLLM
    from suffice._route import ScoreRouter

    small = ScriptedLLM("<answer>no idea</answer>")
    strong = ScriptedLLM("<answer>Figo</answer>", model="strong")
    item = QAItem("dana#0", "dana", 0, LocomoQuestion("What is the name of Dana's cat?", "Figo", 4, ()))
    out = tmp_path / "p.jsonl"
    counts = run(memory, small, [item], out, budget=600, gold_seqs=lambda item: set(), deep_llm=strong,
                 stop_path=True)
    assert counts["ran"] == 3
    rec = json.loads(out.read_text().splitlines()[0])
    assert rec["fast"]["f1"] == 0.0 and rec["stop"]["f1"] == 1.0
    tokens = {path: rec[path]["receipt"]["context_tokens"] for path in ("stop", "deep")}
    assert tokens["stop"] <= int(0.95 * 600) < tokens["deep"]  # the fast budget, not the deep one
    real = memory.ask(item.q.question, scope="dana", llm=small, deep_llm=strong, mode="auto",
                      router=ScoreRouter(), tau=0.0, budget=600, engine=EngineConfig(stop_reader="deep"))
    assert real.text == rec["stop"]["answer"] and real.receipt.path == "fast"
    assert strong.calls[-1] == strong.calls[1]  # the very prompt the stop path recorded
    assert run(memory, small, [item], out, budget=600, gold_seqs=lambda item: set(), deep_llm=strong,
               stop_path=True)["ran"] == 0


def test_verify_checks_a_deep_model_stop_against_the_stop_path_and_a_fast_stop_against_fast(
        tmp_path, memory):
    from suffice._bench.progressive import run, verify
    from suffice._bench.qa import QAItem
    from suffice._datasets.locomo import LocomoQuestion
    from suffice._llm import ScriptedLLM
    from suffice._route import ScoreRouter

    small = ScriptedLLM("<answer>no idea</answer>")
    strong = ScriptedLLM("<answer>Figo</answer>", model="strong")
    item = QAItem("dana#0", "dana", 0, LocomoQuestion("What is the name of Dana's cat?", "Figo", 4, ()))
    out = tmp_path / "p.jsonl"
    for stop_path in (True, False):
        run(memory, small, [item], out, budget=600, gold_seqs=lambda item: {1}, deep_llm=strong,
            stop_path=stop_path)
        v = verify(memory, small, [item], out, n=1, tau=0.0, budget=600, router=ScoreRouter(),
                   deep_llm=strong)
        assert v["same_path"] == v["same_answer"] == 1, v["mismatches"]
        rec = json.loads(out.read_text())
        assert ("stop" in rec) == stop_path and "wider_adds" in rec
        out.unlink()


def test_a_rerun_reuses_nothing_recorded_for_another_question_budget_or_settings(tmp_path, memory):
    """Records are kept by position ("dana#0"): a key now asking something else is answered
    from scratch, a router scores again at another budget, and a stop result of other settings
    is dropped rather than composed into auto rows."""
    import dataclasses

    from suffice._bench.progressive import run
    from suffice._bench.qa import QAItem, questions_of
    from suffice._datasets.locomo import LocomoQuestion
    from suffice._llm import ScriptedLLM

    small = ScriptedLLM("<answer>no idea</answer>")
    strong = ScriptedLLM("<answer>Figo</answer>", model="strong")
    item = QAItem("dana#0", "dana", 0, LocomoQuestion("What is the name of Dana's cat?", "Figo", 4, ()))
    out = tmp_path / "p.jsonl"
    run(memory, small, [item], out, budget=600, gold_seqs=lambda item: set(), deep_llm=strong, stop_path=True)
    # Same settings: everything reused, no router scored again.
    again = run(memory, small, [item], out, budget=600, gold_seqs=lambda item: set(), deep_llm=strong,
                stop_path=True)
    assert again["ran"] == 0 and again["routers_scored"] == 0
    # Another budget: the paths run again (their fingerprints differ) and so do the routers,
    # whose input is what the fast reader reads at that budget; the stop result of the old
    # budget is not kept when this run does not record the stop path.
    other = run(memory, small, [item], out, budget=400, gold_seqs=lambda item: set(), deep_llm=strong)
    assert other["ran"] == 2 and other["routers_scored"] == 2
    rec = json.loads(out.read_text().splitlines()[0])
    assert "stop" not in rec
    # The same key now asking another question: nothing of the old record is reused.
    reworded = dataclasses.replace(item, q=dataclasses.replace(item.q, question="Which pet does Dana have?"))
    fresh = run(memory, small, [reworded], out, budget=400, gold_seqs=lambda item: set(), deep_llm=strong)
    assert fresh["ran"] == 2 and fresh["reused"] == 0
    assert summarize(out, questions=questions_of([item]))["n"] == 0
    assert summarize(out, questions=questions_of([reworded]))["n"] == 1
