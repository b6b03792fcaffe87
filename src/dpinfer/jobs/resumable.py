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

Budget hook (:class:`Charge`): an optional per-record charge, for a persistent budget ledger. ``open(key)`` before a
record is handed to ``generate``, ``close(token, released=True)`` after its line is durably in ``OUT``,
``close(token, released=False)`` when the record ends as an error record (nothing released) or is never generated
(the run stopped first). A record already in ``OUT`` is never charged again, so a resumed job never charges a
finished record twice. A torn record settled as released is charged once, on the run that finds it (``open`` then
``close`` as released): the run that wrote it was stopped before it closed. A failed append (a full disk, ...)
closes as released: part of the line may be on disk.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from dpinfer.io import OutputLines

T = TypeVar("T")

TORN_ERROR = ("torn: an interrupted run wrote part of this record; that part counts as released, so the record is not "
              "generated again")
"""The error of a record whose line was torn after its guarantee (see the module docstring)."""


class Charge(Protocol):
    """A per-record budget charge (the charge path's :class:`~dpinfer.accounting.charge.RecordCharges` on a
    persistent ledger): ``open(key)`` before a record is generated, ``close(token, released=...)`` once it ends.

    ``open`` may refuse (raise a :class:`~dpinfer.errors.DPInferError`, e.g. an overspent budget): the run then stops
    before that record is generated, and every charge not yet closed is closed as not released."""

    def open(self, key: str) -> Any:
        """Hold the charge of the record ``key`` (a job's canonical id key) before it is generated; a token."""

    def close(self, token: Any, *, released: bool) -> None:
        """The record ended: ``released`` (its line is durably in ``OUT``, or part of it may be): charge it; else (an
        error record, or never generated) it released nothing: drop the charge."""


class JobOutput(Protocol):
    """The file side of a job (:class:`~dpinfer.jobs.corpus.CorpusOutput`,
    :class:`~dpinfer.jobs.synth.SynthesisOutput`)."""

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


def parse_line(raw: bytes) -> Any:
    """A complete line of ``OUT`` as JSON; None when it is not (bad UTF-8, bad JSON, nested too deep)."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def settle_tail(out: Any, tail: OutputLines, key_field: str, released_after: str, *,
                fresh: Callable[[Any], bool], what: str) -> None:
    """Settle the torn last line of ``out``'s file, once its complete lines are in ``out.done``: replaced by the error
    record of :func:`settle_torn` (appended, and kept in ``out.settled_torn``) when its key is complete and
    ``fresh(key)`` (a valid key not in ``out.done``), else cut off (``out.truncated_bytes``). ``what`` names a line
    of the job in the refusal of a tail that cannot be one (:meth:`~dpinfer.io.OutputLines.cut`)."""
    settled = settle_torn(tail.torn, key_field, released_after) if tail.torn else None
    if settled is not None and not fresh(settled[key_field]):
        settled = None
    cut = tail.cut(out.path, what)
    if settled is None:
        out.truncated_bytes = cut
    else:
        out.append(settled)
        out.settled_torn = settled


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
                charge.close(charge.open(ckey(match[0]) if match else str(torn_key)), released=True)
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
                tokens[key(it)] = charge.open(charge_key(it))
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
                        charge.close(token, released=True)  # part of the line may be on disk: charged
                    raise
                if is_error(record):
                    run.errors += 1
                    if charge is not None and token is not None:
                        charge.close(token, released=False)
                else:
                    run.done += 1
                    if charge is not None and token is not None:
                        charge.close(token, released=True)
                    if on_release is not None:
                        on_release(by_key[k], record)
                run.new.append(dict(record))
                if update is not None:
                    update(run.done + run.errors, run.errors)
    finally:
        if charge is not None:
            for token in tokens.values():
                charge.close(token, released=False)
