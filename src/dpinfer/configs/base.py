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
from dataclasses import dataclass
from typing import Any, TypeVar

from dpinfer.errors import ConfigurationError, InvalidInputError

C = TypeVar("C", bound="Config")

_MISSING: Any = dataclasses.MISSING


SPELLINGS = ("api", "cli")
"""How a config's messages name a setting: as the Python API and a request body do (``max_new_tokens``) or as the
command line does (``--max-new-tokens``)."""

NUMBER = (int, float)


def spelled(setting: str, spelling: str = "api") -> str:
    """``setting`` as :data:`SPELLINGS` name it: ``max_new_tokens`` (api) or ``--max-new-tokens`` (cli)."""
    return "--" + setting.replace("_", "-") if spelling == "cli" else setting


def option(default: Any = _MISSING, *, help: str = "", type: Callable[[str], Any] | None = None,
           flag: str | None = None, choices: Iterable[Any] | None = None, metavar: str | None = None,
           cli: bool = True, request: bool = False, words: Mapping[str, Any] | None = None,
           default_factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field with its command-line option: ``help`` text, argparse ``type`` (default: the default's
    type), ``flag`` (default ``--field-name``), ``choices``, ``metavar``; ``cli=False`` keeps it off the parser;
    ``request=True``: a service request body may set it (:meth:`Config.request_fields`); ``words``: strings a
    request body may give for a value (``{"all": None}``)."""
    meta = {"help": help, "type": type, "flag": flag, "choices": tuple(choices) if choices is not None else None,
            "metavar": metavar, "cli": cli, "request": request, "words": dict(words or {})}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _json_types(annotation: object) -> tuple[type, ...] | None:
    """The JSON value types a field's annotation admits (None: any; the config's own checks decide)."""
    kinds: list[type] = []
    for part in str(annotation).split("|"):
        name = part.strip()
        if name == "None":
            continue
        if name == "float":
            kinds.extend(NUMBER)
        elif name in ("int", "str", "bool"):
            kinds.append({"int": int, "str": str, "bool": bool}[name])
        elif name.startswith(("Mapping", "dict")):
            kinds.append(dict)
        else:
            return None
    return tuple(dict.fromkeys(kinds)) or None


def typed(value: Any, name: str, types: tuple[type, ...]) -> Any:
    """``value`` if it is one of ``types`` (a bool only where ``bool`` is); the message names the types, never the
    value (a request body may hold private text sent by mistake).

    >>> typed(2, "epsilon", NUMBER)
    2
    >>> typed("secret", "epsilon", NUMBER)
    Traceback (most recent call last):
    ...
    dpinfer.errors.InvalidInputError: epsilon must be a number, got str
    """
    if isinstance(value, bool) and bool not in types:
        raise InvalidInputError(f"{name} must be {'/'.join(t.__name__ for t in types)}, got a boolean")
    if not isinstance(value, types):
        names = " or ".join(dict.fromkeys("a number" if t in NUMBER else f"a {t.__name__}" for t in types))
        raise InvalidInputError(f"{name} must be {names}, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class Config:
    """Base of the task configs (frozen dataclasses): keyword arguments in, keyword arguments out.

    ``spelling`` (keyword-only, not a setting: not compared, not in :meth:`to_kwargs`) is how messages name a
    setting, ``"api"`` or ``"cli"`` (:data:`SPELLINGS`, :meth:`name`)."""

    spelling: str = dataclasses.field(default="api", kw_only=True, compare=False, repr=False,
                                      metadata={"cli": False, "setting": False})

    def __post_init__(self) -> None:
        if self.spelling not in SPELLINGS:
            raise ConfigurationError(f"spelling must be one of {', '.join(SPELLINGS)}, got {self.spelling!r}")

    def name(self, setting: str) -> str:
        """How a message names ``setting``: ``n_rewrites`` (api) or ``--n-rewrites`` (cli)."""
        return spelled(setting, self.spelling)

    def to_kwargs(self) -> dict[str, Any]:
        """Field name → value (shallow: nested values as they are), the settings only."""
        return {name: getattr(self, name) for name in self.field_names()}

    def replace(self: C, **changes: Any) -> C:
        """A copy with ``changes`` (checked again by ``__post_init__``)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def api(self: C) -> C:
        """This config with messages spelled for the API."""
        return self if self.spelling == "api" else self.replace(spelling="api")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The settings' names (the keywords the task takes)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("setting", True))  # type: ignore[arg-type]

    @classmethod
    def request_fields(cls) -> tuple[str, ...]:
        """The settings a service request body may give (declared ``option(..., request=True)``)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("request"))  # type: ignore[arg-type]

    @classmethod
    def merged(cls: type[C], base: C | None = None, /, **settings: Any) -> C:
        """``base`` (None: the defaults) with ``settings`` applied, checked; an unknown setting is refused in one
        line with the list of settings (``spelling=`` is taken too).

        >>> from dpinfer.configs.protect import ProtectConfig
        >>> ProtectConfig.merged(ProtectConfig(n_keywords=3), n_exemplars=1).n_keywords
        3
        >>> ProtectConfig.merged(None, top_k=5)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        dpinfer.errors.ConfigurationError: unknown setting(s) for ProtectConfig: top_k; settings: method, ...
        """
        if base is not None and not isinstance(base, cls):
            raise ConfigurationError(f"config must be a {cls.__name__}, got {type(base).__name__}")
        names = cls.field_names()
        unknown = sorted(set(settings) - {*names, "spelling"})
        if unknown:
            raise ConfigurationError(f"unknown setting(s) for {cls.__name__}: {', '.join(unknown)}; settings: "
                                     f"{', '.join(names)}")
        if base is None:
            return cls(**settings)
        return base.replace(**settings) if settings else base

    @classmethod
    def from_mapping(cls: type[C], body: Mapping[str, Any], *, spelling: str = "api", base: C | None = None,
                     allowed: Iterable[str] | None = None, extra: Iterable[str] = ()) -> C:
        """The config of ``body`` (a request body, parsed options): its keys are settings (``allowed``, default all;
        ``extra`` keys are the caller's and left alone); a null value keeps the default; each value's JSON type is
        checked against the field's (named in the message, never the value); an unknown key is refused in one line
        that counts but does not echo it (it may be private text sent by mistake).

        >>> from dpinfer.configs.ask import AskConfig
        >>> AskConfig.from_mapping({"epsilon": 8, "question": "q"}, extra=("question",)).epsilon
        8.0
        >>> AskConfig.from_mapping({"Mr Smith's file": 1})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        dpinfer.errors.InvalidInputError: 1 unknown field(s); allowed: mechanism, epsilon, delta, ...
        """
        names = tuple(cls.field_names() if allowed is None else allowed)
        known = {*names, *extra}
        stray = [k for k in body if k not in known]
        if stray:
            raise InvalidInputError(f"{len(stray)} unknown field(s); allowed: {', '.join([*extra, *names])}")
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        settings: dict[str, Any] = {}
        for key in names:
            value = body.get(key)
            if value is None:
                continue
            f = fields[key]
            words = f.metadata.get("words") or {}
            if isinstance(value, str) and value.strip().lower() in words:
                settings[key] = words[value.strip().lower()]
                continue
            kinds = _json_types(f.type)
            kinds = kinds if kinds is None or not words else (*kinds, str)
            settings[key] = value if kinds is None else typed(value, spelled(key, spelling), kinds)
        return cls.merged(base, spelling=spelling, **settings)

    @classmethod
    def from_kwargs(cls: type[C], kwargs: Mapping[str, Any], *, strict: bool = True) -> C:
        """The config from ``kwargs``; an unknown keyword is refused (``strict``) or ignored."""
        names = set(cls.field_names())
        if strict:
            return cls.merged(None, **kwargs)
        return cls(**{k: v for k, v in kwargs.items() if k in names})

    @classmethod
    def from_args(cls: type[C], args: argparse.Namespace, *, spelling: str = "cli", **overrides: Any) -> C:
        """The config from a parsed namespace (options not given keep the config's defaults) and ``overrides``;
        messages name the options."""
        given = {k: v for k, v in vars(args).items() if k in set(cls.field_names())}
        return cls(**{**given, **overrides}, spelling=spelling)


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
