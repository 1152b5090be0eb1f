"""Which tier each pipeline module runs at, per question: a trained policy or a fixed rule.

The trained policy is BudgetMem's shared network, run with numpy from a plain ``.npz`` file:
the state of a module is [question vector; vector of the module's input] and the module's
learned descriptor, each projected, then a small trunk and a three-way head (Low / Mid /
High). One network serves all five modules; the descriptor tells them apart. Inference is
the argmax; training (``suffice train tiers``) samples.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from .._errors import ConfigError
from .._files import write_atomic
from .._pipeline import MODULES, TIERS, Chooser, Module, Tier, TierSource, tiers_up_to

__all__ = ["TIERS_ENV", "FixedTiers", "HeuristicTiers", "TierPolicy", "TierSource", "default_tiers",
           "load_tier_policy"]

TIERS_ENV = "SUFFICE_TIERS"
"""Names a trained tier policy: a .npz file, or a folder of them, one per cost weight."""


@dataclass(frozen=True, slots=True)
class FixedTiers:
    """The same tier for every module (or per module): the fixed baselines."""

    tiers: Mapping[str, Tier]
    name: str = "fixed"
    reads_vectors: ClassVar[bool] = False
    """Its choice ignores the question and input vectors (so the pipeline need not embed)."""

    def __post_init__(self) -> None:
        missing = [m for m in MODULES if m not in self.tiers]
        unknown = sorted(set(self.tiers) - set(MODULES))
        bad = {m: t for m, t in self.tiers.items() if t not in TIERS}
        if missing or unknown or bad:
            said = ([f"no tier for {', '.join(missing)}"] * bool(missing)
                    + [f"unknown module(s) {', '.join(unknown)}"] * bool(unknown)
                    + [f"{m}: {t!r} is not one of {', '.join(TIERS)}" for m, t in bad.items()])
            raise ConfigError(f"fixed tiers need one of {', '.join(TIERS)} for each of "
                              f"{', '.join(MODULES)}: " + "; ".join(said))

    @classmethod
    def all(cls, tier: Tier) -> FixedTiers:
        if tier not in TIERS:
            raise ConfigError(f"tier must be one of {', '.join(TIERS)}, got {tier!r}")
        return cls({m: tier for m in MODULES}, f"all-{tier}")

    def chooser(self, question: str) -> Chooser:
        return lambda module, q, x: TIERS.index(self.tiers[module])


_TIME_CUE = re.compile(r"\b(when|what (?:date|day|year|month|time)|how long|ago|before|after|"
                       r"since|first|last|year|month|week)\b", re.I)
_RELATION_CUE = re.compile(r"\b(who|whom|whose|relationship|married|friend|sister|brother|"
                           r"mother|father|partner|kids?|children|with)\b", re.I)


class HeuristicTiers:
    """The tiers an untrained install uses, chosen from the question's words; never an LLM
    module, so the default costs no model call beyond the answer.

    - filter: Mid (embedding similarity) when the memory has an embedder, else Low;
    - entity: Mid (spaCy relations) when the question asks who or about a relationship;
    - temporal: Mid (spaCy events with resolved dates) when it asks when, or how long;
    - topic: Low (topic markers);
    - summary: Mid (facts ranked by similarity under headings).
    """

    name = "heuristic"
    reads_vectors = False

    def __init__(self, *, embedder: bool = True) -> None:
        self.embedder = embedder

    @staticmethod
    def rules() -> list[str]:
        """The patterns the choice reads, so a record can say which rules made it."""
        return [_RELATION_CUE.pattern, _TIME_CUE.pattern]

    def tiers(self, question: str) -> dict[str, Tier]:
        return {"filter": "mid" if self.embedder else "low",
                "entity": "mid" if _RELATION_CUE.search(question) else "low",
                "temporal": "mid" if _TIME_CUE.search(question) else "low",
                "topic": "low",
                "summary": "mid"}

    def chooser(self, question: str) -> Chooser:
        t = self.tiers(question)
        return lambda module, q, x: TIERS.index(t[module])


_KEYS = ("descriptors", "wu", "bu", "wv", "bv", "w1", "b1", "w2", "b2", "w3", "b3", "w4", "b4")


class TierPolicy:
    """A trained tier policy (numpy only). ``lam`` is the cost weight it was trained at."""

    def __init__(self, weights: Mapping[str, np.ndarray], *, lam: float, encoder: str,
                 name: str = "trained", cap: Tier = "high") -> None:
        missing = [k for k in _KEYS if k not in weights]
        if missing:
            raise ConfigError(f"tier policy weights lack {', '.join(missing)}")
        try:
            self.w = {k: np.asarray(weights[k], dtype=np.float32) for k in _KEYS}
        except (TypeError, ValueError) as exc:  # text arrays, objects
            raise ConfigError(f"tier policy weights are not numbers: {exc}") from None
        flat = [k for k in ("descriptors", "wu", "wv", "w1", "w2", "w3", "w4") if self.w[k].ndim != 2]
        flat += [k for k in ("bu", "bv", "b1", "b2", "b3", "b4") if self.w[k].ndim != 1]
        if flat:
            raise ConfigError(f"tier policy weights {', '.join(flat)} have the wrong number of "
                              "dimensions (matrices and bias vectors)")
        broken = [k for k in _KEYS if not np.isfinite(self.w[k]).all()]
        if broken:  # NaN turns every choice into the first tier, silently
            raise ConfigError(f"tier policy weights {', '.join(broken)} hold NaN or infinite values")
        if self.w["descriptors"].shape[0] != len(MODULES):
            raise ConfigError(f"tier policy has {self.w['descriptors'].shape[0]} module "
                              f"descriptors, expected {len(MODULES)}")
        if cap not in TIERS:
            raise ConfigError(f"tier policy cap must be one of {', '.join(TIERS)}, got {cap!r}")
        self.lam = lam
        self.encoder = encoder
        self.name = name
        self.cap: Tier = cap
        """The highest tier it was trained to choose: the tiers above were never sampled in
        training, so their outputs mean nothing and are never chosen."""
        h = hashlib.sha256()
        for k in _KEYS:
            h.update(k.encode() + repr(self.w[k].shape).encode() + self.w[k].tobytes())
        if cap != "high":
            h.update(f"cap={cap}".encode())
        self.digest = h.hexdigest()[:16]
        """The weights' sha256 (short): a retrained policy has another, whatever its name."""
        # One pass per module on zero vectors: weights whose shapes do not chain (a file edited
        # by hand, or of another version) fail here, at load, not at the first tiered query.
        try:
            dim = self.dim
            outs = [self.probs(m, np.zeros(dim, np.float32), np.zeros(dim, np.float32)) for m in MODULES]
        except (ValueError, IndexError) as exc:
            raise ConfigError(f"tier policy weights do not fit together: {exc}") from None
        out = outs[0]
        if dim < 1 or any(o.shape != (len(TIERS),) or not np.isfinite(o).all() for o in outs):
            raise ConfigError(f"tier policy weights give {out.shape[0] if out.ndim else 0} outputs "
                              f"for {dim}-dim vectors; a policy gives one per tier ({len(TIERS)})")

    def probs(self, module: Module, q: np.ndarray, x: np.ndarray) -> np.ndarray:
        w = self.w
        d = w["descriptors"][MODULES.index(module)]
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused below
            u = w["wu"] @ np.concatenate([q, x]).astype(np.float32) + w["bu"]
            v = w["wv"] @ d + w["bv"]
            h = np.maximum(w["w1"] @ np.concatenate([u, v]) + w["b1"], 0)
            h = np.maximum(w["w2"] @ h + w["b2"], 0)
            h = np.maximum(w["w3"] @ h + w["b3"], 0)
            z = w["w4"] @ h + w["b4"]
            z[len(tiers_up_to(self.cap)):] = -np.inf
            e: np.ndarray = np.exp(z - z.max())
            p: np.ndarray = e / float(e.sum())
        if not np.isfinite(p).all():  # overflow on an input far from training: argmax would say Low
            raise ConfigError(f"the tier policy {self.name} gave no usable choice for {module} "
                              "(its outputs overflowed)")
        return p

    @property
    def dim(self) -> int:
        """The length of the vectors it reads (the question's and the input's are the same)."""
        return int(self.w["wu"].shape[1]) // 2

    def chooser(self, question: str) -> Chooser:
        def choose(module: Module, q: np.ndarray, x: np.ndarray) -> int:
            if q.shape[0] != self.dim or x.shape[0] != self.dim:
                raise ConfigError(f"the tier policy {self.name} reads {self.dim}-dim vectors; this "
                                  f"memory's are {q.shape[0]}-dim (another encoder)")
            return int(np.argmax(self.probs(module, q, x)))
        return choose

    def check_fits(self, encoder: str, dim: int | None = None) -> None:
        """Refuse a memory this policy cannot read: one without an embedder (the pipeline would
        feed it zero vectors) or one whose encoder is not the one it was trained on."""
        if not encoder:
            raise ConfigError(f"the tier policy {self.name} reads question and input embeddings, and "
                              "this memory has no embedder; use the heuristic default or FixedTiers")
        if self.encoder and self.encoder != encoder:
            raise ConfigError(f"the tier policy {self.name} was trained on encoder {self.encoder!r}; "
                              f"this memory uses {encoder!r}")
        if dim is not None and dim != self.dim:
            raise ConfigError(f"the tier policy {self.name} reads {self.dim}-dim vectors; this "
                              f"memory's encoder gives {dim}")

    @classmethod
    def load(cls, path: str | Path) -> TierPolicy:
        p = Path(path)
        card = p.with_suffix(".json")
        try:
            meta = json.loads(card.read_text()) if card.exists() else {}
            with np.load(p, allow_pickle=False) as z:
                weights = {k: z[k] for k in z.files}
        except (OSError, ValueError, TypeError, AttributeError, EOFError,
                zipfile.BadZipFile) as exc:  # not a .npz (or cut short), or not JSON
            # numpy's own text for a file that is no .npz advises loading it unsafely: not shown.
            why = ("not a .npz weights file" if isinstance(exc, ValueError) and "pickle" in str(exc)
                   else f"{type(exc).__name__}: {exc}")
            raise ConfigError(f"cannot read tier policy {p} (a .npz file of `suffice train tiers` "
                              f"and its .json card): {why}") from None
        if not isinstance(meta, dict):
            raise ConfigError(f"tier policy card {card} is not a JSON object")
        try:
            lam = float(meta.get("lam", 0.0))
        except (TypeError, ValueError):
            raise ConfigError(f"tier policy card {card}: lam must be a number, got {meta['lam']!r}") from None
        if not math.isfinite(lam):  # NaN would win every "nearest λ" choice in a folder
            raise ConfigError(f"tier policy card {card}: lam must be a finite number, got {lam}")
        # A policy from a stopped training run says so wherever its name is shown (receipts, bench).
        mark = ", provisional" if meta.get("provisional") else ""
        mark += "" if card.exists() else ", no card"
        cap = str(meta.get("tier_cap", "high"))
        if cap not in TIERS:
            raise ConfigError(f"tier policy {p}: its card's tier_cap must be one of {', '.join(TIERS)}, "
                              f"got {cap!r}")
        capped = "" if cap == "high" else f", up to {cap}"
        return cls(weights, lam=lam, encoder=str(meta.get("encoder", "")),
                   name=f"trained(λ={meta.get('lam', 0.0)}{capped}{mark})", cap=cap)

    def save(self, path: str | Path, **meta: object) -> None:
        """Write the weights (``path``) and the card (``.json`` beside it). Each file is written
        whole to a temporary name and then renamed over the old one, so a run stopped while
        saving leaves the previous checkpoint, never half a file."""
        p = Path(path)
        weights = io.BytesIO()
        np.savez(weights, **self.w)  # type: ignore[arg-type]
        write_atomic(p, weights.getvalue())
        write_atomic(p.with_suffix(".json"), json.dumps(
            {"lam": self.lam, "encoder": self.encoder, "tier_cap": self.cap, **meta}, indent=2,
            default=str))


