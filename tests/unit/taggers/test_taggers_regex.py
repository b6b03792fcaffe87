"""The regex tagger and dpinfer's patterns."""

from __future__ import annotations

import itertools

import pytest

from dpinfer.errors import ConfigurationError
from dpinfer.taggers import RegexTagger, default_label_map, get_tagger
from dpinfer.taggers.patterns import find_matches, pattern_entities


def _tagged(text, tagger=None):
    tagger = tagger or RegexTagger()
    return [(s.label, text[s.start : s.end]) for s in tagger.tag(text)]


def _labels_of(text, fragment, tagger=None):
    return [label for label, frag in _tagged(text, tagger) if frag == fragment]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The case originated in an application (no. 42552/98) against Turkey.", ["42552/98"]),
        ("in applications nos. 123/05 and 456/06 lodged", ["123/05", "456/06"]),
        ("application no. 12/05 was", ["12/05"]),
        ("Application No. 36244/06", ["36244/06"]),
    ],
)
def test_echr_application_numbers(text, expected):
    codes = [frag for label, frag in _tagged(text) if label == "CODE"]
    assert codes == expected


def test_emails_urls_phones_ids():
    text = (
        "Write to jane.doe+x@example.co.uk or see https://www.example.org/page. Call +44 20 7946 0958 or "
        "(555) 555-1234. IBAN GB82WEST12345698765432, card 4111 1111 1111 1111, SSN 123-45-6789, IP 192.168.1.20."
    )
    tagged = _tagged(text)
    codes = {frag for label, frag in tagged if label == "CODE"}
    assert {
        "jane.doe+x@example.co.uk",
        "https://www.example.org/page",
        "+44 20 7946 0958",
        "(555) 555-1234",
        "GB82WEST12345698765432",
        "4111 1111 1111 1111",
        "123-45-6789",
        "192.168.1.20",
    } <= codes


def test_iban_and_card_checksums():
    assert not [m for m in find_matches("IBAN GB82WEST12345698765433") if m.entity == "IBAN_CODE"]
    assert not [m for m in find_matches("card 4111 1111 1111 1112") if m.entity == "CREDIT_CARD"]


@pytest.mark.parametrize(
    "date",
    [
        "10 March 2003",
        "2003-03-10",
        "March 2003",
        "19 and 20 August 1995",
        "March 10, 2003",
        "27th day of September 1996",
        "10/03/2003",
        "14 May and 16 August 1999",
    ],
)
def test_dates(date):
    assert _labels_of(f"It happened on {date} in the morning.", date) == ["DATETIME"]


def test_years_durations_ages_quantities():
    text = (
        "The applicants were born in 1975 and 1970. He served three years and nine months. At the age of 65 he "
        "paid 10,000 Polish zlotys (PLN) and GBP 2,535 for 2,282 sq. m, i.e. 36 % of it. She was eight years old."
    )
    tagged = dict((frag, label) for label, frag in _tagged(text))
    assert tagged["1975"] == tagged["1970"] == "DATETIME"
    assert tagged["three years and nine months"] == "DATETIME"
    assert tagged["age of 65"] == "DEM"
    assert tagged["eight years old"] == "DEM"
    for q in ("10,000 Polish zlotys (PLN)", "GBP 2,535", "2,282 sq. m", "36 %"):
        assert tagged[q] == "QUANTITY"


def test_titled_persons_with_non_ascii_names():
    text = "represented by Mr H.Ç. Akbulut and Ms Şahin Yılmaz. The Court held"
    persons = [frag for label, frag in _tagged(text) if label == "PERSON"]
    assert persons == ["Mr H.Ç. Akbulut", "Ms Şahin Yılmaz"]


def test_organisations_and_demonyms():
    text = "The Turkish Government and the Izmir State Security Court; a Polish national."
    tagged = _tagged(text)
    assert ("ORG", "Turkish Government") in tagged
    assert ("ORG", "Izmir State Security Court") in tagged
    assert ("DEM", "Polish national") in tagged


def test_stoplist_drops_generic_court_words():
    text = "The European Court of Human Rights held."
    assert _tagged(text) == []
    assert _tagged(text, RegexTagger(stoplist=())) == [("ORG", "European Court of Human Rights")]


def test_output_is_sorted_non_overlapping_and_mapped():
    text = "On 2003-03-10 Mr J. Smith (no. 36244/06) phoned 905-674-3793 from 6750 Main Street, Apt. 4."
    spans = get_tagger("regex").tag(text)
    assert spans == sorted(spans, key=lambda s: s.start)
    assert all(a.end <= b.start for a, b in itertools.pairwise(spans))
    assert all(s.source.startswith("regex:") for s in spans)


def test_every_pattern_entity_is_in_the_label_map():
    m = default_label_map()
    assert all(m.get(e) is not None for e in pattern_entities())


def test_label_map_and_min_score_options():
    text = "no. 36244/06 on 10 March 2003"
    only_dates = RegexTagger(label_map={"DATE_TIME": "DATETIME"})
    assert _tagged(text, only_dates) == [("DATETIME", "10 March 2003")]
    assert RegexTagger(min_score=0.95).tag(text) == []
    with pytest.raises(ConfigurationError):
        RegexTagger(min_score=2)


def test_no_false_positives_on_plain_prose():
    assert _tagged("the weather was nice and everybody went for a walk in the park.") == []


@pytest.mark.parametrize(
    "text",
    ["12-" * 7000, "1, " * 7000 + "March", "www." * 5000, "1/" * 10000, "a." * 10000 + "@", "Mr " + "A." * 10000],
    ids=["dashes", "day-list", "www", "slashes", "dots-at", "initials"],
)
def test_no_catastrophic_backtracking(text):
    import time

    t0 = time.perf_counter()
    RegexTagger().tag(text)
    assert time.perf_counter() - t0 < 3.0
