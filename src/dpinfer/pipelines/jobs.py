"""One resumable-job loop for every corpus job: :func:`run_resumable`.

``dpinfer sanitize --corpus``, ``rag ask --questions``, ``protect-prompt --prompts`` and ``synth --out`` all run the
same loop over the same kind of file (docs/corpus.md):

1. take the run's exclusive lock on ``OUT`` (a second run on the same file is refused: it would release the records
   still missing a second time);
2. read back what ``OUT`` holds (:meth:`JobOutput.open`): every complete line, keyed by its id; a torn last line
   (a kill, a crash or a full disk in the middle of a write) is settled by :func:`settle_torn`;
3. run the job's checks (``check``) on the records still to do: every refusal comes here, before the model loads;
4. hand the records still to do to ``generate`` (which loads the model only now) and append each output record it
   yields as ONE durable line (one ``write`` on an ``O_APPEND`` descriptor, then ``fsync``), an error record like any
   other;
5. count what this run did and what ``OUT`` holds (:class:`JobRun`).

A torn last line is never generated again. Its prefix was on disk, and anyone reading ``OUT`` at that moment read it:
it is part of a release. Every record is written with its guarantee right after its key (:func:`release_order`), so a
torn line either ends before its guarantee is complete, and then holds no released text (it is cut off and the record
generated as if it were missing), or it holds the complete guarantee and possibly part of the text, and then it is
replaced by an error record that keeps the key and the guarantee and says it was torn (:data:`TORN_ERROR`): the record
counts as released, once.

Budget hook (:class:`Charge`): an optional per-record charge, for a persistent budget ledger. ``reserve(key)`` before a
record is handed to ``generate``, ``commit(token)`` after its line is durably in ``OUT``, ``cancel(token)`` when the
record ends as an error record (nothing released) or is never generated (the run stopped first). A record already in
``OUT`` is never reserved again, so a resumed job never charges a finished record twice. A torn record settled as
released is charged once, on the run that finds it (``reserve`` then ``commit``): the run that wrote it was stopped
before its ``commit``. A failed append (a full disk, ...) commits rather than cancels: part of the line may be on disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.io import OutputLines, append_line, encode_record, read_output_lines, write_line  # noqa: F401 - re-exported

T = TypeVar("T")

TORN_ERROR = ("torn: an interrupted run wrote part of this record; that part counts as released, so the record is not "
              "generated again")
"""The error of a record whose line was torn after its guarantee (see the module docstring)."""


class Charge(Protocol):
    """A per-record budget charge (e.g. a persistent ledger): reserve → commit, or reserve → cancel.

    ``reserve`` may refuse (raise a :class:`~dpinfer.errors.DPInferError`, e.g. an overspent budget): the run then
    stops before that record is generated, and every reservation not yet committed is cancelled."""

    def reserve(self, key: str) -> Any:
        """Reserve the charge of the record ``key`` (a job's canonical id key) before it is generated; a token."""

    def commit(self, token: Any) -> None:
        """The record's line is durably in ``OUT`` (or part of it may be): charge it."""

    def cancel(self, token: Any) -> None:
        """The record released nothing (an error record, or never generated): drop the reservation."""


class JobOutput(Protocol):
    """The file side of a job (:class:`~dpinfer.pipelines.corpus.CorpusOutput`,
    :class:`~dpinfer.pipelines.synth_job.SynthesisOutput`)."""

    done: dict[Any, dict[str, Any]]
    settled_torn: dict[str, Any] | None

    def lock(self, job: str) -> None: ...

    def close(self) -> None: ...

    def open(self) -> int: ...

    def append(self, record: Mapping[str, Any]) -> None: ...

    def key_of(self, record: Mapping[str, Any]) -> Hashable: ...


@dataclass
class JobRun:
    """What one run did and what ``OUT`` holds after it."""

    done: int = 0
    """Releases written by this run."""
    errors: int = 0
    """Error records written by this run."""
    skipped: int = 0
    """Input records already in ``OUT`` when the run started."""
    truncated_bytes: int = 0
    """Bytes of a torn last line cut off (a torn line that held no released text)."""
    torn: int = 0
    """Torn last lines kept as released (replaced by an error record saying so)."""
    out_records: int = 0
    """Records in ``OUT`` after the run (releases and errors, whatever input they came from)."""
    out_errors: int = 0
    """Error records in ``OUT`` after the run (torn records not included: they were released)."""
    out_torn: int = 0
    """Torn records in ``OUT`` (part of each was released; each counts as released)."""
    new: list[dict[str, Any]] = field(default_factory=list)
    """The records this run appended, in order."""
    held: list[dict[str, Any]] = field(default_factory=list)
    """Every record in ``OUT`` after the run, in file order (what a reader of ``OUT`` sees)."""

    @property
    def out_releases(self) -> int:
        return self.out_records - self.out_errors

    def head(self, out: str) -> str:
        """``done N / skipped S / errors E`` of this run, then what ``OUT`` holds."""
        line = f"this run: done {self.done} / skipped {self.skipped} / errors {self.errors}"
        if self.truncated_bytes:
            line += f" (a torn last line of {self.truncated_bytes} bytes holding no release was cut off)"
        if self.torn:
            line += " (a torn last line was kept as released: its record is an error record saying so)"
        noun = "error" if self.out_errors == 1 else "errors"
        torn = f", {self.out_torn} of them torn" if self.out_torn else ""
        return (f"{line}; {out} holds {self.out_records} records ({self.out_releases} released{torn}, "
                f"{self.out_errors} {noun})")


def is_error(record: Mapping[str, Any]) -> bool:
    return "error" in record


def release_order(key_field: str, record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` with its key first and its guarantee right after: a line torn before its guarantee is complete
    holds no released text (:func:`settle_torn`)."""
    first = {k: record[k] for k in (key_field, "guarantee") if k in record}
    return {**first, **{k: v for k, v in record.items() if k not in first}}


def parse_prefix(torn: bytes) -> dict[str, Any]:
    """The complete top-level fields of a torn JSON-object line, in order (a field is complete when the character after
    its value, a ``,`` or ``}``, is there too); ``{}`` when none is.

    >>> parse_prefix(b'{"id":"a","guarantee":{"epsilon":2},"text":"a rel')
    {'id': 'a', 'guarantee': {'epsilon': 2}}
    >>> parse_prefix(b'{"id":12')  # 12 may be the start of 123: not complete
    {}
    """
    text = torn.decode("utf-8", errors="replace")
    dec = json.JSONDecoder()
    out: dict[str, Any] = {}
    pos = text.find("{")
    if pos < 0 or text[:pos].strip():
        return {}
    pos += 1
    while True:
        try:
            key, pos = dec.raw_decode(text, _skip(text, pos))
            pos = _skip(text, pos)
            if not isinstance(key, str) or text[pos:pos + 1] != ":":
                return out
            value, pos = dec.raw_decode(text, _skip(text, pos + 1))
        except (json.JSONDecodeError, RecursionError):
            return out
        pos = _skip(text, pos)
        if text[pos:pos + 1] not in (",", "}"):
            return out
        out[key] = value
        if text[pos] == "}":
            return out
        pos += 1


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r":
        pos += 1
    return pos


def settle_torn(torn: bytes, key_field: str, released_after: str) -> dict[str, Any] | None:
    """The error record that replaces a torn last line, or None when the line is to be cut off.

    The line counts as released when its prefix holds the complete ``released_after`` field (the guarantee, for
    corpus records, written before any released text; the batch index for synth texts): the error record keeps the
    key and that guarantee. Otherwise nothing released was on disk: None (cut it off, generate the record again)."""
    fields = parse_prefix(torn)
    if key_field not in fields or released_after not in fields:
        return None
    record = {key_field: fields[key_field], "error": TORN_ERROR, "torn": True}
    if "guarantee" in fields:
        record["guarantee"] = fields["guarantee"]
    return record


def run_resumable(out: JobOutput, items: Sequence[T], generate: Callable[[Iterator[T]], Iterable[Mapping[str, Any]]],
                  *, job: str, key: Callable[[T], Hashable], check: Callable[[list[T]], None] | None = None,
                  charge: Charge | None = None, charge_key: Callable[[T], str] | None = None,
                  progress: Callable[[int], AbstractContextManager[Callable[[int, int], None]]] | None = None,
                  on_release: Callable[[T, Mapping[str, Any]], None] | None = None) -> JobRun:
    """Run a resumable job on ``out`` (see the module docstring): lock, read back, ``check(todo)``, generate, append.

    ``items``: the job's input records; ``key(item)``: its key in ``out.done``; ``generate(todo)``: an iterable of
    output records (each with its key field, in any order) for the records it is handed (it consumes ``todo`` before
    generating a record, which is where ``charge`` reserves); ``check(todo)``: refusals before anything is generated;
    ``progress(total)``: a context giving ``update(done, errors)``; ``on_release(item, record)``: called after a
    release (not an error record) is durably appended. ``charge_key(item)``: the key given to ``charge.reserve``
    (default ``str(key(item))``)."""
    ckey = charge_key or (lambda it: str(key(it)))
    out.lock(job)
    try:
        out.open()
        run = JobRun(truncated_bytes=getattr(out, "truncated_bytes", 0))
        if out.settled_torn is not None:
            run.torn = 1
            torn_key = out.key_of(out.settled_torn)
            if charge is not None:
                match = [it for it in items if key(it) == torn_key]
                charge.commit(charge.reserve(ckey(match[0]) if match else str(torn_key)))
        todo = [it for it in items if key(it) not in out.done]
        run.skipped = len(items) - len(todo)
        if check is not None:
            check(todo)
        if todo:
            _generate(out, todo, generate, run, key=key, charge=charge, charge_key=ckey, progress=progress,
                      on_release=on_release)
        run.held = list(out.done.values())
        run.out_records = len(run.held)
        run.out_errors = sum(1 for rec in run.held if is_error(rec) and not rec.get("torn"))
        run.out_torn = sum(1 for rec in run.held if rec.get("torn"))
        return run
    finally:
        out.close()


def _generate(out: JobOutput, todo: list[T], generate: Callable[[Iterator[T]], Iterable[Mapping[str, Any]]],
              run: JobRun, *, key: Callable[[T], Hashable], charge: Charge | None, charge_key: Callable[[T], str],
              progress: Callable[[int], AbstractContextManager[Callable[[int, int], None]]] | None,
              on_release: Callable[[T, Mapping[str, Any]], None] | None) -> None:
    by_key = {key(it): it for it in todo}
    tokens: dict[Hashable, Any] = {}

    def feed() -> Iterator[T]:
        for it in todo:
            if charge is not None:
                tokens[key(it)] = charge.reserve(charge_key(it))
            yield it

    try:
        with progress(len(todo)) if progress is not None else contextlib.nullcontext(None) as update:
            for record in generate(feed()):
                k = out.key_of(record)
                if k not in by_key or k in out.done:  # a generator bug would release a record twice: stop
                    raise RuntimeError("a corpus job produced a record that is not one of the records to do")
                token = tokens.pop(k, None)
                try:
                    out.append(record)
                except BaseException:
                    if charge is not None and token is not None:
                        charge.commit(token)  # part of the line may be on disk: charged
                    raise
                if is_error(record):
                    run.errors += 1
                    if charge is not None and token is not None:
                        charge.cancel(token)
                else:
                    run.done += 1
                    if charge is not None and token is not None:
                        charge.commit(token)
                    if on_release is not None:
                        on_release(by_key[k], record)
                run.new.append(dict(record))
                if update is not None:
                    update(run.done + run.errors, run.errors)
    finally:
        if charge is not None:
            for token in tokens.values():
                charge.cancel(token)


# ------------------------------------------------------------------------------------------------ file rules
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
