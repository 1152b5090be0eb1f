"""Text as a store can hold it: the one clean-up every dataset reader applies."""

from __future__ import annotations

from .._text import is_utf8


def clean(text: str) -> str:
    """``text`` as a store can hold it, every other character kept."""
    if "\x00" in text:
        text = text.replace("\x00", "\u2400")
    if not is_utf8(text):
        text = "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)
    return text
