"""Corpus jobs: read a JSONL corpus, append one release per record to a JSONL output, resume after any interruption.

Used by ``dpinfer sanitize --corpus IN.jsonl --out OUT.jsonl`` (both backends: local and Ray).

Input (:func:`read_corpus`): one JSON object per line with an id field (a string or an integer, unique in the file),
a text field (a string) and, optionally, a spans field (a list of spans or a TAB-style object; absent or null: the
tagger tags the record). Blank lines are skipped. A line that is not a JSON object, a missing id or text field, an id
that is not a string or an integer, and a duplicate id are refused for the whole file, naming the line number only.

Output (:class:`CorpusOutput`): one line per input id, either the release (:func:`release_record`: the rewrite, its
ex-ante guarantee with ε per group, δ and T_max, the method, the finish reason, the number of generated tokens and the
public settings) or ``{"id": ..., "error": "one line"}``. Never the input text, the spans or the seed.

Resume semantics:

* each record is appended with ONE ``write`` of one full line to a file opened with ``O_APPEND``, then flushed and
  ``fsync``-ed, so a record on disk is complete and durable before the next one starts;
* on the next run a torn last line (a kill or a crash in the middle of a write: the file does not end with a newline)
  is cut off, every complete line is read back, and the ids found there are skipped;
* finished lines are never rewritten: they stay byte-identical across any number of reruns;
* an error record counts as done (rerunning does not retry it; delete its line to retry it);
* a run holds an exclusive lock on the output (:class:`OutputLock`): a second run on the same file is refused, since
  it would release the records still missing a second time.

>>> import json, os, tempfile
>>> d = tempfile.mkdtemp()
>>> out = CorpusOutput(os.path.join(d, "out.jsonl"))
>>> out.open()
0
>>> out.append({"id": "a", "text": "rewrite"})
>>> with open(out.path, "ab") as fh:
...     _ = fh.write(b'{"id": "b", "te')  # a torn line, as a kill in the middle of a write leaves it
>>> again = CorpusOutput(out.path)
>>> again.open(), sorted(again.done)  # the torn line is cut off; "a" is done
(1, ['"a"'])
>>> open(out.path, encoding="utf-8").read()
'{"id":"a","text":"rewrite"}\\n'
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpinfer.errors import ConfigurationError, InvalidInputError

if TYPE_CHECKING:
    from dpinfer.pipelines.sanitize import Record, RecordOutcome


def id_key(record_id: str | int) -> str:
    """The canonical key of an id (its JSON text: the string ``"5"`` and the integer ``5`` are different ids).

    >>> id_key("5"), id_key(5)
    ('"5"', '5')
    """
    return json.dumps(record_id, ensure_ascii=False)


def _valid_id(value: Any) -> bool:
    return (isinstance(value, str) and value != "") or (isinstance(value, int) and not isinstance(value, bool))


def read_corpus(path: str | os.PathLike[str], *, id_field: str = "id", text_field: str = "text",
                spans_field: str | None = "spans") -> list[Record]:
    """The records of a JSONL corpus (see the module docstring), or a one-line refusal naming a line number (never
    the content of a line)."""
    from dpinfer.pipelines.sanitize import Record
    from dpinfer.validation import input_file

    p = input_file(str(path), "corpus")
    records: list[Record] = []
    seen: dict[str, int] = {}
    try:
        fh = p.open("rb")
    except OSError as exc:
        raise InvalidInputError(f"cannot read the corpus {p} ({exc.strerror or type(exc).__name__})") from None
    with fh:
        for n, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidInputError(f"{p} line {n} is not UTF-8 text; give a JSONL file (one JSON object per "
                                        "line)") from None
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InvalidInputError(f"{p} line {n} is not JSON (column {e.colno}); give a JSONL file (one JSON "
                                        "object per line)") from None
            if not isinstance(obj, dict):
                raise InvalidInputError(f"{p} line {n} is a JSON {type(obj).__name__}, not an object; give one JSON "
                                        "object per line")
            if id_field not in obj:
                raise InvalidInputError(f"{p} line {n} has no id field {id_field!r}; choose the field with "
                                        "--id-field")
            rid = obj[id_field]
            if not _valid_id(rid):
                raise InvalidInputError(f"{p} line {n}: the id field {id_field!r} must be a non-empty string or an "
                                        f"integer, got {type(rid).__name__}")
            if text_field not in obj:
                raise InvalidInputError(f"{p} line {n} has no text field {text_field!r}; choose the field with "
                                        "--text-field")
            if not isinstance(obj[text_field], str):
                raise InvalidInputError(f"{p} line {n}: the text field {text_field!r} must be a string, got "
                                        f"{type(obj[text_field]).__name__}")
            key = id_key(rid)
            if key in seen:
                raise InvalidInputError(f"{p} line {n} repeats the id of line {seen[key]}; every record needs its "
                                        "own id (one output record per id)")
            seen[key] = n
            spans = obj.get(spans_field) if spans_field else None
            records.append(Record(rid, obj[text_field], spans))
    if not records:
        raise InvalidInputError(f"the corpus {p} holds no record; give a JSONL file with one JSON object per line")
    return records


def check_corpus_paths(corpus: str, out: str) -> None:
    """Refuse, before any work, an output that is the corpus (or a link to it) or cannot be written."""
    from dpinfer.validation import check_output_path

    if str(out) == "-":
        raise ConfigurationError("--out must be a file for --corpus (records are appended to it and read back to "
                                 "resume); standard output cannot be resumed")
    with contextlib.suppress(OSError):
        if Path(corpus).resolve() == Path(out).resolve():
            raise ConfigurationError("--out is the --corpus file; writing there would overwrite the private corpus: "
                                     "choose another path")
    check_output_path(out, inputs=(corpus,))


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


@dataclass
class CorpusOutput:
    """The JSONL output of a corpus job, append-only (see the module docstring for the resume semantics).

    :meth:`lock` takes the run's :class:`OutputLock` (a second run on the same file is refused); :meth:`open` repairs
    a torn last line and reads the ids done; :meth:`append` writes one record atomically and durably; :meth:`close`
    releases the lock. ``done`` maps :func:`id_key` to the record read back (or appended)."""

    path: str | os.PathLike[str]
    done: dict[str, dict[str, Any]] = field(default_factory=dict)
    truncated_bytes: int = 0
    _lock: OutputLock | None = field(default=None, repr=False)

    def lock(self, job: str) -> None:
        """Take the exclusive lock of this run (``job`` names the command in the refusal)."""
        self._lock = OutputLock(self.path, job)
        self._lock.acquire()

    def close(self) -> None:
        """Release the lock (a file this run created and never wrote to is removed)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def open(self) -> int:
        """Cut a torn last line, read the records done; the number of complete records. Refuses (one line) a file
        that is not a corpus output (a line that is not a JSON object with an id), or one with a repeated id; a
        refused file is left as it is."""
        p = Path(self.path)
        self.done = {}
        if not p.exists():
            return 0
        tail = read_output_lines(p)
        for n, raw in tail.lines:
            try:
                obj = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                obj = None
            if not isinstance(obj, dict) or not _valid_id(obj.get("id")):
                raise InvalidInputError(f"--out {p} line {n} is not a dpinfer corpus record (a JSON object with an "
                                        "id); give a new path or the output of an earlier run of this job")
            key = id_key(obj["id"])
            if key in self.done:
                raise InvalidInputError(f"--out {p} line {n} repeats an id of an earlier line; it is not the output "
                                        "of one corpus job")
            self.done[key] = obj
        self.truncated_bytes = tail.cut(p, "a dpinfer corpus record")
        return len(self.done)

    def append(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` as one line: one ``write`` on an ``O_APPEND`` descriptor, then ``fsync``."""
        append_line(self.path, encode_record(record))
        self.done[id_key(record["id"])] = dict(record)


@contextlib.contextmanager
def locked_output(path: str | os.PathLike[str], job: str) -> Iterator[CorpusOutput]:
    """A :class:`CorpusOutput` holding its run's lock for the length of the ``with`` block (released on any exit)."""
    out = CorpusOutput(path)
    out.lock(job)
    try:
        yield out
    finally:
        out.close()


@dataclass
class OutputLines:
    """The complete lines of an append-only output file (:func:`read_output_lines`) and its torn tail, if any."""

    lines: list[tuple[int, bytes]]
    """``(line number, bytes without the newline)`` of every complete, non-blank line."""
    complete_bytes: int
    """Length of the file up to and including its last newline."""
    torn: bytes = b""
    """What follows the last newline: a line cut short by a kill, a crash or a full disk in the middle of a write."""

    def cut(self, path: str | os.PathLike[str], what: str) -> int:
        """Cut the torn tail off ``path`` (after the complete lines were accepted); the number of bytes cut. A tail
        that cannot be the start of a record (a line of ours starts with ``{``) is refused and left in place."""
        if not self.torn:
            return 0
        if self.torn.strip() and not self.torn.lstrip().startswith(b"{"):
            raise InvalidInputError(f"--out {path}: its last line is not {what} and does not end with a newline; give "
                                    "a new path or the output of an earlier run of this job")
        with open(path, "r+b") as fh:
            fh.truncate(self.complete_bytes)
            fh.flush()
            os.fsync(fh.fileno())
        return len(self.torn)


def read_output_lines(path: str | os.PathLike[str]) -> OutputLines:
    """The complete lines of ``path`` and its torn tail, read without changing the file (the caller checks the
    lines, then :meth:`OutputLines.cut` cuts the tail)."""
    data = Path(path).read_bytes()
    end = data.rfind(b"\n") + 1
    lines = [(n, raw) for n, raw in enumerate(data[:end].split(b"\n")[:-1], start=1) if raw.strip()]
    return OutputLines(lines=lines, complete_bytes=end, torn=data[end:])


def write_line(fd: int, line: bytes) -> None:
    """Write one complete line to ``fd`` (opened with ``O_APPEND``) and ``fsync`` it: one ``write`` for a regular
    file (the loop only guards against a short write)."""
    view = memoryview(line)
    while view:
        written = os.write(fd, view)
        view = view[written:]
    os.fsync(fd)


def append_line(path: str | os.PathLike[str], line: bytes) -> None:
    """Append one complete line to ``path`` (created with mode 0600): :func:`write_line` on an ``O_APPEND``
    descriptor."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        write_line(fd, line)
    finally:
        os.close(fd)


def encode_record(record: Mapping[str, Any]) -> bytes:
    """One output line: compact JSON (keys in the record's order), UTF-8, with its newline."""
    from dpinfer._json import plain

    return (json.dumps(plain(dict(record)), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            + "\n").encode("utf-8")


def release_record(outcome: RecordOutcome) -> dict[str, Any]:
    """The output record of one :class:`~dpinfer.pipelines.sanitize.RecordOutcome`: ``{"id", "error"}`` or the id
    and the release (:meth:`SanitizeResult.to_dict <dpinfer.pipelines.sanitize.SanitizeResult.to_dict>` without
    debug statistics: no spans, no input text, no seed)."""
    if outcome.error is not None or outcome.result is None:
        return {"id": outcome.id, "error": outcome.error or "no result"}
    res = outcome.result
    if res.debug:
        raise ConfigurationError("a corpus record never carries debug statistics; run without debug")
    return {"id": outcome.id, **res.to_dict()}


def pending(records: Iterable[Record], done: Mapping[str, Any]) -> Iterator[Record]:
    """The records whose id is not in ``done`` (keys of :func:`id_key`)."""
    return (r for r in records if id_key(r.id) not in done)


@dataclass
class CorpusSummary:
    """Counts of one run and the budget per document read from every release record in the output."""

    done: int = 0
    skipped: int = 0
    errors: int = 0
    truncated_bytes: int = 0

    def line(self, records: Iterable[Mapping[str, Any]]) -> str:
        """``done N / skipped S / errors E`` and the budget per document: the largest worst-group ε, the group ε
        range, δ and T_max of the release records (each document is released once; documents do not compose)."""
        eps, deltas, tmax, group_eps = [], [], [], []
        for rec in records:
            g = rec.get("guarantee")
            if not isinstance(g, Mapping):
                continue
            eps.append(_num(g.get("epsilon")))
            deltas.append(_num(g.get("delta")))
            if g.get("max_new_tokens") is not None:
                tmax.append(int(g["max_new_tokens"]))
            group_eps.extend(_num(gr.get("epsilon")) for gr in g.get("groups") or () if isinstance(gr, Mapping))
        head = f"done {self.done} / skipped {self.skipped} / errors {self.errors}"
        if self.truncated_bytes:
            head += f" (a torn last line of {self.truncated_bytes} bytes from an interrupted run was cut off)"
        if not eps:
            return head + "; no release in the output yet"
        from dpinfer.accounting._format import format_up

        worst = max(eps)
        budget = "no privacy guarantee" if math.isinf(worst) else f"ε ≤ {format_up(worst)} (worst group)"
        if group_eps and not math.isinf(worst) and format_up(min(group_eps)) != format_up(max(group_eps)):
            budget += f", per group ε {format_up(min(group_eps))}–{format_up(max(group_eps))}"
        budget += f", δ ≤ {format_up(max(deltas))}"
        if tmax:
            budget += f", T_max {min(tmax)}–{max(tmax)}" if min(tmax) != max(tmax) else f", T_max {tmax[0]}"
        return (f"{head}; budget per document (each released once, {len(eps)} releases in the output): {budget}")


def _num(value: Any) -> float:
    if value in ("inf", "Infinity"):
        return math.inf
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
