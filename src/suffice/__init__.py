"""suffice: long-term memory for LLM agents that decides, per query, how much work it needs."""

from .api import Memory
from .config import Settings
from .engine import Answer, BlockReceipt, Engine, Receipt
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
from .route.sufficiency import LMRouter, RouterDecision, ScoreRouter, SufficiencyRouter
from .types import Block, Context, ContextPart, Evidence, Hit, Item, NewItem, Piece, StoreStats, Unit

__version__ = "0.1.0"

__all__ = [
    "Answer",
    "Block",
    "BlockReceipt",
    "BudgetError",
    "ConfigError",
    "ConflictError",
    "Context",
    "ContextPart",
    "Engine",
    "Evidence",
    "Hit",
    "ImportFormatError",
    "InvalidItemError",
    "Item",
    "LMRouter",
    "Memory",
    "MissingExtraError",
    "ModelFileError",
    "NewItem",
    "OutputParseError",
    "Piece",
    "ProviderError",
    "Receipt",
    "RouterDecision",
    "ScoreRouter",
    "Settings",
    "StoreError",
    "StoreStats",
    "SufficeError",
    "SufficiencyRouter",
    "Unit",
    "UnknownScopeError",
    "__version__",
]
