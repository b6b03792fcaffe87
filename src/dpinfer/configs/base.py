"""What every task config shares: frozen dataclasses whose fields carry their ``--help`` text, turned into keyword
arguments, changed with :func:`dataclasses.replace`, and read into command-line options.

A field declared with :func:`option` carries its help text (and, where its default cannot tell, its argparse
``type``); :func:`add_options` adds one ``--flag`` per such field to a parser, with ``default=argparse.SUPPRESS`` so
that an option not given is absent from the namespace and the config's own default applies
(:meth:`Config.from_args`). Defaults come from :mod:`dpinfer.defaults`, checks from :mod:`dpinfer.checks` (in each
config's ``__post_init__``).

>>> import argparse
>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Toy(Config):
...     epsilon: float = option(2.0, help="the ε budget")
...     top_k: int | None = option(None, type=int, help="Top-k (None: full vocabulary)")
>>> p = argparse.ArgumentParser()
>>> add_options(p, Toy)
>>> Toy.from_args(p.parse_args(["--top-k", "5"])), Toy().to_kwargs()
(Toy(epsilon=2.0, top_k=5), {'epsilon': 2.0, 'top_k': None})
>>> Toy().replace(epsilon=4.0).epsilon
4.0
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from dpinfer.errors import ConfigurationError

C = TypeVar("C", bound="Config")

_MISSING: Any = dataclasses.MISSING


def option(default: Any = _MISSING, *, help: str = "", type: Callable[[str], Any] | None = None,
           flag: str | None = None, choices: Iterable[Any] | None = None, metavar: str | None = None,
           cli: bool = True, default_factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field with its command-line option: ``help`` text, argparse ``type`` (default: the default's
    type), ``flag`` (default ``--field-name``), ``choices``, ``metavar``; ``cli=False`` keeps it off the parser."""
    meta = {"help": help, "type": type, "flag": flag, "choices": tuple(choices) if choices is not None else None,
            "metavar": metavar, "cli": cli}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


class Config:
    """Mixin of the task configs (frozen dataclasses): keyword arguments in, keyword arguments out."""

    def to_kwargs(self) -> dict[str, Any]:
        """Field name → value (shallow: nested values as they are)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def replace(self: C, **changes: Any) -> C:
        """A copy with ``changes`` (checked again by ``__post_init__``)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]

    @classmethod
    def from_kwargs(cls: type[C], kwargs: Mapping[str, Any], *, strict: bool = True) -> C:
        """The config from ``kwargs``; an unknown keyword is refused (``strict``) or ignored."""
        names = set(cls.field_names())
        unknown = sorted(set(kwargs) - names)
        if unknown and strict:
            raise ConfigurationError(f"unknown setting(s) for {cls.__name__}: {', '.join(unknown)}")
        return cls(**{k: v for k, v in kwargs.items() if k in names})

    @classmethod
    def from_args(cls: type[C], args: argparse.Namespace, **overrides: Any) -> C:
        """The config from a parsed namespace (options not given keep the config's defaults) and ``overrides``."""
        given = {k: v for k, v in vars(args).items() if k in set(cls.field_names())}
        return cls(**{**given, **overrides})


def _flag(f: dataclasses.Field[Any]) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_options(parser: argparse.ArgumentParser | Any, config: type[Config], *,
                only: Iterable[str] | None = None, skip: Iterable[str] = (),
                defaults: Mapping[str, Any] | None = None, show: Callable[[Any], str] | None = None,
                store_true: bool = False) -> None:
    """Add one option per :func:`option` field of ``config`` (those in ``only`` when given, less ``skip``).

    Every option defaults to :data:`argparse.SUPPRESS`, and a bool field becomes ``--flag`` / ``--no-flag``, unless:
    ``defaults`` (a command that reads every field from the namespace): each option's default is the field's, or the
    one ``defaults`` gives it; ``show``: ``{default}`` in a help text is replaced by ``show(default)`` (the option's
    default, or the field's where the option's is None); ``store_true``: a bool field is a plain ``--flag``."""
    wanted = None if only is None else set(only)
    skipped = set(skip)
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        meta = f.metadata
        if "cli" not in meta or not meta["cli"] or f.name in skipped or (wanted is not None and f.name not in wanted):
            continue
        default = f.default if f.default is not _MISSING else None
        given = argparse.SUPPRESS if defaults is None else defaults.get(f.name, default)
        text = meta.get("help") or None
        if text and show is not None:
            text = text.format(default=show(default if given is None or given is argparse.SUPPRESS else given))
        kw: dict[str, Any] = {"dest": f.name, "default": given, "help": text}
        if isinstance(default, bool) and meta.get("type") is None:
            kw["action"] = "store_true" if store_true else argparse.BooleanOptionalAction
        else:
            known = default if default is not None else (None if given is argparse.SUPPRESS else given)
            typ = meta.get("type") or (type(known) if known is not None else None)
            if typ is None:
                raise ConfigurationError(f"{config.__name__}.{f.name}: give option(type=...) (its default is None)")
            kw["type"] = typ
            if meta.get("choices"):
                kw["choices"] = meta["choices"]
            if meta.get("metavar"):
                kw["metavar"] = meta["metavar"]
        parser.add_argument(_flag(f), **kw)
