"""suffice: long-term memory for LLM agents that decides, per query, how much work it needs."""

from .api import Memory
from .config import Settings
from .errors import (
    BudgetError,
    ConfigError,
    ConflictError,
    ImportFormatError,
    InvalidItemError,
    MissingExtraError,
    ModelFileError,
    OutputParseError,
    ProviderError,
    StoreError,
    SufficeError,
    UnknownScopeError,
)
from .types import Block, Evidence, Hit, Item, NewItem, Piece, StoreStats, Unit

__version__ = "0.1.0"

__all__ = [
    "Block",
    "BudgetError",
    "ConfigError",
    "ConflictError",
    "Evidence",
    "Hit",
    "ImportFormatError",
    "InvalidItemError",
    "Item",
    "Memory",
    "MissingExtraError",
    "ModelFileError",
    "NewItem",
    "OutputParseError",
    "Piece",
    "ProviderError",
    "Settings",
    "StoreError",
    "StoreStats",
    "SufficeError",
    "Unit",
    "UnknownScopeError",
    "__version__",
]
