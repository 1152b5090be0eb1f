"""suffice: long-term memory for LLM agents that decides, per query, how much work it needs.

Everything public is importable from here; modules whose names start with ``_`` are internal.
"""

from ._api import AsyncMemory, Memory
from ._config import EngineConfig, RenderConfig, RetrievalConfig, StoreConfig
from ._deep import AgentNote, MemoryAgent
from ._embed import Embedder, MiniLMEmbedder
from ._engine import Answer, BlockReceipt, Receipt
from ._errors import (
    BudgetError,
    ConfigError,
    ConflictError,
    DeadlineError,
    ImportFormatError,
    InvalidInputError,
    InvalidItemError,
    InvalidQueryError,
    MissingExtraError,
    ModelFileError,
    NotFoundError,
    OutputParseError,
    ProviderError,
    StoreConfigError,
    StoreError,
    SufficeError,
    UnknownScopeError,
)
from ._llm import (
    LLM,
    CallRecord,
    Completion,
    Ledger,
    LocalLlama,
    Message,
    OpenAIHTTP,
    Price,
    ScriptedLLM,
    make_llm,
)
from ._route.sufficiency import LMRouter, RouterDecision, ScoreRouter, SufficiencyRouter
from ._store import SQLiteStore, Store
from ._types import (
    AuditEntry,
    Block,
    Context,
    ContextPart,
    Evidence,
    Filter,
    ForgetReport,
    Hit,
    Item,
    NewItem,
    StoreStats,
)

__version__ = "0.2.0"

__all__ = [
    "AgentNote",
    "Answer",
    "AsyncMemory",
    "AuditEntry",
    "Block",
    "BlockReceipt",
    "BudgetError",
    "CallRecord",
    "Completion",
    "ConfigError",
    "ConflictError",
    "Context",
    "ContextPart",
    "DeadlineError",
    "Embedder",
    "EngineConfig",
    "Evidence",
    "Filter",
    "ForgetReport",
    "Hit",
    "ImportFormatError",
    "InvalidInputError",
    "InvalidItemError",
    "InvalidQueryError",
    "Item",
    "LLM",
    "LMRouter",
    "Ledger",
    "LocalLlama",
    "Memory",
    "MemoryAgent",
    "Message",
    "MiniLMEmbedder",
    "MissingExtraError",
    "ModelFileError",
    "NewItem",
    "NotFoundError",
    "OpenAIHTTP",
    "OutputParseError",
    "Price",
    "ProviderError",
    "Receipt",
    "RenderConfig",
    "RetrievalConfig",
    "RouterDecision",
    "SQLiteStore",
    "ScoreRouter",
    "ScriptedLLM",
    "Store",
    "StoreConfig",
    "StoreConfigError",
    "StoreError",
    "StoreStats",
    "SufficeError",
    "SufficiencyRouter",
    "UnknownScopeError",
    "__version__",
    "make_llm",
]
