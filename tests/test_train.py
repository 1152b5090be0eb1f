"""The trained retriever: pairs split by conversation, an int8 export as faithful as the shipped
one, trained encoders named by their weights, and stores that refuse to mix encoders."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from suffice import InvalidInputError, Memory, ModelFileError, NewItem, StoreConfigError
from suffice._datasets.locomo import LocomoConversation, LocomoQuestion
from suffice._embed.card import sha256
from suffice._embed.hashing import HashEmbedder
from suffice._embed.minilm import load_encoder
from suffice._train.pairs import Pair, folds, locomo_pairs

TOPICS = ["river gauge", "pottery class", "Kyoto trip", "sister wedding", "cat named Figo", "tea shop",
          "flood model", "kayak club", "budget review", "night train"]


def conversation(name: str) -> LocomoConversation:
    items = tuple(NewItem(text=f"Today I talked about the {t} again, turn {i}",
                          speaker="Ana" if i % 2 else "Ben", session="s1", meta={"dia_id": f"D1:{i + 1}"})
                  for i, t in enumerate(TOPICS * 2))
    qs = (LocomoQuestion("What about the kayak club?", "x", 4, ("D1:8",)),
          LocomoQuestion("Which trips and weddings?", "x", 1, ("D1:3", "D1:14")),
          LocomoQuestion("Nothing to see", "x", 5, ("D1:1",)))
    return LocomoConversation(name, items, qs)


def test_folds_deal_conversations_round_robin_and_never_split_one() -> None:
    assert folds(["a", "b", "c", "d", "e"], 2) == [["a", "c", "e"], ["b", "d"]]
    for bad in (1, 6):
        with pytest.raises(InvalidInputError, match="folds must be between 2"):
            folds(["a", "b", "c", "d", "e"], bad)


def test_pairs_hold_the_gold_items_and_hard_negatives_that_are_neither_gold_nor_next_to_it(
        tmp_path: Path) -> None:
    convs = [conversation("c1"), conversation("c2")]
    mem = Memory(tmp_path / "m.db", embedder=HashEmbedder())
    for c in convs:
        mem.add(list(c.items), scope=c.scope)
    pairs = locomo_pairs(mem, convs, hard=3)
    assert [(p.group, p.category) for p in pairs] == [("c1", 4), ("c1", 1), ("c2", 4), ("c2", 1)]  # no cat 5
    first, multi = pairs[0], pairs[1]
    assert first.positives == ("Ana: Today I talked about the kayak club again, turn 7",)
    assert len(multi.positives) == 2 and len(first.negatives) == 3
    banned = {f"turn {i}" for i in (6, 7, 8)}  # the gold turn and its neighbours
    assert not any(t.rsplit(", ", 1)[1] in banned for t in first.negatives)


def test_a_trained_encoder_is_refused_unless_its_weights_match_its_card(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="not a trained encoder"):
        load_encoder(tmp_path)
    (tmp_path / "model.onnx").write_bytes(b"not a model")
    (tmp_path / "card.json").write_text("{}")
    with pytest.raises(ModelFileError, match="not a valid encoder card"):
        load_encoder(tmp_path)
    (tmp_path / "card.json").write_text(json.dumps({"name": "x", "sha256": "0" * 64}))
    with pytest.raises(ModelFileError, match="does not match the digest"):
        load_encoder(tmp_path)
    # The digest right, the bytes no model: a one-line error, not onnxruntime's own.
    (tmp_path / "card.json").write_text(json.dumps({"name": "x", "sha256": sha256(tmp_path / "model.onnx")}))
    with pytest.raises(ModelFileError, match="not a model onnxruntime can read"):
        load_encoder(tmp_path)


def test_a_model_of_another_kind_behind_a_right_digest_is_refused(tmp_path: Path) -> None:
    """The shipped encoder's weights in a router's folder: digest and kind right, graph wrong."""
    from suffice._embed.minilm import default_model_path
    from suffice._route.features import ELEMENT_FEATURES, GLOBAL_FEATURES
    from suffice._route.trained import TrainedRouter

    (tmp_path / "model.onnx").write_bytes(default_model_path().read_bytes())
    (tmp_path / "card.json").write_text(json.dumps({
        "name": "r", "sha256": sha256(tmp_path / "model.onnx"), "kind": "router", "features_version": 1,
        "element_features": list(ELEMENT_FEATURES), "global_features": list(GLOBAL_FEATURES)}))
    with pytest.raises(ModelFileError, match="is not a sufficiency router: it takes"):
        TrainedRouter(tmp_path)

@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An encoder trained for two steps: enough to change its weights, seconds on a CPU."""
    pytest.importorskip("torch", reason="needs the [train] extra")
    from suffice._train.encoder import TrainConfig, export, train
    pairs = [Pair("c", f"what about the {t}?", (f"Ana: we spoke of the {t}",),
                  (f"Ben: the {TOPICS[(i + 3) % len(TOPICS)]} was fine",)) for i, t in enumerate(TOPICS)]
    model, report = train(pairs, TrainConfig(epochs=1, batch_questions=5, lr=1e-4))
    assert report.steps == 2 and all(np.isfinite(report.losses))
    return export(model, tmp_path_factory.mktemp("enc"), {"name_prefix": "test-enc"})


