"""The folder a training writes: ``model.onnx`` beside ``card.json``, which names the model,
says what kind it is and holds the weights' sha256 (checked before the weights are used)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._errors import ModelFileError

KINDS = {"encoder": "dense encoder", "reranker": "reranker", "router": "sufficiency router"}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def open_model(folder: str | Path, kind: str) -> tuple[Path, str]:
    """(model path, name) of a trained ``kind`` ("encoder", "reranker" or "router"); a card
    without a kind is an encoder's (older cards had none)."""
    what = KINDS[kind]
    d = Path(folder)
    card_path, model = d / "card.json", d / "model.onnx"
    if not card_path.is_file() or not model.is_file():
        raise ModelFileError(f"{d} is not a trained {kind} (needs model.onnx and card.json)")
    try:
        card = json.loads(card_path.read_text(encoding="utf-8"))
        name, digest, found = str(card["name"]), str(card["sha256"]), card.get("kind") or "encoder"
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ModelFileError(f"{card_path}: not a valid {kind} card") from None
    if found != kind:
        raise ModelFileError(f"{d} holds a {KINDS.get(found, found)}, not a {what}")
    if sha256(model) != digest:
        raise ModelFileError(f"{model} does not match the digest in its card")
    return model, name


def onnx_session(path: str | Path, options: Any, needs: Iterable[str], what: str) -> Any:
    """An onnxruntime session over ``path`` that takes the inputs ``needs`` names; a file it
    cannot read, or a model of another kind (its checksum right, its graph not), is a
    ModelFileError naming the file, before anything is done with it."""
    import onnxruntime as ort

    try:
        sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own classes for a bad file
        raise ModelFileError(f"{path}: not a model onnxruntime can read ({type(exc).__name__}: "
                             f"{str(exc)[:160]})") from None
    have = {i.name for i in sess.get_inputs()}
    missing = sorted(set(needs) - have)
    if missing:
        raise ModelFileError(f"{path} is not a {what}: it takes {', '.join(sorted(have)) or 'no inputs'}, "
                             f"not {', '.join(missing)}")
    return sess
