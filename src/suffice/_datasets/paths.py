"""Where the shared benchmark data lives (``$SUFFICE_DATA`` or ``../shared/data`` of the
checkout), and reading one of its JSON files with an error that names it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .._errors import ImportFormatError


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


def read_json(path: Path, what: str) -> Any:
    """The parsed file; ImportFormatError when it is missing or not JSON (``what`` names the
    dataset in the message)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ImportFormatError(f"{what} file not found: {path}") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # nested past what Python reads
        raise ImportFormatError(f"{path}: not valid JSON ({type(exc).__name__}: {exc})") from None
    except OSError as exc:  # a folder, no permission...
        raise ImportFormatError(f"cannot read {what} file {path}: {exc.strerror or exc}") from None
