"""The rerank stage: a cross-encoder reorders only the prefix's first candidates, its time is on
the receipt, a failing reranker leaves the fused order and says so, and a trained reranker
exports to int8 ONNX that scores like the network it came from."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from suffice import Memory, ModelFileError, NewItem, RetrievalConfig, ScriptedLLM, load_encoder, load_reranker
from suffice._embed.hashing import HashEmbedder
from suffice._retrieve import rerank_order
from suffice._text import embedding_text
from suffice._train.pairs import Pair

TEXTS = ["the river gauge broke in May", "my cat Figo sleeps all day", "we booked the night train",
         "Figo the cat caught a mouse", "the tea shop opened on Friday", "cats and rivers and trains",
         "budget review moved to June", "kayak club meets on Sunday"]


class WordCount:
    """Scores a text by how often it names 'figo': a reranker whose order is easy to foresee."""

    name = "word-count"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(len(texts))
        return np.array([t.lower().count("figo") for t in texts], dtype=np.float32)


class Broken:
    name = "broken"

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        raise RuntimeError("onnx session lost")


def memory(path: Path, reranker: object = None, **kw: object) -> Memory:
    mem = Memory(path, embedder=HashEmbedder(), reranker=reranker, **kw)  # type: ignore[arg-type]
    mem.add([NewItem(text=t, speaker="Ana") for t in TEXTS], scope="s")
    return mem


def test_the_reranker_reorders_only_the_first_n_fused_candidates(tmp_path: Path) -> None:
    plain = memory(tmp_path / "a.db")
    fused = plain.retriever.rank("s", "cat Figo", RetrievalConfig(), depth=8).seqs
    rr = WordCount()
    mem = memory(tmp_path / "b.db", rr)
    ranking = mem.retriever.rank("s", "cat Figo", RetrievalConfig(rerank=4), depth=8)
    items = {it.seq: it for it in mem.items(scope="s")}
    head_scores = rr.score("", [embedding_text(items[s].speaker, items[s].text) for s in fused[:4]])
    assert list(ranking.seqs) == rerank_order(fused, head_scores.tolist(), 4)  # the bench's order
    assert ranking.seqs[4:] == fused[4:] and ranking.reranked == 4 and rr.calls[-1] == 4
    assert "rerank_ms" in ranking.timings_ms and not ranking.notice


def test_rerank_zero_or_no_reranker_keeps_the_fused_order(tmp_path: Path) -> None:
    rr = WordCount()
    mem = memory(tmp_path / "m.db", rr)
    fused = memory(tmp_path / "p.db").retriever.rank("s", "cat Figo", RetrievalConfig(), depth=8).seqs
    off = mem.retriever.rank("s", "cat Figo", RetrievalConfig(rerank=0), depth=8)
    assert off.seqs == fused and off.reranked == 0 and rr.calls == []
    assert mem.retriever.rank("s", "cat", RetrievalConfig(), method="recency", depth=3).reranked == 0


def test_a_failing_reranker_leaves_the_fused_order_and_the_receipt_says_so(tmp_path: Path) -> None:
    mem = memory(tmp_path / "m.db", Broken(), llm=ScriptedLLM(["Figo"]))
    fused = memory(tmp_path / "p.db").retriever.rank("s", "cat Figo", RetrievalConfig(), depth=8).seqs
    ranking = mem.retriever.rank("s", "cat Figo", RetrievalConfig(), depth=8)
    assert ranking.seqs == fused and ranking.reranked == 0
    assert "reranker failed (RuntimeError: onnx session lost)" in ranking.notice
    answer = mem.ask("What is the cat called?", scope="s", mode="fast")
    assert any("reranker failed" in n for n in answer.receipt.notes)
    assert "rerank" in answer.receipt.stages_ms
    # search and render say it too: they gave the fused order without a word
    assert "reranker failed" in mem.search("cat Figo", scope="s").notice
    assert "reranker failed" in mem.render("cat Figo", 300, scope="s").notice


def test_a_reranker_folder_is_not_an_encoder_and_the_other_way_round(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="not a trained reranker"):
        load_reranker(tmp_path)
    (tmp_path / "model.onnx").write_bytes(b"weights")
    (tmp_path / "card.json").write_text(json.dumps({"name": "x", "sha256": "0" * 64, "kind": "reranker"}))
    with pytest.raises(ModelFileError, match="holds a reranker, not a dense encoder"):
        load_encoder(tmp_path)
    with pytest.raises(ModelFileError, match="does not match the digest"):
        load_reranker(tmp_path)
    (tmp_path / "card.json").write_text(json.dumps({"name": "x", "sha256": "0" * 64}))
    with pytest.raises(ModelFileError, match="holds a dense encoder, not a reranker"):
        load_reranker(tmp_path)


def test_a_trained_reranker_exports_to_onnx_that_scores_like_the_torch_network(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="needs the [train] extra")
    from suffice._train.encoder import _tokenizer
    from suffice._train.reranker import RerankConfig, _scores, export_reranker, train_reranker
    pairs = [Pair("c", f"what about the {t}?", (f"Ana: we spoke of the {t}",),
                  tuple(f"Ben: the {u} was fine" for u in TEXTS[:3] if u != t)) for t in TEXTS]
    model, report = train_reranker(pairs, RerankConfig(batch_questions=4))
    assert report.steps == 2 and all(np.isfinite(report.losses))
    query, texts = "where is the tea shop?", ["Ana: the tea shop opened on Friday", "Ben: cats " * 80, "x"]
    with torch.no_grad():
        ref = _scores(torch, model, _tokenizer(160), query, texts).numpy()
    folder = export_reranker(model, tmp_path / "rr", {"trained_on": ["c"]})
    card = json.loads((folder / "card.json").read_text())
    rr = load_reranker(folder)
    assert card["kind"] == "reranker" and rr.name == card["name"] and rr.name.startswith("minilm-rerank-")
    ours = rr.score(query, texts)
    assert ours.shape == (3,) and np.allclose(ours, ref, atol=0.05)  # int8 weights, padded batches
    assert rr.score(query, []).shape == (0,)


def test_the_bench_refuses_a_reranker_or_folds_it_could_not_judge_fairly() -> None:
    from typer.testing import CliRunner

    from suffice._cli import app
    runner = CliRunner()
    alone = runner.invoke(app, ["bench", "retrieval", "--rerank"])
    assert alone.exit_code != 0 and "--rerank needs --folds K" in alone.output
    beam = runner.invoke(app, ["bench", "retrieval", "--dataset", "beam", "--folds", "4"])
    assert beam.exit_code != 0 and "--folds is implemented for locomo" in beam.output
    unknown = runner.invoke(app, ["bench", "retrieval", "--dataset", "nope"])
    assert unknown.exit_code != 0 and "unknown dataset 'nope'" in unknown.output


def test_rerank_time_is_counted_once_in_memory_time(tmp_path: Path) -> None:
    class Slow(WordCount):
        def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
            time.sleep(0.3)
            return super().score(query, texts)

    mem = memory(tmp_path / "m.db", Slow(), llm=ScriptedLLM(["Figo"]))
    r = mem.ask("What is the cat called?", scope="s", mode="fast").receipt
    assert r.stages_ms["rerank"] >= 300
    assert r.t_mem_ms + r.stages_ms["answer"] <= r.t_e2e_ms  # stages are disjoint
