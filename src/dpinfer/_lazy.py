"""Names a package imports on first use (PEP 562 ``__getattr__`` / ``__dir__``), so that importing it stays cheap."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str, names: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: ``names`` maps a name to the module that defines it; a
    name is imported on first use and kept in ``namespace`` (the package's globals).

    >>> ns: dict = {}
    >>> get, names = lazy_names("toy", {"dumps": "json"}, ns)
    >>> get("dumps").__name__, "dumps" in ns, names()
    ('dumps', True, ['dumps'])
    """

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
