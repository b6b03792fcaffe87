"""dpinfer's own recognisers: regular expressions (stdlib :mod:`re`) with optional validators.

They cover what a small spaCy NER model misses or labels wrongly in court cases and PII-heavy text: ECHR application
numbers (``36244/06``, ``no. 36244/06``, ``nos. 123/05 and 456/06``), case references, ID numbers, e-mail addresses,
URLs, IP addresses, phone numbers, IBANs (mod-97 checked), credit cards (Luhn checked), US SSNs, dates in common
formats, ages, money, percentages and measures, titled person names (``Mr H.Ç. Akbulut``) and street addresses.

The ``regex`` tagger uses them alone; the ``presidio`` tagger adds them to Presidio's recognisers. Each pattern emits
a recogniser entity type (e.g. ``ECHR_APPLICATION_NO``) that the label map (:mod:`dpinfer.taggers.labels`) turns into
a TAB type (``CODE``).

>>> text = "The application (no. 36244/06) was lodged on 10 March 2003 by Mr J. Smith (j.smith@example.org)."
>>> [(m.entity, text[m.start:m.end]) for m in find_matches(text)][1:4]  # overlapping hits are all returned
[('ECHR_APPLICATION_NO', '36244/06'), ('DATE_TIME', '10 March 2003'), ('DATE_TIME', 'March 2003')]
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from dpinfer.taggers.validators import (
    Validator,
    iban_prefix,
    id_ok,
    ipv6_ok,
    luhn_ok,
    numeric_date_ok,
    phone_ok,
    trim_url,
)

# --------------------------------------------------------------------------------------------------------- helpers


def _char_class(pred: Callable[[str], bool]) -> str:
    """A regex character-class body listing every BMP code point satisfying ``pred`` as ``\\uXXXX`` ranges."""
    parts: list[str] = []
    start = prev = None
    for cp in range(0x10000):
        if 0xD800 <= cp <= 0xDFFF or not pred(chr(cp)):
            continue
        if prev is not None and cp == prev + 1:
            prev = cp
            continue
        if start is not None:
            parts.append(f"\\u{start:04x}" if start == prev else f"\\u{start:04x}-\\u{prev:04x}")
        start = prev = cp
    if start is not None:
        parts.append(f"\\u{start:04x}" if start == prev else f"\\u{start:04x}-\\u{prev:04x}")
    return "".join(parts)


UP = _char_class(lambda c: c.isupper() or c.istitle())
"""Every upper- and title-case letter (stdlib ``re`` has no ``\\p{Lu}``)."""

_L = r"[^\W\d_]"  # any letter
_SP = r"[^\S\n]+"  # horizontal whitespace (names and dates do not span lines)

NUM_WORDS = (
    "one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|seventeen"
    "|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred|a hundred|one hundred"
)
NUMWORD = rf"(?:(?:{NUM_WORDS})(?:[-‑ ](?:one|two|three|four|five|six|seven|eight|nine))?)"
AMOUNT = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d{1,3}(?:[  ]\d{3})+(?:[.,]\d+)?|\d+(?:[.,]\d+)?)"
NUM = rf"(?:{AMOUNT}|{NUMWORD})"

MONTH = (
    r"(?:January|February|March|April|May|June|July|August|September|October|November|December"
    r"|Jan\.?|Feb\.?|Mar\.?|Apr\.?|Jun\.?|Jul\.?|Aug\.?|Sept\.?|Sep\.?|Oct\.?|Nov\.?|Dec\.?)(?!\w)"
)
DAY = r"(?:[12]\d|3[01]|0?[1-9])(?!\d)(?:st|nd|rd|th)?"
YEAR = r"(?:1[5-9]\d\d|20\d\d)(?!\d)"
_SEP = r"\s*(?:,|and|or|to|until|-|–|—)\s*"

CURRENCY_CODES = (
    "EUR|USD|GBP|GPB|PLN|SEK|DKK|NOK|ISK|CHF|TRY|TRL|YTL|RUB|RUR|UAH|HRK|CZK|SKK|HUF|RON|ROL|BGN|BGL|LTL|LVL|EEK"
    "|MKD|RSD|BAM|AMD|AZN|GEL|MDL|CYP|MTL|GRD|ITL|FRF|DEM|ATS|BEF|NLG|ESP|PTE|IEP|FIM|LUF|SIT|JPY|CNY|CAD|AUD"
)
CURRENCY_WORDS = (
    r"euros?|pounds(?:\s+sterling)?|pound\s+sterling|dollars?|francs?|marks?|kronor|kroner|kronur|krona|krone"
    r"|zlotys?|zlotych|złoty|lire|liras?|lei|leva|levs?|roubles?|rubles?|hryvnias?|forints?|kunas?|korunas?|dinars?"
    r"|denars?|litai|litas|lats|drachmas?|escudos?|pesetas?|guilders?|schillings?|tolars?|manats?|laris?|drams?"
    r"|cents?|pence|yen"
)

_TLDS = (
    "com|org|net|edu|gov|int|mil|info|biz|io|co|eu|uk|de|fr|it|es|pl|se|no|dk|fi|nl|be|ch|at|cz|sk|hu|ro|bg|gr|pt"
    "|ie|ru|ua|tr|us|ca|au|br|ar|mx|uy|cy|lt|lv|ee|si|hr|rs|is|jp|cn|in|za|nz|me|tv|app|dev"
)


@lru_cache(maxsize=1)
def lexicon() -> dict[str, tuple[str, ...]]:
    """Word lists from ``dpinfer/data/tagger_lexicon.json``: demonyms, occupations, ner_stoplist."""
    raw = resources.files("dpinfer").joinpath("data").joinpath("tagger_lexicon.json").read_text(encoding="utf-8")
    doc = json.loads(raw)
    return {k: tuple(doc[k]) for k in ("demonyms", "occupations", "ner_stoplist")}


def _alternation(words: Iterable[str]) -> str:
    """Regex alternation of literal words, longest first (so multi-word entries win)."""
    return "|".join(re.escape(w).replace("\\ ", r"\s+") for w in sorted(set(words), key=lambda w: (-len(w), w)))


# -------------------------------------------------------------------------------------------------------- patterns


@dataclass(frozen=True)
class PatternDef:
    """One recogniser: a regex (stdlib ``re``), the entity type it emits and a confidence score."""

    name: str
    entity: str
    regex: str
    score: float
    flags: int = 0
    group: int = 0
    """Which group of the match is the span (0: the whole match)."""
    validator: Validator | None = None
    compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "compiled", re.compile(self.regex, self.flags))


@dataclass(frozen=True)
class PatternMatch:
    """A raw pattern hit (before label mapping)."""

    start: int
    end: int
    entity: str
    score: float
    pattern: str


_TITLE = r"(?:Mr|Mrs|Ms|Miss|Mx|Dr|Prof|Professor|Judge|Justice|Lord|Lady|Sir|Dame|Mme|Mlle)\.?"
_STOP = r"(?:The|On|In|At|And|Of|For|To|By|With|Under|From|He|She|They|It|This|That|A|An|But|Or|As|If|When)\b"
_NAME_WORD = rf"[{UP}](?:{_L}|['’\-](?={_L}))+"
_INITIAL = rf"[{UP}]\.(?:-?[{UP}]\.){{0,3}}"
_PARTICLE = r"(?:van|von|de|der|den|du|da|di|del|della|la|le|ten|ter|bin|ibn|al|el|dos|das)"
_NAME_SEQ = rf"(?:(?:{_INITIAL}|(?!{_STOP}){_NAME_WORD}|{_PARTICLE}){_SP}?){{0,4}}(?!{_STOP}){_NAME_WORD}"

_STREET_WORDS = (
    r"Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Lane|Ln|Drive|Dr|Court|Ct|Place|Pl|Square|Sq|Way|Terrace|Crescent"
    r"|Highway|Hwy|Parkway|Pkwy|Close|Gardens|Row|Alley|Circle|Cir"
)
_DURATION_UNIT = r"(?:years?|months?|weeks?|days?|hours?|minutes?)"
_ORG_KEYWORDS = (
    r"Court|Tribunal|Ministry|Office|Prison|Police|Department|Directorate|Council|University|Hospital|Clinic|Bank"
    r"|Company|Corporation|Association|Party|Union|Agency|Authority|Board|Service|Committee|Institute|School|Centre"
    r"|Center|Foundation|Federation|Group|Prosecutor|Gendarmerie|Army|Regiment|Brigade|Newspaper|Television|Radio"
    r"|Fund|Trust|Church|Society|Parliament|Assembly|Registry|Inspectorate|Municipality|Commission|Administration"
    r"|Government|Ltd\.?|Inc\.?|plc|LLC|GmbH|AG|AB|AS|SA"
)
_ORG_OF = (
    r"Ministry|Department|University|Office|Bank|Republic|Kingdom|Government|Court|Council|Directorate|Police"
    r"|Federation|Principality|Grand\s+Duchy|Institute|School|Chamber|Faculty|Academy|Church|Bar"
)
_LOC_OF = r"District|County|Province|Region|Village|City|Town|Canton|Oblast|Voivodeship|Prefecture|Island|Isle"


def _code_patterns() -> tuple[PatternDef, ...]:
    """CODE: court references and identifiers."""
    I = re.IGNORECASE
    P = PatternDef
    return (
        # --- CODE: court references and identifiers
        P("echr_application_no", "ECHR_APPLICATION_NO", r"(?<![\w/.,])\d{3,6}/\d{2}(?![\w/]|[.,]\d)", 0.9),
        P("echr_application_no_ctx", "ECHR_APPLICATION_NO", r"\b[Nn]os?\.\s*(\d{1,2}/\d{2})(?![\w/])", 0.9, group=1),
        P(
            "neutral_citation",
            "CASE_REFERENCE",
            r"\[(?:19|20)\d\d\]\s+(?:\d+\s+)?[A-Z][A-Za-z]{1,6}(?:\s+(?:Civ|Crim|Admin|Fam|Ch|QB|KB))?\s+\d+"
            r"(?:\s+\([A-Za-z]+\))?",
            0.85,
        ),
        P(
            "keyword_reference",
            "CASE_REFERENCE",
            r"\b(?:case|file|reference|ref|registration|record|docket|account|passport|licen[cs]e|card|ID|policy"
            r"|serial|membership|customer|invoice|order|application)\s+(?:no\.?|nos\.?|number|num\.?|#)\s*:?\s*"
            r"([A-Z0-9][A-Z0-9\-/.]*\d[A-Z0-9\-/]*)",
            0.8,
            flags=I,
            group=1,
        ),
        P(
            "slash_reference",
            "CASE_REFERENCE",
            r"(?<![\w/.,])\d{1,5}/\d{1,5}(?:/\d{1,5}){0,3}(?:\s?[A-Z]{1,3}\.?\d+)?(?![\w/]|[.,]\d)",
            0.45,
        ),
        P("us_ssn", "US_SSN", r"(?<![\w\-])\d{3}-\d{2}-\d{4}(?![\w\-])", 0.8),
        P("credit_card", "CREDIT_CARD", r"(?<![\w\-])\d(?:[ \-]?\d){11,18}(?![\w\-]|[ \-]\d)", 0.9, validator=luhn_ok),
        P(
            "iban",
            "IBAN_CODE",
            r"(?<!\w)[A-Z]{2}\d{2}(?:[ ]?[A-Z0-9]{4}){2,7}(?:[ ]?[A-Z0-9]{1,3})?(?!\w)",
            0.9,
            flags=I,
            validator=iban_prefix,
        ),
        P(
            "alnum_id",
            "ID_NUMBER",
            r"(?<![\w\-/.])(?=[A-Z0-9\-]*\d)[A-Z]{0,20}\d[A-Z0-9]{0,40}(?:-[A-Z0-9]{1,20}){0,5}(?![\w\-/]|\.\w)",
            0.5,
            validator=id_ok,
        ),
        P("long_digits", "ID_NUMBER", r"(?<![\w.,\-/])\d{7,}(?![\w/]|[.,]\d)", 0.5),
        P("dashed_digits", "ID_NUMBER", r"(?<![\w\-/.])\d{2,6}(?:-\d{2,6}){2,4}(?![\w\-/])", 0.5),
    )


def _contact_patterns() -> tuple[PatternDef, ...]:
    """CODE: contact details and network identifiers."""
    I = re.IGNORECASE
    P = PatternDef
    return (
        # --- CODE: contact details and network identifiers
        P(
            "email",
            "EMAIL_ADDRESS",
            r"(?<![\w.+\-])[A-Za-z0-9._%+\-]{1,64}@(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?\.){1,10}[A-Za-z]{2,63}"
            r"(?![\w\-])",
            0.9,
        ),
        P(
            "url",
            "URL",
            r"\b(?:https?://|ftp://|www\d{0,3}\.)[^\s<>\"'()\[\]]{1,2000}",
            0.85,
            flags=I,
            validator=trim_url,
        ),
        P(
            "domain",
            "DOMAIN_NAME",
            rf"(?<![\w@.\-/])(?:[a-z0-9](?:[a-z0-9\-]{{0,61}}[a-z0-9])?\.){{1,10}}(?:{_TLDS})(?:/[^\s<>\"']{{0,2000}})?(?![\w\-])",
            0.6,
            flags=I,
            validator=trim_url,
        ),
        P(
            "ipv4",
            "IP_ADDRESS",
            r"(?<![\w.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?!\w|\.\d)",
            0.85,
        ),
        P("ipv6", "IP_ADDRESS", r"(?<![\w:.])[0-9A-Fa-f:]{2,39}(?![\w:])", 0.85, validator=ipv6_ok),
        P(
            "phone_international",
            "PHONE_NUMBER",
            r"(?<![\w+])(?:\+|\b00)\d{1,3}(?:[ .\-]?(?:\(\d{1,4}\)|\d{1,4})){2,6}(?!\w)",
            0.75,
            validator=phone_ok(8, 15),
        ),
        P(
            "phone_parens",
            "PHONE_NUMBER",
            r"(?<![\w(])\(\d{2,5}\)[ .\-]?\d{2,4}(?:[ .\-]?\d{2,4}){1,3}(?!\w)",
            0.7,
            validator=phone_ok(6, 15),
        ),
        P(
            "phone_groups",
            "PHONE_NUMBER",
            r"(?<![\w.\-/+,])\d{2,5}(?:[ .\-]\d{2,4}){2,4}(?!\w|[.\-/,]\d)",
            0.45,
            validator=phone_ok(7, 15),
        ),
        P("phone_short", "PHONE_NUMBER", r"(?<![\w.\-/+,])\d{3}[ \-]\d{4}(?!\w|[ .\-/,]\d)", 0.4),
    )


def _datetime_patterns() -> tuple[PatternDef, ...]:
    """DATETIME: dates, years, times and durations."""
    I = re.IGNORECASE
    P = PatternDef
    return (
        # --- DATETIME
        P(
            "date_day_month",
            "DATE_TIME",
            rf"(?<![\w/.]){DAY}(?:{_SEP}{DAY}){{0,6}}(?:\s+day)?(?:\s+of)?{_SP}{MONTH}"
            rf"(?:{_SEP}{DAY}(?:\s+of)?{_SP}{MONTH}){{0,4}}(?:,?{_SP}{YEAR})?",
            0.85,
        ),
        P("date_month_day", "DATE_TIME", rf"\b{MONTH}{_SP}{DAY}(?:{_SEP}{DAY}){{0,6}}(?:,?{_SP}{YEAR})?", 0.75),
        P(
            "date_month_year",
            "DATE_TIME",
            rf"\b(?:(?:early|mid|late|mid-)\s*)?{MONTH}(?:{_SEP}{MONTH}){{0,4}},?{_SP}{YEAR}",
            0.8,
        ),
        P(
            "date_iso",
            "DATE_TIME",
            r"(?<!\d)\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])"
            r"(?:[T ](?:[01]\d|2[0-3]):[0-5]\d(?::[0-5]\d(?:\.\d+)?)?)?(?!\d)",
            0.85,
        ),
        P(
            "date_numeric",
            "DATE_TIME",
            r"(?<![\d/.\-])\d{1,2}([./-])\d{1,2}\1(?:\d{4}|\d{2})(?![\d/]|[.\-]\d)",
            0.7,
            validator=numeric_date_ok,
        ),
        P("year_range", "DATE_TIME", rf"(?<![\w.,/§£$€]){YEAR}\s*(?:-|–|—|to)\s*{YEAR}", 0.6),
        P("year", "DATE_TIME", rf"(?<![\w.,/§£$€]){YEAR}s?(?![\w/]|[.,]\d)", 0.5),
        P("weekday", "DATE_TIME", r"\b(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)s?\b", 0.6),
        P(
            "time_ampm",
            "DATE_TIME",
            r"(?<![\w.:])(?:[01]?\d|2[0-3])(?:[:.][0-5]\d)?\s?(?:a\.m\.|p\.m\.|am\b|pm\b|AM\b|PM\b)",
            0.7,
        ),
        P("time_24h", "DATE_TIME", r"(?<![\w.:])(?:[01]?\d|2[0-3]):[0-5]\d(?::[0-5]\d)?(?![\w:])", 0.6),
        P(
            "duration",
            "DATE_TIME",
            rf"(?<![\w.,]){NUM}\s+{_DURATION_UNIT}(?:(?:,\s*|\s+and\s+){NUM}\s+{_DURATION_UNIT}){{0,4}}(?!\w)",
            0.5,
            flags=I,
        ),
    )


def _age_quantity_patterns() -> tuple[PatternDef, ...]:
    """DEM ages, then QUANTITY: money, percentages, measures."""
    I = re.IGNORECASE
    P = PatternDef
    return (
        # --- DEM: ages
        P(
            "age_of",
            "AGE",
            rf"\b(?:aged|ages?\s+of)\s+{NUM}(?:\s+(?:years?|months?))?(?:[\s\-‑]+old)?(?!\w)",
            0.85,
            flags=I,
        ),
        P("age_years_old", "AGE", rf"(?<![\w.,]){NUM}[\s\-‑]+(?:years?|months?)[\s\-‑]+old(?!\w)", 0.85, flags=I),
        P("age_yo", "AGE", r"(?<![\w.,])\d{1,3}\s?(?:y/o|yo|y\.o\.)(?!\w)", 0.8, flags=I),
        P("age_turned", "AGE", r"\b(?:turned|turn|turning)\s+(\d{1,3})(?![\w.,]\d|\w)", 0.6, flags=I, group=1),
        # --- QUANTITY
        P(
            "money_code",
            "MONEY",
            rf"(?<!\w)(?:approximately\s+)?(?:{CURRENCY_CODES})\s?{AMOUNT}(?:\s?(?:million|billion|thousand|m|bn))?"
            r"(?!\w)",
            0.85,
        ),
        P(
            "money_words",
            "MONEY",
            rf"(?<![\w.,]){NUM}(?:\s(?:million|billion|thousand))?\s+(?:[{UP}]{_L}+\s+)?(?:{CURRENCY_WORDS})"
            rf"(?:\s+\((?:{CURRENCY_CODES})\))?(?!\w)",
            0.85,
            flags=0,
        ),
        P("money_suffix_code", "MONEY", rf"(?<![\w.,]){AMOUNT}\s?(?:{CURRENCY_CODES})(?!\w)", 0.8),
        P("money_symbol", "MONEY", rf"[€£$¥]\s?{AMOUNT}(?:\s?(?:million|billion|m|bn))?(?!\w)", 0.85),
        P(
            "percent",
            "PERCENT",
            rf"(?<![\w.,]){AMOUNT}(?:\s?[-–]\s?{AMOUNT})?\s?(?:%|per\s?cent\b|percent\b)",
            0.8,
            flags=I,
        ),
        P(
            "measure",
            "QUANTITY",
            rf"(?<![\w.,]){AMOUNT}\s?(?:sq\.\s?m\.?|square\s+met(?:re|er)s?|m2|m²|km2|km²|hectares?|km|kilomet(?:re|er)s?"
            r"|met(?:re|er)s?|cm|mm|kg|kilograms?|grams?|tons?|tonnes?|litres?|liters?|ml|mg)(?!\w)",
            0.7,
        ),
    )


def _name_patterns() -> tuple[PatternDef, ...]:
    """PERSON, ORG, DEM (nationalities, occupations) and LOC: capitalised names and addresses."""
    P = PatternDef
    lex = lexicon()
    demonyms = _alternation(lex["demonyms"])
    occupations = _alternation(lex["occupations"])
    cap_seq = rf"(?:(?!{_STOP}){_NAME_WORD}{_SP}){{1,5}}"
    of_tail = rf"(?:{_SP}(?:and{_SP}|of{_SP}|for{_SP}|the{_SP})?(?!{_STOP}){_NAME_WORD}){{0,5}}"
    return (
        # --- PERSON: titled names
        P("titled_person", "PERSON", rf"\b{_TITLE}{_SP}{_NAME_SEQ}", 0.7),
        # --- ORG: capitalised names ending in an organisation word, "<Ministry|Republic|...> of <Name>"
        P(
            "org_keyword",
            "ORGANIZATION",
            rf"\b{cap_seq}(?:{_ORG_KEYWORDS})(?!\w)(?:{_SP}of(?:{_SP}the)?{_SP}(?!{_STOP}){_NAME_WORD}{of_tail})?",
            0.6,
        ),
        P(
            "org_of",
            "ORGANIZATION",
            rf"\b(?:(?!{_STOP}){_NAME_WORD}{_SP}){{0,3}}(?:{_ORG_OF}){_SP}of(?:{_SP}the)?{_SP}(?!{_STOP}){_NAME_WORD}{of_tail}",
            0.6,
        ),
        # --- DEM: nationalities, religions, occupations
        P("demonym", "NRP", rf"\b(?:{demonyms})(?:s|es)?(?:{_SP}(?:national|citizen)s?)?(?!\w)", 0.6),
        P("occupation", "OCCUPATION", rf"\b(?:{occupations})(?:s|es)?(?!\w)", 0.45),
        # --- LOC: "<District|County|...> of <Name>", street addresses
        P(
            "loc_of",
            "LOCATION",
            rf"\b(?:{_LOC_OF}){_SP}of{_SP}(?!{_STOP}){_NAME_WORD}(?:{_SP}{_NAME_WORD}){{0,2}}",
            0.6,
        ),
        P(
            "street_address",
            "STREET_ADDRESS",
            rf"(?<!\w)\d{{1,5}}[A-Za-z]?{_SP}(?!{MONTH})(?:(?!{_STOP})[{UP}][\w'’\-]*{_SP}){{0,3}}(?:{_STREET_WORDS})\.?(?!\w)"
            rf"(?:,?{_SP}(?:Apt|Apartment|Suite|Ste|Unit|Flat|#)\.?\s*[\w\-]+)?",
            0.6,
        ),
        P(
            "street_suffix_number",
            "STREET_ADDRESS",
            rf"\b[{UP}]{_L}*(?:katu|tie|gatan|gata|vägen|väg|straße|strasse|gasse|weg|platz|laan|straat|plein|vej"
            rf"|veien|gade|utca|ulica){_SP}\d{{1,5}}[A-Za-z]?(?!\w)",
            0.6,
        ),
        P(
            "street_prefix",
            "STREET_ADDRESS",
            rf"\b(?:Rue|Rua|Via|Viale|Calle|Avenida|Ulica|ul\.|Piazza|Plaza|Strada|Carrer){_SP}(?:[\w'’\-]+{_SP}){{0,4}}?"
            r"\d{1,5}[A-Za-z]?(?!\w)",
            0.6,
        ),
        P("unit", "STREET_ADDRESS", r"\b(?:Apt|Apartment|Suite|Ste|Unit|Flat)\.?\s*#?\d+[A-Za-z]?(?!\w)", 0.6),
    )


def _build_patterns() -> tuple[PatternDef, ...]:
    """Every built-in pattern, in the order the tagger tries them."""
    return (
        *_code_patterns(),
        *_contact_patterns(),
        *_datetime_patterns(),
        *_age_quantity_patterns(),
        *_name_patterns(),
    )


@lru_cache(maxsize=1)
def default_patterns() -> tuple[PatternDef, ...]:
    """dpinfer's built-in patterns (compiled once)."""
    return _build_patterns()


def pattern_entities(patterns: Iterable[PatternDef] | None = None) -> tuple[str, ...]:
    """The entity types the patterns emit, sorted."""
    pats = default_patterns() if patterns is None else patterns
    return tuple(sorted({p.entity for p in pats}))


def find_matches(text: str, patterns: Sequence[PatternDef] | None = None) -> list[PatternMatch]:
    """Every (validated) hit of every pattern in ``text``, sorted by (start, end, entity). Overlaps are kept."""
    pats = default_patterns() if patterns is None else patterns
    out: list[PatternMatch] = []
    for p in pats:
        for m in p.compiled.finditer(text):
            start, end = m.span(p.group)
            if start < 0 or end <= start:
                continue
            if p.validator is not None:
                verdict = p.validator(text[start:end])
                if verdict is True:
                    pass
                elif isinstance(verdict, int) and not isinstance(verdict, bool) and verdict > 0:
                    end = start + min(verdict, end - start)
                else:
                    continue
            out.append(PatternMatch(start, end, p.entity, p.score, p.name))
    out.sort(key=lambda m: (m.start, m.end, m.entity, m.pattern))
    return out
