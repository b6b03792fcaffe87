"""Corpus jobs under their older import path: the id-keyed corpus side lives in :mod:`dpinfer.jobs.corpus`; what is
sanitisation's own is here (:func:`release_record`, the output line of one document)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dpinfer.errors import ConfigurationError
from dpinfer.io import OutputLines, append_line, encode_record, read_output_lines, write_line
from dpinfer.jobs.corpus import (
    CorpusOutput,
    Record,
    check_corpus_paths,
    id_key,
    locked_output,
    pending,
    per_record_budget,
    read_corpus,
    run_corpus_job,
)
from dpinfer.jobs.files import OutputLock
from dpinfer.jobs.resumable import JobRun
from dpinfer.release import release_of

if TYPE_CHECKING:
    from dpinfer.pipelines.sanitize import RecordOutcome

__all__ = ["CorpusOutput", "JobRun", "OutputLines", "OutputLock", "Record", "append_line", "check_corpus_paths",
           "encode_record", "id_key", "locked_output", "pending", "per_record_budget", "read_corpus",
           "read_output_lines", "release_record", "run_corpus_job", "write_line"]


def release_record(outcome: RecordOutcome) -> dict[str, Any]:
    """The output record of one :class:`~dpinfer.pipelines.sanitize.RecordOutcome`: ``{"id", "error"}`` or the id
    and the result's release (``release()``, else ``to_dict()`` without debug statistics: no spans, no input text,
    no seed)."""
    if outcome.error is not None or outcome.result is None:
        return {"id": outcome.id, "error": outcome.error or "no result"}
    res = outcome.result
    if getattr(res, "debug", False):
        raise ConfigurationError("a corpus record never carries debug statistics; run without debug")
    release = release_of(res) if hasattr(res, "release") else res.to_dict()
    return {"id": outcome.id, **release}
