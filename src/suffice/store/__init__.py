"""Storage: one append-only log of items per scope, plus the indexes derived from it."""

from .sqlite import SCHEMA_VERSION, SQLiteStore

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]
