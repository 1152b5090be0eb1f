"""BudgetMem's tiered pipeline as a memory agent of the deep path: modules, tiers, costs."""

from .agent import TieredAgent, chunks_for
from .chunks import Chunk, build_chunks
from .modules import FACT_MODULES, MODULES, TIERS, Module, Strategy, Tier, tiers_up_to
from .run import (
    Chooser,
    ModuleCache,
    ModuleReceipt,
    PipelineResult,
    TieredPipeline,
    TierSettings,
    TierSource,
    check_models,
)

__all__ = ["FACT_MODULES", "MODULES", "TIERS", "Chooser", "Chunk", "Module", "ModuleCache",
           "ModuleReceipt", "PipelineResult", "Strategy", "Tier", "TierSettings", "TierSource", "TieredAgent",
           "TieredPipeline", "build_chunks", "check_models", "chunks_for", "tiers_up_to"]
