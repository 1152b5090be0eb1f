"""Readers for published dataset formats; any file in the same format works."""

from .locomo import LocomoConversation, LocomoQuestion, load_locomo

__all__ = ["LocomoConversation", "LocomoQuestion", "load_locomo"]
