"""The output of ``dpinfer synth FILE --out OUT.jsonl`` as a resumable corpus job (docs/corpus.md, "Synthetic texts").

``OUT`` holds a header line (``{"dpinfer": {"kind": "synthesis", ...}}``: the guarantee, the settings, the counts;
:meth:`SynthesisPlan.header <dpinfer.pipelines.synthesize.SynthesisPlan.header>`), then one line per text with its
``batch`` index (first in the line), appended as each batch finishes by the corpus jobs' loop
(:func:`dpinfer.jobs.run_resumable`: one ``write`` of one complete line on an ``O_APPEND`` descriptor, then
``fsync``; finished lines are never rewritten). A torn last line that holds its complete batch index is kept as
released: it is replaced by ``{"batch": i, "error": "torn: ...", "torn": true}`` and that batch is never generated
again (its prefix may hold part of the text); a line torn before that is cut off.

Privacy of a resume. The per-reference guarantee holds because the batches are disjoint and each batch is released
once. The partition is deterministic (the seed, the labels and the order of the references), so batch ``i`` covers the
same references on a rerun only if the corpus is unchanged; a changed corpus could put a reference into two released
batches. Hence a private sidecar, ``OUT`` + :data:`PARTITION_SUFFIX` (mode 0600, written atomically before the first
text is appended), holds the SHA-256 of the partition
(:meth:`SynthesisPlan.partition_sha256 <dpinfer.pipelines.synthesize.SynthesisPlan.partition_sha256>`). A rerun of an
unfinished ``OUT`` that already holds texts recomputes it and refuses, before the model loads, a digest that differs or
a sidecar that is missing. The sidecar is derived from the private corpus: it is not part of the release, must not be
published, and is deleted once every batch is released. Nothing derived from the references' texts goes into ``OUT``
beyond the released texts themselves.

A run holds an exclusive lock (``flock``) on ``OUT`` from its checks to its end: a second run on the same ``OUT`` is
refused instead of releasing the same batches again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpinfer.accounting.charge import Reservation, charge
from dpinfer.errors import ConfigurationError, InvalidInputError
from dpinfer.io import append_line, atomic_write_text, encode_record, read_output_lines, write_line
from dpinfer.jobs.files import OutputLock
from dpinfer.jobs.resumable import JobRun, parse_line, release_order, run_resumable, settle_tail

PARTITION_SUFFIX = ".partition"
"""The private sidecar of an unfinished ``OUT``: ``OUT.jsonl.partition``."""

PARTITION_KIND = "synthesis-partition"

PARTITION_NOTE = ("private: derived from the private corpus (a SHA-256 of the partition); not part of the release, "
                  "never publish it; dpinfer deletes it once every batch of the output is released")

SETTING_NAMES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("method",), "--method"),
    (("settings", "model"), "--model"),
    (("settings", "epsilon"), "--epsilon"),
    (("settings", "delta"), "--delta"),
    (("settings", "batch_size"), "--batch-size (B)"),
    (("settings", "max_new_tokens"), "--max-new-tokens (T_max)"),
    (("settings", "top_k"), "--top-k"),
    (("settings", "temperature"), "--temperature (τ)"),
    (("settings", "prompt_template"), "--template / --template-file"),
    (("settings", "prompt_template_sha256"), "the prompt template's text (--template-file)"),
    (("settings", "label_fields"), "--label-fields"),
    (("settings", "text_field"), "--text-field"),
    (("settings", "limit"), "--limit"),
    (("settings", "max_texts"), "--max-texts"),
    (("settings", "max_reference_tokens"), "--max-reference-tokens"),
    (("settings", "options"), "the mechanism's options"),
    (("guarantee", "seeded"), "whether the run is seeded (--seed)"),
    (("references",), "the number of references read (did the corpus change?)"),
    (("references_used",), "the number of references used (did the corpus change?)"),
    (("texts",), "the number of batches (did the corpus change?)"),
)
"""Header fields compared on a rerun, in this order, with the name a refusal gives them."""

_MISSING = object()


def partition_path(out: str | os.PathLike[str]) -> Path:
    """The private sidecar of ``out``."""
    return Path(f"{os.fspath(out)}{PARTITION_SUFFIX}")


def _normal(obj: Any) -> Any:
    """``obj`` as it reads back from an output line (tuples as lists, infinities as strings, ...)."""
    return json.loads(encode_record(obj))


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, Mapping) or key not in obj:
            return _MISSING
        obj = obj[key]
    return obj


def _show(value: Any) -> str:
    return "absent" if value is _MISSING else json.dumps(value, ensure_ascii=False)


def header_difference(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """The first difference between two synthesis headers (the ``{"kind": "synthesis", ...}`` objects), in words:
    ``"--epsilon is 6.0 there, 5.0 here"``; None when they are equal. Headers hold public settings only."""
    old, new = _normal(old), _normal(new)
    if old == new:
        return None
    for path, name in SETTING_NAMES:
        a, b = _at(old, path), _at(new, path)
        if a != b:
            return f"{name} is {_show(a)} there, {_show(b)} here"
    for key in sorted(set(old) | set(new)):
        if old.get(key, _MISSING) != new.get(key, _MISSING):
            return f"its header field {key!r} differs from this run's (written by another dpinfer version?)"
    return "its header differs from this run's"


@dataclass
class SynthesisOutput:
    """The append-only output of one synthesis job (see the module docstring).

    :meth:`open` (under :meth:`lock`) reads the header and the batches done and cuts a torn last line;
    :meth:`check` refuses a header or a partition that is not this run's; :meth:`start` writes the sidecar and the
    header; :meth:`append` writes one text; :meth:`finish` deletes the sidecar."""

    path: str | os.PathLike[str]
    header: dict[str, Any] | None = None
    """The ``{"kind": "synthesis", ...}`` object of the first line, or None for a new (or empty) file."""
    done: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Batch index → the text record read back (or appended)."""
    truncated_bytes: int = 0
    settled_torn: dict[str, Any] | None = None
    """The error record that replaced a torn last line holding part of a text, if any."""
    _lock: Any = field(default=None, repr=False)

    @staticmethod
    def key_of(record: Mapping[str, Any]) -> int:
        return int(record["batch"])

    @property
    def sidecar(self) -> Path:
        return partition_path(self.path)

    def lock(self, job: str = "dpinfer synth") -> None:
        """Take the run's exclusive lock on ``OUT`` (:class:`~dpinfer.jobs.OutputLock`); refuses, in one
        line, an ``OUT`` another run is writing. :meth:`close` releases it."""
        self._lock = OutputLock(self.path, job)
        self._lock.acquire()

    def close(self) -> None:
        """Release the lock; an ``OUT`` this run created and never wrote to is removed (with its sidecar)."""
        if self._lock is not None and self._lock.release():
            self.finish()
        self._lock = None

    def open(self) -> int:
        """Read the header and the text lines, then cut a torn last line; the number of texts done. Refuses (one
        line, never a line's content; the file is left as it is) a file whose first line is not a synthesis header,
        a line that is not a text record (or a torn text's error record), a repeated batch index."""
        p = Path(self.path)
        self.header, self.done, self.settled_torn, self.truncated_bytes = None, {}, None, 0
        if not p.exists():
            return 0
        tail = read_output_lines(p)
        seen: dict[int, int] = {}
        for k, (n, raw) in enumerate(tail.lines):
            obj = parse_line(raw)
            if k == 0:
                head = obj.get("dpinfer") if isinstance(obj, dict) else None
                if n != 1 or not isinstance(head, dict) or head.get("kind") != "synthesis":
                    raise InvalidInputError(f"--out {p} is not the output of dpinfer synth (its first line is not a "
                                            "synthesis header); use another --out, or delete the file")
                self.header = head
                continue
            batch = obj.get("batch") if isinstance(obj, dict) else None
            if (isinstance(batch, bool) or not isinstance(batch, int) or batch < 0
                    or not isinstance(obj.get("text", obj.get("error")), str)):
                raise InvalidInputError(f"--out {p} line {n} is not a dpinfer synth text (a JSON object with a text "
                                        "and a batch index); use another --out, or delete the file")
            if batch in seen:
                raise InvalidInputError(f"--out {p} line {n} repeats batch {batch} of line {seen[batch]}: a batch is "
                                        "released once; it is not the output of one synth job")
            seen[batch] = n
            self.done[batch] = obj
        settle_tail(self, tail, "batch", "batch", what="a dpinfer synth line",
                    fresh=lambda b: (self.header is not None and isinstance(b, int) and not isinstance(b, bool)
                                     and b >= 0 and b not in self.done))
        return len(self.done)

    def check(self, header: Mapping[str, Any], partition_sha256: str) -> None:
        """Refuse, in one line, an ``OUT`` that is not this run's: other settings in its header, a batch index
        beyond this run's plan, or (texts there but not all) a partition that differs from the sidecar's or no
        sidecar. ``header`` is this run's ``{"dpinfer": {...}}``."""
        p = Path(self.path)
        mine = header["dpinfer"]
        batches = int(mine["texts"])
        if self.header is not None:
            diff = header_difference(self.header, mine)
            if diff is not None:
                raise ConfigurationError(f"--out {p} was started with other settings: {diff}; use another --out, or "
                                         f"delete {p} (and {self.sidecar.name} if present) to start over")
        beyond = sorted(b for b in self.done if b >= batches)
        if beyond:
            raise InvalidInputError(f"--out {p} holds batch {beyond[0]}, beyond this run's {batches} batches; use "
                                    "another --out, or delete the file")
        if not self.done or len(self.done) == batches:
            return  # nothing released yet (any partition will do), or nothing left to release
        side = self.sidecar
        redo = (f"delete {p} to start over, but only if none of its {len(self.done)} texts was shared (a new run "
                "uses every reference again)")
        if not side.exists():
            raise ConfigurationError(f"--out {p} holds {len(self.done)} of {batches} texts but its partition file "
                                     f"{side.name} is missing: cannot check that the corpus is unchanged, and a "
                                     f"changed corpus would release a reference twice; restore {side.name} or {redo}")
        try:
            data = json.loads(side.read_bytes().decode("utf-8"))
            digest = data["dpinfer"]["sha256"] if data["dpinfer"]["kind"] == PARTITION_KIND else None
        except (OSError, UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError):
            digest = None
        if not isinstance(digest, str):
            raise InvalidInputError(f"{side} is not a dpinfer synth partition file; restore it or {redo}")
        if digest != partition_sha256:
            raise ConfigurationError(f"the corpus changed since --out {p} was started (its partition into batches "
                                     f"differs from {side.name}'s): resuming could release a reference in two "
                                     f"batches; rerun on the unchanged corpus, use another --out, or {redo}")

    def remaining(self, header: Mapping[str, Any]) -> int:
        """Batches of ``header``'s plan not in ``OUT`` yet."""
        return int(header["dpinfer"]["texts"]) - len(self.done)

    def start(self, header: Mapping[str, Any], partition_sha256: str) -> None:
        """Before the first text of this run: the sidecar (atomically, mode 0600; rewritten while no text is out),
        then the header line when ``OUT`` has none."""
        if not self.done:
            body = {"dpinfer": {"kind": PARTITION_KIND, "note": PARTITION_NOTE, "out": Path(self.path).name,
                                "batches": int(header["dpinfer"]["texts"]), "sha256": partition_sha256}}
            atomic_write_text(self.sidecar, json.dumps(body, ensure_ascii=False) + "\n")
        if self.header is None:
            self._write(encode_record(header))
            self.header = dict(header["dpinfer"])

    def append(self, record: Mapping[str, Any]) -> None:
        """Append one text record (its ``batch`` index first, its text, ...) as one line, durably."""
        self._write(encode_record(release_order("batch", record)))
        self.done[int(record["batch"])] = dict(record)

    def finish(self) -> bool:
        """Delete the sidecar (every batch is released); whether there was one."""
        try:
            self.sidecar.unlink()
        except FileNotFoundError:
            return False
        return True

    def _write(self, line: bytes) -> None:
        fd = self._lock.fd if self._lock is not None else None
        if fd is not None:
            write_line(fd, line)
        else:
            append_line(self.path, line)


