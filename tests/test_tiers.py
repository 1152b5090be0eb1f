"""The tiered pipeline: five modules at three distinct tiers, each call costed, failures
falling one tier down, a numpy policy that matches its torch twin, and PPO that learns."""

from __future__ import annotations

import json
from datetime import date

import numpy as np
import pytest

from suffice import ConfigError, InvalidQueryError, Memory, NewItem, ProviderError
from suffice._llm import ScriptedLLM
from suffice._llm.base import Ledger
from suffice._pipeline import (
    MODULES,
    Chunk,
    ModuleCache,
    TieredPipeline,
    TierSettings,
)
from suffice._pipeline.modules import keyword_filter, rule_facts, similarity_filter, spacy_facts
from suffice._route.tiers import FixedTiers, HeuristicTiers, TierPolicy, load_tier_policy
from suffice._times import as_timestamp
from suffice._types import Item


def item(seq: int, text: str, speaker: str = "Dana", day: str = "2025-04-11", session: str = "s1") -> Item:
    return Item(id=f"i{seq}", scope="dana", seq=seq, session=session, speaker=speaker, role="user",
                kind="message", observed_at=day, text=text, meta={}, tokens=len(text.split()),
                observed_ts=as_timestamp(day))


def chunks(embedder=None) -> list[Chunk]:  # type: ignore[no-untyped-def]
    turns = [
        [item(0, "We adopted a grey cat from the shelter last weekend. Her name is Figo.")],
        [item(1, "My sister Ana moved to Lisbon in March.", day="2025-04-20")],
        [item(2, "The rainfall model for the Douro is due in June.", day="2025-05-02")],
    ]
    out = []
    for its in turns:
        vec = None
        if embedder is not None:
            vec = embedder.embed([its[0].text])[0]
        out.append(Chunk(tuple(its), vec))
    return out


def pipeline(llm=None, embedder=None, **kw) -> TieredPipeline:  # type: ignore[no-untyped-def]
    return TieredPipeline(llm, embedder, TierSettings(keep=2, **kw))


# -- Low and Mid: rules and small models, and they differ --------------------------------------

def test_the_keyword_filter_keeps_chunks_that_share_words_with_the_question() -> None:
    kept = keyword_filter("What is the name of Dana's cat?", chunks(), k=2)
    assert kept[0] == 0 and len(kept) <= 2


def test_the_similarity_filter_needs_an_embedder() -> None:
    with pytest.raises(ConfigError, match="embedder"):
        similarity_filter("cat?", None, chunks(), k=2)


def test_low_time_facts_state_relative_phrases_against_the_turns_own_date() -> None:
    facts = rule_facts("temporal", "When did Dana adopt the cat?", chunks())
    line = next(f for f in facts if "last weekend" in f)
    assert "11 April 2025" in line and "weekend before 11 April 2025" in line


def test_low_relations_name_the_speaker_for_i_and_my() -> None:
    facts = rule_facts("entity", "Where did Dana's sister move?", chunks())
    assert any(f.startswith("Dana's sister") and "Lisbon" in f for f in facts)


def test_mid_facts_come_from_a_parse_and_differ_from_the_rules() -> None:
    pytest.importorskip("spacy")
    q = "When did Dana's sister move to Lisbon?"
    mid = spacy_facts("temporal", q, chunks())
    assert any("March" in f and "move" in f for f in mid)
    for module in ("entity", "temporal", "topic"):
        assert spacy_facts(module, q, chunks()) != rule_facts(module, q, chunks())  # tiers stay distinct


# -- one run: receipts, costs, ledger, cache ---------------------------------------------------

def test_every_module_leaves_a_costed_receipt_and_a_ledger_record(embedder) -> None:  # type: ignore[no-untyped-def]
    pipe = pipeline(embedder=embedder, cpu_usd_per_hour=3600.0)  # $1 per second: visible
    ledger = Ledger()
    q = "What is the name of Dana's cat?"
    res = pipe.run(q, chunks(embedder), FixedTiers.all("low").chooser(q),
                   qvec=embedder.embed_query(q), ledger=ledger)
    assert [m.module for m in res.modules] == list(MODULES)
    assert all(m.tier == "low" == m.asked and m.latency_ms > 0 for m in res.modules)
    assert all(m.cost_usd == pytest.approx(m.latency_ms / 1e3) for m in res.modules)
    stages = [f"tier_{m}" for m in MODULES]
    # the tier chooser's view of the facts is embedded between the fact modules and the summary
    assert [c.stage for c in ledger.records] == [*stages[:-1], "tier_state", stages[-1]]
    assert ledger.records[-2].model == embedder.name and ledger.records[-2].latency_ms > 0
    assert "Figo" in res.text and res.kept[0] == 0


def test_a_repeated_call_is_replayed_with_the_cost_it_was_measured_at(tmp_path, embedder) -> None:  # type: ignore[no-untyped-def]
    cache = ModuleCache(tmp_path / "modules.db")
    q = "What is the name of Dana's cat?"
    first = TieredPipeline(None, embedder, TierSettings(keep=2), cache).run(
        q, chunks(embedder), FixedTiers.all("mid").chooser(q), qvec=embedder.embed_query(q))
    again = TieredPipeline(None, embedder, TierSettings(keep=2), ModuleCache(tmp_path / "modules.db")).run(
        q, chunks(embedder), FixedTiers.all("mid").chooser(q), qvec=embedder.embed_query(q))
    assert all(m.cached for m in again.modules) and not any(m.cached for m in first.modules)
    assert [m.cost_usd for m in again.modules] == [m.cost_usd for m in first.modules]
    assert again.text == first.text


def test_a_high_tier_that_cannot_be_read_falls_back_one_tier_and_says_so(embedder) -> None:  # type: ignore[no-untyped-def]
    llm = ScriptedLLM("<answer>I am not sure</answer>")
    q = "What is the name of Dana's cat?"
    res = pipeline(llm, embedder).run(q, chunks(embedder), FixedTiers.all("high").chooser(q),
                                      qvec=embedder.embed_query(q))
    filt = res.modules[0]
    assert filt.asked == "high" and filt.tier == "mid" and "fell back to mid" in filt.note
    assert filt.input_tokens > 0 and filt.output_tokens > 0  # the failed call is paid for too
    assert res.modules[1].tier == "high"  # "I am not sure" is a (poor) fact line, not a failure


