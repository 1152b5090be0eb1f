"""The one exception tree of suffice.

Every error a caller can act on derives from :class:`SufficeError`; messages say what was
wrong and, where there is one, what to do about it.
"""

from __future__ import annotations


class SufficeError(Exception):
    """Base of every error raised on purpose by suffice."""


class ConfigError(SufficeError):
    """A setting is missing, out of range, or names something that does not exist."""


class MissingExtraError(ConfigError):
    """An optional dependency is not installed; the message names the install command."""

    def __init__(self, extra: str, package: str) -> None:
        super().__init__(
            f"{package} is not installed; install it with: pip install 'suffice[{extra}]'"
        )
        self.extra = extra
        self.package = package


class StoreError(SufficeError):
    """The store refused an operation or could not complete it; nothing was written."""


class InvalidItemError(StoreError):
    """An item to add is malformed (empty text, bad field); the batch was not written."""


class ConflictError(StoreError):
    """An item id already exists with different content; items are immutable."""


class UnknownScopeError(StoreError):
    """A scope was named that holds no items."""


class ImportFormatError(StoreError):
    """An import file does not have the expected format; names the offending record."""


class ModelFileError(ConfigError):
    """A model file is missing or its checksum does not match the pinned one."""


class ProviderError(SufficeError):
    """A model provider call failed (connection, timeout, HTTP status, bad body)."""

    def __init__(self, message: str, *, endpoint: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.status = status


class OutputParseError(ProviderError):
    """A model answered, but not in the shape asked for, even after one re-ask."""


class BudgetError(SufficeError):
    """A budget is invalid (negative, not a number)."""


__all__ = [
    "BudgetError",
    "ConfigError",
    "ConflictError",
    "ImportFormatError",
    "InvalidItemError",
    "MissingExtraError",
    "ModelFileError",
    "OutputParseError",
    "ProviderError",
    "StoreError",
    "SufficeError",
    "UnknownScopeError",
]
