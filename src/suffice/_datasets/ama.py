"""AMA-Bench open-ended QA episodes (``<task>-<episode>.json.gz``, one agent run each).

Each turn becomes two items in step order: the agent's action (kind ``action``, speaker
``agent``) and the environment's reply (kind ``observation``, speaker ``environment``), both
verbatim (but for NUL characters, which a few tool outputs hold and the store refuses: they
become U+2400, the visible symbol for NUL), with the turn's index in ``meta['step']``; an empty
side is skipped. An action that is the agent's ``think`` tool (``think: {"thought": ...}``, in
the SWE-bench episodes) is a ``thought`` item instead: it reasons and changes nothing, as a
mini-SWE-agent step's THOUGHT text does, so every agent dataset here files reasoning under one
kind (:mod:`suffice._datasets.trajectories`). Long observations
are stored whole (the store pieces them for search). The questions name the steps they are about
("at step 37", "from step 72 to 74"); those cited steps, read from the question and its answer,
are the evidence, as the dataset's README suggests (approximate: a cited step is sometimes the
moment of the question rather than its evidence).
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import _steps
from .._errors import ImportFormatError
from .._types import NewItem
from .paths import shared_data_dir
from .text import clean

_THINK = re.compile(r"think:\s*\{")
"""The think tool's call, as AMA-Bench writes actions (``name: {arguments}``)."""
MAX_RANGE = _steps.MAX_RANGE
"""A cited range wider than this is read as its two ends only (such spans are context, not evidence)."""


@dataclass(frozen=True, slots=True)
class AmaQuestion:
    question: str
    answer: str
    type: str
    """A (recall), B (causal), C (state), D (abstraction), as the dataset labels them."""
    steps: tuple[int, ...]
    """Steps (turn indices) the question or its answer cites, within the episode."""


@dataclass(frozen=True, slots=True)
class AmaEpisode:
    name: str
    """``<task type>-<episode id>``, the file's name."""
    domain: str
    task: str
    items: tuple[NewItem, ...]
    questions: tuple[AmaQuestion, ...]
    success: bool

    @property
    def scope(self) -> str:
        return f"ama-{self.name}"


def default_path() -> Path:
    return shared_data_dir() / "agent" / "ama_bench"


def cited_steps(text: str, n_turns: int) -> list[int]:
    """Step numbers named in ``text`` ("step 12", "turn 40", "steps 34, 35 and 36", "from step 72 to 74",
    "steps 3-5"), in order of first mention, kept when the episode has such a step. The parsing is
    the query path's (:func:`suffice._steps.cited_steps`); "between step 73 and 76" cites the two
    steps named, as the dataset's answers do, and there is no cap."""
    return _steps.cited_steps(text, n_turns, between=False, limit=None)


def load_episode(path: str | Path) -> AmaEpisode:
    p = Path(path)
    try:
        with gzip.open(p, "rt", encoding="utf-8") if p.suffix == ".gz" else open(p, encoding="utf-8") as fh:
            raw: Any = json.load(fh)
    except FileNotFoundError:
        raise ImportFormatError(f"AMA-Bench file not found: {p}") from None
    except (OSError, EOFError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ImportFormatError(f"{p}: not a gzip JSON episode ({type(exc).__name__}: {exc})") from None
    return episode_from(p, raw)


def episode_from(p: Path, raw: Any) -> AmaEpisode:
    """The episode in ``raw``, the parsed content of the file ``p``."""
    if not isinstance(raw, dict) or not isinstance(raw.get("trajectory"), list) \
            or not isinstance(raw.get("qa_pairs"), list):
        raise ImportFormatError(f"{p}: expected an object with 'trajectory' and 'qa_pairs' lists")
    name = p.name.removesuffix(".gz").removesuffix(".json")
    items: list[NewItem] = []
    steps: set[int] = set()
    for ti, turn in enumerate(raw["trajectory"]):
        if not isinstance(turn, dict) or "turn_idx" not in turn:
            raise ImportFormatError(f"{p.name} trajectory {ti}: needs 'turn_idx'")
        step = turn["turn_idx"]
        if isinstance(step, str) and re.fullmatch(r"[0-9]+", step.strip()):  # "²" is a digit too
            step = int(step)
        if not isinstance(step, int) or isinstance(step, bool) or step in steps:
            raise ImportFormatError(f"{p.name} trajectory {ti}: turn_idx must be a whole number not seen "
                                    f"before, got {turn['turn_idx']!r}")
        steps.add(step)
        for field, speaker in (("action", "agent"), ("observation", "environment")):
            text = turn.get(field)
            text = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False) if text else ""
            text = clean(text)  # a few tool outputs hold NUL bytes; the store refuses them
            kind = "thought" if field == "action" and _THINK.match(text) else field
            if text.strip():
                items.append(NewItem(text=text, speaker=speaker, role=speaker, kind=kind,
                                     meta={"step": step, "dataset": "ama"},
                                     id=f"ama-{name}:{step}:{kind}"))
    items.sort(key=lambda it: it.meta["step"])  # stored in step order even if the file is not (stable)
    n_turns = max(steps, default=-1) + 1
    questions = []
    for qi, qa in enumerate(raw["qa_pairs"]):
        if not isinstance(qa, dict) or "question" not in qa:
            raise ImportFormatError(f"{p.name} qa {qi}: needs 'question'")
        q, a = str(qa["question"]), str(qa.get("answer", ""))
        cited = [s for s in cited_steps(f"{q}\n{a}", n_turns) if s in steps]
        questions.append(AmaQuestion(q, a, str(qa.get("type", "")), tuple(cited)))
    return AmaEpisode(name, str(raw.get("domain", "")), str(raw.get("task", "")), tuple(items),
                      tuple(questions), raw.get("state") == "success")


def load_ama(path: str | Path | None = None) -> list[AmaEpisode]:
    """Every episode of a folder (the shared copy by default), sorted by name, or one file."""
    p = Path(path) if path is not None else default_path()
    if p.is_file():
        return [load_episode(p)]
    if not p.is_dir():
        raise ImportFormatError(f"AMA-Bench folder not found: {p}")
    files = sorted(f for f in p.iterdir()
                   if f.name.endswith((".json.gz", ".json")) and f.name != "manifest.json")
    if not files:
        raise ImportFormatError(f"{p}: no episode files")
    return [load_episode(f) for f in files]
