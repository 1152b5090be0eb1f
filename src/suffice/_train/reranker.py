"""Training the cross-encoder reranker from the same MiniLM weights and the same pairs.

The network reads ``[CLS] question [SEP] item [SEP]`` and a one-unit head over its mean-pooled
output gives the score. The loss is listwise: each evidence item is scored against the
question's hard negatives (the non-evidence items the prefix ranked high), and a softmax over
that list should put it first; the question's other evidence items are left out of the list, as
in the encoder's loss. Hard negatives are exactly what the reranker meets at query time: the
prefix's near misses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .encoder import TrainConfig, TrainReport, _tokenizer, _torch, base_model, export_onnx, fit
from .pairs import Pair


@dataclass(frozen=True, slots=True)
class RerankConfig(TrainConfig):
    batch_questions: int = 8
    lr: float = 4e-5
    head_lr: float = 1e-3
    """The head starts from nothing and needs a larger step than the pretrained body."""
    max_length: int = 96
    """Question and item together; nearly every conversation turn fits."""


def _scorer(torch: Any, bert: Any) -> Any:
    """MiniLM plus a linear head on the mean-pooled tokens; outputs one score per pair."""
    class CrossEncoder(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.encoder = bert
            self.head = torch.nn.Linear(bert.config.hidden_size, 1)
            torch.nn.init.normal_(self.head.weight, std=0.02)
            torch.nn.init.zeros_(self.head.bias)

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                  token_type_ids=token_type_ids).last_hidden_state
            m = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return self.head(pooled).squeeze(-1)
    return CrossEncoder()


def _scores(torch: Any, model: Any, tok: Any, query: str, texts: Sequence[str]) -> Any:
    encs = tok.encode_batch([(query, t) for t in texts])
    ids = torch.tensor([e.ids for e in encs], dtype=torch.long)
    mask = torch.tensor([e.attention_mask for e in encs], dtype=torch.long)
    types = torch.tensor([e.type_ids for e in encs], dtype=torch.long)
    return model(ids, mask, types)


def _batch_loss(torch: Any, model: Any, tok: Any, batch: Sequence[Pair]) -> Any:
    losses = []
    for p in batch:
        texts = [*p.positives, *p.negatives]
        s = _scores(torch, model, tok, p.query, texts)
        n_pos = len(p.positives)
        negs = s[n_pos:]
        for j in range(n_pos):
            row = torch.cat([s[j:j + 1], negs]).unsqueeze(0)
            losses.append(torch.nn.functional.cross_entropy(row, torch.zeros(1, dtype=torch.long)))
    return torch.stack(losses).mean()


def train_reranker(pairs: Sequence[Pair], config: RerankConfig = RerankConfig(),
                   progress: Callable[[int], None] | None = None) -> tuple[Any, TrainReport]:
    """A cross-encoder fine-tuned from the base MiniLM on ``pairs`` (those with at least one
    negative); returns (model, report)."""
    torch = _torch()
    model = _scorer(torch, base_model(torch, config))
    tok = _tokenizer(config.max_length)
    usable = [p for p in pairs if p.negatives and p.positives]
    groups = [{"params": model.encoder.parameters(), "lr": config.lr},
              {"params": model.head.parameters(), "lr": config.head_lr}]
    report = fit(torch, model, groups, usable, config,
                 lambda batch: _batch_loss(torch, model, tok, batch), progress)
    return model, report


def export_reranker(model: Any, out_dir: Path, card: dict[str, Any]) -> Path:
    """``out_dir/model.onnx`` (int8 weights; output ``score`` per pair) and its card."""
    return export_onnx(model, out_dir, "score", {"batch": 0},
                       {"kind": "reranker", "name_prefix": "minilm-rerank", **card})
