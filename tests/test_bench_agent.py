"""The agent recall runner (suffice bench agent): baselines, verdicts, resumable records, the
cluster bootstrap, on a tiny run (fast, no shared data)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from suffice import HashEmbedder, Memory
from suffice._bench import agent as bench
from suffice._config import StoreConfig
from suffice._datasets.checkpoints import Checkpoint
from suffice._datasets.trajectories import Trajectory
from suffice._types import NewItem


def _traj(n: int = 40) -> Trajectory:
    items = []
    for s in range(n):
        items.append(NewItem(text=f"cat src/mod_{s}.py", kind="action", speaker="agent", meta={"step": s},
                             id=f"t-x:{s}:action"))
        body = "\n".join(f"def f_{s}_{k}(): return {k}  # helper {s} {k}" for k in range(12))
        items.append(NewItem(text=body, kind="observation", speaker="env", meta={"step": s},
                             id=f"t-x:{s}:observation"))
    return Trajectory("x", "t", "", tuple(items))


@pytest.fixture
def mem(tmp_path: Path):  # type: ignore[no-untyped-def]
    m = Memory(tmp_path / "a.db", embedder=HashEmbedder(), store_config=StoreConfig.for_agent())
    yield m
    m.close()


def test_truncation_keeps_a_contiguous_suffix_and_marks_the_cut_item() -> None:
    taken, cut, used = bench.suffix([10, 50, 10, 10], 4, 40)
    assert taken == {2, 3} and cut == 1 and used == 20
    taken, cut, _ = bench.suffix([10, 50, 10, 10], 4, 25)
    assert taken == {2, 3} and cut is None  # 5 tokens left: too few to show part of item 1
    assert bench.greedy([1, 0, 2], [10, 50, 10], 25) == ({0, 2}, 20)


def test_masking_hides_all_but_the_newest_observations(mem: Memory) -> None:
    t = _traj(10)
    mem.add(list(t.items), scope=t.scope)
    items = mem.items(scope=t.scope, limit=None)
    hidden = bench.masked_view(items, len(items), keep=3)
    obs = [it.seq for it in items if it.kind == "observation"]
    assert hidden == set(obs[:-3]) and not hidden & {it.seq for it in items if it.kind == "action"}
    assert "omitted" in bench.placeholder(items[1]) and "step 0" in bench.placeholder(items[1])


def test_a_checkpoint_is_measured_as_of_its_step_and_resumes(mem: Memory, tmp_path: Path) -> None:
    t = _traj()
    mem.add(list(t.items), scope=t.scope)
    ev = t.items[7]  # the observation of step 3
    at = 60  # the checkpoint is before step 30
    cps = [Checkpoint(t.scope, 30, "What did src/mod_3.py contain? f_3_5", ev.text, (str(ev.id),), "re_view",
                      at, 3),
           Checkpoint(t.scope, 31, "What did step 3 show?", ev.text, (str(ev.id),), "re_view", at + 2, 3)]
    qs = list(bench.checkpoint_questions(mem, [t], cps))
    assert [q.history for _, q in qs] == [60, 62] and qs[0][1].evidence == (7,)
    out = tmp_path / "recs.jsonl"
    assert bench.run(mem, qs, out, (1000, 4000), bench.METHODS, limit=1) == 1
    assert bench.run(mem, qs, out, (1000, 4000), bench.METHODS) == 1  # only the one not done yet
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["key"] for r in recs] == [q.key for _, q in qs]
    m = recs[1]["methods"]
    # 27 steps back: truncation to 1k cannot hold it; the step reference can.
    assert not m["truncation"]["1000"]["all"] and m["suffice"]["1000"]["all"]
    assert m["prefix fill"]["1000"]["all"] and m["suffice"]["1000"]["tokens"] <= 1000
    for rec in recs:
        for per in rec["methods"].values():
            for v in per.values():
                assert v["tokens"] <= 4000 and (v["all"] <= v["any"]) and (v["all"] <= v["piece_all"])
    res = bench.summarize(out, (1000, 4000), bench.METHODS, bench.CHECKPOINT_GROUPS, "trajectory")
    assert res["questions"] == 2 and res["clusters"] == 1
    overall = res["overall"]["suffice"]
    assert overall["4000"]["all"] == 100.0 and overall["1000"]["piece_all"] == 100.0
    assert "suffice - truncation @1000" in res["bootstrap"]
    assert "re_view" in bench.format_summary(res, groups=bench.CHECKPOINT_GROUPS)
    # Other budgets are another setting: measured again, and summed up without the old records
    # (which hold no 8k figures).
    asked: dict[str, dict[str, object]] = {}
    assert bench.run(mem, qs, out, (8000,), bench.METHODS, asked=asked) == 2
    res8 = bench.summarize(out, (8000,), bench.METHODS, bench.CHECKPOINT_GROUPS, "trajectory",
                           fingerprint=bench.fingerprint(mem, (8000,), bench.METHODS), questions=asked)
    assert res8["questions"] == 2 and res8["overall"]["suffice"]["8000"]["all"] == 100.0
    # A key that now asks about another step is measured again, not matched by its key.
    moved = [(d, dataclasses.replace(q, evidence=(6,))) for d, q in qs[:1]]
    assert bench.run(mem, moved, out, (8000,), bench.METHODS) == 1


def test_the_cluster_bootstrap_resamples_runs_not_questions() -> None:
    mean, lo, hi = bench.cluster_bootstrap({"a": [100.0] * 50, "b": [0.0] * 50})
    assert mean == 50.0 and lo < 20 and hi > 80  # two runs: wide, though 100 questions
    mean, lo, hi = bench.cluster_bootstrap({str(i): [10.0, 10.0] for i in range(30)})
    assert mean == lo == hi == 10.0
    assert bench.cluster_bootstrap({}) == (0.0, 0.0, 0.0)
    assert bench.gap_bucket(1) == "1" and bench.gap_bucket(7) == "5-9" and bench.gap_bucket(300) == "20+"