def run_synthesis_job(out: SynthesisOutput, total: int, header: Mapping[str, Any], partition_sha256: str,
                      texts: Callable[[set[int]], Iterable[Any]], *, job: str,
                      hold: Callable[[bool], Reservation | None], record: Callable[[Any], Mapping[str, Any]],
                      check: Callable[[list[int]], None] | None = None,
                      on_release: Callable[[int, Mapping[str, Any]], None] | None = None) -> JobRun:
    """The one loop of a synthesis job (``dpinfer synth --out`` and the service's ``POST /v1/synth``): the
    ``total`` batches not yet in ``out``, through the corpus jobs' loop (:func:`~dpinfer.jobs.run_resumable`: the
    lock, the read-back, the torn-line rule, ``check(todo)`` before anything runs, one durable line per text).

    ``hold(resumed)``: the run's charge, reserved at the plan's ex-ante guarantee before the model loads (a
    :class:`~dpinfer.accounting.charge.Reservation`), or None (no ledger; or ``resumed``: ``out`` already holds texts,
    charged by the run it resumes). ``texts(skip)``: the synthetic texts of the batches not in ``skip``, in the
    order they finish (the model loads when it is called, before the header is written); ``record(text)``: a text's
    line. A text in ``out`` (or part of one) is released: the charge is committed however the run ends; a run that
    released none cancels it."""
    def generate(todo: Iterator[int]) -> Iterator[Mapping[str, Any]]:
        batches = set(todo)
        held = hold(bool(out.done))
        released = False
        with charge(held, None, scope="corpus"):  # committed when the run ends, cancelled when it raises
            stream = texts(set(range(total)) - batches)
            out.start(header, partition_sha256)  # the private partition file, then the header line (before any text)
            for text in stream:
                if held is not None and not released:
                    held.releasing()  # from here a cancel commits: part of the release may have left
                released = True
                yield record(text)
            if held is not None and not released:
                held.cancel()  # the run ended without a text: nothing was released

    return run_resumable(out, range(total), generate, job=job, key=lambda b: b, check=check, on_release=on_release)
