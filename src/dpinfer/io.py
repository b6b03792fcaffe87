"""File parsing and atomic IO, shared by every pipeline, the command line, the server and the benchmarks.

* Reading: :func:`input_file` (a readable regular file, or a one-line refusal), :func:`decode_text` (UTF-8 text of at
  most :data:`MAX_TEXT_BYTES`), :func:`sniff_text_file` (a cheap look at a large data file before the model loads),
  :func:`read_jsonl` (records of a JSONL file, with the line number of a bad one).
* Writing: :func:`check_output_path` (refuse, before any work, a path that cannot be written or that is the input),
  :func:`atomic_open` / :func:`atomic_write_text` / :func:`atomic_write_json` (a temporary file in the same folder,
  then :func:`os.replace`: no partial file, mode 0600), :func:`append_line` / :func:`append_jsonl` (one durable
  line: one ``write`` on an ``O_APPEND`` descriptor, then ``fsync``), :func:`read_output_lines` (the complete lines
  of an append-only file and its torn tail), :func:`rescue_write_text` (a result that could not be written where
  asked is saved rather than lost).

Every message names paths, sizes and line numbers only, never file content (rule 5).

>>> decode_text(b"ok", "doc.txt")
'ok'
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from dpinfer._json import plain
from dpinfer.errors import ConfigurationError, InvalidInputError

MAX_TEXT_BYTES = 4 * 1024 * 1024
"""Largest document or prompt file read whole (4 MiB, far beyond any supported model's context window)."""


def decode_text(data: bytes, where: str) -> str:
    """``data`` as UTF-8 text, or a one-line refusal naming ``where`` (never the content): larger than
    :data:`MAX_TEXT_BYTES`, binary (NUL bytes), not UTF-8, or empty."""
    if len(data) > MAX_TEXT_BYTES:
        raise InvalidInputError(f"{where} is larger than {MAX_TEXT_BYTES // (1024 * 1024)} MiB; split it into parts")
    if b"\x00" in data:
        raise InvalidInputError(f"{where} looks binary (it contains NUL bytes); give a UTF-8 text file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{where} is not valid UTF-8 text (bad byte at offset {exc.start})") from None
    if not text.strip():
        raise InvalidInputError(f"{where} is empty")
    return text


# ------------------------------------------------------------------------------------------------------ files
def input_file(source: str | os.PathLike[str], what: str = "input") -> Path:
    """``source`` as a readable regular file; says whether it is missing, a folder or something else."""
    p = Path(source)
    if p.is_dir():
        raise InvalidInputError(f"{p} is a folder; give the {what} file")
    if not p.exists():
        raise InvalidInputError(f"no such file: {p}")
    if not p.is_file():
        raise InvalidInputError(f"{p} is not a regular file; give the {what} as a file")
    if not os.access(p, os.R_OK):
        raise InvalidInputError(f"{p} is not readable (check its permissions)")
    return p


def sniff_text_file(source: str | os.PathLike[str], what: str = "data") -> Path:
    """``source`` as a regular, non-empty file whose first 64 KiB are UTF-8 text without NUL bytes (a cheap check
    of a large data file before any model loads; the loader still checks the rest)."""
    p = input_file(source, what)
    with p.open("rb") as f:
        head = f.read(64 * 1024)
    if not head.strip():
        raise InvalidInputError(f"{p} is empty")
    if b"\x00" in head:
        raise InvalidInputError(f"{p} looks binary (it contains NUL bytes); give a UTF-8 text file")
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{p} is not valid UTF-8 text (bad byte at offset {exc.start})") from None
    return p


def check_output_path(path: str | os.PathLike[str], *, inputs: Iterable[str | os.PathLike[str] | None] = (),
                      option: str = "--out") -> Path:
    """Refuse, before any work, an output path that cannot be written or that is one of ``inputs``.

    Refused: a folder, a path in a missing folder, a folder that cannot be written (probed by creating and removing a
    temporary file), an existing file that is read-only or not a regular file, and the input itself or a hard or
    symbolic link to it (same device and inode): writing there would overwrite the private document.
    """
    p = Path(path)
    if not str(path).strip():
        raise ConfigurationError(f"{option} is empty; give a file path")
    if p.is_dir():
        raise ConfigurationError(f"{option} {p} is a folder; give a file path inside it")
    folder = p.parent
    if not folder.exists():
        raise ConfigurationError(f"{option} {p}: the folder {folder} does not exist; create it first")
    if not folder.is_dir():
        raise ConfigurationError(f"{option} {p}: {folder} is not a folder")
    if p.exists():
        if not p.is_file():
            raise ConfigurationError(f"{option} {p} exists and is not a regular file; give a file path")
        for inp in inputs:
            if inp is None or str(inp) == "-":
                continue
            with contextlib.suppress(OSError):
                if os.path.samefile(p, inp):
                    raise ConfigurationError(f"{option} {p} is the input file (or a link to it); writing there would "
                                             "overwrite the private input: choose another path")
        if not os.access(p, os.W_OK):
            raise ConfigurationError(f"{option} {p} exists and is read-only; choose another path")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{p.name}.", suffix=".probe")
    except OSError as exc:
        raise ConfigurationError(f"{option} {p}: cannot write in {folder} ({exc.strerror or 'permission denied'})"
                                 ) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return p


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str]) -> Iterator[IO[str]]:
    """Open a temporary file next to ``path`` for writing; on success it replaces ``path`` in one step
    (:func:`os.replace`), on any error or interruption it is removed: no partial output and no leftover file.
    The file is created with mode 0600 (it holds output derived from private data)."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_open`)."""
    with atomic_open(path) as f:
        f.write(text)


def rescue_write_text(text: str, suffix: str) -> Path | None:
    """Save ``text`` to a new private file (mode 0600) in the temporary folder; its path, or None if that fails too."""
    try:
        fd, name = tempfile.mkstemp(prefix="dpinfer-rescue-", suffix=suffix)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError:
        return None
    return Path(name)


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON (UTF-8, non-ASCII kept, NaN refused) to ``path`` atomically, with a final newline."""
    atomic_write_text(path, json.dumps(plain(obj), indent=indent, ensure_ascii=False, allow_nan=False) + "\n")


# ------------------------------------------------------------------------------------------------------ lines
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
    return (json.dumps(plain(dict(record)), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            + "\n").encode("utf-8")


def append_jsonl(path: str | os.PathLike[str], record: Mapping[str, Any]) -> None:
    """Append ``record`` to ``path`` as one durable JSONL line (:func:`encode_record`, :func:`append_line`)."""
    append_line(path, encode_record(record))


def read_jsonl(path: str | os.PathLike[str], what: str = "JSONL file") -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line of the JSONL file ``path``; a line that is not a JSON object is
    refused with its number (never its content)."""
    p = input_file(path, what)
    with p.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise InvalidInputError(f"{p}:{number}: not valid UTF-8 (bad byte at offset {exc.start})") from None
            except json.JSONDecodeError as exc:
                raise InvalidInputError(f"{p}:{number}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise InvalidInputError(f"{p}:{number}: expected a JSON object, got {type(obj).__name__}")
            yield number, obj
