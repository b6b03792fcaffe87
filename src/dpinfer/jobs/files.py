"""The file rules every resumable job shares: one run per output at a time (:class:`OutputLock`), and no text released
twice across runs (:class:`ReleaseDigests`, :func:`check_rerelease`)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.io import append_line, read_output_lines
from dpinfer.jobs.resumable import is_error


@dataclass
class OutputLock:
    """An exclusive ``flock`` on an append-only output for the length of one run: two runs on the same ``OUT`` would
    both see the same records missing and release them twice (twice the privacy loss for those records).

    :meth:`acquire` opens (creating, mode 0600) the file and locks it, refusing in one line when another run holds
    it; :meth:`release` unlocks it and removes a file this run created and never wrote to. Where ``fcntl`` does not
    exist (not POSIX) there is no lock.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "out.jsonl")
    >>> first = OutputLock(path, "dpinfer sanitize --corpus"); first.acquire()
    >>> OutputLock(path, "dpinfer sanitize --corpus").acquire()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dpinfer.errors.ConfigurationError: --out ... is being written by another dpinfer sanitize --corpus run; wait ...
    >>> first.release(), os.path.exists(path)  # created by this run, never written: removed
    (True, False)
    """

    path: str | os.PathLike[str]
    job: str
    created: bool = False
    _fd: int | None = field(default=None, repr=False)

    def acquire(self) -> None:
        p = Path(self.path)
        self.created = not p.exists()
        fd = os.open(p, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            import fcntl
        except ImportError:  # pragma: no cover - no flock on this platform: no lock
            self._fd = fd
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ConfigurationError(f"--out {p} is being written by another {self.job} run; wait for it to end (a "
                                     "second run would release the same records again), then rerun") from None
        self._fd = fd

    @property
    def fd(self) -> int | None:
        """The locked descriptor (opened with ``O_APPEND``), or None when not held."""
        return self._fd

    def release(self) -> bool:
        """Unlock; True when the file was created by this run, never written to, and so removed."""
        if self._fd is None:
            return False
        removed = False
        with contextlib.suppress(OSError):
            if self.created and os.fstat(self._fd).st_size == 0:
                os.unlink(self.path)
                removed = True
        os.close(self._fd)
        self._fd = None
        return removed


# ------------------------------------------------------------------------------------------- what OUT released
DIGESTS_SUFFIX = ".digests"
"""The private sidecar of an id-keyed job's ``OUT``: ``OUT.jsonl.digests``."""

DIGESTS_KIND = "release-digests"

DIGESTS_NOTE = ("private: keyed digests (HMAC-SHA256) of the texts whose records were released to the output, with "
                "their key; not part of the release, never publish it; it lets a resumed job refuse to release the "
                "same text twice")

ALLOW_FLAG = "--allow-rerelease"