def load_tier_policy(path: str | Path, lam: float | None = None) -> TierPolicy:
    """A policy file, or from a folder of them (one per λ) the one trained nearest ``lam``;
    without ``lam``, the λ = 0 one: quality first, at whatever its training cap allows (a
    policy trained without a cap may call the model for every module)."""
    p = Path(path)
    if p.is_file():
        return TierPolicy.load(p)
    files = sorted(p.glob("tiers-*.npz")) if p.is_dir() else []
    if not files:
        raise ConfigError(f"no tier policy at {p} (expected a .npz file or a folder of tiers-*.npz)")
    policies = [TierPolicy.load(f) for f in files]
    want = 0.0 if lam is None else lam
    return min(policies, key=lambda pol: (abs(pol.lam - want), pol.lam))


def default_tiers(lam: float | None, encoder: str, dim: int | None = None) -> TierSource:
    """The trained policy ``$SUFFICE_TIERS`` names (the one nearest ``lam``) when it was
    trained on ``encoder``; else :class:`HeuristicTiers`. A named policy that cannot be read,
    or that cannot read this memory (no embedder, another encoder), is an error, not a silent
    fallback; so is a ``lam`` with no policy installed to pick from."""
    path = os.environ.get(TIERS_ENV, "").strip()
    if not path:
        if lam is not None:
            raise ConfigError(f"lam={lam:g} picks a trained tier policy and none is installed (set "
                              f"${TIERS_ENV} to a file or folder from `suffice train tiers`); "
                              "leave lam out for the heuristic default")
        return HeuristicTiers(embedder=bool(encoder))
    policy = load_tier_policy(path, lam)
    policy.check_fits(encoder, dim)
    return policy
