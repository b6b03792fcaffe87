"""The decoding engine: jobs submitted, one token per :meth:`Engine.step` for every admitted job.

Modules: :mod:`~dpinfer.engine.job` (a job and its output), :mod:`~dpinfer.engine.scheduler` (admission and the
batch's public shapes), :mod:`~dpinfer.engine.runner` (the slot runner, where rule 2 is enforced),
:mod:`~dpinfer.engine.dynamic` (the dynamic-cache runner), :mod:`~dpinfer.engine.prefill`,
:mod:`~dpinfer.engine.cache` (slot KV cache, decode step), :mod:`~dpinfer.engine.head` (the split output head) and
:mod:`~dpinfer.engine.core` (:class:`Engine`).
"""

from dpinfer.engine.cache import COMPILE_CPU_DEFAULT, DecodeStep, SlotCache, resolve_compile
from dpinfer.engine.core import Engine, EngineStream, StepOutput
from dpinfer.engine.head import SPLIT_HEAD_MODEL_TYPES
from dpinfer.engine.job import EngineOutput, Job, JobStatus, StepEvent
from dpinfer.engine.prefill import MIN_SHARED_PREFIX, PER_ROW_PREFILL, PrefixKV, PrefixStore, common_prefix_length
from dpinfer.engine.scheduler import CAPACITY_STEP, DEFAULT_MAX_ROWS, Pool, Scheduler, bucket_capacity, public_width

__all__ = [
    "CAPACITY_STEP", "COMPILE_CPU_DEFAULT", "DEFAULT_MAX_ROWS", "MIN_SHARED_PREFIX", "PER_ROW_PREFILL",
    "SPLIT_HEAD_MODEL_TYPES", "DecodeStep", "Engine", "EngineOutput", "EngineStream", "Job", "JobStatus",
    "Pool", "PrefixKV", "PrefixStore", "Scheduler", "SlotCache", "StepEvent", "StepOutput", "bucket_capacity",
    "common_prefix_length", "public_width", "resolve_compile",
]
