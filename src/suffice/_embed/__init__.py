"""Dense text embeddings from models shipped inside PyPI packages (no download at run time)."""

from .minilm import MiniLMEmbedder
from .protocol import Embedder

__all__ = ["Embedder", "MiniLMEmbedder"]
