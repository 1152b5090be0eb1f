"""AMA-Bench open-ended QA episodes (``<task>-<episode>.json.gz``, one agent run each).

Each turn becomes two items in step order: the agent's action (kind ``action``, speaker
``agent``) and the environment's reply (kind ``observation``, speaker ``environment``), both
verbatim (but for NUL characters, which a few tool outputs hold and the store refuses: they
become U+2400, the visible symbol for NUL), with the turn's index in ``meta['step']``; an empty
side is skipped. Long observations
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

from .._errors import ImportFormatError
from .._types import NewItem
from .paths import shared_data_dir

_STEPS = re.compile(r"\b(?:steps?|turns?)\s*#?\s*(\d+)((?:\s*(?:,|and|to|through|-|–|—|&)\s*"
                    r"(?:(?:steps?|turns?)\s*)?\d+)*)", re.IGNORECASE)
_PART = re.compile(r"(,|and|to|through|-|–|—|&)\s*(?:(?:steps?|turns?)\s*)?(\d+)", re.IGNORECASE)
MAX_RANGE = 50
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
    "steps 3-5"), in order of first mention, kept when the episode has such a step."""
    out: list[int] = []
    for m in _STEPS.finditer(text):
        nums = [int(m.group(1))]
        tail = m.group(2) or ""
        for part in _PART.finditer(tail):
            sep, n = part.group(1).lower(), int(part.group(2))
            if sep in ("to", "through", "-", "–", "—") and 0 < n - nums[-1] <= MAX_RANGE:
                nums.extend(range(nums[-1] + 1, n + 1))
            else:
                nums.append(n)
        for n in nums:
            if 0 <= n < n_turns and n not in out:
                out.append(n)
    return out


def load_episode(path: str | Path) -> AmaEpisode:
    p = Path(path)
    try:
        with gzip.open(p, "rt", encoding="utf-8") if p.suffix == ".gz" else open(p, encoding="utf-8") as fh:
            raw: Any = json.load(fh)
    except FileNotFoundError:
        raise ImportFormatError(f"AMA-Bench file not found: {p}") from None
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ImportFormatError(f"{p}: not a gzip JSON episode ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("trajectory"), list) \
            or not isinstance(raw.get("qa_pairs"), list):
        raise ImportFormatError(f"{p}: expected an object with 'trajectory' and 'qa_pairs' lists")
    name = p.name.removesuffix(".gz").removesuffix(".json")
    items: list[NewItem] = []
    steps: set[int] = set()
    for ti, turn in enumerate(raw["trajectory"]):
        if not isinstance(turn, dict) or "turn_idx" not in turn:
            raise ImportFormatError(f"{p.name} trajectory {ti}: needs 'turn_idx'")
        step = int(turn["turn_idx"])
        steps.add(step)
        for kind, speaker in (("action", "agent"), ("observation", "environment")):
            text = turn.get(kind)
            text = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False) if text else ""
            text = text.replace("\x00", "\u2400")  # a few tool outputs hold NUL bytes; the store refuses them
            if text.strip():
                items.append(NewItem(text=text, speaker=speaker, role=speaker, kind=kind,
                                     meta={"step": step, "dataset": "ama"},
                                     id=f"ama-{name}:{step}:{kind}"))
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
