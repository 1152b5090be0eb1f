"""Storage: one append-only log of items per scope, plus the indexes derived from it."""

from .base import ItemRow, Store, validate_filter, validate_item, validate_scope
from .open import is_url, open_store
from .sqlite import SCHEMA_VERSION, SQLiteStore, observed_text

__all__ = ["SCHEMA_VERSION", "ItemRow", "SQLiteStore", "Store", "is_url", "observed_text", "open_store",
           "validate_filter", "validate_item", "validate_scope"]
