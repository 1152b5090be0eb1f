"""The one exception tree of suffice.

Every error a caller can act on derives from :class:`SufficeError`; messages say what was
wrong and, where there is one, what to do about it. Bad arguments are also ``ValueError``s, so
code that already catches those keeps working.

```
SufficeError
├── ConfigError                 a setting is wrong, or a model / extra is missing
│   ├── MissingExtraError
│   ├── ModelFileError
│   └── StoreConfigError        the store was built with other view settings
├── InvalidInputError           a bad argument; nothing was written (also a ValueError)
│   ├── InvalidItemError
│   ├── InvalidQueryError
│   ├── BudgetError
│   └── ImportFormatError
├── AccessError                 a caller may not do this
│   ├── AuthenticationError     no API key, or one that is not known
│   └── AccessDeniedError       the key or view may not touch that scope
├── StoreError                  the store refused or could not finish an operation
│   ├── ConflictError
│   ├── UnknownScopeError
│   └── NotFoundError
└── ProviderError               a model call failed
    ├── OutputParseError
    └── DeadlineError           the query's deadline passed before or during the call
```
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


class ModelFileError(ConfigError):
    """A model file is missing or its checksum does not match the pinned one."""


class StoreConfigError(ConfigError):
    """The store's saved view settings differ from the ones asked for; the message names the
    fields and the command that rebuilds the views (``suffice rebuild``)."""


class InvalidInputError(SufficeError, ValueError):
    """An argument is malformed or out of range; nothing was read or written because of it."""


class InvalidItemError(InvalidInputError):
    """An item to add is malformed (empty text, bad field); the batch was not written."""


class InvalidQueryError(InvalidInputError):
    """A query, filter or paging argument is malformed (empty query, bad time range, k < 0)."""


class BudgetError(InvalidInputError):
    """A budget is invalid (negative, not a whole number)."""


class ImportFormatError(InvalidInputError):
    """An import file does not have the expected format; names the offending record."""


class AccessError(SufficeError):
    """A caller was refused before anything was read or written."""


class AuthenticationError(AccessError):
    """No API key was given, or the one given matches no stored key."""


class AccessDeniedError(AccessError):
    """The key, or the restricted memory, may not touch the scope named; nothing was read.

    The message names the scope asked for, never the scopes that exist (they may belong to
    other tenants)."""


class StoreError(SufficeError):
    """The store refused an operation or could not complete it; nothing was written."""


class ConflictError(StoreError):
    """An item id already exists with different content; items are immutable."""


class UnknownScopeError(StoreError):
    """A scope was named that holds no items."""


class NotFoundError(StoreError):
    """An item id was named that the scope does not hold."""


class ProviderError(SufficeError):
    """A model provider call failed (connection, timeout, HTTP status, bad body)."""

    def __init__(self, message: str, *, endpoint: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.status = status


class OutputParseError(ProviderError):
    """A model answered, but not in the shape asked for, even after one re-ask."""


class DeadlineError(ProviderError):
    """The query's deadline passed before a model call could start or while it ran."""
