"""The release protocol (dpinfer.release): a release holds no timing, seed, statistic or input; the check finds them
at any depth."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpinfer.release import (
    DIAGNOSTICS_WARNING,
    FORBIDDEN_KEYS,
    Release,
    ReleaseError,
    check_release,
    diagnostics_of,
    forbidden_keys,
    release_of,
    with_warning,
)


class Result:
    def release(self) -> dict[str, Any]:
        return {"text": "t", "guarantee": {"epsilon": 1.0, "delta": 1e-5}, "settings": {"top_k": 3}}

    def diagnostics(self) -> dict[str, Any]:
        return with_warning({"seconds": 1.5})


def test_a_result_is_a_release_and_its_parts_are_read() -> None:
    r = Result()
    assert isinstance(r, Release) and not isinstance(object(), Release)
    assert check_release(release_of(r)) == r.release()
    assert diagnostics_of(r) == {"warning": DIAGNOSTICS_WARNING, "seconds": 1.5}
    assert diagnostics_of({"text": "x"}) == {} and release_of({"text": "x"}) == {"text": "x"}
    with pytest.raises(ReleaseError, match="has no release"):
        release_of(3)


def test_forbidden_keys_are_found_at_any_depth_and_named_without_values() -> None:
    rel = {"text": "secret words", "settings": {"seed": 7, "nested": [{"seconds": 2.0}]}, "debug": {"x": 1}}
    assert forbidden_keys(rel) == ["debug", "settings.nested[0].seconds", "settings.seed"]
    with pytest.raises(ReleaseError) as err:
        check_release(rel)
    assert "secret" not in str(err.value) and "7" not in str(err.value)
    assert forbidden_keys(rel, allow={"seed", "seconds", "debug"}) == []


@settings(deadline=None)
@given(st.dictionaries(st.sampled_from([*sorted(FORBIDDEN_KEYS), "text", "guarantee", "settings"]),
                       st.integers(), min_size=1))
def test_check_release_refuses_exactly_the_forbidden_top_level_keys(rel: dict[str, int]) -> None:
    bad = sorted(k for k in rel if k in FORBIDDEN_KEYS)
    assert forbidden_keys(rel) == bad
    if not bad:
        assert check_release(rel) == rel
