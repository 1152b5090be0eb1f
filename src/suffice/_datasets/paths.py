"""Where the shared benchmark data lives: ``$SUFFICE_DATA`` or ``../shared/data`` of the checkout."""

from __future__ import annotations

import os
from pathlib import Path


def shared_data_dir() -> Path:
    env = os.environ.get("SUFFICE_DATA")
    if env:
        return Path(env)
    for base in (Path.cwd(), Path(__file__).resolve()):
        for parent in (base, *base.parents):
            cand = parent.parent / "shared" / "data"
            if (parent / "pyproject.toml").exists() and cand.is_dir():
                return cand
    return Path.cwd().parent / "shared" / "data"
