"""Dense text embeddings from models shipped inside PyPI packages (no download at run time)."""

from .hashing import HashEmbedder
from .minilm import MiniLMEmbedder, load_encoder
from .protocol import Embedder

__all__ = ["Embedder", "HashEmbedder", "MiniLMEmbedder", "load_encoder"]