@pytest.mark.parametrize("error", [ProviderError("down"), RuntimeError("socket closed by the proxy")])
def test_a_failing_model_falls_back_and_the_query_still_gets_a_summary(embedder, error) -> None:  # type: ignore[no-untyped-def]
    """A provider's failure, or a caller's own model class failing its own way: the rung
    fails, the next one down runs."""
    llm = ScriptedLLM([error] * 10)
    q = "What is the name of Dana's cat?"
    res = pipeline(llm, embedder).run(q, chunks(embedder), FixedTiers.all("high").chooser(q),
                                      qvec=embedder.embed_query(q))
    assert all(m.tier == "mid" and type(error).__name__ in m.note for m in res.modules)
    assert "Figo" in res.text


def test_a_provider_outage_is_not_remembered_but_unusable_output_is(tmp_path, embedder) -> None:  # type: ignore[no-untyped-def]
    """A cached failure is replayed for good, so only failures that would repeat are cached."""
    q = "What is the name of Dana's cat?"

    def run(llm):  # type: ignore[no-untyped-def]
        cache = ModuleCache(tmp_path / "modules.db")
        return TieredPipeline(llm, embedder, TierSettings(keep=2), cache).run(
            q, chunks(embedder), FixedTiers.all("high").chooser(q), qvec=embedder.embed_query(q))

    down = run(ScriptedLLM([ProviderError("down")] * 10))
    assert down.modules[0].tier == "mid" and "ProviderError" in down.modules[0].note
    unsure = ScriptedLLM("<answer>I am not sure</answer>")
    garbled = run(unsure)  # the server is back: the filter asks it again, and cannot read the reply
    assert unsure.calls and "OutputParseError" in garbled.modules[0].note
    assert garbled.modules[0].tier == "mid"
    never = ScriptedLLM([ProviderError("must not be asked")] * 10)
    again = run(never)  # unusable output would come again: the failure is replayed, not asked for
    assert not never.calls and "OutputParseError" in again.modules[0].note
    assert all(m.cached for m in again.modules)


def test_the_capacity_strategy_needs_three_models() -> None:
    with pytest.raises(ConfigError, match="three models"):
        TieredPipeline(None, None, TierSettings(strategy="capacity"))
    with pytest.raises(ConfigError, match="unknown tier strategy"):
        TierSettings(strategy="bigger")  # type: ignore[arg-type]


def test_the_reasoning_strategy_asks_one_model_in_three_ways(embedder) -> None:  # type: ignore[no-untyped-def]
    llm = ScriptedLLM(lambda m: '<answer>["Dana - adopted - Figo"]</answer>')
    q = "What is the name of Dana's cat?"
    for tier, cue in (("low", "and nothing else"), ("mid", "step by step"), ("high", "PLAN")):
        llm.calls.clear()
        TieredPipeline(llm, embedder, TierSettings(strategy="reasoning", keep=2)).run(
            q, chunks(embedder), FixedTiers({m: tier for m in MODULES}).chooser(q),
            qvec=embedder.embed_query(q))
        entity_prompt = next(c[0]["content"] for c in llm.calls if "relationships" in c[0]["content"])
        assert cue in entity_prompt


# -- through Memory.ask ------------------------------------------------------------------------

def test_ask_with_the_tiered_agent_lists_each_modules_tier_on_the_receipt(memory) -> None:  # type: ignore[no-untyped-def]
    llm = ScriptedLLM("<answer>Figo</answer>")
    ans = memory.ask("What is the name of Dana's cat?", scope="dana", llm=llm, mode="deep",
                     agent="tiered", tier_cap="low")
    r = ans.receipt
    assert ans.text == "Figo" and r.path == "deep"
    assert [m.module for m in r.modules] == list(MODULES) and {m.tier for m in r.modules} == {"low"}
    lever = next(lv for lv in r.levers if lv.name == "tiers")
    assert "heuristic" in lever.detail and lever.cost_usd == pytest.approx(sum(m.cost_usd for m in r.modules))
    assert "tiers" in r.stages_ms and len(llm.calls) == 1  # untrained default: no module LLM call


def test_the_tiered_agent_refuses_what_it_cannot_honour(memory) -> None:  # type: ignore[no-untyped-def]
    llm = ScriptedLLM("<answer>Figo</answer>")
    with pytest.raises(InvalidQueryError, match="deep path"):
        memory.ask("cat?", scope="dana", llm=llm, agent="tiered")
    with pytest.raises(InvalidQueryError, match="tier_cap"):
        memory.ask("cat?", scope="dana", llm=llm, mode="deep", agent="tiered", tier_cap="max")  # type: ignore[arg-type]
    with pytest.raises(InvalidQueryError, match="agent='tiered' only"):
        memory.ask("cat?", scope="dana", llm=llm, mode="deep", lam=0.3)


def test_the_heuristic_default_reads_the_question() -> None:
    h = HeuristicTiers()
    assert h.tiers("When did Dana adopt the cat?")["temporal"] == "mid"
    assert h.tiers("What is the cat called?")["temporal"] == "low"
    assert "high" not in h.tiers("Who is Dana's sister?").values()


# -- the policy: numpy inference matches torch; files; nearest lambda ---------------------------

def test_the_numpy_policy_computes_what_the_trained_network_computes(tmp_path, embedder) -> None:  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    from suffice._train.tiers import _net, export

    desc = embedder.embed(["a", "b", "c", "d", "e"])
    net = _net(384, 32, desc, seed=1)
    for p in net.parameters():  # move off the near-uniform start so the test means something
        p.data.normal_(0, 0.3)
    policy = export(net, 0.3, embedder.name)
    rng = np.random.default_rng(0)
    for i, m in enumerate(MODULES):
        q, x = rng.normal(size=384).astype(np.float32), rng.normal(size=384).astype(np.float32)
        logits, _ = net(torch.tensor(i), torch.from_numpy(q), torch.from_numpy(x))
        want = torch.softmax(logits, -1).detach().numpy()
        assert np.allclose(policy.probs(m, q, x), want, atol=1e-5)
    policy.save(tmp_path / "tiers-0.3.npz", note="x")
    weights = dict(np.load(tmp_path / "tiers-0.3.npz"))
    TierPolicy(weights, lam=0.9, encoder="e").save(tmp_path / "tiers-0.9.npz")
    assert load_tier_policy(tmp_path, 0.5).lam == 0.3 and load_tier_policy(tmp_path, 0.8).lam == 0.9
    assert json.loads((tmp_path / "tiers-0.3.json").read_text())["note"] == "x"
    with pytest.raises(ConfigError, match="no tier policy"):
        load_tier_policy(tmp_path / "nowhere")


