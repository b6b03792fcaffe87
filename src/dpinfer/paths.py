"""Where dpinfer finds things on disk: its cache and the shared evaluation data.

Nothing here touches the network.
"""

from __future__ import annotations

import os
from pathlib import Path

from dpinfer.errors import DataNotFoundError

CACHE_ENV = "DPINFER_CACHE"
DATA_ENV = "DPINFER_DATA"


def cache_dir() -> Path:
    """Root of dpinfer's cache: ``$DPINFER_CACHE`` if set, else the platform's user cache dir (``~/.cache/dpinfer``)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("dpinfer", appauthor=False))


def repo_root() -> Path | None:
    """The source checkout this package runs from (a folder with ``pyproject.toml``), or ``None`` if installed."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "src" / "dpinfer").is_dir():
            return parent
    return None


def data_dir(required: bool = True) -> Path | None:
    """The evaluation data folder: ``$DPINFER_DATA``, else ``<repo root>/../shared/data``, else ``./../shared/data``.

    Raises :class:`DataNotFoundError` (or returns ``None`` when ``required`` is false) if it is absent.
    """
    candidates: list[Path] = []
    env = os.environ.get(DATA_ENV)
    if env:
        candidates.append(Path(env).expanduser())
    root = repo_root()
    if root is not None:
        candidates.append(root.parent / "shared" / "data")
    candidates.append(Path.cwd().parent / "shared" / "data")
    for c in candidates:
        if c.is_dir():
            return c
    if required:
        looked = ", ".join(str(c) for c in candidates)
        raise DataNotFoundError(
            f"evaluation data not found (looked in: {looked}); put the shared data beside the repository "
            f"as ../shared/data or set {DATA_ENV}=/path/to/data"
        )
    return None


def data_file(*parts: str) -> Path:
    """A file under :func:`data_dir`; raises :class:`DataNotFoundError` with the full path if it is missing."""
    base = data_dir(required=True)
    assert base is not None
    p = base.joinpath(*parts)
    if not p.exists():
        raise DataNotFoundError(f"evaluation data file not found: {p}")
    return p
