"""Training the sufficiency router: a set encoder over the context's items, distilled from a
teacher that reads the rationale.

**Why this network.** The router must decide in well under 50 ms on two CPU cores, for a
context of about 1,000 tokens. Reading that text with even the smallest transformer here
(MiniLM-L6) costs about a second; a 0.5B LM costs seconds. But every item the context shows
already has a vector, made once at write time, and a place in the query's ranking. So the
student reads a *set*: one token per item (its vector, its product with the query vector, and
the numbers of :mod:`suffice._route.features`) plus one summary token (the query vector and the
context's numbers), through two small self-attention layers; the summary token's output is the
representation ``h_s`` and a linear head gives the single score. Attention lets it weigh items
against each other ("one item names the person and the event; none holds a date"), which a
pooled average cannot. It runs in about a millisecond, torch-free, from ONNX.

**Loss** (Router-Mem's two terms): class-weighted binary cross-entropy on "the context holds all
gold evidence", plus ``beta * s0 * (1 - cos(P h_s, h_t))`` where ``h_t`` is what a frozen
teacher makes of the question *and the rationale* (which evidence is there, which decisive piece
is missing): all-MiniLM-L6-v2, mean-pooled, the same network the store's vectors come from. ``P``
is a projection used only in training; ``s0`` puts the two losses on one scale (the ratio of
their values at the start). At inference no rationale exists and none is needed.

**Checkpoint and threshold** are chosen on a validation split of whole conversations (episodes),
on natural contexts at the reader's budget: the epoch with the best AUC there, and the smallest
tau at which the contexts the router lets stop hold all gold evidence at least ``precision`` of
the time (most early exits under a quality floor). With ``calibrate_on="width"`` the floor is on
what a stop gives up when the deep model answers it: the stopped contexts are those whose
render at twice the budget would show no more of the evidence.
"""

from __future__ import annotations

import json
import math
import random
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .._route.features import ELEMENT_FEATURES, FEATURES_VERSION, GLOBAL_FEATURES
from .encoder import CARD, MODEL, _tokenizer, _torch, base_model, int8_weights
from .sufficiency_data import SufficiencyExample


@dataclass(frozen=True, slots=True)
class RouterTrainConfig:
    epochs: int = 24
    batch: int = 64
    lr: float = 1.5e-3
    weight_decay: float = 0.01
    d_model: int = 64
    rank: int = 16
    """Dimension of the learned query-item match (a low-rank bilinear form over the vectors)."""
    dropout: float = 0.2
    beta: float = 0.5
    """Weight of the distillation term (0: the ablation without it)."""
    item_weight: float = 0.5
    """Weight of the per-item "is this gold evidence" loss (evidence-level supervision)."""
    multi_weight: float = 0.3
    """Weight of the "does the question need several pieces of evidence" loss."""
    intervention_weight: float = 0.5
    """Loss weight of intervened contexts against natural ones (the kind judged)."""
    precision: float = 0.9
    """tau is the smallest threshold at which stopped contexts hold all gold this often (validation)."""
    stop_rate: float | None = None
    """Instead of ``precision``: tau is the largest threshold at which at least this share of
    validation contexts stop early. A time budget rather than a quality floor: with
    ``EngineConfig(stop_reader="deep")`` auto costs about ``s * r + (1 - s)`` of deep's time at
    stop rate ``s``, ``r`` being a stop's time over a deep answer's, so a target share of deep's
    time fixes the stop rate it needs (docs/benchmarks.md section 7)."""
    calibrate_on: Literal["label", "width"] = "label"
    """What tau's precision is measured against on validation: the training label ("label"),
    or "width": the wider render shows no more evidence (:attr:`SufficiencyExample.wider_adds`),
    what a stop answered by the deep model gives up. The router still learns the label.
    ``suffice train router`` defaults to "width", the engine's default stop (docs/benchmarks.md
    section 7); this default stays "label" for data without the wider renders."""
    eval_budget: int = 1000
    """Natural contexts of this budget (the reader's) choose the checkpoint and tau."""
    teacher_tokens: int = 256
    seed: int = 0
    threads: int = 2


