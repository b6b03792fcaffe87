"""The tagger registry (Presidio style): taggers by name.

>>> available_taggers()
('presidio', 'regex', 'spans')
>>> get_tagger("regex").name
'regex'
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from dpinfer.errors import InvalidInputError
from dpinfer.taggers.base import Tagger

TaggerFactory = Callable[..., Tagger]

_LOCK = threading.Lock()
_FACTORIES: dict[str, TaggerFactory] = {}


def register_tagger(name: str, factory: TaggerFactory, *, replace: bool = False) -> None:
    """Register ``factory(**kw) -> Tagger`` under ``name`` (``replace=True`` to overwrite an existing entry)."""
    if not isinstance(name, str) or not name:
        raise InvalidInputError("tagger name must be a non-empty string")
    if not callable(factory):
        raise InvalidInputError(f"tagger factory for {name!r} is not callable")
    with _LOCK:
        if name in _FACTORIES and not replace:
            raise InvalidInputError(f"a tagger named {name!r} is already registered (pass replace=True)")
        _FACTORIES[name] = factory


def available_taggers() -> tuple[str, ...]:
    """Names of the registered taggers, sorted. ``presidio`` is listed even if the ``pii`` extra is not installed:
    :func:`get_tagger` then raises :class:`~dpinfer.errors.MissingDependencyError` with the pip command."""
    with _LOCK:
        return tuple(sorted(_FACTORIES))


def get_tagger(name: str, **kwargs: Any) -> Tagger:
    """A new tagger ``name`` built with ``kwargs`` (e.g. ``get_tagger("spans", spans="spans.json")``).

    Raises :class:`~dpinfer.errors.InvalidInputError` for an unknown name and
    :class:`~dpinfer.errors.MissingDependencyError` when the tagger's optional dependencies are missing.
    """
    with _LOCK:
        factory = _FACTORIES.get(name)
        names = sorted(_FACTORIES)
    if factory is None:
        raise InvalidInputError(f"unknown tagger {name!r}; available: {', '.join(names)}")
    return factory(**kwargs)


def _presidio(**kwargs: Any) -> Tagger:
    from dpinfer.taggers.presidio_tagger import PresidioTagger, require_pii

    require_pii()
    return PresidioTagger(**kwargs)


def _regex(**kwargs: Any) -> Tagger:
    from dpinfer.taggers.regex_tagger import RegexTagger

    return RegexTagger(**kwargs)


def _spans(**kwargs: Any) -> Tagger:
    from dpinfer.taggers.spans import SpansTagger

    return SpansTagger(**kwargs)


register_tagger("presidio", _presidio)
register_tagger("regex", _regex)
register_tagger("spans", _spans)
