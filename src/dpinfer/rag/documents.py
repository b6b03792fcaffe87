"""Documents for a RAG store: files (``.jsonl`` / ``.csv`` records, ``.txt`` / ``.md`` files) and in-memory records,
each checked before anything is stored; refusals name the file or the record's index, never its content."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dpinfer.errors import InvalidInputError
from dpinfer.io import decode_text, input_file
from dpinfer.references import load_references

__all__ = ["TEXT_SUFFIXES", "read_documents", "read_records"]

TEXT_SUFFIXES = (".jsonl", ".csv", ".txt", ".md")


def read_records(texts_or_records: Sequence[str] | Sequence[Mapping[str, Any]], *, ids: Sequence[str] | None = None,
                 text_field: str = "text", id_field: str | None = None) -> tuple[list[str], Sequence[str] | None]:
    """(texts, ids) of strings, or of records (mappings) whose ``text_field`` holds the text and, optionally,
    ``id_field`` the id (``ids`` given win)."""
    if isinstance(texts_or_records, (str, bytes)) or not isinstance(texts_or_records, Sequence):
        raise InvalidInputError("add() takes a list of texts or of records (mappings)")
    texts: list[str] = []
    rec_ids: list[str] = []
    for i, item in enumerate(texts_or_records):
        if isinstance(item, str):
            texts.append(item)
            continue
        if not isinstance(item, Mapping):
            raise InvalidInputError(f"document {i} is a {type(item).__name__}, not a string or a mapping")
        if text_field not in item or not isinstance(item[text_field], str):
            raise InvalidInputError(f"record {i}: no text field {text_field!r} holding a string")
        texts.append(item[text_field])
        if id_field is not None:
            if id_field not in item or item[id_field] in (None, ""):
                raise InvalidInputError(f"record {i}: no id field {id_field!r}")
            rec_ids.append(str(item[id_field]))
    if ids is None and id_field is not None:
        ids = rec_ids
    return texts, ids


def read_documents(paths: Sequence[str | Path], *, text_field: str = "text",
                   id_field: str | None = None) -> tuple[list[str], list[str] | None]:
    """Texts (and ids when ``id_field`` is given) of ``.jsonl`` / ``.csv`` records and ``.txt`` / ``.md`` files.

    Refused with a one-line message naming the file (never its content): a missing file, a folder, another suffix,
    a binary or non-UTF-8 file, an empty file, a record without the field.
    """
    if isinstance(paths, (str, Path)) or not paths:
        raise InvalidInputError("give one or more files to add")
    texts: list[str] = []
    ids: list[str] = []
    for raw in paths:
        p = input_file(raw, "document")
        suffix = p.suffix.lower()
        if suffix not in TEXT_SUFFIXES:
            raise InvalidInputError(f"{p.name}: give .jsonl, .csv, .txt or .md files (got {suffix or 'no suffix'})")
        if suffix in (".jsonl", ".csv"):
            refs = load_references(p, text_field=text_field, label_fields=(id_field,) if id_field else ())
            for r in refs:
                texts.append(r.text)
                if id_field:
                    ids.append(r.labels[id_field])
            continue
        text = decode_text(p.read_bytes(), p.name)
        texts.append(text)
        if id_field:
            ids.append(p.stem)
    for i, t in enumerate(texts):
        if not t.strip():
            raise InvalidInputError(f"document {i} is empty (or only white space)")
    return texts, (ids if id_field else None)
