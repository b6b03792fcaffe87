"""The release protocol: what a result may publish, and what stays with the operator.

Every result of a task (a sanitised document, a synthetic corpus, a RAG answer, a protected prompt) has

* ``release() -> dict``: the public record, public **by construction**: the released text, the ex-ante guarantee
  and the public settings it was made under. Never a timing, a per-step statistic, a seed, the input text or anything
  else computed from the private input (rules 1, 3 and 5 of the project);
* ``diagnostics() -> dict``: the rest (timings, token counts of the input, data-dependent statistics), for
  ``--debug-stats`` and benchmarks, always under a :data:`DIAGNOSTICS_WARNING`.

Interfaces (the command line, the server, the benchmarks) print or send ``release()`` as it is: none of them deletes
keys from it or patches its strings, so the privacy rule is enforced once, where the result builds its release.
:func:`check_release` is the shared test of that rule (it refuses a release holding a forbidden key, at any depth).

>>> class Toy:
...     def release(self): return {"text": "a rewrite", "guarantee": {"epsilon": 1.0}, "settings": {"top_k": 5}}
...     def diagnostics(self): return {"seconds": 0.4}
>>> isinstance(Toy(), Release), check_release(Toy().release())
(True, {'text': 'a rewrite', 'guarantee': {'epsilon': 1.0}, 'settings': {'top_k': 5}})
>>> forbidden_keys({"text": "x", "settings": {"seed": 3}, "debug": {}})
['debug', 'settings.seed']
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

from dpinfer.errors import DPInferError

FORBIDDEN_KEYS: frozenset[str] = frozenset({
    # timing (wall time depends on the private input)
    "seconds", "generation_seconds", "prefill_seconds", "decode_seconds", "load_seconds", "elapsed", "elapsed_s",
    "timing", "timings", "tokens_per_second", "profile",
    # randomness (the guarantee holds only while a seed is secret)
    "seed",
    # per-step / data-dependent statistics
    "data_dependent", "debug", "diagnostics", "stats", "step_stats", "lambdas", "divergences",
    # the private input and what is read off it
    "input", "input_text", "original_prompt", "question", "spans", "prompt_tokens", "doc_ids",
})
"""Keys that never appear in a release, at any depth (see the module docstring)."""

DIAGNOSTICS_WARNING = ("diagnostics are data-dependent: they are computed from the private input (timings, lengths, "
                       "per-step statistics), are not covered by the guarantee, and must not be released")
"""The warning every ``diagnostics()`` output carries under the key ``"warning"``."""


class ReleaseError(DPInferError):
    """A release holds a key that only diagnostics may hold (a programming error: fail closed)."""


@runtime_checkable
class Release(Protocol):
    """A task's result: ``release()`` is public by construction, ``diagnostics()`` is everything else."""

    def release(self) -> dict[str, Any]:
        """The public record: the released text, the guarantee, the public settings."""
        ...

    def diagnostics(self) -> dict[str, Any]:
        """Data-dependent figures (timings, lengths, statistics) with :data:`DIAGNOSTICS_WARNING`; never released."""
        ...


def _walk(obj: Any, path: str) -> Iterator[str]:
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            here = f"{path}.{key}" if path else str(key)
            if str(key) in FORBIDDEN_KEYS:
                yield here
            else:
                yield from _walk(value, here)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _walk(value, f"{path}[{i}]")


def forbidden_keys(release: Mapping[str, Any], *, allow: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """The dotted paths of every forbidden key in ``release`` (sorted); ``allow`` exempts public keys that share a
    forbidden name in one task (say which and why where it is used)."""
    return sorted(p for p in _walk(release, "") if p.rsplit(".", 1)[-1].split("[", 1)[0] not in allow)


def check_release(release: Mapping[str, Any], *, allow: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    """``release`` as a dict, or :class:`ReleaseError` naming the forbidden keys it holds (names only, no values)."""
    bad = forbidden_keys(release, allow=allow)
    if bad:
        raise ReleaseError(f"a release may not hold {', '.join(bad)}: move them to diagnostics()")
    return dict(release)


def with_warning(diagnostics: Mapping[str, Any]) -> dict[str, Any]:
    """``diagnostics`` with :data:`DIAGNOSTICS_WARNING` first (for ``diagnostics()`` implementations)."""
    return {"warning": DIAGNOSTICS_WARNING, **{k: v for k, v in diagnostics.items() if k != "warning"}}


def release_of(result: Any) -> dict[str, Any]:
    """``result.release()`` for a :class:`Release`, a mapping as it is; anything else is refused."""
    if isinstance(result, Release):
        return result.release()
    if isinstance(result, Mapping):
        return dict(result)
    raise ReleaseError(f"{type(result).__name__} has no release(); results must implement dpinfer.release.Release")


def diagnostics_of(result: Any) -> dict[str, Any]:
    """``result.diagnostics()`` for a :class:`Release`, else an empty dict."""
    return result.diagnostics() if isinstance(result, Release) else {}