def random_policy(dim: int = 384, lam: float = 0.0, encoder: str = "") -> TierPolicy:
    """A policy of the trained shape with random weights (no torch needed)."""
    rng = np.random.default_rng(0)
    h = 8
    shapes = {"descriptors": (len(MODULES), 16), "wu": (h, 2 * dim), "bu": (h,), "wv": (h, 16), "bv": (h,),
              "w1": (h, 2 * h), "b1": (h,), "w2": (h, h), "b2": (h,), "w3": (h, h), "b3": (h,),
              "w4": (3, h), "b4": (3,)}
    return TierPolicy({k: rng.normal(size=v) for k, v in shapes.items()}, lam=lam, encoder=encoder)


def test_fixed_tiers_name_every_module_with_a_real_tier() -> None:
    with pytest.raises(ConfigError, match="no tier for entity, temporal, topic, summary"):
        FixedTiers({"filter": "mid"})
    with pytest.raises(ConfigError, match="unknown module"):
        FixedTiers({**{m: "low" for m in MODULES}, "ranker": "low"})
    with pytest.raises(ConfigError, match="'medium' is not one of"):
        FixedTiers({**{m: "low" for m in MODULES}, "topic": "medium"})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="tier must be one of"):
        FixedTiers.all("medium")  # type: ignore[arg-type]
    assert FixedTiers({m: "mid" for m in MODULES}).chooser("q")("topic", np.zeros(1), np.zeros(1)) == 1


def test_a_policy_file_that_is_not_one_is_refused_with_its_name(tmp_path) -> None:  # type: ignore[no-untyped-def]
    np.save(tmp_path / "tiers-0.npy", np.zeros(3))
    with pytest.raises(ConfigError, match="cannot read tier policy"):
        TierPolicy.load(tmp_path / "tiers-0.npy")
    (tmp_path / "junk.npz").write_bytes(b"garbage bytes")
    with pytest.raises(ConfigError, match="not a .npz weights file") as caught:
        TierPolicy.load(tmp_path / "junk.npz")
    assert "pickle" not in str(caught.value)  # numpy's advice to load it unsafely is not passed on
    random_policy(lam=0.3).save(tmp_path / "tiers-0.3.npz")
    card = tmp_path / "tiers-0.3.json"
    card.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a JSON object"):
        TierPolicy.load(tmp_path / "tiers-0.3.npz")
    card.write_text(json.dumps({"lam": "abc"}))
    with pytest.raises(ConfigError, match="lam must be a number"):
        TierPolicy.load(tmp_path / "tiers-0.3.npz")
    card.unlink()
    assert "no card" in TierPolicy.load(tmp_path / "tiers-0.3.npz").name  # λ unknown: said, not hidden


def test_policy_weights_whose_shapes_do_not_chain_are_refused_at_load() -> None:
    """They used to load, and fail with numpy's matmul error at the first tiered question."""
    good = random_policy(dim=8)
    for key, shape in (("w2", (5, 5)), ("wu", (8,)), ("w4", (4, 8)), ("b4", (2,))):
        broken = {**good.w, key: np.zeros(shape)}
        with pytest.raises(ConfigError, match="tier policy weights"):
            TierPolicy(broken, lam=0.0, encoder="e")


