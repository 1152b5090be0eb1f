"""Readers for published dataset formats; any file in the same format works."""

from .beam import BeamConversation, BeamQuestion, load_beam
from .locomo import LocomoConversation, LocomoQuestion, load_locomo

__all__ = ["BeamConversation", "BeamQuestion", "LocomoConversation", "LocomoQuestion", "load_beam",
           "load_locomo"]
