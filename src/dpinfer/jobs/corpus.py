"""Corpus jobs: read a JSONL corpus, append one release per record to a JSONL output, resume after any interruption.

Used by ``dpinfer sanitize --corpus IN.jsonl --out OUT.jsonl`` (both backends: local and Ray), ``rag ask
--questions`` and ``protect-prompt --prompts``.

Input (:func:`read_corpus`): one JSON object per line with an id field (a string or an integer, unique in the file),
a text field (a string) and, optionally, a spans field (a list of spans or a TAB-style object; absent or null: the
tagger tags the record). Blank lines are skipped. A line that is not a JSON object, a missing id or text field, an id
that is not a string or an integer, and a duplicate id are refused for the whole file, naming the line number only.

Output (:class:`CorpusOutput`): one line per input id, either the id and the record's release (the result's
``release()``: the text, its ex-ante guarantee and the public settings) or ``{"id": ..., "error": "one line"}``.
Never the input text, the spans or the seed.

Resume semantics (the loop is :func:`dpinfer.jobs.run_resumable`, shared by every corpus job):

* each record is appended with ONE ``write`` of one full line to a file opened with ``O_APPEND``, then ``fsync``-ed,
  so a record on disk is complete and durable before the next one starts; its guarantee comes right after its id;
* on the next run every complete line is read back and the ids found there are skipped; a torn last line (a kill or a
  crash in the middle of a write: the file does not end with a newline) is cut off when it ends before its guarantee
  is complete (it holds no released text), and otherwise replaced by an error record saying it was torn: its prefix
  was released, so it is never generated again;
* finished lines are never rewritten: they stay byte-identical across any number of reruns;
* an error record counts as done (rerunning does not retry it; delete its line to retry it);
* a private sidecar ``OUT.digests`` (:class:`~dpinfer.jobs.ReleaseDigests`) keeps a keyed digest of every
  released text: a resume that would release a text a second time (under a new id, or after its line was deleted)
  or that finds ids in ``OUT`` the input does not have is refused unless ``--allow-rerelease`` is given;
* a run holds an exclusive lock on the output (:class:`OutputLock`): a second run on the same file is refused, since
  it would release the records still missing a second time.

>>> import json, os, tempfile
>>> d = tempfile.mkdtemp()
>>> out = CorpusOutput(os.path.join(d, "out.jsonl"))
>>> out.open()
0
>>> out.append({"id": "a", "text": "rewrite", "guarantee": {"epsilon": 2}})
>>> with open(out.path, "ab") as fh:
...     _ = fh.write(b'{"id": "b", "guar')  # a torn line, as a kill in the middle of a write leaves it
>>> again = CorpusOutput(out.path)
>>> again.open(), sorted(again.done)  # cut before its guarantee: it held no release and is cut off
(1, ['"a"'])
>>> open(out.path, encoding="utf-8").read()
'{"id":"a","guarantee":{"epsilon":2},"text":"rewrite"}\\n'
>>> with open(out.path, "ab") as fh:
...     _ = fh.write(b'{"id":"b","guarantee":{"epsilon":2},"text":"a rel')  # torn inside the released text
>>> again.open(), again.done['"b"']["torn"]  # kept as released: an error record, never generated again
(2, True)
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpinfer.checks import format_up
from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.io import append_line, check_output_path, encode_record, input_file, read_output_lines, write_line
from dpinfer.jobs.files import OutputLock, ReleaseDigests, check_rerelease
from dpinfer.jobs.resumable import Charge, JobRun, parse_line, release_order, run_resumable, settle_tail


@dataclass(frozen=True)
class Record:
    """One record of an id-keyed corpus (:func:`read_corpus`; :func:`dpinfer.sanitize_many`'s input): its ``id`` (a
    string or an integer, unique in the corpus), its ``text`` and its ``spans`` (a list of spans or a spans object in
    a format :func:`~dpinfer.pipelines.sanitize_plan.resolve_spans` accepts, e.g. TAB's ``entity_mentions``;
    ``None``: the tagger tags it). A string is not accepted as ``spans`` by sanitisation (it would be read as a file
    path)."""

    id: str | int
    text: str
    spans: Any = None


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
    if str(out) == "-":
        raise ConfigurationError("--out must be a file for --corpus (records are appended to it and read back to "
                                 "resume); standard output cannot be resumed")
    with contextlib.suppress(OSError):
        if Path(corpus).resolve() == Path(out).resolve():
            raise ConfigurationError("--out is the --corpus file; writing there would overwrite the private corpus: "
                                     "choose another path")
    check_output_path(out, inputs=(corpus,))
    check_output_path(ReleaseDigests.of(out).path, inputs=(corpus,), option="--out's digest file")


@dataclass
class CorpusOutput:
    """The JSONL output of a corpus job, append-only (see the module docstring for the resume semantics).

    :meth:`lock` takes the run's :class:`OutputLock` (a second run on the same file is refused); :meth:`open` repairs
    a torn last line and reads the ids done; :meth:`append` writes one record atomically and durably; :meth:`close`
    releases the lock. ``done`` maps :func:`id_key` to the record read back (or appended)."""

    path: str | os.PathLike[str]
    done: dict[str, dict[str, Any]] = field(default_factory=dict)
    truncated_bytes: int = 0
    settled_torn: dict[str, Any] | None = None
    """The error record that replaced a torn last line holding a release (see the module docstring), if any."""
    _lock: OutputLock | None = field(default=None, repr=False)

    @staticmethod
    def key_of(record: Mapping[str, Any]) -> str:
        return id_key(record["id"])

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
        """Read the records done and settle a torn last line (cut off, or kept as a torn error record); the number of
        records. Refuses (one line) a file that is not a corpus output (a line that is not a JSON object with an id),
        or one with a repeated id; a refused file is left as it is."""
        p = Path(self.path)
        self.done, self.settled_torn, self.truncated_bytes = {}, None, 0
        if not p.exists():
            return 0
        tail = read_output_lines(p)
        for n, raw in tail.lines:
            obj = parse_line(raw)
            if not isinstance(obj, dict) or not _valid_id(obj.get("id")):
                raise InvalidInputError(f"--out {p} line {n} is not a dpinfer corpus record (a JSON object with an "
                                        "id); give a new path or the output of an earlier run of this job")
            key = id_key(obj["id"])
            if key in self.done:
                raise InvalidInputError(f"--out {p} line {n} repeats an id of an earlier line; it is not the output "
                                        "of one corpus job")
            self.done[key] = obj
        settle_tail(self, tail, "id", "guarantee", what="a dpinfer corpus record",
                    fresh=lambda rid: _valid_id(rid) and id_key(rid) not in self.done)
        return len(self.done)

    def append(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` as one line (its id first, its guarantee next): one ``write`` on an ``O_APPEND``
        descriptor, then ``fsync``."""
        line = encode_record(release_order("id", record))
        fd = self._lock.fd if self._lock is not None else None
        if fd is not None:
            write_line(fd, line)
        else:
            append_line(self.path, line)
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