def test_a_policy_refuses_vectors_it_was_not_trained_on(tmp_path, memory, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    small = random_policy(dim=8)
    with pytest.raises(ConfigError, match="reads 8-dim vectors; this memory's are 384-dim"):
        small.chooser("q")("filter", np.zeros(384, np.float32), np.zeros(384, np.float32))
    llm = ScriptedLLM("<answer>Figo</answer>")
    with pytest.raises(ConfigError, match="reads 8-dim vectors; this memory's encoder gives 384"):
        memory.ask("What is the name of Dana's cat?", scope="dana", llm=llm, mode="deep",
                   agent="tiered", tiers=small)  # refused before any work, not degraded at every ask
    with pytest.raises(ConfigError, match="trained on encoder 'other'"):
        memory.ask("cat?", scope="dana", llm=llm, mode="deep", agent="tiered",
                   tiers=random_policy(encoder="other"))
    bare = Memory(tmp_path / "bare.db", embedder=None)  # no embedder: a policy would read zero vectors
    bare.add([NewItem(text="We adopted a grey cat called Figo.", speaker="Dana")], scope="dana")
    with pytest.raises(ConfigError, match="no embedder"):
        bare.ask("cat?", scope="dana", llm=llm, mode="deep", agent="tiered", tiers=random_policy())
    bare.close()


def test_lam_must_pick_something(tmp_path, memory, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    llm = ScriptedLLM("<answer>Figo</answer>")
    monkeypatch.delenv("SUFFICE_TIERS", raising=False)
    with pytest.raises(ConfigError, match="none is installed"):
        memory.ask("cat?", scope="dana", llm=llm, mode="deep", agent="tiered", lam=0.3)
    with pytest.raises(InvalidQueryError, match="give one or the other"):
        memory.ask("cat?", scope="dana", llm=llm, mode="deep", agent="tiered", lam=0.3,
                   tiers=FixedTiers.all("low"))
    assert not llm.calls  # refused before any model call
    for lam in (0.0, 0.9):
        random_policy(lam=lam, encoder=memory.embedder.name).save(tmp_path / f"tiers-{lam}.npz")
    monkeypatch.setenv("SUFFICE_TIERS", str(tmp_path))
    r = memory.ask("cat?", scope="dana", llm=llm, mode="deep", agent="tiered", lam=0.8).receipt
    assert "trained(λ=0.9" in next(lv for lv in r.levers if lv.name == "tiers").detail
    r = memory.ask("cat?", scope="dana", llm=llm, mode="deep", agent="tiered").receipt
    assert "trained(λ=0.0" in next(lv for lv in r.levers if lv.name == "tiers").detail  # no lam: λ = 0


# -- rewards and PPO ---------------------------------------------------------------------------

def test_cost_rewards_run_from_one_for_the_cheapest_to_zero_for_the_dearest() -> None:
    from suffice._train.tiers import CostWindow, ScaleAligner

    w = CostWindow(size=100)
    w.push([float(c) for c in range(1, 101)])
    assert w.reward(0.0) == 1.0 and w.reward(1e6) == 0.0 and 0 < w.reward(30.0) < 1
    w.push([5.0] * 100)  # the window slides: only the last 100 costs count
    assert w.costs == [5.0] * 100 and CostWindow.from_state(w.state()).costs == w.costs
    a = ScaleAligner()
    a.push([0.0, 1.0, 0.0, 1.0], [0.4, 0.6, 0.4, 0.6])
    assert a.kappa() == pytest.approx(0.2)
    assert ScaleAligner(enabled=False).kappa() == 1.0


class PricedTiers:
    """A stand-in pipeline for the trainer (unit test only): Low costs 0, Mid 1, High 3 a
    module, and only a High summary gets the task right."""

    cache = ModuleCache()

    def run(self, question, chunks, choose, *, qvec, **kw):  # type: ignore[no-untyped-def]
        from suffice._pipeline import ModuleReceipt, PipelineResult

        rng = np.random.default_rng(abs(hash(question)) % 2**32)
        receipts, states = [], []
        for m in MODULES:
            x = rng.normal(size=qvec.shape[0]).astype(np.float32)
            states.append((m, x))
            t = ("low", "mid", "high")[choose(m, qvec, x)]
            receipts.append(ModuleReceipt(m, t, t, "priced", 0, 0, 1.0, {"low": 0, "mid": 1, "high": 3}[t]))
        text = "zebra" if receipts[-1].tier == "high" else "no idea"
        return PipelineResult(text, tuple(receipts), (), (), {}, tuple(states))


def split_questions(n: int, seed: int):  # type: ignore[no-untyped-def]
    """n questions in four conversations; the fourth is the validation split."""
    from suffice._train.tiers import TierQuestion

    rng = np.random.default_rng(seed)
    qs = [TierQuestion(f"q{i}", f"g{i % 4}", f"question {i}", "zebra", (),
                       rng.normal(size=384).astype(np.float32)) for i in range(n)]
    return [q for q in qs if q.group != "g3"], [q for q in qs if q.group == "g3"]


def test_ppo_learns_to_pay_for_a_tier_only_when_cost_does_not_matter(tmp_path, embedder) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    from suffice._train.tiers import PPOConfig, train_tiers

    train, val = split_questions(24, seed=0)
    runs = {lam: train_tiers(PricedTiers(), embedder, train, val,  # type: ignore[arg-type]
                             PPOConfig(lam=lam, epochs=30, batch=18, lr=3e-3), tmp_path / f"{lam}.npz",
                             score=lambda q, r: float(r.text == q.answer))
            for lam in (0.0, 5.0)}
    free, dear = runs[0.0]["val"], runs[5.0]["val"]
    assert free["tiers"]["summary"][2] == 1.0 and free["task"] == 1.0   # pays for what scores
    assert dear["tiers"]["summary"][0] == 1.0 and dear["cost_usd"] < free["cost_usd"]  # not when dear
    assert all(dear["tiers"][m][0] > 0.5 for m in MODULES)  # and shifts every module towards Low
    card = json.loads((tmp_path / "5.0.json").read_text())
    assert card["cost_window"]["costs"] and card["aligner"]["enabled"]  # reward state kept with it
    with pytest.raises(ConfigError, match="both"):
        train_tiers(PricedTiers(), embedder, train, train, PPOConfig(), tmp_path / "x.npz",  # type: ignore[arg-type]
                    score=lambda q, r: 0.0)


def test_a_capped_policy_never_chooses_above_its_cap_in_training_or_after_loading(tmp_path, embedder) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    from suffice._train.tiers import PPOConfig, train_tiers

    train, val = split_questions(24, seed=0)
    asked: list[int] = []

    class Watched(PricedTiers):
        def run(self, question, chunks, choose, **kw):  # type: ignore[no-untyped-def]
            assert kw.get("cap") == "mid"  # the pipeline is told too, so a fallback cannot climb

            def watch(m, q, x):  # type: ignore[no-untyped-def]
                asked.append(choose(m, q, x))
                return asked[-1]
            return super().run(question, chunks, watch, **kw)

    # Only a High summary scores, and High is out of reach: the policy must still never ask for it.
    rep = train_tiers(Watched(), embedder, train, val,  # type: ignore[arg-type]
                      PPOConfig(lam=0.0, epochs=4, batch=18, lr=3e-3, cap="mid"), tmp_path / "c.npz",
                      score=lambda q, r: float(r.text == q.answer))
    assert asked and max(asked) <= 1 and set(rep["fixed_val"]) == {"all-low", "all-mid"}
    policy = load_tier_policy(tmp_path / "c.npz")
    assert policy.cap == "mid" and "up to mid" in policy.name
    rng = np.random.default_rng(1)
    for m in MODULES:
        assert policy.probs(m, rng.normal(size=384).astype(np.float32),
                            rng.normal(size=384).astype(np.float32))[2] == 0.0
    uncapped = TierPolicy(policy.w, lam=0.0, encoder="e")
    assert uncapped.digest != policy.digest  # a receipt tells the two apart
    with pytest.raises(ConfigError, match="cap"):
        TierPolicy(policy.w, lam=0.0, encoder="e", cap="top")  # type: ignore[arg-type]


def test_training_commands_refuse_unknown_choices_before_loading_anything(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from suffice._cli import app

    for args in (["train", "tiers", "--out", str(tmp_path), "--tier-cap", "top"],
                 ["train", "tiers", "--out", str(tmp_path), "--reward", "judge"],
                 ["train", "router", "--out", str(tmp_path), "--target", "answer"],
                 ["train", "router", "--out", str(tmp_path), "--calibrate-on", "both"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and "is not one of" in res.output, args
    assert not any(tmp_path.iterdir())


def test_epochs_are_compared_under_one_reward_state_and_a_tie_goes_to_the_cheaper() -> None:
    from suffice._train.tiers import CostWindow, ScaleAligner, selection_key, validation_score

    window, aligner = CostWindow(), ScaleAligner()
    window.push([0.0, 1.0, 4.0])
    aligner.push([0.0, 1.0], [0.0, 0.5])  # kappa 0.5
    cheap = validation_score([0.5, 0.5], [0.0, 1.0], 0.0, window, aligner)
    dear = validation_score([0.5, 0.5], [4.0, 4.0], 0.0, window, aligner)
    assert cheap["kappa"] == dear["kappa"] == pytest.approx(0.5)
    assert cheap["objective"] == dear["objective"] == pytest.approx(0.25)  # lam 0: cost is no reward
    ranked = sorted([{**dear, "epoch": 1}, {**cheap, "epoch": 7}, {**cheap, "epoch": 3}],
                    key=selection_key, reverse=True)
    assert [r["epoch"] for r in ranked] == [3, 7, 1]  # cheaper first, then earlier
    better = validation_score([0.6, 0.6], [4.0, 4.0], 0.0, window, aligner)
    assert selection_key({**better, "epoch": 9}) > selection_key({**cheap, "epoch": 3})
    priced = validation_score([0.5, 0.5], [0.0, 1.0], 1.0, window, aligner)
    assert priced["objective"] > validation_score([0.5, 0.5], [4.0, 4.0], 1.0, window, aligner)["objective"]


def test_an_exported_policy_keeps_its_weights_while_training_goes_on(embedder) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    from suffice._train.tiers import _net, export

    net = _net(384, 32, embedder.embed(["a", "b", "c", "d", "e"]), seed=1)
    policy = export(net, 0.0, embedder.name)
    before = {k: v.copy() for k, v in policy.w.items()}
    for p in net.parameters():
        p.data.add_(1.0)
    assert all(np.array_equal(policy.w[k], before[k]) for k in before)


def test_the_saved_checkpoint_is_the_best_epoch_under_one_reward_state(tmp_path, embedder) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    from suffice._train.tiers import PPOConfig, selection_key, train_tiers

    train, val = split_questions(16, seed=1)
    pipeline = PricedTiers()
    rep = train_tiers(pipeline, embedder, train, val, PPOConfig(lam=0.0, epochs=12, batch=12, lr=3e-3),  # type: ignore[arg-type]
                      tmp_path / "p.npz", score=lambda q, r: float(r.text == q.answer))
    epochs = [h["val"] for h in rep["history"] if "val" in h]
    assert len(epochs) == 12 and all("as_trained" in e for e in epochs)
    assert max(epochs, key=selection_key)["epoch"] == rep["best_epoch"]
    kappas = {e["kappa"] for e in epochs} | {v["kappa"] for v in rep["fixed_val"].values()}
    assert len(kappas) == 1  # one reward state for every epoch and for the fixed pipelines
    saved = TierPolicy.load(tmp_path / "p.npz")  # the chosen epoch's weights, not the last epoch's
    picks: list[list[int]] = []
    for q in val:
        choose, chosen = saved.chooser(q.question), []
        pipeline.run(q.question, (), lambda m, qv, x: chosen.append(choose(m, qv, x)) or chosen[-1],  # noqa: B023
                     qvec=q.qvec)
        picks.append(chosen)
    assert [sum(p[i] == t for p in picks) / len(val) for i, m in enumerate(MODULES) for t in range(3)] \
        == pytest.approx([s for m in MODULES for s in rep["val"]["tiers"][m]])


def test_a_run_stopped_midway_leaves_the_best_epoch_so_far_marked_provisional(tmp_path, embedder) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    from suffice._train.tiers import PPOConfig, train_tiers

    train, val = split_questions(16, seed=2)
    cfg = PPOConfig(lam=0.0, epochs=6, batch=12, lr=3e-3)

    def stop_in_epoch_three(stage: str, done: int, total: int) -> None:
        if done == 2 * total // cfg.epochs + 1:   # the first batch of the third epoch
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_tiers(PricedTiers(), embedder, train, val, cfg, tmp_path / "p.npz",  # type: ignore[arg-type]
                    score=lambda q, r: float(r.text == q.answer), progress=stop_in_epoch_three)
    card = json.loads((tmp_path / "p.json").read_text())
    assert card["provisional"] is True and card["epochs_done"] == 2 and card["epoch"] in (0, 1)
    assert "provisional" in TierPolicy.load(tmp_path / "p.npz").name   # receipts show it
    assert not list(tmp_path.glob("*.tmp"))                            # no half-written file left
    train_tiers(PricedTiers(), embedder, train, val, cfg, tmp_path / "p.npz",  # type: ignore[arg-type]
                score=lambda q, r: float(r.text == q.answer))
    card = json.loads((tmp_path / "p.json").read_text())
    assert card["provisional"] is False and card["epochs_done"] == 6
    assert "provisional" not in TierPolicy.load(tmp_path / "p.npz").name


def test_a_day_without_a_date_gets_no_invented_date() -> None:
    from suffice._pipeline.modules import _resolved

    assert _resolved("last weekend", None) == ""
    assert _resolved("yesterday", date(2025, 4, 11)) == "10 April 2025"


SAID = "2023-05-08"  # a Monday


@pytest.mark.parametrize(("text", "phrase", "meaning"), [
    ("We went to Rome in May.", "in May", "= May 2023 "),  # the day is not made up
    ("It rained all of February.", "of February", "= February 2023 "),
    ("We married in June 2019.", "in June 2019", "= June 2019 "),
    ("The trip is on 3 June.", "on 3 June", "= 3 June 2023 "),  # ahead in the year, not last year's
    ("I moved two months ago.", "two months ago", "March 2023"),
    ("I ran a marathon day before yesterday.", "day before yesterday", "6 May 2023"),
    ("Next Tuesday is the party.", "Next Tuesday", "9 May 2023"),
    ("In 2019 we married.", "In 2019", "= 2019 "),
])
def test_low_time_facts_are_only_as_precise_as_the_words(text, phrase, meaning) -> None:  # type: ignore[no-untyped-def]
    facts = rule_facts("temporal", "When?", [Chunk((item(0, text, day=SAID),))])
    assert len(facts) == 1, facts  # "Next Tuesday" is not also last Tuesday
    assert f"'{phrase}'" in facts[0] and meaning in facts[0]


@pytest.mark.parametrize("text", ["May I ask you something?", "April said she would come."])
def test_a_month_that_is_a_name_or_a_verb_is_no_date(text) -> None:  # type: ignore[no-untyped-def]
    assert rule_facts("temporal", "When?", [Chunk((item(0, text, day=SAID),))]) == []


def test_a_turn_without_a_date_or_speaker_gives_clean_fact_lines() -> None:
    bare = Item(id="x", scope="dana", seq=0, session="s", speaker="", role="user", kind="message",
                observed_at="", text="We are talking about Art History in May 2020.", meta={}, tokens=9)
    lines = rule_facts("temporal", "When?", [Chunk((bare,))]) + rule_facts("topic", "Art?", [Chunk((bare,))])
    assert lines and not any(" on :" in ln or ", )" in ln or "(, " in ln or "()" in ln for ln in lines)


def test_low_relations_skip_sentence_openers_that_are_not_subjects() -> None:
    turns = [Chunk((item(0, "Yesterday I adopted a puppy named Max."),)),
             Chunk((item(1, "The weather was great and Melanie painted a sunset.", speaker="Ana"),)),
             Chunk((item(2, "Did you see the game?"),))]
    facts = rule_facts("entity", "What did they do?", turns)
    assert any(f.startswith("Dana - adopted - a puppy named Max") for f in facts)
    assert any(f.startswith("Melanie - painted - a sunset") for f in facts)
    assert not any(f.split(" - ")[0] in ("Yesterday", "The", "Did") for f in facts), facts


def test_a_chunk_too_long_for_the_summary_leaves_room_for_the_shorter_ones() -> None:
    from suffice._pipeline.modules import digest

    long = Chunk((item(0, "log line " * 3000),))
    short = Chunk((item(1, "The cabin is in Banff."),))
    text = digest("Where is the cabin?", [long, short], {}, 500, structured=True)
    assert "Banff" in text
    alone = digest("Where is the cabin?", [long], {}, 500, structured=True)
    assert "log line" in alone  # nothing fits whole: the first chunk, cut


@pytest.mark.parametrize("budget", [0, 1, 7, 30, 92, 156])
def test_the_summary_fits_its_budget_separators_and_title_counted(budget) -> None:
    """Each chunk was charged one token for a two-token separator, and the title not at all."""
    from suffice._pipeline.modules import digest
    from suffice._tokens import count_tokens

    chunks = [Chunk((item(i, f"Ana moved to Lisbon in May with cat {i}" + " ok" * (i % 5)),))
              for i in range(40)]
    facts = {"temporal": [f"moved in May {i}" for i in range(5)]}
    for structured in (False, True):
        text = digest("When did Ana move to Lisbon?", chunks, facts, budget, structured=structured)
        assert count_tokens(text) <= budget


def test_cached_outputs_are_never_shared_across_scopes_or_settings(embedder) -> None:  # type: ignore[no-untyped-def]
    """Client ids are unique only within a scope, so two users' items can share seq and id;
    a cached module output must still be each one's own, and a setting that changes the
    output (how many chunks the filter keeps) must not replay the other setting's."""
    cache = ModuleCache()
    q = "What is my PIN?"

    def run(scope: str, pin: str, keep: int = 2) -> str:
        its = [Item(id=f"m{i}", scope=scope, seq=i, session="s", speaker="me", role="user",
                    kind="message", observed_at=SAID, text=f"Note {i}: my PIN is {pin}{i}.", meta={},
                    tokens=8, observed_ts=as_timestamp(SAID)) for i in range(3)]
        res = TieredPipeline(None, None, TierSettings(keep=keep), cache).run(
            q, [Chunk((it,)) for it in its], FixedTiers.all("low").chooser(q), qvec=None)
        return res.text

    assert "4321" in run("alice", "4321")
    bob = run("bob", "9999")
    assert "9999" in bob and "4321" not in bob
    assert run("bob", "9999", keep=1).count("PIN is") == 1


def test_a_failed_rung_is_on_the_ledger_as_itself(embedder) -> None:  # type: ignore[no-untyped-def]
    llm = ScriptedLLM("<answer>I am not sure</answer>")
    q = "What is the name of Dana's cat?"
    ledger = Ledger()
    pipeline(llm, embedder).run(q, chunks(embedder), FixedTiers.all("high").chooser(q),
                                qvec=embedder.embed_query(q), ledger=ledger)
    failed, answered = ledger.records[0], ledger.records[1]
    assert failed.model == llm.model and not failed.ok and "OutputParseError" in failed.error
    assert failed.input_tokens > 0 and answered.model == "learned" and answered.ok
    assert answered.input_tokens == 0  # the failed call's tokens are not billed to the embedder


def test_a_date_hanging_off_a_verbless_sentence_still_yields_a_time_fact() -> None:
    pytest.importorskip("spacy")
    # The date's head chain ends at a noun root: the walk up must stop there, not loop.
    facts = spacy_facts("temporal", "When was the fun weekend?",
                        [Chunk((item(0, "Such a fun weekend, last month."),))])
    assert any("March 2025" in f for f in facts)


def test_the_tier_benchmark_compares_on_shared_questions_and_pairs_with_the_best_fixed(tmp_path) -> None:
    from suffice._bench import tiers as bt

    def rec(variant: str, key: str, f1: float, usd: float, tier: str) -> str:
        t = {m: tier for m in MODULES}
        return json.dumps({"variant": variant, "key": key, "f1": f1, "pipeline_usd": usd, "pipeline_ms": 1.0,
                           "t_e2e_ms": 1.0, "degraded": False, "tiers": t, "answered_at": t})

    lines = [rec("all-low", k, 0.2, 1e-7, "low") for k in "abc"]
    lines += [rec("all-mid", k, 0.5, 1e-5, "mid") for k in "abc"]
    lines += [rec("policy", k, f, 1e-6, "low") for k, f in zip("ab", (0.6, 0.7), strict=True)]  # c not yet
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    s = bt.summarize(path)
    assert s["n_common"] == 2 and s["best_fixed"] == "all-mid"
    assert s["configs"]["policy"]["vs_best_fixed"]["delta_f1"] == pytest.approx(15.0)
    assert s["configs"]["all-low"]["tiers"]["filter"]["low"] == 1.0
    line = s["configs"]["policy"]["vs_fixed_line"]
    w = (1e-5 - 1e-6) / (1e-5 - 1e-7)  # all-low's weight at the policy's cost, linear in cost
    assert line["linear"]["between"] == ["all-low", "all-mid"]
    assert line["linear"]["line_f1"] == pytest.approx(100 * (0.2 * w + 0.5 * (1 - w)))
    assert line["linear"]["above"] == pytest.approx(65.0 - line["linear"]["line_f1"])
    assert line["log"]["line_f1"] == pytest.approx(35.0)  # 1e-6 is halfway in log cost
    assert "vs_fixed_line" not in s["configs"]["all-mid"]
    pytest.importorskip("matplotlib")
    bt.plot(s, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 0


def test_a_retrained_policy_is_answered_again_though_it_keeps_its_name(tmp_path, memory) -> None:  # type: ignore[no-untyped-def]
    from suffice._bench import tiers as bt
    from suffice._bench.qa import QAItem
    from suffice._datasets.locomo import LocomoQuestion

    rng = np.random.default_rng(0)
    shapes = {"descriptors": (len(MODULES), 4), "wu": (8, 2 * memory.embedder.dim), "bu": (8,),
              "wv": (8, 4), "bv": (8,), "w1": (8, 16), "b1": (8,), "w2": (8, 8), "b2": (8,),
              "w3": (8, 8), "b3": (8,), "w4": (3, 8), "b4": (3,)}

    def policy() -> TierPolicy:
        pol = TierPolicy({k: rng.normal(size=s) for k, s in shapes.items()}, lam=0.3,
                         encoder=memory.embedder.name)
        pol.name = "policy λ=0.3"  # as the CLI names it, whatever run trained it
        return pol

    item = QAItem("dana#0", "dana", 0, LocomoQuestion("What is the cat's name?", "Figo", 4, ()))
    out, llm = tmp_path / "t.jsonl", ScriptedLLM("<answer>Figo</answer>")
    fixed = FixedTiers.all("low")
    first, second = policy(), policy()
    assert first.digest != second.digest
    assert bt.run(memory, llm, [item], [fixed, first], out, budget=500)["ran"] == 2
    assert bt.run(memory, llm, [item], [fixed, first], out, budget=500)["ran"] == 0
    assert bt.run(memory, llm, [item], [fixed, second], out, budget=500) == {"ran": 1, "reused": 1}
    s = bt.summarize(out, fingerprints=bt.fingerprints(memory, llm, [fixed, second], budget=500))
    assert s["configs"]["policy λ=0.3"]["n"] == 1
    with pytest.raises(ConfigError, match="more than once"):
        bt.run(memory, llm, [item], [first, second], out, budget=500)


def test_a_missing_capacity_model_is_refused_before_the_reader_loads(memory, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    memory.tier_settings = TierSettings(strategy="capacity")
    memory.tier_models = {"low": ScriptedLLM("x"), "high": ScriptedLLM("y")}
    monkeypatch.setattr(memory, "default_llm", lambda: pytest.fail("the reader was loaded first"))
    with pytest.raises(ConfigError, match="three models"):
        memory.ask("What is the name of Dana's cat?", scope="dana", mode="deep", agent="tiered",
                   tiers=FixedTiers.all("low"))


def test_the_capacity_strategy_asks_the_model_of_each_tier(memory) -> None:  # type: ignore[no-untyped-def]
    small, large = ScriptedLLM('<answer>["small"]</answer>', model="small"), \
        ScriptedLLM('<answer>["large"]</answer>', model="large")
    memory.tier_settings = TierSettings(strategy="capacity")
    memory.tier_models = {"low": small, "mid": small, "high": large}
    ans = memory.ask("What is the name of Dana's cat?", scope="dana", mode="deep", agent="tiered",
                     llm=ScriptedLLM("<answer>Figo</answer>"),
                     tiers=FixedTiers({"filter": "low", "entity": "high", "temporal": "low",
                                       "topic": "low", "summary": "low"}))
    models = {m.module: m.model for m in ans.receipt.modules}
    assert models["entity"] == "large" and models["temporal"] == "small"


def test_choosers_that_ignore_vectors_cost_no_state_embedding(memory) -> None:  # type: ignore[no-untyped-def]
    """Fixed tiers and the heuristic never read the facts' embedding, so the agent does not
    pay an embedder call for it; a trained policy reads it, and pays."""
    llm = ScriptedLLM("<answer>Figo</answer>")
    q = "When did Dana adopt the cat, Figo?"

    def stages(tiers):  # type: ignore[no-untyped-def]
        r = memory.ask(q, scope="dana", llm=llm, mode="deep", agent="tiered", tiers=tiers,
                       tier_cap="mid").receipt
        return [c.stage for c in r.calls]

    fixed, heuristic = stages(FixedTiers.all("mid")), stages(None)
    trained = stages(random_policy(encoder=memory.embedder.name))
    assert "tier_summary" in fixed and "tier_summary" in heuristic and "tier_summary" in trained
    assert "tier_state" not in fixed and "tier_state" not in heuristic
    assert "tier_state" in trained


# -- what an audit of the tiered path found (2026-12-05) --------------------------------------------

TURNS = [("Caroline", "2023-05-08T13:56:00", "I went to the LGBTQ support group yesterday, so powerful."),
         ("Melanie", "2023-05-08T13:57:00", "That's great! I painted a sunrise last week, it was fun."),
         ("Caroline", "2023-06-09T09:02:00", "My friend Jon started a dance studio on 3 June.")]
QUESTION = "When did Caroline go to the support group?"


def small_memory() -> Memory:
    from suffice import HashEmbedder

    m = Memory(":memory:", embedder=HashEmbedder())
    for speaker, at, text in TURNS:
        m.add(text, scope="u", speaker=speaker, observed_at=at)
    return m


def test_with_nothing_to_read_no_module_is_asked_and_the_fast_path_answers() -> None:
    """Asked about empty excerpts, the High modules made facts up and the reader answered from them."""
    m = small_memory()
    llm = ScriptedLLM(lambda msgs: "Caroline went to the group on 7 May 2023")
    ans = m.ask(QUESTION, scope="u", llm=llm, mode="deep", agent="tiered", tiers=FixedTiers.all("high"),
                speaker="Nobody")
    assert not any(c.stage.startswith("tier_") for c in ans.receipt.calls)
    assert ans.receipt.path == "fast"
    assert any("found nothing to read" in n for n in ans.receipt.notes)


def test_a_tier_source_choosing_outside_the_tiers_cannot_pass_the_cap() -> None:
    class Minus:
        name = "minus"
        reads_vectors = False

        def chooser(self, question: str):  # type: ignore[no-untyped-def]
            return lambda module, q, x: -1  # indexed High before

    m = small_memory()
    llm = ScriptedLLM("<answer>7 May 2023</answer>")
    ans = m.ask(QUESTION, scope="u", llm=llm, mode="deep", agent="tiered", tiers=Minus(), tier_cap="low")
    assert not any(c.stage.startswith("tier_") for c in ans.receipt.calls)
    assert any("chose -1" in n for n in ans.receipt.notes)


def test_a_model_class_failing_its_own_way_is_not_remembered_as_the_modules_answer() -> None:
    """A KeyError on a rate-limit body was cached as the module's failure: High never ran again."""
    from suffice._pipeline import ModuleCache

    m = small_memory()
    m.tier_cache = ModuleCache()
    down = {"now": True}

    def reply(msgs):  # type: ignore[no-untyped-def]
        content = msgs[-1]["content"]
        if "Excerpt" in content and down["now"]:
            raise KeyError("choices")
        return "1, 2" if "Excerpt 1" in content else "<answer>7 May 2023</answer>"

    for _ in range(2):
        llm = ScriptedLLM(reply)
        ans = m.ask(QUESTION, scope="u", llm=llm, mode="deep", agent="tiered", tiers=FixedTiers.all("high"))
        down["now"] = False
    assert ans.receipt.modules[0].tier == "high" and not ans.receipt.modules[0].cached


def test_an_empty_fact_reply_is_a_failed_call_not_high_with_no_facts() -> None:
    m = small_memory()
    llm = ScriptedLLM(lambda msgs: "   " if "Excerpt" in msgs[-1]["content"] else "<answer>x</answer>")
    ans = m.ask(QUESTION, scope="u", llm=llm, mode="deep", agent="tiered",
                tiers=FixedTiers({"filter": "low", "entity": "high", "temporal": "high", "topic": "high",
                                  "summary": "low"}))
    facts = [r for r in ans.receipt.modules if r.module in ("entity", "temporal", "topic")]
    assert facts and all(r.tier != "high" and "empty" in r.note for r in facts)


def test_the_tiered_summary_keeps_to_the_prompt_cap_as_every_context_does() -> None:
    from suffice import HashEmbedder, RenderConfig
    from suffice._engine import deep_budget_of

    m = Memory(":memory:", embedder=HashEmbedder())
    for i in range(40):
        m.add(f"Support group meeting {i}: we talked about adoption, painting, camping and the race. " * 3,
              scope="u", speaker="Caroline", observed_at=f"2023-05-{1 + i % 28:02d}T10:00:00")
    llm = ScriptedLLM(lambda msgs: "<answer>x</answer>")
    ans = m.ask(QUESTION, scope="u", llm=llm, mode="deep", agent="tiered", tiers=FixedTiers.all("low"),
                budget=300, render=RenderConfig(prompt_cap=0.5))
    cap = int(0.5 * deep_budget_of(m.engine_config.replace(reader_budget=300)))
    assert 0 < ans.receipt.context_tokens <= cap  # it was 545 of a 600-token deep budget


def test_tiers_must_be_a_tier_source_and_a_policy_must_read_this_memorys_vectors() -> None:
    m = small_memory()
    llm = ScriptedLLM("<answer>x</answer>")
    for wrong in ("high", {"filter": "low"}, FixedTiers):
        with pytest.raises(InvalidQueryError, match="tiers must be a tier source"):
            m.ask(QUESTION, scope="u", llm=llm, mode="deep", agent="tiered", tiers=wrong)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="reads 8-dim vectors"):
        m.ask(QUESTION, scope="u", llm=llm, mode="deep", agent="tiered", tiers=random_policy(dim=8))
    m.ask(QUESTION, scope="u", llm=llm, mode="deep", agent="tiered", tiers=FixedTiers.all("low"),
          lam=None)
    with pytest.raises(InvalidQueryError, match="give one or the other"):  # a numpy float is a number
        m.ask(QUESTION, scope="u", llm=llm, mode="deep", agent="tiered", tiers=FixedTiers.all("low"),
              lam=np.float32(0.3))  # type: ignore[arg-type]


@pytest.mark.parametrize("damage", ["cut", "empty", "nan", "text"])
def test_a_damaged_policy_file_is_a_config_error(tmp_path, damage) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "tiers-0.npz"
    policy = random_policy()
    policy.save(path)
    if damage == "cut":
        path.write_bytes(path.read_bytes()[:200])
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        w = {k: v.copy() for k, v in policy.w.items()}
        if damage == "nan":
            w["descriptors"][1, 0] = np.nan  # the entity row: the old check read the filter's only
        else:
            w["descriptors"] = np.array("not numbers")
        np.savez(path, **w)
    with pytest.raises(ConfigError):
        load_tier_policy(path)


def test_a_card_whose_lam_is_not_a_number_cannot_win_every_choice(tmp_path) -> None:  # type: ignore[no-untyped-def]
    random_policy(lam=0.0).save(tmp_path / "tiers-0.npz")
    random_policy(lam=0.9).save(tmp_path / "tiers-0.9.npz")
    card = tmp_path / "tiers-0.9.json"
    card.write_text(json.dumps({**json.loads(card.read_text()), "lam": float("nan")}))
    with pytest.raises(ConfigError, match="finite"):
        load_tier_policy(tmp_path, 0.0)


def test_dates_without_a_year_are_past_ones_unless_said_of_the_future() -> None:
    from suffice._pipeline.modules import _ABS_DATE, _resolved

    said = date(2024, 1, 10)
    assert _resolved("in December", said) == "December 2023"       # was December 2024
    assert _resolved("on 28 December", said) == "28 December 2023"
    assert _resolved("on June 3rd", said, "Our wedding is on June 3rd") == "3 June 2024"  # said of the future
    assert _resolved("in May", date(2023, 11, 25), "We went to Paris in May") == "May 2023"  # not next May
    assert _resolved("on 3 June", date(2023, 5, 8)) == "3 June 2023"  # within a month ahead
    text = "Our wedding is on Saturday, June 3rd. We met on Friday."
    found = [m.group(0) for m in _ABS_DATE.finditer(text)]
    assert found == ["June 3rd", "on Friday"]  # the weekday beside a date is that date
    assert [m.group(0) for m in _ABS_DATE.finditer("I ran on Sunday 10k, and Monday 5pm works")] == [
        "on Sunday", "Monday"]  # a number after a weekday is not always a date


def test_a_policy_whose_outputs_overflow_refuses_to_choose_rather_than_say_low() -> None:
    policy = random_policy()
    policy.w["wu"] *= np.float32(1e37)  # fine on the zero vectors of the load check
    x = np.ones(384, np.float32)
    with pytest.raises(ConfigError, match="no usable choice"):
        policy.chooser("q")("entity", x, x)


def test_a_fact_the_encoder_cannot_take_does_not_throw_the_pipeline_away() -> None:
    """A lone surrogate in a fact (a JSON "\\ud83d" escape) failed the policy's view of the facts,
    outside every module: the fast path answered and the paid module calls left the receipt."""
    from suffice import HashEmbedder

    m = small_memory()
    dim = HashEmbedder().dim
    llm = ScriptedLLM(lambda msgs: "<answer>7 May 2023</answer>" if "Memory" in msgs[-1]["content"][:300]
                      else '["Caroline went to the group \\ud83d"]')
    ans = m.ask(QUESTION, scope="u", llm=llm, mode="deep", agent="tiered", tiers=random_policy(dim=dim))
    assert len(ans.receipt.modules) == 5 and not any("tiered pipeline failed" in n for n in ans.receipt.notes)
