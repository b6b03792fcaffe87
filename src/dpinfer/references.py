"""Private reference corpora for synthesis: one :class:`Reference` per record (its text is private, its labels are
public), read from a ``.jsonl`` or ``.csv`` file (:func:`load_references`), and the data-independent partition into
disjoint batches (:func:`partition`).

The partition depends on the seed, the labels and the order of the records only, never on their text, so the texts
of different batches compose in parallel (docs/synthesize.md).
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpinfer.errors import ConfigurationError, DataNotFoundError, InvalidInputError
from dpinfer.io import input_file


@dataclass(frozen=True)
class Reference:
    """One private record: its ``text`` (private) and public ``labels``."""

    text: str
    labels: Mapping[str, str] = field(default_factory=dict)


def _field_error(name: str, where: str, count: int, kind: str) -> InvalidInputError:
    return InvalidInputError(f"{where}: no field {name!r} ({kind} has {count} field{'s' if count != 1 else ''}); "
                             "check --text-field / --label-fields")


def load_references(path: str | Path, *, text_field: str, label_fields: Sequence[str] = (),
                    limit: int | None = None) -> list[Reference]:
    """Records of a ``.jsonl`` or ``.csv`` file (a CSV's first line is its header row).

    Every error is an :class:`~dpinfer.errors.InvalidInputError` (or :class:`~dpinfer.errors.DataNotFoundError` for
    a missing file) that names the file, the line and the field asked for, with counts: never the file's content
    (a headerless CSV's first record would otherwise be read as its field names).
    """
    _check_fields(text_field, label_fields, limit)
    name, suffix, raw = _read_corpus(path)
    fields = (text_field, *label_fields)
    rows = _jsonl_rows(raw, name) if suffix == ".jsonl" else _csv_rows(raw, name, fields)
    refs: list[Reference] = []
    for row, where in rows:
        refs.append(_reference(row, where, text_field, label_fields))
        if limit is not None and len(refs) >= limit:
            break
    return refs


def _check_fields(text_field: str, label_fields: Sequence[str], limit: int | None) -> None:
    if not isinstance(text_field, str) or not text_field:
        raise ConfigurationError("text_field must be a non-empty field name")
    if isinstance(label_fields, str) or not all(isinstance(f, str) and f for f in label_fields):
        raise ConfigurationError("label_fields must be a list of non-empty field names")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigurationError(f"limit must be an integer ≥ 1, got {limit!r}")


def _read_corpus(path: str | Path) -> tuple[str, str, str]:
    """The file's name, its suffix (``.jsonl`` or ``.csv``) and its text (UTF-8, no NUL byte)."""
    p = Path(path)
    if not p.exists() and not p.is_dir():
        raise DataNotFoundError(f"no such file: {p}")
    p = input_file(p, "corpus")
    suffix = p.suffix.lower()
    if suffix not in (".jsonl", ".csv"):
        raise InvalidInputError(f"{p.name}: give a .jsonl or .csv file (got {suffix or 'no suffix'})")
    try:
        raw = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{p.name} is not valid UTF-8 text (bad byte at offset {exc.start})") from None
    except MemoryError:
        raise InvalidInputError(f"{p.name} is too large to read into memory; pass a smaller file") from None
    if "\x00" in raw:
        raise InvalidInputError(f"{p.name} looks binary (it contains NUL bytes)")
    return p.name, suffix, raw


def _reference(row: Mapping[Any, Any], where: str, text_field: str, label_fields: Sequence[str]) -> Reference:
    """One record's :class:`Reference` (its fields checked; a message names the field, never its value)."""
    for name in (text_field, *label_fields):
        if name not in row:
            raise _field_error(name, where, len(row), "the record")
    text = row[text_field]
    if not isinstance(text, str):
        raise InvalidInputError(f"{where}: field {text_field!r} is not a string "
                                f"({'missing value' if text is None else type(text).__name__})")
    labels: dict[str, str] = {}
    for name in label_fields:
        value = row[name]
        if value is None or isinstance(value, (dict, list)):
            raise InvalidInputError(f"{where}: label field {name!r} is "
                                    f"{'missing' if value is None else 'not a plain value'}")
        labels[name] = str(value)
    return Reference(text=text, labels=labels)


def _jsonl_rows(raw: str, name: str) -> Iterator[tuple[dict[str, Any], str]]:
    """Each JSON object of a ``.jsonl`` text and where it stands (blank lines skipped)."""
    seen = False
    for i, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        seen = True
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):  # JSONDecodeError, over-long integers, deep nesting
            raise InvalidInputError(f"{name}, line {i}: not valid JSON") from None
        if not isinstance(obj, dict):
            raise InvalidInputError(f"{name}, line {i}: each line must be a JSON object")
        yield obj, f"{name}, line {i}"
    if not seen:
        raise InvalidInputError(f"{name} holds no records")


def _csv_rows(raw: str, name: str, fields: Sequence[str]) -> Iterator[tuple[dict[str, str], str]]:
    """Each record of a CSV text (its header row naming ``fields``) and where it stands (empty lines skipped)."""
    csv.field_size_limit(1 << 28)
    reader = csv.reader(raw.removeprefix("\ufeff").splitlines())
    seen = False
    try:
        header = next(reader, None)
        if header is None or not any(h.strip() for h in header):
            raise InvalidInputError(f"{name} is empty (a CSV file needs a header row naming its fields)")
        missing = [f for f in fields if f not in header]
        if missing:
            raise InvalidInputError(
                f"{name}: no field {missing[0]!r} in the first line (the header row, {len(header)} columns); a CSV "
                "file must start with a header row naming its fields (check --text-field / --label-fields)"
            )
        if len(set(header)) != len(header):
            raise InvalidInputError(f"{name}: the header row names a column twice; give each column its own name")
        for row in reader:
            if not row:
                continue
            seen = True
            where = f"{name}, line {reader.line_num}"
            if len(row) != len(header):
                raise InvalidInputError(f"{where}: {len(row)} columns, the header row has {len(header)}")
            yield dict(zip(header, row, strict=True)), where
    except csv.Error:
        raise InvalidInputError(f"{name}, line {reader.line_num}: not valid CSV (check the quoting)") from None
    if not seen:
        raise InvalidInputError(f"{name} holds no records (only a header row)")


def partition(references: Sequence[Reference], batch_size: int, seed: int | None) -> tuple[list[list[int]], int]:
    """Disjoint batches of ``batch_size`` record indices, and the number of records left out.

    Records are grouped by their public labels (groups in order of first appearance), each group is shuffled with
    ``random.Random(seed)`` and cut into batches; a group's remainder (< B) is left out. Data-independent: the text of a
    record plays no part.

    >>> refs = [Reference("a", {"s": "1"}), Reference("b", {"s": "2"}), Reference("c", {"s": "1"})]
    >>> partition(refs, 2, seed=0)
    ([[0, 2]], 1)
    """
    groups: dict[tuple[tuple[str, str], ...], list[int]] = {}
    for i, ref in enumerate(references):
        groups.setdefault(tuple(sorted(ref.labels.items())), []).append(i)
    rng = random.Random(0 if seed is None else seed)
    batches, left = [], 0
    for members in groups.values():
        members = list(members)
        rng.shuffle(members)
        full = len(members) // batch_size * batch_size
        batches.extend(members[j:j + batch_size] for j in range(0, full, batch_size))
        left += len(members) - full
    return batches, left


def as_references(references: Sequence[Reference | str]) -> list[Reference]:
    """``references`` as :class:`Reference` objects (a plain string is a reference without labels); anything else, or
    an empty corpus, is refused in one line that never quotes a record."""
    if isinstance(references, (str, bytes)) or not isinstance(references, Sequence):
        raise InvalidInputError(f"references must be a list of Reference objects or strings, got "
                                f"{type(references).__name__}")
    for i, r in enumerate(references):
        if isinstance(r, Reference):
            if not isinstance(r.text, str) or not isinstance(r.labels, Mapping):
                raise InvalidInputError(f"reference {i}: Reference.text must be a string and .labels a mapping")
        elif not isinstance(r, str):
            raise InvalidInputError(f"reference {i} must be a Reference or a string, got {type(r).__name__}")
    refs = [r if isinstance(r, Reference) else Reference(r) for r in references]
    if not refs:
        raise InvalidInputError("the reference corpus is empty (no references)")
    return refs


def partition_sha256(references: Sequence[Reference], batches: Sequence[Sequence[int]]) -> str:
    """SHA-256 over a partition: each batch's references (text and labels) in batch order. Two runs with the
    same digest give every batch index the same references; a changed corpus, seed or label changes it.

    DERIVED FROM THE PRIVATE CORPUS (a guess of the whole corpus can be checked against it): keep it private,
    never in a release (``dpinfer synth`` keeps it in a private sidecar file next to ``--out``)."""
    h = hashlib.sha256(b"dpinfer synthesis partition v1\0")
    for b, members in enumerate(batches):
        h.update(f"batch {b} of {len(members)}\0".encode())
        for i in members:
            ref = references[i]
            item = json.dumps([ref.text, sorted(ref.labels.items())], ensure_ascii=False).encode("utf-8")
            h.update(len(item).to_bytes(8, "big"))
            h.update(item)
    return h.hexdigest()
