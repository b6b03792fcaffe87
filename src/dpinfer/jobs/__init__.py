"""Resumable jobs over JSONL files: one loop (:func:`run_resumable`) for every corpus job, the file rules they share
(:class:`OutputLock`, :class:`ReleaseDigests`) and the id-keyed corpus side (:mod:`dpinfer.jobs.corpus`).

``dpinfer sanitize --corpus``, ``rag ask --questions``, ``protect-prompt --prompts`` and ``synth --out`` all run
:func:`run_resumable` (docs/corpus.md).
"""

from __future__ import annotations

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
from dpinfer.jobs.files import ALLOW_FLAG, DIGESTS_SUFFIX, OutputLock, ReleaseDigests, check_rerelease
from dpinfer.jobs.resumable import (
    TORN_ERROR,
    Charge,
    JobOutput,
    JobRun,
    is_error,
    parse_prefix,
    release_order,
    run_resumable,
    settle_torn,
)

__all__ = ["ALLOW_FLAG", "DIGESTS_SUFFIX", "TORN_ERROR", "Charge", "CorpusOutput", "JobOutput", "JobRun", "OutputLock",
           "Record", "ReleaseDigests", "check_corpus_paths", "check_rerelease", "id_key", "is_error", "locked_output",
           "parse_prefix", "pending", "per_record_budget", "read_corpus", "release_order", "run_corpus_job",
           "run_resumable", "settle_torn"]
