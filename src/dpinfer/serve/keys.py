"""API keys of ``dpinfer serve``: random, shown once, stored hashed, each bound to a tenant and a role.

A key is ``dpk_`` followed by 32 random bytes (``secrets.token_urlsafe``); the keys file keeps only its SHA-256 (a
fast hash is enough for a 256-bit random secret: there is nothing to guess), its tenant, role and a short public id.
The file is written atomically with mode 0600. No torch import here: ``dpinfer serve keys create`` is instant.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dpinfer.errors import ConfigurationError, DPInferError, InvalidInputError

ROLES = ("user", "admin")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""Tenant, unit and store names: letters, digits, ``_ . -``, at most 64 characters, not starting with a dot."""
PREFIX = "dpk_"


def check_name(value: object, what: str) -> str:
    """A tenant or store name (one line naming the rule; the value is never quoted)."""
    if not isinstance(value, str) or not NAME.match(value):
        raise InvalidInputError(f"{what} must be 1-64 letters, digits, '_', '.' or '-' (not starting with '.' or '-')")
    return value


UNIT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
"""A unit's name in a tenant's namespace: as :data:`NAME`, up to 96 characters (a store's unit ``store.STORE``
fits)."""


def check_unit_name(value: object) -> str:
    """A unit's name (one line naming the rule; the value is never quoted)."""
    if not isinstance(value, str) or not UNIT.match(value):
        raise InvalidInputError("the unit must be 1-96 letters, digits, '_', '.' or '-' (not starting with '.' or "
                                "'-')")
    return value


class NotFound(DPInferError):
    """A resource (store, job) that does not exist for this tenant (HTTP 404)."""


class Forbidden(DPInferError):
    """Another tenant's resource, or an admin-only action (HTTP 403)."""


@dataclass(frozen=True)
class Principal:
    """Who sent a request: the tenant, the role and the key's public id (``local`` without a keys file)."""

    tenant: str
    role: str
    key_id: str

    @property
    def admin(self) -> bool:
        return self.role == "admin"


LOCAL = Principal(tenant="local", role="admin", key_id="local")
"""The principal of every request to a server without a keys file (loopback only)."""


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class KeyStore:
    """The keys file: ``{"keys": [{"id", "sha256", "tenant", "role", "created"}]}``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._entries: list[dict[str, str]] = []
        if self.path.exists():
            self._entries = self._read()

    def _read(self) -> list[dict[str, str]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            entries = data["keys"]
            for e in entries:
                if not (isinstance(e["sha256"], str) and e["role"] in ROLES and NAME.match(e["tenant"])):
                    raise ValueError
            return list(entries)
        except (OSError, ValueError, KeyError, TypeError):
            raise ConfigurationError(f"{self.path} is not a dpinfer keys file; make one with: dpinfer serve keys "
                                     "create --keys PATH --tenant T --role user") from None

    def __len__(self) -> int:
        return len(self._entries)

    def create(self, tenant: str, role: str = "user") -> str:
        """Add a key for ``tenant`` with ``role``; returns the key (the only time it is seen in clear)."""
        check_name(tenant, "the tenant")
        if role not in ROLES:
            raise InvalidInputError(f"the role must be one of {', '.join(ROLES)}")
        key = PREFIX + secrets.token_urlsafe(32)
        entry = {"id": secrets.token_hex(4), "sha256": _digest(key), "tenant": tenant, "role": role,
                 "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self._entries = (self._read() if self.path.exists() else []) + [entry]
        self._write()
        return key

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".keys-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"keys": self._entries}, f, indent=1)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def verify(self, key: str) -> Principal | None:
        """The principal of ``key``, or None (constant-time comparison of the hashes)."""
        if not isinstance(key, str) or not key.startswith(PREFIX):
            return None
        digest = _digest(key)
        found = None
        for e in self._entries:
            if hmac.compare_digest(e["sha256"], digest):
                found = Principal(tenant=e["tenant"], role=e["role"], key_id=e["id"])
        return found
