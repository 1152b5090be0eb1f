"""One place that turns a location (a file path or a database URL) into a store."""

from __future__ import annotations

import os

from .._errors import MissingExtraError
from .base import Store
from .sqlite import SQLiteStore


def is_url(location: object) -> bool:
    """True for a PostgreSQL URL (``postgresql://`` or ``postgres://``); anything else is a path."""
    return isinstance(location, str) and location.lower().startswith(("postgresql://", "postgres://"))


def open_store(location: str | os.PathLike[str] | Store, *, create: bool = True) -> Store:
    """A PostgreSQL store for a ``postgresql://`` URL, else the SQLite store at that path; a
    store already opened (to set its own options) is used as it is.

    The PostgreSQL backend is imported only here, so ``import suffice`` never needs psycopg;
    without it a URL raises :class:`MissingExtraError` naming the extra to install.
    """
    if isinstance(location, Store):
        return location
    if not isinstance(location, (str, os.PathLike)):
        # str() of any object is a valid file name: refuse it rather than create that file.
        raise TypeError(f"a store location is a path, a postgresql:// URL or a store, "
                        f"not {type(location).__name__}")
    if is_url(location):
        try:
            from .postgres import PostgresStore
        except ImportError as exc:
            missing = (exc.name or "psycopg").split(".")[0].replace("_", "-")
            package = missing if missing.startswith("psycopg") else "psycopg"
            raise MissingExtraError("postgres", package) from None
        return PostgresStore(str(location), create=create)
    return SQLiteStore(location, create=create)
