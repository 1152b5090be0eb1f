"""``suffice bench render`` on a tiny LoCoMo-format file: table, JSON envelope and plot."""

from __future__ import annotations

import json
from pathlib import Path

from suffice._bench import render as bench


def tiny_locomo(path: Path) -> Path:
    turns1 = [
        {"speaker": "Ana", "dia_id": "D1:1", "text": "I adopted a grey cat called Figo last weekend."},
        {"speaker": "Bo", "dia_id": "D1:2", "text": "Lovely! How is Figo settling in?"},
        {"speaker": "Ana", "dia_id": "D1:3", "text": "He hides under the sofa most of the day."},
    ]
    turns2 = [
        {"speaker": "Bo", "dia_id": "D2:1", "text": "I start my new job at the river authority in June."},
        {"speaker": "Ana", "dia_id": "D2:2", "text": "Congratulations on the river authority job!"},
    ]
    data = [{
        "sample_id": "tiny",
        "conversation": {"speaker_a": "Ana", "speaker_b": "Bo",
                         "session_1": turns1, "session_1_date_time": "1 May 2023",
                         "session_2": turns2, "session_2_date_time": "3 June 2023"},
        "qa": [
            {"question": "What is the name of Ana's cat?", "answer": "Figo", "category": 4,
             "evidence": ["D1:1"]},
            {"question": "Where will Bo work?", "answer": "river authority", "category": 4,
             "evidence": ["D2:1"]},
            {"question": "Skipped: no evidence", "answer": "", "category": 4, "evidence": []},
            {"question": "Skipped: adversarial", "answer": "", "category": 5, "evidence": ["D1:2"]},
        ],
    }]
    path.write_text(json.dumps(data))
    return path


def test_the_benchmark_scores_every_method_and_writes_json_and_a_plot(tmp_path: Path) -> None:
    data = tiny_locomo(tmp_path / "tiny.json")
    table = bench.main("locomo", data, json_out=tmp_path / "r.json", plot=tmp_path / "r.png")
    assert table.startswith("2 questions")
    for v in bench.VARIANTS:
        assert table.count(f"| {v.name} |") == 2  # full-evidence and recall tables
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["benchmark"] == "render" and doc["dataset"] == "locomo"
    res = doc["results"]
    assert res["budgets"] == list(bench.LOCOMO_BUDGETS) and res["questions"] == 2
    # A five-turn history fits any budget, so the detail methods see every evidence turn.
    for name in ("unit", "piece", "unit+piece", "prefix fill", "recency"):
        assert res["methods"][name]["overall"]["full@1000"] == 100.0, name
    assert set(res["methods"]["piece"]) == {"overall", "4"}
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
