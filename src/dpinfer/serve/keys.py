"""API keys of ``dpinfer serve``: random, shown once, stored hashed, each bound to a tenant and a role.

A key is ``dpk_`` followed by 32 random bytes (``secrets.token_urlsafe``); its store keeps only its SHA-256 (a
fast hash is enough for a 256-bit random secret: there is nothing to guess), its tenant, role and a short public id.
Two stores, one interface (``create``, ``verify``, ``list``, ``revoke``, ``len``):

* :class:`KeyStore`, a keys file (``--keys PATH``; one process, or replicas on one machine), written atomically with
  mode 0600 and read again when it changes (a key created or revoked works without a restart);
* :class:`LedgerKeys`, the ``api_keys`` table of the ledger's own database (``--ledger postgresql://…``: every replica
  on every machine reads the same keys, each request looked up by its hash with a bound parameter, so a key created
  or revoked works at once on every replica).

No torch import here: ``dpinfer serve keys create`` is instant.
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
from typing import Any

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


def _new_key(tenant: str, role: str) -> tuple[str, dict[str, str]]:
    """A new key for ``tenant`` with ``role`` and its stored entry (id, SHA-256, tenant, role, created)."""
    check_name(tenant, "the tenant")
    if role not in ROLES:
        raise InvalidInputError(f"the role must be one of {', '.join(ROLES)}")
    key = PREFIX + secrets.token_urlsafe(32)
    return key, {"id": secrets.token_hex(4), "sha256": _digest(key), "tenant": tenant, "role": role,
                 "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


class KeyStore:
    """The keys file: ``{"keys": [{"id", "sha256", "tenant", "role", "created"}]}``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._entries: list[dict[str, str]] = []
        self._seen: tuple[int, int] | None = None
        if self.path.exists():
            self._entries = self._read()

    def _fresh(self) -> list[dict[str, str]]:
        """The entries, read again when the file changed since (a key created or revoked by another process)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return self._entries
        if (st.st_mtime_ns, st.st_size) != self._seen:
            self._entries = self._read()
        return self._entries

    def _read(self) -> list[dict[str, str]]:
        try:
            st = os.stat(self.path)
            data = json.loads(self.path.read_text(encoding="utf-8"))
            entries = data["keys"]
            for e in entries:
                if not (isinstance(e["sha256"], str) and e["role"] in ROLES and NAME.match(e["tenant"])):
                    raise ValueError
            self._seen = (st.st_mtime_ns, st.st_size)
            return list(entries)
        except (OSError, ValueError, KeyError, TypeError):
            raise ConfigurationError(f"{self.path} is not a dpinfer keys file; make one with: dpinfer serve keys "
                                     "create --keys PATH --tenant T --role user") from None

    def __len__(self) -> int:
        return len(self._fresh())

    def create(self, tenant: str, role: str = "user") -> str:
        """Add a key for ``tenant`` with ``role``; returns the key (the only time it is seen in clear)."""
        key, entry = _new_key(tenant, role)
        self._entries = (self._read() if self.path.exists() else []) + [entry]
        self._write()
        return key

    def list(self) -> list[dict[str, str]]:
        """The keys' public facts (id, tenant, role, created), never their hashes."""
        return [{k: e[k] for k in ("id", "tenant", "role", "created") if k in e} for e in self._fresh()]

    def revoke(self, key_id: str) -> bool:
        """Remove the key of public id ``key_id``; False when there is none."""
        entries = self._read() if self.path.exists() else []
        kept = [e for e in entries if e.get("id") != key_id]
        if len(kept) == len(entries):
            return False
        self._entries = kept
        self._write()
        return True

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
            st = os.stat(self.path)
            self._seen = (st.st_mtime_ns, st.st_size)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def verify(self, key: str) -> Principal | None:
        """The principal of ``key``, or None (constant-time comparison of the hashes)."""
        if not isinstance(key, str) or not key.startswith(PREFIX):
            return None
        digest = _digest(key)
        found = None
        for e in self._fresh():
            if hmac.compare_digest(e["sha256"], digest):
                found = Principal(tenant=e["tenant"], role=e["role"], key_id=e["id"])
        return found


class LedgerKeys:
    """The keys in the ledger's own database (its ``api_keys`` table: id, SHA-256, tenant, role, created, revoked;
    schema version 4). Every call reads the database, bound parameters only: a key created or revoked by ``dpinfer
    serve keys`` works at once on every replica sharing the ledger. A revoked key is kept (marked), never reused."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self.path = ledger.path

    def __len__(self) -> int:
        return int(self.ledger._query("SELECT COUNT(*) FROM api_keys WHERE revoked IS NULL")[0][0])

    def create(self, tenant: str, role: str = "user") -> str:
        key, e = _new_key(tenant, role)
        with self.ledger._transaction("add an API key") as db:
            db.execute("INSERT INTO api_keys (id, sha256, tenant, role, created) VALUES (?, ?, ?, ?, ?)",
                       (e["id"], e["sha256"], e["tenant"], e["role"], e["created"]))
        return key

    def list(self) -> list[dict[str, str]]:
        rows = self.ledger._query("SELECT id, tenant, role, created, revoked FROM api_keys ORDER BY created, id")
        return [{"id": i, "tenant": t, "role": r, "created": c, **({"revoked": v} if v else {})}
                for i, t, r, c, v in rows]

    def revoke(self, key_id: str) -> bool:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with self.ledger._transaction("revoke an API key") as db:
            found = db.execute("SELECT id FROM api_keys WHERE id = ? AND revoked IS NULL", (key_id,)).fetchone()
            db.execute("UPDATE api_keys SET revoked = ? WHERE id = ? AND revoked IS NULL", (now, key_id))
        return found is not None

    def verify(self, key: str) -> Principal | None:
        """The principal of ``key`` (looked up by its SHA-256; a revoked key is none), or None."""
        if not isinstance(key, str) or not key.startswith(PREFIX):
            return None
        rows = self.ledger._query("SELECT id, tenant, role FROM api_keys WHERE sha256 = ? AND revoked IS NULL",
                                  (_digest(key),))
        return Principal(tenant=rows[0][1], role=rows[0][2], key_id=rows[0][0]) if rows else None


Keys = KeyStore | LedgerKeys
"""Either key store."""


def open_keys(source: str | None, keys: str | None, ledger: Any) -> Keys | None:
    """The service's keys: ``source`` ``"file"`` (the keys file ``keys``), ``"ledger"`` (the ledger at ``ledger``'s
    table) or None (no keys: loopback only)."""
    if source == "file" and keys is not None:
        return KeyStore(keys)
    if source == "ledger":
        from dpinfer.accounting.ledger import Ledger

        return LedgerKeys(Ledger(ledger))
    return None
