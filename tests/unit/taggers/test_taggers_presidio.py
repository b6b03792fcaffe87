"""The presidio tagger: offline operation, ECHR-like text, fail-closed behaviour, log suppression, label coverage.

Every test here runs with sockets blocked (the ``no_network`` fixture, module scope, also active while spaCy loads).
"""

from __future__ import annotations

import itertools
import json
import logging
import socket

import pytest

from dpinfer.errors import MissingDependencyError, TaggingError
from dpinfer.paths import data_file
from dpinfer.taggers import default_label_map

pytestmark = pytest.mark.usefixtures("no_network")

PARAGRAPH = (
    "PROCEDURE\n\n"
    "The case originated in an application (no. 36244/06) against the Republic of Poland lodged with the Court "
    "under Article 34 of the Convention by a Polish national, Ms Anna Kowalska (\u201cthe applicant\u201d), on "
    "10 March 2006.\n\n"
    "The applicant was represented by Mr J. Nowak, a lawyer practising in Warsaw "
    "(e-mail: jnowak@kancelaria-nowak.pl). The applicant was born in 1961 and lives in Kraków. On 2 June 2004 "
    "the Warsaw Regional Court ordered her to pay PLN 7,500."
)


def _found(tagger, text):
    return [(s.label, text[s.start : s.end]) for s in tagger.tag(text)]


def test_network_is_really_blocked():
    with pytest.raises(OSError):
        socket.create_connection(("publicsuffix.org", 443), timeout=1)


def test_echr_paragraph(presidio_tagger):
    found = _found(presidio_tagger, PARAGRAPH)
    assert ("CODE", "36244/06") in found
    assert ("DATETIME", "10 March 2006") in found
    assert ("DATETIME", "2 June 2004") in found
    assert ("CODE", "jnowak@kancelaria-nowak.pl") in found
    assert ("QUANTITY", "PLN 7,500") in found
    persons = [frag for label, frag in found if label == "PERSON"]
    assert any("Kowalska" in p for p in persons)
    assert any("Nowak" in p for p in persons)
    spans = presidio_tagger.tag(PARAGRAPH)
    assert all(a.end <= b.start for a, b in itertools.pairwise(spans))
    assert all(s.label in default_label_map().values() for s in spans)


def test_email_uses_offline_tldextract(presidio_tagger, monkeypatch):
    import tldextract

    from dpinfer.taggers.presidio_tagger import offline_tld_extractor

    def online(*a, **k):
        raise AssertionError("the module-level tldextract.extract (which downloads) must not be used")

    monkeypatch.setattr(tldextract, "extract", online)
    assert offline_tld_extractor()("someone@example.co.uk").fqdn == "example.co.uk"
    text = "Contact: someone@example.co.uk"
    spans = presidio_tagger.tag(text)
    emails = [s for s in spans if text[s.start : s.end] == "someone@example.co.uk"]
    assert emails and emails[0].label == "CODE" and "OfflineEmailRecognizer" in emails[0].source


def test_long_text_is_chunked_with_correct_offsets(presidio_tagger):
    from dpinfer.taggers.presidio_tagger import PresidioTagger

    tagger = PresidioTagger(max_chunk_chars=1000)
    text = ("Nothing happened here at all. " * 40 + "\n\n") * 2 + "Application no. 36244/06 on 10 March 2006."
    found = _found(tagger, text)
    assert ("CODE", "36244/06") in found and ("DATETIME", "10 March 2006") in found


def _recognizer(behaviour):
    from presidio_analyzer import EntityRecognizer

    class Misbehaving(EntityRecognizer):
        def __init__(self):
            super().__init__(supported_entities=["PERSON"], name="Misbehaving")

        def load(self):
            pass

        def analyze(self, text, entities, nlp_artifacts=None):
            return behaviour(text)

    return Misbehaving()


def test_recognizer_exception_fails_closed_without_text(presidio_tagger):
    from dpinfer.taggers.presidio_tagger import PresidioTagger

    def boom(text):
        raise RuntimeError(f"cannot handle {text}")

    tagger = PresidioTagger(extra_recognizers=[_recognizer(boom)])
    with pytest.raises(TaggingError) as e:
        tagger.tag(PARAGRAPH)
    assert "Kowalska" not in str(e.value) and "RuntimeError" in str(e.value)
    assert e.value.__cause__ is None
    # the shared default analyzer is untouched
    assert presidio_tagger.tag("no. 36244/06")


def test_presidio_regex_timeout_warning_fails_closed(presidio_tagger):
    from dpinfer.taggers.presidio_tagger import PresidioTagger

    def times_out(text):
        logging.getLogger("presidio-analyzer").warning(
            "Regex pattern '%s' timed out after %s seconds, skipping.", "x", 60
        )
        return []

    with pytest.raises(TaggingError, match="timeout"):
        PresidioTagger(extra_recognizers=[_recognizer(times_out)]).tag(PARAGRAPH)


def test_presidio_log_records_with_text_are_suppressed(presidio_tagger, caplog):
    from dpinfer.taggers.presidio_tagger import PresidioTagger

    def leaky(text):
        logging.getLogger("presidio-analyzer").error("Failed to validate text %s", text)
        return []

    caplog.set_level(logging.DEBUG)
    PresidioTagger(extra_recognizers=[_recognizer(leaky)]).tag(PARAGRAPH)
    assert "Kowalska" not in caplog.text
    logging.getLogger("presidio-analyzer").info("outside analysis")  # other records still pass
    assert "outside analysis" in caplog.text


def test_label_map_covers_every_presidio_entity(presidio_tagger):
    supported = presidio_tagger.analyzer.get_supported_entities(language="en")
    m = default_label_map()
    assert not [e for e in supported if e not in m]


def test_label_map_covers_synthetic_dataset_types(requires_data):
    records = json.loads(data_file("pii", "presidio_synth_v2.json").read_text(encoding="utf-8"))
    types = {s["entity_type"] for r in records for s in r["spans"]}
    assert len(types) == 17
    m = default_label_map()
    assert {t: m.get(t) for t in types if m.get(t) is None} == {}


def test_missing_extra_raises_missing_dependency(monkeypatch):
    import builtins

    from dpinfer.taggers import get_tagger

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.split(".")[0] == "presidio_analyzer":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(MissingDependencyError, match=r'pip install -e "\.\[pii\]"'):
        get_tagger("presidio")


def test_missing_spacy_model_raises_missing_dependency_instead_of_downloading(requires_pii):
    from dpinfer.taggers.presidio_tagger import PresidioTagger

    with pytest.raises(MissingDependencyError, match="never downloads"):
        PresidioTagger(model="en_core_web_nonexistent_xx")
