"""Who may touch which scopes: scope grants and the API keys that carry them.

A :class:`Grant` is a set of scope patterns (an exact name, a prefix ending in ``*``, or ``*``
for every scope). :meth:`suffice.Memory.restrict` binds a memory to one, so the check runs in
the core, below every surface: the REST and MCP servers only turn a key into a grant.

API keys are random tokens shown once at creation. The key file keeps only their SHA-256
digests: a token carries 256 random bits, so an unsalted fast hash is as strong as a slow
one here, and a lookup compares the digest against every stored one in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock
from filelock import Timeout as LockTimeout

from ._errors import AccessDeniedError, AuthenticationError, ConfigError, InvalidInputError
from ._files import write_atomic
from ._store.base import normalize_scope

KEY_PREFIX = "sfk_"
KEYS_FORMAT = "suffice-keys/1"


@dataclass(frozen=True, slots=True)
class Grant:
    """Scope patterns a caller may touch: ``"user:ana"``, ``"team:red:*"`` or ``"*"``."""

    patterns: tuple[str, ...]

    @classmethod
    def of(cls, patterns: Iterable[str]) -> Grant:
        """A grant from patterns, each normalised like a scope name; at least one."""
        if isinstance(patterns, str):
            patterns = [patterns]
        out = []
        for p in patterns:
            if not isinstance(p, str):
                raise InvalidInputError(f"a scope pattern must be a string, got {type(p).__name__}")
            if p == "*":
                out.append(p)
                continue
            star = p.endswith("*")
            body = normalize_scope(p[:-1] if star else p, "scope pattern")
            out.append(body + "*" if star else body)
        if not out:
            raise InvalidInputError("a grant needs at least one scope pattern")
        return cls(tuple(dict.fromkeys(out)))

    @property
    def everything(self) -> bool:
        return "*" in self.patterns

    def allows(self, scope: str) -> bool:
        return any(p == "*" or p == scope or (p.endswith("*") and scope.startswith(p[:-1]))
                   for p in self.patterns)

    def covers(self, other: Grant) -> bool:
        """True when every scope ``other`` allows is allowed here too."""
        def within(q: str) -> bool:
            if q == "*":
                return self.everything
            if q.endswith("*"):
                return any(p == "*" or (p.endswith("*") and q[:-1].startswith(p[:-1]))
                           for p in self.patterns)
            return self.allows(q)
        return all(within(q) for q in other.patterns)

    def intersect(self, other: Grant) -> Grant | None:
        """The patterns allowed by both grants (None when they share no scope pattern): each
        side's patterns that the other side covers whole. Two prefixes that overlap only in
        part (``a:*`` and ``a:b*``) give the narrower one."""
        mine = [p for p in self.patterns if other.covers(Grant((p,)))]
        theirs = [q for q in other.patterns if self.covers(Grant((q,)))]
        both = tuple(dict.fromkeys([*mine, *theirs]))
        return Grant(both) if both else None

    def check(self, scope: str) -> str:
        """``scope`` when allowed, else AccessDeniedError naming it (and nothing else)."""
        if not self.allows(scope):
            raise AccessDeniedError(f"access to scope {scope!r} is not granted")
        return scope


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One stored key: its public id, name, grant and digest (never the token)."""

    key_id: str
    name: str
    grant: Grant
    sha256: str
    created_at: float


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class KeyRing:
    """API keys kept in a JSON file (digests only), written atomically with mode 0600.

    The file is read again whenever it changed on disk, so a key added or revoked with
    ``suffice keys`` reaches a running server without a restart.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._keys: tuple[ApiKey, ...] = ()

    def _load(self) -> tuple[ApiKey, ...]:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return ()
        except OSError as exc:
            raise ConfigError(f"key file {self.path} is unreadable ({exc.strerror or exc})") from None
        # Each write replaces the file, so its inode changes even within one clock tick.
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if stamp != self._stamp:
                self._keys = self._read()
                self._stamp = stamp
            return self._keys

    def _read(self) -> tuple[ApiKey, ...]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"key file {self.path} is unreadable ({exc})") from None
        if not isinstance(raw, dict) or raw.get("format") != KEYS_FORMAT:
            raise ConfigError(f"key file {self.path} is not a {KEYS_FORMAT} file")
        try:
            return tuple(ApiKey(k["id"], k.get("name", ""), Grant.of(k["scopes"]), k["sha256"],
                                float(k.get("created_at", 0.0))) for k in raw["keys"])
        except (KeyError, TypeError, InvalidInputError) as exc:
            raise ConfigError(f"key file {self.path} holds a malformed key ({exc})") from None

    def _write(self, keys: Iterable[ApiKey]) -> None:
        data: dict[str, Any] = {"format": KEYS_FORMAT, "keys": [
            {"id": k.key_id, "name": k.name, "scopes": list(k.grant.patterns), "sha256": k.sha256,
             "created_at": k.created_at} for k in keys]}
        try:
            write_atomic(self.path, json.dumps(data, indent=1), mode=0o600)
        except OSError as exc:
            raise ConfigError(f"cannot write key file {self.path} ({exc.strerror or exc})") from None

    @contextmanager
    def _changing(self) -> Iterator[tuple[ApiKey, ...]]:
        """The keys as they are on disk, held under a lock file until the block's write is
        done: two processes adding or revoking keys at once must not write over each other
        (a revoked key would come back, a printed token would never be stored)."""
        lock = FileLock(self.path.with_name(self.path.name + ".lock"), timeout=30, mode=0o600)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with lock:  # read again inside the lock: the cached copy may predate another write
                yield self._read() if self.path.exists() else ()
        except LockTimeout:
            raise ConfigError(f"key file {self.path} stayed locked by another process for 30 s "
                              f"(lock file {lock.lock_file})") from None
        except OSError as exc:
            raise ConfigError(f"cannot lock key file {self.path} ({exc.strerror or exc})") from None

    def keys(self) -> list[ApiKey]:
        return list(self._load())

    def create(self, scopes: Iterable[str], name: str = "") -> tuple[str, ApiKey]:
        """A new key for ``scopes``: (token, stored key). The token is not kept anywhere."""
        grant = Grant.of(scopes)
        with self._changing() as keys:
            taken = {k.key_id for k in keys}
            key_id = secrets.token_hex(4)
            while key_id in taken:  # an id names one key: revoke removes by id
                key_id = secrets.token_hex(4)
            token = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
            key = ApiKey(key_id, name, grant, _digest(token), time.time())
            self._write([*keys, key])
        return token, key

    def revoke(self, key_id: str) -> bool:
        """Remove the key with this id; False when there is none."""
        with self._changing() as keys:
            kept = [k for k in keys if k.key_id != key_id]
            if len(kept) == len(keys):
                return False
            self._write(kept)
        return True

    def authenticate(self, token: str | None) -> ApiKey:
        """The stored key whose digest matches ``token``; AuthenticationError otherwise.

        Every stored digest is compared (no early exit), each in constant time, so the time
        taken says nothing about how close a guess was."""
        if not token:
            raise AuthenticationError("an API key is required (Authorization: Bearer <key>)")
        want = _digest(token)
        found = None
        for key in self._load():
            if hmac.compare_digest(key.sha256, want):
                found = key
        if found is None:
            raise AuthenticationError("the API key is not known (revoked, or from another key file)")
        return found
