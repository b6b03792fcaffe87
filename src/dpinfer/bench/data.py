"""The evaluation data the benchmarks read (the shared data folder, :func:`dpinfer.paths.data_file`): TAB-ECHR
documents with their gold spans and CommonsenseQA questions."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpinfer.errors import DataNotFoundError, InvalidInputError
from dpinfer.paths import data_file
from dpinfer.taggers.base import Span


@dataclass
class Doc:
    doc_id: str
    text: str
    spans: list[Span]


def load_tab(path: str | Path | None, n: int, max_chars: int, skip: int = 0) -> list[Doc]:
    """The first ``n`` TAB documents (after ``skip``), cut to ``max_chars`` at a paragraph boundary."""
    p = Path(path) if path else data_file("tab", "tab_echr_docs.jsonl")
    if not p.is_file():
        raise DataNotFoundError(f"TAB data not found: {p}")
    docs: list[Doc] = []
    with p.open(encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i < skip:
                continue
            if len(docs) >= n:
                break
            rec = json.loads(line)
            text = rec["text"]
            cut = len(text)
            if cut > max_chars:  # at the last paragraph break, or failing that the last space, before max_chars
                cut = text.rfind("\n\n", 0, max_chars)
                if cut < max_chars // 2:
                    cut = max(text.rfind(" ", 0, max_chars), max_chars // 2)
            spans = [Span(m["start_offset"], m["end_offset"], m["entity_type"]) for m in rec["entity_mentions"]
                     if m["end_offset"] <= cut]
            docs.append(Doc(rec["doc_id"], text[:cut], spans))
    return docs


def mention_pool(docs: list[Doc], exclude: str) -> dict[str, list[str]]:
    """Gold mention strings per label from every document except ``exclude``."""
    pool: dict[str, set[str]] = {}
    for d in docs:
        if d.doc_id == exclude:
            continue
        for s in d.spans:
            pool.setdefault(s.label, set()).add(d.text[s.start:s.end])
    return {k: sorted(v) for k, v in pool.items()}


def load_csqa(dataset: str, n: int) -> list[dict[str, Any]]:
    """The first ``n`` CSQA records ``{question, choices: [5 texts], answer: index}``."""
    path = data_file("csqa", "csqa_dev.jsonl") if dataset == "csqa" else Path(dataset)
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                labels, texts = rec["choices"]["label"], rec["choices"]["text"]
                out.append({"question": rec["question"], "choices": list(texts),
                            "answer": labels.index(rec["answerKey"])})
            except (ValueError, KeyError, TypeError):
                raise InvalidInputError(f"{path.name}, line {i}: not a CSQA record "
                                        "({question, choices: {label, text}, answerKey})") from None
            if len(out) == n:
                break
    if not out:
        raise InvalidInputError(f"{path} holds no CSQA records")
    return out