@dataclass
class ReleaseDigests:
    """The private 0600 sidecar ``OUT`` + :data:`DIGESTS_SUFFIX` of an id-keyed job: a random key (first line) and,
    for every released record, its id key and the HMAC-SHA256 of its input text under that key. It is written after
    each release line (a record whose entry is missing, after a crash between the two writes, is filled in from the
    input on the next run). No plain hash of private text is written anywhere: without the key a digest cannot be
    checked against a guess."""

    path: Any
    key: bytes = b""
    released: dict[str, str] = field(default_factory=dict)
    exists: bool = False

    @classmethod
    def of(cls, out: Any) -> ReleaseDigests:
        return cls(Path(f"{os.fspath(out)}{DIGESTS_SUFFIX}"))

    def load(self) -> ReleaseDigests:
        """Read the sidecar (none: a new random key); a torn last line is cut off. Refuses a foreign file."""
        self.released = {}
        if not self.path.exists():
            self.key, self.exists = secrets.token_bytes(32), False
            return self
        tail = read_output_lines(self.path)
        bad = InvalidInputError(f"{self.path} is not a dpinfer release-digests file; restore it, or delete it (a "
                                "resumed job then cannot tell whether a text was released under another id)")
        try:
            objs = [json.loads(raw.decode("utf-8")) for _, raw in tail.lines]
            head = objs[0]["dpinfer"]
            if head["kind"] != DIGESTS_KIND:
                raise ValueError
            self.key = bytes.fromhex(head["key"])
            for obj in objs[1:]:
                self.released[str(obj["k"])] = str(obj["d"])
        except (UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError, IndexError):
            raise bad from None
        tail.cut(self.path, "a digest line")
        self.exists = True
        return self

    def digest(self, text: str) -> str:
        return hmac.new(self.key, text.encode("utf-8"), hashlib.sha256).hexdigest()

    def add(self, key: str, digest: str) -> None:
        """Record a release durably (the file, mode 0600, is created with its key on the first release)."""
        if not self.exists:
            head = {"dpinfer": {"kind": DIGESTS_KIND, "note": DIGESTS_NOTE, "key": self.key.hex()}}
            append_line(self.path, (json.dumps(head) + "\n").encode("utf-8"))
            self.exists = True
        append_line(self.path, (json.dumps({"k": key, "d": digest}, ensure_ascii=False) + "\n").encode("utf-8"))
        self.released[key] = digest


def check_rerelease(done: Mapping[str, Mapping[str, Any]], keyed_texts: Sequence[tuple[str, str]],
                    todo_keys: Iterable[str], digests: ReleaseDigests, *, out: Any, source: str,
                    allow: bool, composes: bool = False) -> str | None:
    """Refuse (one line, before the model loads) a resume that would release a text a second time; with ``allow``,
    the warning to print instead (None: nothing to say).

    ``done``: what ``OUT`` holds (id key → record); ``keyed_texts``: the input's ``(id key, text)`` in input order;
    ``todo_keys``: the keys still to do. Refused: ``OUT`` holding ids the input does not have; an input record whose
    text was released under another id (or twice in the input); an id released before whose line is gone from
    ``OUT``. ``composes``: every record of ``OUT`` is counted in one composed budget, so only the last is refused (a
    deleted line would no longer be counted). Messages name input record numbers and counts, never an id or a
    text."""
    index = {k: n for n, (k, _) in enumerate(keyed_texts, start=1)}
    texts = dict(keyed_texts)
    for k, rec in done.items():  # releases whose entry is missing (a crash between the two writes, an older OUT)
        if (not is_error(rec) or rec.get("torn")) and k in texts and k not in digests.released:
            digests.add(k, digests.digest(texts[k]))
    problems: list[str] = []
    foreign = 0 if composes else sum(1 for k in done if k not in index)
    if foreign:
        problems.append(f"--out {out} holds {foreign} record{'s' * (foreign != 1)} whose id is not in {source} (a "
                        "resume on another input could release the same texts under new ids)")
    owner = {d: k for k, d in digests.released.items()}
    planned: dict[str, str] = {}
    for k in todo_keys:
        n = index[k]
        if k in digests.released:
            problems.append(f"input record {n} was released to --out {out} before, and its line is gone from it "
                            "(generating it again would release it twice)")
            continue
        if composes:
            continue
        d = digests.digest(texts[k])
        if d in owner and owner[d] != k:
            problems.append(f"input record {n} holds the same text as a record released to --out {out} under another "
                            "id (it would be released twice)")
        elif d in planned:
            problems.append(f"input records {index[planned[d]]} and {n} hold the same text under two ids (it would "
                            "be released twice)")
        planned.setdefault(d, k)
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
    if not allow:
        raise ConfigurationError(f"{problems[0]}{more}; use another --out, restore OUT, or give {ALLOW_FLAG} to go on "
                                 "(the privacy loss of a text released twice adds up)")
    return (f"warning: {ALLOW_FLAG}: {problems[0]}{more}; going on: the privacy loss of a text released twice adds "
            "up")