@dataclass(slots=True)
class RouterReport:
    epochs: int = 0
    steps: int = 0
    seconds: float = 0.0
    teacher_seconds: float = 0.0
    best_epoch: int = -1
    val_auc: float | None = None
    tau: float = 0.5
    val_early_rate: float | None = None
    val_precision: float | None = None
    s0: float = 1.0
    history: list[dict[str, float]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "steps": self.steps, "train_s": round(self.seconds, 1),
                "teacher_s": round(self.teacher_seconds, 1), "best_epoch": self.best_epoch,
                "val_auc": self.val_auc, "tau": self.tau, "val_early_rate": self.val_early_rate,
                "val_precision": self.val_precision, "s0": self.s0}


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Area under the ROC curve (ties count half); None when a class is empty."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if not n_pos or not n_neg:
        return None
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), dtype=np.float64)
    sorted_s = s[order]
    i = 0
    while i < len(s):  # average ranks over ties
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def calibrate(scores: Sequence[float], labels: Sequence[bool],
              precision: float, stop_rate: float | None = None) -> tuple[float, float, float]:
    """(tau, early-exit rate, precision at tau): the smallest tau whose stopped contexts
    (score >= tau) hold all gold at least ``precision`` of the time; 1.0 (stop nowhere... but a
    perfect score) when no threshold reaches it. With ``stop_rate``, the largest tau at which at
    least that share of contexts stops instead, whatever its precision."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    best = (1.0, 0.0, 0.0)
    if stop_rate is not None:
        if not 0.0 < stop_rate <= 1.0:
            raise ValueError(f"stop_rate must be in (0, 1], got {stop_rate}")
        for tau in sorted(set(np.round(s, 4).tolist()), reverse=True):
            stop = s >= tau
            if stop.mean() >= stop_rate:
                return float(tau), float(stop.mean()), float(y[stop].mean())
        return best
    for tau in sorted(set(np.round(s, 4).tolist())):
        stop = s >= tau
        if not stop.any():
            continue
        prec = float(y[stop].mean())
        if prec >= precision:
            return float(tau), float(stop.mean()), prec
    return best


def _net(torch: Any, config: RouterTrainConfig, dim: int, norms: dict[str, np.ndarray] | None = None) -> Any:
    nn = torch.nn
    d, r, p = config.d_model, config.rank, config.dropout
    n_el, n_gl = len(ELEMENT_FEATURES), len(GLOBAL_FEATURES)

    def block(width: int) -> Any:
        return nn.Sequential(nn.Linear(width, d), nn.GELU(), nn.Dropout(p), nn.Linear(d, d), nn.GELU())

    class RouterNet(nn.Module):  # type: ignore[misc,name-defined]
        """Items -> tokens; attention from the context's summary, max and mean pooling -> h_s.

        Two auxiliary heads see the same tokens in training: is this item gold evidence (the
        evidence-level labels, per item) and does the question need several pieces of evidence.
        The score head reads h_s and what the item head makes of the context's items.
        """

        def __init__(self) -> None:
            super().__init__()
            for name, size in (("el", n_el), ("gl", n_gl)):
                mean = np.zeros(size, np.float32) if norms is None else norms[f"{name}_mean"]
                std = np.ones(size, np.float32) if norms is None else norms[f"{name}_std"]
                self.register_buffer(f"{name}_mean", torch.tensor(mean))
                self.register_buffer(f"{name}_std", torch.tensor(std))
            self.qproj = nn.Linear(dim, r, bias=False)  # a low-rank bilinear match of query and item
            self.vproj = nn.Linear(dim, r, bias=False)
            self.elem = block(n_el + r)
            self.glob = block(n_gl + r)
            self.attend = nn.Linear(d, d, bias=False)
            self.item_head = nn.Linear(d, 1)
            self.multi_head = nn.Linear(d, 1)
            self.mix = block(4 * d + 3)
            self.head = nn.Linear(d, 1)
            self.proj = nn.Linear(d, dim)  # distillation only: maps h_s to the teacher's space

        def parts(self, query: Any, vectors: Any, elements: Any, context: Any,
                  mask: Any) -> tuple[Any, Any, Any, Any]:
            elements = (elements - self.el_mean) / self.el_std
            context = (context - self.gl_mean) / self.gl_std
            qp = self.qproj(query)
            match = qp[:, None, :] * self.vproj(vectors)
            e = self.elem(torch.cat([elements, match], dim=-1))
            g = self.glob(torch.cat([context, qp], dim=-1))
            m = mask[:, :, None]
            logits = (e @ self.attend(g)[:, :, None]) / math.sqrt(d) + (m - 1.0) * 1e4
            w = torch.softmax(logits, dim=1) * m
            pooled = (w * e).sum(1)
            mx = (e + (m - 1.0) * 1e4).max(dim=1).values * (m.sum(1) > 0).float()
            mean = (e * m).sum(1) / m.sum(1).clamp(min=1.0)
            item_logit = self.item_head(e).squeeze(-1)
            item_p = torch.sigmoid(item_logit) * mask
            multi_logit = self.multi_head(g).squeeze(-1)
            summary = torch.stack([item_p.max(dim=1).values, item_p.sum(1) / 5.0,
                                   torch.sigmoid(multi_logit)], dim=-1)
            rep = self.mix(torch.cat([pooled, mx, mean, g, summary], dim=-1))
            return rep, item_logit, multi_logit, summary

        def forward(self, query: Any, vectors: Any, elements: Any, context: Any,
                    mask: Any) -> tuple[Any, Any]:
            rep, _, _, _ = self.parts(query, vectors, elements, context, mask)
            return self.head(rep).squeeze(-1), rep

    return RouterNet()


def feature_norms(examples: Sequence[SufficiencyExample]) -> dict[str, np.ndarray]:
    """Mean and spread of every feature over the training set (baked into the network)."""
    el = np.concatenate([e.features.elements for e in examples if len(e.features.seqs)]) if examples else \
        np.zeros((1, len(ELEMENT_FEATURES)), np.float32)
    gl = np.stack([e.features.context for e in examples])
    def stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return x.mean(0).astype(np.float32), np.maximum(x.std(0), 1e-3).astype(np.float32)

    (el_mean, el_std), (gl_mean, gl_std) = stats(el), stats(gl)
    return {"el_mean": el_mean, "el_std": el_std, "gl_mean": gl_mean, "gl_std": gl_std}


class _Export:
    """The network with one output, the score in [0, 1] (what the runtime reads)."""

    @staticmethod
    def wrap(torch: Any, net: Any) -> Any:
        class Scored(torch.nn.Module):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.net = net

            def forward(self, query: Any, vectors: Any, elements: Any, context: Any, mask: Any) -> Any:
                logit, _ = self.net(query, vectors, elements, context, mask)
                return torch.sigmoid(logit)
        return Scored()


def _item_labels(examples: Sequence[SufficiencyExample], n: int) -> np.ndarray:
    out = np.zeros((len(examples), n), np.float32)
    for i, e in enumerate(examples):
        lab = e.item_labels()
        out[i, :len(lab)] = lab
    return out


def batch_arrays(examples: Sequence[SufficiencyExample]) -> dict[str, np.ndarray]:
    """Pad a batch of examples to its largest context (mask marks real items)."""
    n = max(max(len(e.features.seqs) for e in examples), 1)
    dim = examples[0].features.query.shape[0]
    b = len(examples)
    out = {"query": np.zeros((b, dim), np.float32), "vectors": np.zeros((b, n, dim), np.float32),
           "elements": np.zeros((b, n, len(ELEMENT_FEATURES)), np.float32),
           "context": np.zeros((b, len(GLOBAL_FEATURES)), np.float32), "mask": np.zeros((b, n), np.float32)}
    for i, e in enumerate(examples):
        f = e.features
        k = len(f.seqs)
        out["query"][i] = f.query
        out["context"][i] = f.context
        if k:
            out["vectors"][i, :k] = f.vectors
            out["elements"][i, :k] = f.elements
            out["mask"][i, :k] = 1.0
    return out


def teacher_vectors(examples: Sequence[SufficiencyExample], config: RouterTrainConfig,
                    progress: Callable[[int], None] | None = None) -> np.ndarray:
    """The frozen teacher's view of each example: MiniLM over "question + rationale"."""
    torch = _torch()
    model = base_model(torch, _base_config(config))
    model.eval()
    tok = _tokenizer(config.teacher_tokens)
    texts = [f"Question: {e.query}\nAssessment: {e.rationale}" for e in examples]
    unique = sorted(set(texts), key=len)
    where = {t: i for i, t in enumerate(unique)}
    vecs = np.zeros((len(unique), 384), np.float32)
    with torch.no_grad():
        for b in range(0, len(unique), 64):
            chunk = unique[b:b + 64]
            encs = tok.encode_batch(chunk)
            ids = torch.tensor([x.ids for x in encs], dtype=torch.long)
            mask = torch.tensor([x.attention_mask for x in encs], dtype=torch.long)
            hid = model(input_ids=ids, attention_mask=mask,
                        token_type_ids=torch.zeros_like(ids)).last_hidden_state
            m = mask.unsqueeze(-1).float()
            pooled = torch.nn.functional.normalize((hid * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1)
            vecs[b:b + len(chunk)] = pooled.numpy()
            if progress is not None:
                progress(len(chunk))
    return vecs[[where[t] for t in texts]]


def _base_config(config: RouterTrainConfig) -> Any:
    from .encoder import TrainConfig
    return TrainConfig(seed=config.seed, threads=config.threads)


def unique_teacher_texts(examples: Sequence[SufficiencyExample]) -> int:
    return len({f"Question: {e.query}\nAssessment: {e.rationale}" for e in examples})


def predict(net: Any, examples: Sequence[SufficiencyExample], batch: int = 256) -> np.ndarray:
    """Scores in [0, 1] from a torch network (training-time evaluation)."""
    torch = _torch()
    out = []
    net.eval()
    with torch.no_grad():
        for b in range(0, len(examples), batch):
            arr = {k: torch.from_numpy(v) for k, v in batch_arrays(examples[b:b + batch]).items()}
            logit, _ = net(arr["query"], arr["vectors"], arr["elements"], arr["context"], arr["mask"])
            out.append(torch.sigmoid(logit).numpy())
    return np.concatenate(out) if out else np.zeros(0, np.float32)


def judged(examples: Sequence[SufficiencyExample], budget: int) -> list[SufficiencyExample]:
    """The examples a router is judged on: natural contexts at the reader's budget."""
    return [e for e in examples if e.kind == "natural" and e.budget == budget]


def train(train_set: Sequence[SufficiencyExample], val_set: Sequence[SufficiencyExample],
          config: RouterTrainConfig = RouterTrainConfig(),
          progress: Callable[[str, int, int], None] | None = None) -> tuple[Any, RouterReport]:
    """Fit a router on ``train_set``; keep the epoch with the best validation AUC; set tau.

    ``progress(stage, done, total)`` is told of the teacher pass and of every epoch.
    """
    torch = _torch()
    torch.manual_seed(config.seed)
    torch.set_num_threads(config.threads)
    rnd = random.Random(config.seed)
    report = RouterReport()
    if not train_set:
        raise ValueError("no training examples")
    dim = int(train_set[0].features.query.shape[0])
    t0 = time.perf_counter()
    if config.beta > 0:
        total = len(train_set)
        done = [0]

        def tick(n: int) -> None:
            done[0] += n
            if progress is not None:
                progress("teacher", done[0], unique_teacher_texts(train_set))
        teacher = torch.from_numpy(teacher_vectors(train_set, config, tick))
        del total
    else:
        teacher = torch.zeros((len(train_set), dim))
    report.teacher_seconds = time.perf_counter() - t0

    net = _net(torch, config, dim, feature_norms(train_set))
    opt = torch.optim.AdamW(net.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    n_steps = math.ceil(len(train_set) / config.batch) * config.epochs
    warm = max(1, n_steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, 0.5 * (1 + math.cos(math.pi * min(s / n_steps, 1.0)))))
    labels = torch.tensor([float(e.label) for e in train_set])
    multi = torch.tensor([float(e.n_gold > 1) for e in train_set])
    pos = float(labels.sum())
    pos_weight = torch.tensor((len(train_set) - pos) / max(pos, 1.0))
    weights = torch.tensor([1.0 if e.kind in ("natural", "prefix") else config.intervention_weight
                            for e in train_set])
    val = judged(val_set, config.eval_budget)
    best_state: dict[str, Any] | None = None
    best_auc = -1.0
    order = list(range(len(train_set)))
    s0: float | None = None if config.beta > 0 else 1.0
    t0 = time.perf_counter()
    for epoch in range(config.epochs):
        net.train()
        rnd.shuffle(order)
        losses = []
        for b in range(0, len(order), config.batch):
            idx = order[b:b + config.batch]
            arr = {k: torch.from_numpy(v) for k, v in batch_arrays([train_set[i] for i in idx]).items()}
            rep, item_logit, multi_logit, _ = net.parts(arr["query"], arr["vectors"], arr["elements"],
                                                        arr["context"], arr["mask"])
            logit = net.head(rep).squeeze(-1)
            y = labels[idx]
            ce = torch.nn.functional.binary_cross_entropy_with_logits(
                logit, y, weight=weights[idx], pos_weight=pos_weight)
            item_y = torch.from_numpy(_item_labels([train_set[i] for i in idx], arr["mask"].shape[1]))
            item_loss = (torch.nn.functional.binary_cross_entropy_with_logits(
                item_logit, item_y, reduction="none") * arr["mask"]).sum() / arr["mask"].sum().clamp(min=1.0)
            multi_loss = torch.nn.functional.binary_cross_entropy_with_logits(multi_logit, multi[idx])
            loss = ce + config.item_weight * item_loss + config.multi_weight * multi_loss
            if config.beta > 0:
                cos = torch.nn.functional.cosine_similarity(net.proj(rep), teacher[idx], dim=-1)
                rep_loss = (weights[idx] * (1.0 - cos)).mean()
                if s0 is None:  # one scale for the two parts, fixed by their first values
                    s0 = float(loss.detach()) / max(float(rep_loss.detach()), 1e-6)
                # Added to the supervised terms, not in place of them: until 2026-12-04 this
                # line dropped the item and multi losses whenever beta > 0.
                loss = loss + config.beta * s0 * rep_loss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            sched.step()
            report.steps += 1
            losses.append(float(loss.detach()))
        val_auc = auc(predict(net, val).tolist(), [e.label for e in val]) if val else None
        report.history.append({"epoch": epoch, "loss": float(np.mean(losses)),
                               "val_auc": -1.0 if val_auc is None else val_auc})
        if val_auc is None or val_auc > best_auc:
            best_auc = -1.0 if val_auc is None else val_auc
            best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
            report.best_epoch = epoch
        if progress is not None:
            progress("epochs", epoch + 1, config.epochs)
    report.epochs = config.epochs
    report.seconds = time.perf_counter() - t0
    report.s0 = float(s0 or 1.0)
    if best_state is not None:
        net.load_state_dict(best_state)
    net.eval()
    if val:
        scores = predict(net, val).tolist()
        report.val_auc = auc(scores, [e.label for e in val])
        report.tau, report.val_early_rate, report.val_precision = calibrate_on(scores, val, config)
    return net, report


def calibrate_on(scores: Sequence[float], val: Sequence[SufficiencyExample],
                 config: RouterTrainConfig) -> tuple[float, float, float]:
    """:func:`calibrate` against what ``config.calibrate_on`` names: the training label, or
    whether the wider render adds evidence (examples without that answer left out)."""
    if config.calibrate_on == "width":
        known = [(s, not e.wider_adds) for s, e in zip(scores, val, strict=True)
                 if e.wider_adds is not None]
        if not known:
            raise ValueError("calibrate_on='width' needs validation renders at twice the budget")
        return calibrate([s for s, _ in known], [y for _, y in known], config.precision, config.stop_rate)
    return calibrate(scores, [e.label for e in val], config.precision, config.stop_rate)


def predict_exported(out_dir: Path, examples: Sequence[SufficiencyExample], batch: int = 256) -> np.ndarray:
    """Scores of the exported ONNX model (int8-stored weights), as the runtime computes them."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(out_dir / MODEL), providers=["CPUExecutionProvider"])
    out = [np.asarray(sess.run(None, batch_arrays(examples[b:b + batch]))[0]).reshape(-1)
           for b in range(0, len(examples), batch)]
    return np.concatenate(out) if out else np.zeros(0, np.float32)


def recalibrate_exported(out_dir: Path, val: Sequence[SufficiencyExample],
                         config: RouterTrainConfig) -> dict[str, Any]:
    """Calibrate tau again on the exported model's own scores of the validation contexts
    :func:`train` calibrated on (natural, at ``config.eval_budget``) and write it into the card.

    The runtime reads int8-stored weights, whose scores differ from the training network's by
    a few thousandths (at most 0.0025 on LoCoMo's validation contexts): enough for a tau fit to
    the network's scores to sit on the other side of a context or two. The card keeps the
    network's figure as ``tau_fp32``."""
    card_path = out_dir / CARD
    card: dict[str, Any] = json.loads(card_path.read_text(encoding="utf-8"))
    val = judged(val, config.eval_budget)  # the contexts train() calibrated on
    if not val:
        return card
    scores = predict_exported(out_dir, val).tolist()
    tau, early, prec = calibrate_on(scores, val, config)
    card.setdefault("tau_fp32", card.get("tau"))  # a second run keeps the network's figure
    card["tau"] = tau
    card["val_auc_exported"] = auc(scores, [e.label for e in val])
    if isinstance(card.get("report"), dict):
        card["report"] = {**card["report"], "tau": tau, "val_early_rate": early, "val_precision": prec}
    card_path.write_text(json.dumps(card, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return card


def export_router(net: Any, out_dir: Path, card: dict[str, Any]) -> Path:
    """Write ``model.onnx`` (int8-stored weights, fp32 arithmetic) and ``card.json`` (kind
    ``router``, tau, the feature version and names, the encoder the vectors must come from)."""
    import hashlib

    torch = _torch()
    out_dir.mkdir(parents=True, exist_ok=True)
    fp32 = out_dir / "model.fp32.onnx"
    dim = int(net.qproj.in_features)
    module = _Export.wrap(torch, net)
    module.eval()
    args = (torch.zeros(1, dim), torch.zeros(1, 5, dim), torch.zeros(1, 5, len(ELEMENT_FEATURES)),
            torch.zeros(1, len(GLOBAL_FEATURES)), torch.ones(1, 5))
    names = ["query", "vectors", "elements", "context", "mask"]
    axes = {"vectors": {0: "batch", 1: "items"}, "elements": {0: "batch", 1: "items"},
            "mask": {0: "batch", 1: "items"}, "query": {0: "batch"}, "context": {0: "batch"},
            "score": {0: "batch"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(fp32), input_names=names, output_names=["score"],
                          opset_version=17, dynamo=False, dynamic_axes=axes)
    model = out_dir / MODEL
    int8_weights(fp32, model, min_size=1024)
    fp32.unlink()
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    full = {"name": f"router-{digest[:10]}", "kind": "router", "sha256": digest,
            "features_version": FEATURES_VERSION, "element_features": list(ELEMENT_FEATURES),
            "global_features": list(GLOBAL_FEATURES), "dim": dim, **card}
    (out_dir / CARD).write_text(json.dumps(full, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return out_dir


def split_groups(groups: Sequence[str], val_share: float = 1 / 7,
                 n_val: int | None = None) -> tuple[list[str], list[str]]:
    """(train, validation) groups: every ``round(1/val_share)``-th group, in sorted order, goes
    to validation (at least one when there are two or more). With ``n_val``, that many groups
    spread evenly over the sorted order instead (at least one group always trains): a threshold
    calibrated on one conversation moved with it (docs/benchmarks.md section 7)."""
    ordered = sorted(set(groups))
    if len(ordered) < 2:
        return ordered, []
    if n_val is not None:
        n = max(1, min(n_val, len(ordered) - 1))
        picks = {int((j + 0.5) * len(ordered) / n) for j in range(n)}
        val = [g for i, g in enumerate(ordered) if i in picks]
    else:
        step = max(2, round(1 / max(val_share, 1e-6)))
        val = ordered[step // 2::step] or ordered[:1]
    return [g for g in ordered if g not in val], val


def cross_validate(examples: Sequence[SufficiencyExample], k: int, config: RouterTrainConfig,
                   groups: Sequence[str] | None = None, n_val: int | None = None,
                   progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """K-fold by group: each fold's router is trained on the other folds (with a validation
    group of its own) and judged on its fold's natural contexts at the reader's budget.
    ``groups``: the groups dealt into folds (default: every group, by name; with several
    datasets, pass one dataset's groups to judge on it while the others always train)."""
    from .pairs import folds

    names = sorted(set(groups)) if groups is not None else sorted({e.group for e in examples})
    per: list[dict[str, Any]] = []
    all_scores: list[float] = []
    all_labels: list[bool] = []
    for i, held in enumerate(folds(names, k)):
        held_set = set(held)
        rest = [e for e in examples if e.group not in held_set]
        tr_groups, val_groups = split_groups([e.group for e in rest if e.group in set(names)],
                                                n_val=n_val)
        val_set = set(val_groups)
        tr = [e for e in rest if e.group not in val_set]
        va = [e for e in rest if e.group in val_set]
        te = judged([e for e in examples if e.group in held_set], config.eval_budget)

        def tick(stage: str, done: int, total: int, i: int = i) -> None:
            if progress is not None:
                progress(f"fold {i + 1}/{k} {stage}", done, total)
        net, rep = train(tr, va, config, tick)
        scores = predict(net, te).tolist()
        labels = [e.label for e in te]
        all_scores += scores
        all_labels += labels
        stop = [s >= rep.tau for s in scores]
        # Precision at tau against what tau was calibrated on (unknown widths left out).
        safe = ([None if e.wider_adds is None else not e.wider_adds for e in te]
                if config.calibrate_on == "width" else labels)
        kept = [y for y, s in zip(safe, stop, strict=True) if s and y is not None]
        per.append({"fold": i, "held_out": held, "validation": val_groups, "n": len(te),
                    "sufficient": float(np.mean(labels)) if labels else None,
                    "auc": auc(scores, labels), "tau": rep.tau,
                    "early_rate": float(np.mean(stop)) if stop else None,
                    "precision_at_tau": float(np.mean(kept)) if kept else None,
                    "calibrated_on": config.calibrate_on,
                    **{f"train_{k2}": v for k2, v in rep.summary().items()}})
    aucs = [f["auc"] for f in per if f["auc"] is not None]
    return {"folds": per, "mean_auc": float(np.mean(aucs)) if aucs else None,
            "pooled_auc": auc(all_scores, all_labels), "n": len(all_labels)}
