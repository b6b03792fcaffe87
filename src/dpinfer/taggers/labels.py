"""The label map: recogniser entity types (Presidio, spaCy, dpinfer's patterns) → the eight TAB types.

The map is data, ``dpinfer/data/label_map.json``, read with :mod:`importlib.resources`. A value of ``null`` marks an
entity type that is known and deliberately not tagged (spaCy's ``ORDINAL`` and ``LAW``); a type that is missing from
the map is not requested from the recogniser at all. Users may pass their own mapping anywhere a ``label_map`` is
accepted; it REPLACES the default (start from :func:`default_label_map` to change a few entries)::

    from dpinfer.taggers import default_label_map, get_tagger
    tagger = get_tagger("presidio", label_map={**default_label_map(), "CARDINAL": None})

>>> default_label_map()["GPE"], default_label_map()["ECHR_APPLICATION_NO"], default_label_map()["ORDINAL"]
('LOC', 'CODE', None)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from types import MappingProxyType

from dpinfer.errors import InvalidInputError
from dpinfer.taggers.base import TAB_LABELS

LabelMap = Mapping[str, "str | None"]

_RESOURCE = "label_map.json"


@lru_cache(maxsize=1)
def _load_default() -> Mapping[str, str | None]:
    try:
        raw = resources.files("dpinfer").joinpath("data").joinpath(_RESOURCE).read_text(encoding="utf-8")
    except (FileNotFoundError, ModuleNotFoundError) as e:  # pragma: no cover - broken installation
        raise InvalidInputError(f"package data dpinfer/data/{_RESOURCE} is missing: reinstall dpinfer") from e
    doc = json.loads(raw)
    if tuple(doc.get("tab_labels", ())) != TAB_LABELS:  # pragma: no cover - guards edits of the JSON file
        raise InvalidInputError(f"dpinfer/data/{_RESOURCE}: tab_labels must be {list(TAB_LABELS)}")
    return MappingProxyType(validate_label_map(doc["map"]))


def default_label_map() -> dict[str, str | None]:
    """A fresh copy of the bundled map (entity type → TAB type or ``None``)."""
    return dict(_load_default())


def validate_label_map(
    mapping: Mapping[str, str | None], targets: tuple[str, ...] = TAB_LABELS
) -> dict[str, str | None]:
    """Check a user mapping: str keys, values in ``targets`` or ``None``. Returns a plain dict copy.

    >>> validate_label_map({"PERSON": "PERSON"})
    {'PERSON': 'PERSON'}

    >>> validate_label_map({"PERSON": "PERSON", "FOO": "BAR"})
    Traceback (most recent call last):
    ...
    dpinfer.errors.InvalidInputError: label map: 'FOO' maps to unknown type 'BAR'; allowed: PERSON, CODE, ...
    """
    if not isinstance(mapping, Mapping):
        raise InvalidInputError(f"label map must be a mapping, got {type(mapping).__name__}")
    out: dict[str, str | None] = {}
    for k, v in mapping.items():
        if not isinstance(k, str) or not k:
            raise InvalidInputError("label map keys must be non-empty strings")
        if v is not None and v not in targets:
            raise InvalidInputError(
                f"label map: {k!r} maps to unknown type {v!r}; allowed: {', '.join(targets)} (or null)"
            )
        out[k] = v
    return out


def resolve_label_map(label_map: LabelMap | None) -> dict[str, str | None]:
    """``label_map`` validated, or the default map when it is ``None``."""
    return default_label_map() if label_map is None else validate_label_map(label_map)


def map_label(entity_type: str, label_map: LabelMap | None = None) -> str | None:
    """The TAB type of a recogniser entity type; ``None`` if it is mapped to null or not in the map.

    >>> map_label("EMAIL_ADDRESS"), map_label("NO_SUCH_TYPE")
    ('CODE', None)
    """
    m = _load_default() if label_map is None else label_map
    return m.get(entity_type)
