"""Writing a file so that a kill leaves the old version or the new one, never half of one."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: str | Path, data: str | bytes, *, mode: int = 0o666) -> None:
    """Write ``data`` (text as UTF-8) to a temporary file beside ``path``, flush it to disk,
    then rename it over ``path``: a rename within one folder is atomic, a write is not.

    The temporary name is unique, so two writers never share one, and it is removed when the
    write fails. ``mode`` is the new file's permission bits before the umask (``0o600`` for a
    secret); the file never exists with wider ones.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
