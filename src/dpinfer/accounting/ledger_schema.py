"""The privacy-budget ledger's schema: its version, its tables (SQLite's dialect; the PostgreSQL backend maps the
types) and the migrations from one version to the next, the same on both backends."""

from __future__ import annotations

APPLICATION_ID = 0x64704C67
"""``PRAGMA application_id`` of a dpinfer ledger ("dpLg"): a SQLite file without it is refused as foreign."""
SCHEMA_VERSION = 5
"""Version 2 adds each pending reservation's holder, lease and phase (settle_dead's rule, docs/budget.md); version 3
the service's adoptions (which tenant an admin gave a unit or store made outside the service: names only), kept in
the ledger so that replicas sharing it share them; version 4 the service's API keys (their SHA-256 only, each with
its tenant and role: ``dpinfer serve keys create --ledger URL``), so that replicas sharing a PostgreSQL ledger share
its keys and tenants; version 5 the service's synthesis jobs (status, progress and released texts, never the
request), so that any replica answers a job's poll."""
_SQLITE_HEADER = b"SQLite format 3\x00"
_MAX_UNIT = 128

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS units (
    unit TEXT PRIMARY KEY,
    epsilon REAL NOT NULL CHECK (epsilon >= 0),
    delta REAL NOT NULL CHECK (delta > 0 AND delta < 1),
    scope TEXT,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS charges (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    unit TEXT NOT NULL REFERENCES units(unit),
    mechanism TEXT NOT NULL,
    scope TEXT,
    parameters TEXT NOT NULL,
    cost TEXT NOT NULL,
    epsilon REAL NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'committed', 'cancelled', 'void')),
    created REAL NOT NULL,
    updated REAL NOT NULL,
    resume_key TEXT
);
CREATE INDEX IF NOT EXISTS charges_by_unit ON charges (unit, state);
CREATE INDEX IF NOT EXISTS charges_by_resume_key ON charges (resume_key);
"""

MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: ("ALTER TABLE charges ADD COLUMN holder TEXT",
        "ALTER TABLE charges ADD COLUMN lease {real}",
        "ALTER TABLE charges ADD COLUMN phase TEXT"),
    3: ("CREATE TABLE IF NOT EXISTS adopted (kind TEXT NOT NULL, tenant TEXT NOT NULL, name TEXT NOT NULL, "
        "target TEXT NOT NULL, PRIMARY KEY (kind, tenant, name), UNIQUE (kind, target))",),
    4: ("CREATE TABLE IF NOT EXISTS api_keys (id TEXT PRIMARY KEY, sha256 TEXT NOT NULL UNIQUE, tenant TEXT NOT "
        "NULL, role TEXT NOT NULL, created TEXT NOT NULL, revoked TEXT)",),
    5: ("CREATE TABLE IF NOT EXISTS synth_jobs (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, units TEXT NOT NULL, "
        "status TEXT NOT NULL, done INTEGER NOT NULL, total INTEGER NOT NULL, error TEXT, budget TEXT, result TEXT, "
        "holder TEXT NOT NULL, lease {real} NOT NULL, created {real} NOT NULL, updated {real} NOT NULL)",),
}
"""The statements that bring a ledger of version ``n - 1`` to version ``n``, the same on both backends (``{real}``:
the backend's double-precision type). A new ledger is created at version 1 and migrated, so both paths are one."""
