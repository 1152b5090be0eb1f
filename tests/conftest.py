"""Shared fixtures: a real embedded stack (SQLite + MiniLM) on small, hand-written data."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from suffice import Memory, NewItem
from suffice._datasets.paths import shared_data_dir

ROOT = Path(__file__).resolve().parents[1]
HISTORY = ROOT / "examples" / "history.jsonl"


@pytest.fixture(scope="session")
def embedder():  # type: ignore[no-untyped-def]
    from suffice._embed import MiniLMEmbedder
    return MiniLMEmbedder()


def history_items() -> list[NewItem]:
    rows = [json.loads(line) for line in HISTORY.read_text().splitlines() if line.strip()]
    return [NewItem(**row, id=f"h{i}") for i, row in enumerate(rows)]


@pytest.fixture
def memory(tmp_path: Path, embedder) -> Iterator[Memory]:  # type: ignore[no-untyped-def]
    mem = Memory(tmp_path / "mem.db", embedder=embedder)
    mem.add(history_items(), scope="dana")
    yield mem
    mem.close()


@pytest.fixture(scope="session")
def locomo_path() -> Path:
    path = shared_data_dir() / "locomo" / "locomo_shared.json"
    if not path.exists():
        pytest.skip(f"shared LoCoMo data not found at {path} (set SUFFICE_DATA)")
    return path