def run_corpus_job(records: list[Record], out: str | os.PathLike[str],
                   generate: Callable[[Iterator[Record]], Iterable[Mapping[str, Any]]], *, job: str, source: str,
                   allow_rerelease: bool = False, composes: bool = False, charge: Charge | None = None,
                   progress: Callable[[int], AbstractContextManager[Callable[[int, int], None]]] | None = None,
                   warn: Callable[[str], None] | None = None) -> JobRun:
    """:func:`~dpinfer.jobs.resumable.run_resumable` for an id-keyed job (``sanitize --corpus``, ``rag ask
    --questions``, ``protect-prompt --prompts``): the records of ``source`` keyed by :func:`id_key`, refusing (before
    ``generate`` loads anything) a resume that would release a text twice (:func:`~dpinfer.jobs.files.
    check_rerelease`; ``allow_rerelease``: ``warn`` the line instead) and keeping the digest of every release in
    the private sidecar. ``composes``: the releases compose (every answer of ``rag ask`` reads the same store, and
    the summary composes every record of ``OUT``), so ids from another input and a text asked twice are accounted
    for; only a release whose line is gone from ``OUT`` is refused (it would no longer be counted)."""
    digests = ReleaseDigests.of(out)
    keyed = [(id_key(r.id), r.text) for r in records]

    def check(todo: list[Record]) -> None:
        digests.load()
        note = check_rerelease(output.done, keyed, [id_key(r.id) for r in todo], digests, out=out, source=source,
                               allow=allow_rerelease, composes=composes)
        if note is not None and warn is not None:
            warn(note)

    def on_release(record: Record, _: Mapping[str, Any]) -> None:
        digests.add(id_key(record.id), digests.digest(record.text))

    output = CorpusOutput(out)
    return run_resumable(output, records, generate, job=job, key=lambda r: id_key(r.id), check=check, charge=charge,
                         progress=progress, on_release=on_release)


def pending(records: Iterable[Record], done: Mapping[str, Any]) -> Iterator[Record]:
    """The records whose id is not in ``done`` (keys of :func:`id_key`)."""
    return (r for r in records if id_key(r.id) not in done)


def per_record_budget(records: Iterable[Mapping[str, Any]], *, what: str = "document",
                      groups: bool = True) -> str:
    """The budget per record read from every release record given (those of ``OUT``, whatever input they came from;
    a torn record keeps its guarantee and counts): the largest (worst-group) ε, the group ε range, δ and T_max. Each
    record is released once and records do not compose (each is a different person's)."""
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
    if not eps:
        return "no release in the output yet"
    worst = max(eps)
    budget = "no privacy guarantee" if math.isinf(worst) else f"ε ≤ {format_up(worst)}"
    if groups and not math.isinf(worst):
        budget += " (worst group)"
    if group_eps and not math.isinf(worst) and format_up(min(group_eps)) != format_up(max(group_eps)):
        budget += f", per group ε {format_up(min(group_eps))}–{format_up(max(group_eps))}"
    budget += f", δ ≤ {format_up(max(deltas))}"
    if tmax:
        budget += f", T_max {min(tmax)}–{max(tmax)}" if min(tmax) != max(tmax) else f", T_max {tmax[0]}"
    compose = "" if what == "document" else f", {what}s do not compose"
    return f"budget per {what} (each released once{compose}, {len(eps)} releases in the output): {budget}"


def _num(value: Any) -> float:
    if value in ("inf", "Infinity"):
        return math.inf
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def release_record(outcome: Any) -> dict[str, Any]:
    """The output line of one sanitised record of a corpus (a
    :class:`~dpinfer.pipelines.sanitize_many.RecordOutcome`): ``{"id", "error"}``, or the id and the result's
    ``release()`` (no spans, no input text, no seed); a result with debug statistics is refused. Here, not beside
    the pipeline, so that the command line's refusals import no model code."""
    if outcome.error is not None or outcome.result is None:
        return {"id": outcome.id, "error": outcome.error or "no result"}
    res = outcome.result
    if getattr(res, "debug", False):
        raise ConfigurationError("a corpus record never carries debug statistics; run without debug")
    return {"id": outcome.id, **res.release()}
