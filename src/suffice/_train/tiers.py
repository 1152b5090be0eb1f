"""Training the tier policy with PPO: one episode per question, one reward per episode.

An episode runs the pipeline once for a question: the policy samples a tier for each of the
five modules as the pipeline reaches it, the pipeline runs at those tiers, and the episode's
reward is

    r = kappa * r_task + lam * r_cost

``r_task`` is ``score``'s mark for what the pipeline produced (``suffice train tiers`` gives by
default the share of the gold answer's words the summary holds, a cheap stand-in for the reader
that needs no answer call, or with ``--reward reader`` the reader's token F1). ``r_cost`` is
1 minus the episode's sqrt-cost placed between the 5th and 95th percentiles of a sliding window
of recent costs (:class:`CostWindow`); ``kappa`` is the ratio of the two rewards' standard
deviations over their history (:class:`ScaleAligner`), so that ``lam`` means the same whatever
the units. Both are explicit objects whose state is saved with every checkpoint.

The update is PPO on the product policy: one clipped ratio for the five modules' joint
log-probability, a value baseline read from the filter's state, an entropy bonus. The
checkpoint kept is the one that scores best on *validation* conversations with the greedy
policy, never the one with the best training reward. Every epoch's validation episodes are
kept and scored at the end under one reward state, the final one (the fixed pipelines are
scored under it too): scored as they came, epochs would be compared under different kappas
and cost windows. Among epochs that score the same, the cheaper one wins, then the earlier.
After every epoch the best one so far is written too, marked ``provisional`` in its card, so a
run stopped early leaves a usable policy; the final choice overwrites it.
Every module output is cached by (module, tier, model, input), so an episode whose tiers were
seen before costs no new work.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._embed.protocol import Embedder
from .._errors import ConfigError
from .._pipeline import MODULES, TIERS, Chunk, Tier, TieredPipeline, tiers_up_to
from .._pipeline.run import PipelineResult
from .._route.tiers import TierPolicy

__all__ = ["CostWindow", "Episode", "PPOConfig", "ScaleAligner", "TierQuestion", "selection_key",
           "train_tiers", "validation_score", "warm_cache"]

DESCRIPTIONS = {
    "filter": "Picks which retrieved excerpts of the history are worth reading for the question.",
    "entity": "Extracts relationships between people, places and things from the excerpts.",
    "temporal": "Extracts what happened when from the excerpts, with calendar dates.",
    "topic": "Extracts the topics the excerpts discuss and how they connect.",
    "summary": "Writes the text the answering model reads, from the excerpts and extracted facts.",
}


@dataclass
class CostWindow:
    """Cost normalisation over a sliding window of raw costs (BudgetMem's Eq. 9)."""

    size: int = 2000
    costs: list[float] = field(default_factory=list)

    def push(self, costs: Sequence[float]) -> None:
        self.costs.extend(float(c) for c in costs)
        del self.costs[: max(0, len(self.costs) - self.size)]

    def bounds(self) -> tuple[float, float]:
        if not self.costs:
            return 0.0, 1.0
        s = np.sqrt(np.asarray(self.costs, dtype=np.float64))
        lo, hi = float(np.percentile(s, 5)), float(np.percentile(s, 95))
        if hi <= lo:
            if hi == 0.0:
                hi = 1.0
            else:
                lo = 0.9 * hi
        return lo, hi

    def reward(self, cost: float) -> float:
        """1 for the cheapest episodes of the window, 0 for the dearest."""
        lo, hi = self.bounds()
        return 1.0 - float(np.clip((math.sqrt(max(cost, 0.0)) - lo) / (hi - lo), 0.0, 1.0))

    def state(self) -> dict[str, Any]:
        return {"size": self.size, "costs": self.costs}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> CostWindow:
        return cls(int(state["size"]), [float(c) for c in state["costs"]])


@dataclass
class ScaleAligner:
    """kappa = sd(cost rewards) / sd(task rewards) over a capped history (BudgetMem's Eq. 10)."""

    size: int = 20000
    task: list[float] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    enabled: bool = True

    def push(self, task: Sequence[float], cost: Sequence[float]) -> None:
        self.task.extend(float(t) for t in task)
        self.cost.extend(float(c) for c in cost)
        del self.task[: max(0, len(self.task) - self.size)]
        del self.cost[: max(0, len(self.cost) - self.size)]

    def kappa(self) -> float:
        if not self.enabled or len(self.task) < 2:
            return 1.0
        return max(float(np.std(self.cost)), 1e-5) / max(float(np.std(self.task)), 1e-5)

    def state(self) -> dict[str, Any]:
        return {"size": self.size, "task": self.task, "cost": self.cost, "enabled": self.enabled}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ScaleAligner:
        return cls(int(state["size"]), list(state["task"]), list(state["cost"]), bool(state["enabled"]))


@dataclass(frozen=True, slots=True)
class TierQuestion:
    """One training question with what the pipeline reads for it."""

    key: str
    group: str
    """Its conversation: splits never cut one."""
    question: str
    answer: str
    chunks: tuple[Chunk, ...]
    qvec: np.ndarray = field(repr=False)


@dataclass(frozen=True, slots=True)
class Episode:
    key: str
    tiers: tuple[int, ...]
    states: tuple[np.ndarray, ...]
    task: float
    cost: float


@dataclass(frozen=True, slots=True)
class PPOConfig:
    lam: float = 0.0
    epochs: int = 6
    batch: int = 32
    ppo_epochs: int = 4
    lr: float = 3e-4
    clip: float = 0.2
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    grad_clip: float = 0.5
    hidden: int = 128
    seed: int = 42
    align: bool = True
    """False: the ablation without scale alignment (kappa fixed at 1)."""
    cap: Tier = "high"
    """The highest tier the policy may choose: tiers above it are masked out of every
    sample, update and export (on a CPU, ``"mid"`` keeps LLM calls out of training)."""


def _net(dim: int, hidden: int, descriptors: np.ndarray, seed: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.descriptors = nn.Parameter(torch.tensor(descriptors, dtype=torch.float32))
            self.u = nn.Linear(2 * dim, hidden)
            self.v = nn.Linear(dim, hidden)
            self.t1 = nn.Linear(2 * hidden, hidden)
            self.t2 = nn.Linear(hidden, hidden)
            self.h1 = nn.Linear(hidden, hidden // 2)
            self.h2 = nn.Linear(hidden // 2, 3)
            self.v1 = nn.Linear(hidden, hidden // 2)
            self.v2 = nn.Linear(hidden // 2, 1)
            for layer in (self.u, self.v, self.t1, self.t2, self.h1, self.v1):
                nn.init.orthogonal_(layer.weight, math.sqrt(2))
                nn.init.zeros_(layer.bias)
            for layer in (self.h2, self.v2):
                nn.init.orthogonal_(layer.weight, 0.01)
                nn.init.zeros_(layer.bias)

        def trunk(self, module: Any, q: Any, x: Any) -> Any:
            d = self.descriptors[module]
            s = torch.cat([self.u(torch.cat([q, x], -1)), self.v(d)], -1)
            return torch.relu(self.t2(torch.relu(self.t1(s))))

        def forward(self, module: Any, q: Any, x: Any) -> tuple[Any, Any]:
            h = self.trunk(module, q, x)
            return self.h2(torch.relu(self.h1(h))), self.v2(torch.relu(self.v1(h))).squeeze(-1)

    return Net()


def _masked(logits: Any, cap: Tier) -> Any:
    """Logits with the tiers above ``cap`` pushed out of reach (finite, so the entropy of the
    distribution stays a number)."""
    import torch

    allowed = len(tiers_up_to(cap))
    if allowed == len(TIERS):
        return logits
    return logits.masked_fill(torch.arange(logits.shape[-1]) >= allowed, -1e9)


def export(net: Any, lam: float, encoder: str, cap: Tier = "high") -> TierPolicy:
    """The torch network as a numpy :class:`TierPolicy` (same arithmetic, argmax at the end)."""
    def a(t: Any) -> np.ndarray:
        # A copy: numpy() shares the tensor's memory, and training goes on after an export.
        return np.array(t.detach().cpu().numpy(), dtype=np.float32, copy=True)

    w = {"descriptors": a(net.descriptors), "wu": a(net.u.weight), "bu": a(net.u.bias),
         "wv": a(net.v.weight), "bv": a(net.v.bias), "w1": a(net.t1.weight), "b1": a(net.t1.bias),
         "w2": a(net.t2.weight), "b2": a(net.t2.bias), "w3": a(net.h1.weight), "b3": a(net.h1.bias),
         "w4": a(net.h2.weight), "b4": a(net.h2.bias)}
    return TierPolicy(w, lam=lam, encoder=encoder, cap=cap)


Scorer = Callable[[TierQuestion, PipelineResult], float]


def warm_cache(pipeline: TieredPipeline, questions: Sequence[TierQuestion], *,
               cap: Tier = "high", progress: Callable[[str, int, int], None] | None = None) -> int:
    """Run every filter tier with every tier of the later modules once per question, so the
    module cache holds each output an episode can ask for (every fact module and the
    summary's briefing depend only on the kept chunks), up to ``cap``. Returns the runs made."""
    from .._route.tiers import FixedTiers

    allowed = tiers_up_to(cap)
    runs = 0
    total = len(questions) * len(allowed) ** 2
    for q in questions:
        for f in allowed:
            for t in allowed:
                tiers = {"filter": f, "entity": t, "temporal": t, "topic": t, "summary": t}
                pipeline.run(q.question, q.chunks, FixedTiers(tiers).chooser(q.question), qvec=q.qvec,
                             vectors=False)
                runs += 1
                if progress is not None:
                    progress("warm", runs, total)
    return runs


def train_tiers(pipeline: TieredPipeline, embedder: Embedder, train: Sequence[TierQuestion],
                val: Sequence[TierQuestion], config: PPOConfig, out: Path, *, score: Scorer,
                progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Train one policy at ``config.lam``; write the validation-best checkpoint to ``out``
    (``.npz`` + ``.json`` card with the reward state) and return the training report."""
    import torch

    if not train or not val:
        raise ConfigError("tier training needs training and validation questions")
    if {q.group for q in train} & {q.group for q in val}:
        raise ConfigError("a conversation is in both the training and the validation split")
    dim = train[0].qvec.shape[0]
    desc = embedder.embed([DESCRIPTIONS[m] for m in MODULES]).astype(np.float32)
    net = _net(dim, config.hidden, desc, config.seed)
    opt = torch.optim.Adam(net.parameters(), lr=config.lr, eps=1e-5)
    rng = random.Random(config.seed)
    window = CostWindow()
    aligner = ScaleAligner(enabled=config.align)
    t0 = time.perf_counter()
    history: list[dict[str, Any]] = []
    candidates: list[tuple[dict[str, Any], list[Episode], TierPolicy]] = []

    def run(q: TierQuestion, greedy: bool, fixed: int | None = None) -> Episode:
        picks: list[int] = []

        def choose(module: str, qv: np.ndarray, x: np.ndarray) -> int:
            if fixed is not None:
                picks.append(fixed)
                return fixed
            with torch.no_grad():
                logits, _ = net(torch.tensor(MODULES.index(module)), torch.from_numpy(qv),
                                torch.from_numpy(x))
                logits = _masked(logits, config.cap)
            if greedy:
                a = int(torch.argmax(logits))
            else:
                a = int(torch.distributions.Categorical(logits=logits).sample())  # type: ignore[no-untyped-call]
            picks.append(a)
            return a

        res = pipeline.run(q.question, q.chunks, choose, qvec=q.qvec, cap=config.cap)
        states = [x for _, x in res.states]
        # A pipeline with nothing to read stops before choosing every tier: the modules it did
        # not run count as Low (what they cost, nothing), so every episode has one pick a module.
        states += [np.zeros_like(q.qvec)] * (len(MODULES) - len(states))
        picks += [0] * (len(MODULES) - len(picks))
        return Episode(q.key, tuple(picks), tuple(states), score(q, res), res.cost_usd)

    def rescore(eps: Sequence[Episode]) -> dict[str, Any]:
        """A validation pass scored under the reward state as it stands now."""
        return validation_score([e.task for e in eps], [e.cost for e in eps], config.lam, window, aligner)

    def evaluate(questions: Sequence[TierQuestion],
                 fixed: int | None = None) -> tuple[dict[str, Any], list[Episode]]:
        eps = [run(q, greedy=True, fixed=fixed) for q in questions]
        shares = {m: [0, 0, 0] for m in MODULES}
        for e in eps:
            for m, a in zip(MODULES, e.tiers, strict=True):
                shares[m][a] += 1
        return {**rescore(eps),
                "tiers": {m: [c / len(eps) for c in v] for m, v in shares.items()}}, eps

    module_ids = torch.arange(len(MODULES))
    batches_per_epoch = math.ceil(len(train) / config.batch)
    for epoch in range(config.epochs):
        order = list(train)
        rng.shuffle(order)
        for b in range(batches_per_epoch):
            batch = order[b * config.batch:(b + 1) * config.batch]
            eps = [run(q, greedy=False) for q in batch]
            window.push([e.cost for e in eps])
            r_cost = [window.reward(e.cost) for e in eps]
            r_task = [e.task for e in eps]
            aligner.push(r_task, r_cost)
            kappa = aligner.kappa()
            reward = torch.tensor([kappa * t + config.lam * c for t, c in zip(r_task, r_cost, strict=True)],
                                  dtype=torch.float32)
            qv = torch.stack([torch.from_numpy(q.qvec) for q in batch])            # (B, D)
            xs = torch.stack([torch.from_numpy(np.stack(e.states)) for e in eps])  # (B, 5, D)
            acts = torch.tensor([e.tiers for e in eps])                            # (B, 5)
            q5 = qv[:, None, :].expand(-1, len(MODULES), -1)
            mids = module_ids[None, :].expand(len(eps), -1)
            with torch.no_grad():
                logits, values = net(mids, q5, xs)
                logits = _masked(logits, config.cap)
                old_logp = torch.distributions.Categorical(logits=logits).log_prob(acts).sum(-1)  # type: ignore[no-untyped-call]
                old_v = values[:, 0]
            adv = reward - old_v
            adv = (adv - adv.mean()) / adv.std() if len(eps) > 1 and adv.std() > 1e-8 else adv - adv.mean()
            for _ in range(config.ppo_epochs):
                logits, values = net(mids, q5, xs)
                dist = torch.distributions.Categorical(logits=_masked(logits, config.cap))
                logp = dist.log_prob(acts).sum(-1)  # type: ignore[no-untyped-call]
                ratio = torch.exp(torch.clamp(logp - old_logp, -10, 10))
                clipped = torch.clamp(ratio, 1 - config.clip, 1 + config.clip)
                pg = -torch.min(ratio * adv, clipped * adv).mean()
                v = values[:, 0]
                v_clip = old_v + torch.clamp(v - old_v, -config.clip, config.clip)
                vloss = torch.max((v - reward) ** 2, (v_clip - reward) ** 2).mean()
                entropy = dist.entropy().mean()  # type: ignore[no-untyped-call]
                loss = pg + config.value_coef * vloss - config.entropy_coef * entropy
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(net.parameters(), config.grad_clip)
                opt.step()
            history.append({"epoch": epoch, "batch": b, "reward": float(reward.mean()),
                            "task": float(np.mean(r_task)), "cost_usd": float(np.mean([e.cost for e in eps])),
                            "kappa": kappa})
            if progress is not None:
                progress("batches", epoch * batches_per_epoch + b + 1, config.epochs * batches_per_epoch)
        report, eps = evaluate(val)
        report["epoch"] = epoch
        history.append({"epoch": epoch, "val": report})
        candidates.append((report, eps, export(net, config.lam, embedder.name, config.cap)))
        # The best epoch so far under the reward state as it stands, written at once and marked
        # provisional: a run stopped before the end still leaves a policy to use.
        so_far, pol = max((({**r, **rescore(es)}, p) for r, es, p in candidates),
                          key=lambda c: selection_key(c[0]))
        pol.save(out, val=so_far, epoch=so_far["epoch"], provisional=True, epochs_done=epoch + 1,
                 config=dataclasses.asdict(config), cost_window=window.state(), aligner=aligner.state())
    # Every epoch rescored under the final reward state; the fixed pipelines on the same
    # validation questions are scored under it too.
    for report, eps, _ in candidates:
        report["as_trained"] = {k: report[k] for k in ("objective", "kappa", "cost_reward")}
        report.update(rescore(eps))
    best, _, policy = max(candidates, key=lambda c: selection_key(c[0]))
    policy.save(out, val=best, epoch=best["epoch"], provisional=False, epochs_done=config.epochs,
                config=dataclasses.asdict(config), cost_window=window.state(), aligner=aligner.state())
    fixed = {f"all-{t}": evaluate(val, fixed=i)[0] for i, t in enumerate(tiers_up_to(config.cap))}
    return {"lam": config.lam, "align": config.align, "best_epoch": best["epoch"], "val": best,
            "fixed_val": fixed,
            "train_s": time.perf_counter() - t0, "episodes": config.epochs * len(train),
            "cache_hits": pipeline.cache.hits, "cache_misses": pipeline.cache.misses,
            "history": history, "out": str(out)}


def validation_score(task: Sequence[float], cost: Sequence[float], lam: float,
                     window: CostWindow, aligner: ScaleAligner) -> dict[str, Any]:
    """One validation pass's objective, kappa * task + lam * cost reward, under the reward
    state given (the selection passes the final one for every epoch)."""
    kappa = aligner.kappa()
    mean_task = float(np.mean(task))
    rc = float(np.mean([window.reward(c) for c in cost]))
    return {"objective": kappa * mean_task + lam * rc, "task": mean_task, "cost_reward": rc,
            "cost_usd": float(np.mean(cost)), "kappa": kappa}


TIE = 1e-9
"""Objectives closer than this count as equal (they are means of the same questions' marks)."""


def selection_key(report: dict[str, Any]) -> tuple[float, float, int]:
    """Sort key of a validated epoch: the best objective, then the lower cost, then the earlier
    epoch. Objectives are rounded to :data:`TIE` so that float noise is not a preference."""
    return (round(report["objective"] / TIE) * TIE, -report["cost_usd"], -report["epoch"])


def card(path: Path) -> dict[str, Any]:
    """A saved policy's card (its validation figures and reward state)."""
    return dict(json.loads(path.with_suffix(".json").read_text()))
