"""The resumable-job loop, under its older import path: it lives in :mod:`dpinfer.jobs` (:func:`run_resumable` in
:mod:`dpinfer.jobs.resumable`, the file rules in :mod:`dpinfer.jobs.files`, line IO in :mod:`dpinfer.io`)."""

from __future__ import annotations

from dpinfer.io import OutputLines, append_line, encode_record, read_output_lines, write_line
from dpinfer.jobs.files import (
    ALLOW_FLAG,
    DIGESTS_KIND,
    DIGESTS_NOTE,
    DIGESTS_SUFFIX,
    OutputLock,
    ReleaseDigests,
    check_rerelease,
)
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

__all__ = ["ALLOW_FLAG", "DIGESTS_KIND", "DIGESTS_NOTE", "DIGESTS_SUFFIX", "TORN_ERROR", "Charge", "JobOutput",
           "JobRun", "OutputLines", "OutputLock", "ReleaseDigests", "append_line", "check_rerelease", "encode_record",
           "is_error", "parse_prefix", "read_output_lines", "release_order", "run_resumable", "settle_torn",
           "write_line"]
