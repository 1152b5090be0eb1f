"""Shared plumbing of every ``suffice bench`` command: machine info, tables, the JSON shape.

Every ``--json`` file has the same top level: ``benchmark``, ``dataset``, ``data`` (path),
``command``, ``machine``, ``started_at``, ``settings`` and ``results`` (benchmark-specific, documented
in docs/benchmarks.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from .._files import write_atomic

SCHEMA = 1


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu or platform.processor(), "cores": os.cpu_count(),
            "python": platform.python_version(), "platform": platform.platform()}


def _command(argv: list[str]) -> str:
    """The command line that produced a result: the CLI's, or a benchmark script's."""
    if not argv:
        return ""
    prog = f"python {argv[0]}" if argv[0].endswith(".py") else "suffice"
    return " ".join([prog, *argv[1:]])


def portable(path: str) -> str:
    """A data path as any checkout names it: under the shared data folder, relative to it;
    another absolute path, by its file name only (no path of this machine in a record)."""
    from .._datasets.paths import shared_data_dir
    shared = str(shared_data_dir().resolve())
    if path.startswith(shared):
        return "../shared/data" + path[len(shared):]
    return Path(path).name if Path(path).is_absolute() else path


def envelope(benchmark: str, dataset: str, data: str, settings: Any, results: Any) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "benchmark": benchmark,
        "dataset": dataset,
        "data": portable(data),
        "command": _command(sys.argv),
        "machine": machine(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "settings": (asdict(settings) if is_dataclass(settings) and not isinstance(settings, type)
                     else settings),
        "results": results,
    }


def write_json(path: str | Path, doc: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(doc, indent=2, sort_keys=False) + "\n")


def digest(settings: Mapping[str, Any]) -> str:
    """A short, stable hash of what a recorded answer depends on (reader, budget, prompts,
    configs, the tier source...): a record whose fingerprint differs from the current one was made
    under other settings and is answered again, never reused."""
    from .._types import canonical_json
    return hashlib.sha256(canonical_json(dict(settings)).encode()).hexdigest()[:16]


def current(records: Iterable[dict[str, Any]], fingerprints: Mapping[str, str] | None = None,
            questions: Mapping[str, Mapping[str, Any]] | None = None
            ) -> dict[tuple[str, str], dict[str, Any]]:
    """The record that counts for each (variant, key): the newest one, and with
    ``fingerprints`` (variant -> fingerprint) only one made under the current settings. With
    ``questions`` (key -> the fields that say which question it is, see :func:`same_question`)
    only records of those questions, asked as they are asked now. Older records stay in the
    file (a change can be undone) but are neither reused nor summarised."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for rec in records:
        v = str(rec.get("variant"))
        if fingerprints is not None and (v not in fingerprints or rec.get("fingerprint") != fingerprints[v]):
            continue
        if questions is not None and not same_question(rec, questions):
            continue
        out[(v, rec["key"])] = rec
    return out


def same_question(rec: Mapping[str, Any], questions: Mapping[str, Mapping[str, Any]]) -> bool:
    """Is ``rec`` a record of one of ``questions``, as asked now? Keys are positions in a data
    file (``conv-26#19``), so a record made from another copy of the data, or before the data
    was corrected, has the key of a question it never answered: its question text and gold
    answer (the fields ``questions`` gives) must match too."""
    want = questions.get(str(rec.get("key")))
    return want is not None and all(rec.get(k) == v for k, v in want.items())


def read_results(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a per-question JSONL; a line cut by a kill is skipped (its question is
    redone by the benchmark that wrote it)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def fmt(x: Any) -> str:
        if isinstance(x, float):
            return f"{x:.1f}"
        return str(x)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def percentile(xs: Sequence[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def paired_bootstrap(a: Sequence[float], b: Sequence[float], *, rounds: int = 5000,
                     seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``a - b`` over paired samples and its 95% bootstrap interval (lo, hi).

    Two runs on the same questions differ question by question; resampling the questions
    keeps the pairing, so the interval says whether a gap is larger than the spread of
    per-question differences would produce by chance. Deterministic for a given ``seed``.
    """
    import numpy as np

    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} and {len(b)}")
    if not a:
        return 0.0, 0.0, 0.0
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(rounds, d.size))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(d.mean()), float(lo), float(hi)