def test_the_int8_export_of_the_base_weights_matches_the_fp32_network(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="needs the [train] extra")
    from transformers import BertModel

    from suffice._embed.minilm import MiniLMEmbedder
    from suffice._train.encoder import _encode, _tokenizer, base_model_dir, export
    texts = ["Ana: my cat Figo hates the rain", "when did the flood model fail?", "tea in Kyoto " * 20]
    model = BertModel.from_pretrained(str(base_model_dir())).eval()
    with torch.no_grad():
        ref = _encode(torch, model, _tokenizer(256), texts).numpy()
    ours = load_encoder(export(model, tmp_path, {"name_prefix": "base"})).embed(texts)
    shipped = MiniLMEmbedder().embed(texts)
    assert (ours * ref).sum(1).min() > 0.998  # as close as the shipped int8 model:
    assert (shipped * ref).sum(1).min() > 0.998


def test_a_trained_encoder_embeds_under_its_own_name_and_a_store_will_not_mix_encoders(
        trained: Path, tmp_path: Path) -> None:
    card = json.loads((trained / "card.json").read_text())
    enc = load_encoder(trained)
    assert enc.name == card["name"] and enc.name.startswith("test-enc-")
    vecs = enc.embed(["Ana: we spoke of the tea shop", "hello"])
    assert vecs.shape == (2, 384) and np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    path = tmp_path / "m.db"
    with Memory(path, embedder=enc) as mem:
        mem.add(NewItem(text="we spoke of the tea shop", speaker="Ana"), scope="s")
    with pytest.raises(StoreConfigError, match=r"--encoder FOLDER\] rebuild"):
        Memory(path, embedder=HashEmbedder())
    with Memory(path, embedder=HashEmbedder(), rebuild=True) as mem:  # re-embedded, not re-ingested
        assert mem.store_config.encoder == "hash-64"
        assert mem.search("tea shop", scope="s").hits[0].item.text == "we spoke of the tea shop"


def test_the_cli_embeds_with_a_trained_encoder_and_names_the_way_back_when_they_differ(
        trained: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from suffice._cli import app
    db = str(tmp_path / "m.db")
    runner = CliRunner()
    added = runner.invoke(app, ["--encoder", str(trained), "--db", db, "add", "we spoke of the tea shop",
                                "--scope", "s"])
    assert added.exit_code == 0, added.output
    found = runner.invoke(app, ["--encoder", str(trained), "--db", db, "search", "tea shop", "--scope", "s"])
    assert found.exit_code == 0 and "tea shop" in found.output
    refused = runner.invoke(app, ["--db", db, "search", "tea shop", "--scope", "s"])
    assert refused.exit_code != 0 and "--encoder FOLDER] rebuild" in refused.output
    assert runner.invoke(app, ["--db", db, "rebuild"]).exit_code == 0  # back to the default encoder
    assert runner.invoke(app, ["--db", db, "search", "tea shop", "--scope", "s"]).exit_code == 0


def test_cross_validated_gains_are_paired_per_question_and_kept_compactly() -> None:
    from suffice._bench.retrieval import BUDGETS, compact, paired_gains

    def rec(q: int, category: int, base: bool, tuned: bool) -> dict[str, object]:
        row: dict[str, object] = {"scope": "c", "q": q, "category": category}
        for m in ("dense", "fused"):
            row[m] = {"all_in": {b: base for b in BUDGETS}}
            row[f"{m}-tuned"] = {"all_in": {b: tuned for b in BUDGETS}}
        return row

    records = [rec(0, 1, False, True), rec(1, 1, False, True), rec(2, 4, True, True), rec(3, 4, True, False)]
    gains = paired_gains(records)["fused-tuned vs fused"]
    assert gains["1 all@4000"][0] == pytest.approx(100.0)
    assert gains["4 all@4000"][0] == pytest.approx(-50.0)
    assert gains["overall all@2000"][0] == pytest.approx(25.0)
    rows = compact(records, ["fused", "fused-tuned"])["rows"]
    assert rows[0] == ["c", 0, 1, "0000", "1111"] and rows[3] == ["c", 3, 4, "1111", "0000"]


def test_held_out_results_merge_as_one_run_weighted_by_questions(tmp_path: Path) -> None:
    from suffice._bench.render import held_out_encoders, merge

    a = {"questions": 1, "ms_per_context": {"x": 10.0},
         "methods": {"x": {"overall": {"n": 1, "full@1000": 100.0}}}}
    b = {"questions": 3, "ms_per_context": {"x": 2.0},
         "methods": {"x": {"overall": {"n": 3, "full@1000": 0.0}, "1": {"n": 3, "full@1000": 0.0}}}}
    merged = merge([a, b])
    assert merged["questions"] == 4 and merged["ms_per_context"]["x"] == pytest.approx(4.0)
    assert merged["methods"]["x"]["overall"] == {"n": 4, "full@1000": 25.0}
    assert merged["methods"]["x"]["1"]["n"] == 3
    (tmp_path / "encoder_fold0").mkdir()
    (tmp_path / "encoder_fold0" / "card.json").write_text(json.dumps({"held_out": ["c1"]}))
    convs = [conversation("c1"), conversation("c2")]
    with pytest.raises(InvalidInputError, match="no fold encoder holds out c2"):
        held_out_encoders(tmp_path, convs)

