"""Writing a file (or a model's folder) so that a kill leaves the old version or the new one,
never half of one."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from ._errors import ModelFileError

__all__ = ["atomic_file", "staged_folder", "write_atomic"]


def _temp_name(path: Path, tag: str = "") -> Path:
    """A fresh temporary name beside ``path``: hidden, unique to this writer (so two writers never
    share one), ending in ``.tmp``. ``tag`` goes into the name for a cleaner that must tell its
    own writers' files from stale ones."""
    middle = f".{tag}" if tag else ""
    return path.with_name(f".{path.name}{middle}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


@contextmanager
def atomic_file(path: str | Path, *, mode: int = 0o666, tag: str = "") -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new content into; when the block ends without an
    error, the file is flushed to disk and renamed over ``path`` (a rename within one folder is
    atomic, a write is not). When the block raises (a failed check of what was written
    included), the temporary file is removed and ``path`` is left as it was.

    The handle's ``name`` is the temporary path, for a check that reads the file back before
    it is published. ``mode`` is the new file's permission bits before the umask (``0o600``
    for a secret); the file never exists with wider ones.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_name(p, tag)
    fh = open(tmp, "xb", opener=lambda name, flags: os.open(name, flags, mode))  # noqa: SIM115
    try:
        with fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
        _sync_folder(p.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable: without it, a crash just after may bring the old
    file back (a revoked key among them). Best effort: not every system opens folders."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: str | bytes, *, mode: int = 0o666) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` through :func:`atomic_file`."""
    with atomic_file(path, mode=mode) as fh:
        fh.write(data.encode("utf-8") if isinstance(data, str) else data)


@contextmanager
def staged_folder(path: str | Path) -> Iterator[Path]:
    """A fresh folder beside ``path`` to write a whole model into (weights and card); when the
    block ends without an error it takes ``path``'s place, an old folder there being moved
    aside first and removed after. When the block raises, the new folder is removed and
    ``path`` is left as it was: an export that fails halfway never leaves weights that do not
    match their card where a memory loads them.

    Two renames, not one (a folder cannot be renamed over a full one): a kill between them
    leaves ``path`` missing, with the old folder beside it under a hidden ``.old`` name.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = _temp_name(final, "new")
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if final.is_symlink() or (final.exists() and not final.is_dir()):
        raise ModelFileError(f"{final} is not a folder; what was written is in {staging}")
    old = _temp_name(final, "old") if final.exists() else None
    try:
        if old is not None:
            os.replace(final, old)
        try:
            os.replace(staging, final)
        except OSError:
            if old is not None:
                os.replace(old, final)  # the old folder back where it was
            raise
    except OSError as exc:  # a mount point, a folder another program holds open, ...
        moved = f"; the old folder is at {old}" if old is not None and old.exists() else ""
        raise ModelFileError(f"could not put the new folder at {final} ({exc}); what was written "
                             f"is in {staging}{moved}") from exc
    _sync_folder(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
