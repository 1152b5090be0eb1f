"""Dense text embeddings from models shipped inside PyPI packages (no download at run time)."""

from .hashing import HashEmbedder
from .minilm import MiniLMEmbedder, load_encoder
from .protocol import Embedder, Reranker
from .rerank import CrossEncoderReranker, load_reranker

__all__ = ["CrossEncoderReranker", "Embedder", "HashEmbedder", "MiniLMEmbedder", "Reranker", "load_encoder",
           "load_reranker"]
