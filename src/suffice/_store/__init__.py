"""Storage: one append-only log of items per scope, plus the indexes derived from it."""

from .base import ItemRow, Store, validate_filter, validate_item, validate_scope
from .sqlite import SCHEMA_VERSION, SQLiteStore, observed_text

__all__ = ["SCHEMA_VERSION", "ItemRow", "SQLiteStore", "Store", "observed_text", "validate_filter",
           "validate_item", "validate_scope"]
