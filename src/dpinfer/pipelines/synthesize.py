"""Synthetic long-form text from a private corpus, with a per-reference guarantee (InvisibleInk, ALGORITHMS §2).

Steps of :func:`synthesize`:

1. **Partition** the references into disjoint batches of B, data-independently: references are grouped by their
   public labels (e.g. Yelp's business category and stars, which the prompts show), each group is shuffled with the
   seed and cut into batches of B; a remainder smaller than B is not used (it would need its own, larger ρ). The
   partition depends on the seed, the labels and the order of the records only, never on their text, so the texts of
   different batches compose in parallel: the whole output has the guarantee of one text.
2. **Prompts** from a :class:`PromptTemplate`: the *public* prompt (instruction and labels, no reference) and one
   *private* prompt per reference (``{reference}`` filled in). An empty reference is the null reference ⊥ of the
   adjacency: its row is the public prompt. A reference longer than ``max_reference_tokens`` is cut to that many
   tokens (a function of that reference alone).
3. **Decode** each batch with the chosen method on the engine: B + 1 contexts, one KV cache, left padding.

Methods: every mechanism registered for ``"synthesize"`` and the baseline of :data:`dpinfer.methods.BASELINES`
(:func:`dpinfer.methods.method_names`; :data:`BUILDERS` holds each mechanism's construction): ``invisibleink``
(default), ``amin`` (Amin et al. 2024, sparse-vector test, fixed private-token cap),
``adapmixed`` (Flemings et al. 2024; data-dependent: no guarantee ex ante, the realised figure is reported as such)
and ``public`` (the public prompt only: no reference is read, the zero-privacy floor of utility, 1 LM call per token).
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.defaults import SYNTH
from dpinfer.errors import ConfigurationError, DataNotFoundError, InvalidInputError
from dpinfer.pipelines.budget import charged, current_spend

if TYPE_CHECKING:
    from dpinfer.accounting import Guarantee
    from dpinfer.mechanisms.base import Mechanism
    from dpinfer.models import LM



@dataclass(frozen=True)
class PromptTemplate:
    """The private and public prompts. ``{reference}`` marks the reference (private prompt only); ``{field}`` any
    public label field of the record (e.g. ``{label1}``).

    >>> t = PromptTemplate(private="Here is a review ({stars}).\\nText: \\"{reference}\\"\\nWrite another one.",
    ...                    public="Write a review ({stars}).")
    >>> t.render_private("Great food.", {"stars": "5.0"})
    'Here is a review (5.0).\\nText: "Great food."\\nWrite another one.'
    >>> t.render_public({"stars": "5.0"})
    'Write a review (5.0).'
    """

    private: str
    public: str
    response_prefix: str = ""
    """Public text that opens the model's answer in every context (e.g. ``"Review:\n"``): it steers a small model into
    writing the text itself rather than a reply about it. It is part of the prompt, not of the released text."""

    def __post_init__(self) -> None:
        if "{reference}" not in self.private:
            raise ConfigurationError("the private prompt template must contain {reference}")
        if "{reference}" in self.public or "{reference}" in self.response_prefix:
            raise ConfigurationError("the public prompt template and the response prefix must not contain {reference} "
                                     "(they read no reference)")

    def fields(self) -> set[str]:
        """The label fields the templates use."""
        import string

        names = set()
        for text in (self.private, self.public, self.response_prefix):
            for _, name, _, _ in string.Formatter().parse(text):
                if name:
                    names.add(name)
        names.discard("reference")
        return names

    def render_public(self, labels: Mapping[str, str]) -> str:
        return self._format(self.public, labels)

    def render_prefix(self, labels: Mapping[str, str]) -> str:
        return self._format(self.response_prefix, labels)

    def render_private(self, reference: str, labels: Mapping[str, str]) -> str:
        return self._format(self.private, {**labels, "reference": reference})

    @staticmethod
    def _format(template: str, values: Mapping[str, str]) -> str:
        try:
            return template.format_map(dict(values))
        except KeyError as exc:
            raise ConfigurationError(
                f"the prompt template uses {{{exc.args[0]}}}, which is not a label field of the records; pass it with "
                "--label-fields / label_fields"
            ) from None
        except (ValueError, IndexError):
            raise ConfigurationError(
                "the prompt template is not a valid format string (escape literal braces as {{ }})"
            ) from None


TEMPLATES: dict[str, PromptTemplate] = {
    "generic": PromptTemplate(
        private='Here is a text.\nText: "{reference}"\nPlease write one more text of the same kind, style and length, '
        "about a fictional subject.",
        public="Please write a text.",
    ),
    "yelp": PromptTemplate(
        private='Here is a text with {label1} and {label2} out of 5.0.\nText: "{reference}"\nPlease output one more '
        "similar review of a fictional place with the same score and of the same category of business. Poor reviews "
        "have lower scores and good reviews have higher scores.",
        public="Please give me a fake Yelp customer review of a fictional business with {label1} and {label2} out of "
        "5.0. Poor reviews have lower scores and good reviews have higher scores.",
        response_prefix="Review:\n",
    ),
    "tab": PromptTemplate(
        private="Here is the text of a case transcript set before the European Court for Human Rights.\n"
        'Text: "{reference}"\nPlease output a similar transcript of a fictional case under the European Court for '
        'Human Rights. Begin with the phrase: "PROCEDURE: The case originated in an application".',
        public="Please output a transcript of a fictional case under the European Court for Human Rights. Begin with "
        'the phrase: "PROCEDURE: The case originated in an application".',
        response_prefix="PROCEDURE: The case originated in an application",
    ),
}
"""Prompt templates after the InvisibleInk paper's Table 5 (Yelp's labels are ``label1`` = "Business Category: …" and
``label2`` = "Review Stars: …" in ../shared/data/yelp). The response prefixes keep the 135M model writing the text
itself: without one it mostly answers "Sure, I'd be happy to help…" to the private prompts (docs/synthesize.md)."""


@dataclass(frozen=True)
class Reference:
    """One private record: its ``text`` (private) and public ``labels``."""

    text: str
    labels: Mapping[str, str] = field(default_factory=dict)


def _field_error(name: str, where: str, count: int, kind: str) -> InvalidInputError:
    return InvalidInputError(f"{where}: no field {name!r} ({kind} has {count} field{'s' if count != 1 else ''}); "
                             "check --text-field / --label-fields")


def load_references(path: str | Path, *, text_field: str, label_fields: Sequence[str] = (),
                    limit: int | None = None) -> list[Reference]:
    """Records of a ``.jsonl`` or ``.csv`` file (a CSV's first line is its header row).

    Every error is an :class:`~dpinfer.errors.InvalidInputError` (or :class:`~dpinfer.errors.DataNotFoundError` for
    a missing file) that names the file, the line and the field asked for, with counts: never the file's content
    (a headerless CSV's first record would otherwise be read as its field names).
    """
    from dpinfer.validation import input_file

    if not isinstance(text_field, str) or not text_field:
        raise ConfigurationError("text_field must be a non-empty field name")
    if isinstance(label_fields, str) or not all(isinstance(f, str) and f for f in label_fields):
        raise ConfigurationError("label_fields must be a list of non-empty field names")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigurationError(f"limit must be an integer ≥ 1, got {limit!r}")
    p = Path(path)
    if not p.exists() and not p.is_dir():
        raise DataNotFoundError(f"no such file: {p}")
    p = input_file(p, "corpus")
    suffix = p.suffix.lower()
    if suffix not in (".jsonl", ".csv"):
        raise InvalidInputError(f"{p.name}: give a .jsonl or .csv file (got {suffix or 'no suffix'})")
    try:
        raw = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{p.name} is not valid UTF-8 text (bad byte at offset {exc.start})") from None
    except MemoryError:
        raise InvalidInputError(f"{p.name} is too large to read into memory; pass a smaller file") from None
    if "\x00" in raw:
        raise InvalidInputError(f"{p.name} looks binary (it contains NUL bytes)")
    fields = (text_field, *label_fields)
    refs: list[Reference] = []

    def add(row: Mapping[Any, Any], where: str, kind: str) -> bool:
        for name in fields:
            if name not in row:
                raise _field_error(name, where, len(row), kind)
        text = row[text_field]
        if not isinstance(text, str):
            raise InvalidInputError(f"{where}: field {text_field!r} is not a string "
                                    f"({'missing value' if text is None else type(text).__name__})")
        labels: dict[str, str] = {}
        for name in label_fields:
            value = row[name]
            if value is None or isinstance(value, (dict, list)):
                raise InvalidInputError(f"{where}: label field {name!r} is "
                                        f"{'missing' if value is None else 'not a plain value'}")
            labels[name] = str(value)
        refs.append(Reference(text=text, labels=labels))
        return limit is not None and len(refs) >= limit

    if suffix == ".jsonl":
        seen = False
        for i, line in enumerate(raw.splitlines(), start=1):
            if not line.strip():
                continue
            seen = True
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):  # JSONDecodeError, over-long integers, deep nesting
                raise InvalidInputError(f"{p.name}, line {i}: not valid JSON") from None
            if not isinstance(obj, dict):
                raise InvalidInputError(f"{p.name}, line {i}: each line must be a JSON object")
            if add(obj, f"{p.name}, line {i}", "the record"):
                break
        if not seen:
            raise InvalidInputError(f"{p.name} holds no records")
        return refs
    csv.field_size_limit(1 << 28)
    reader = csv.reader(raw.removeprefix("\ufeff").splitlines())
    try:
        header = next(reader, None)
        if header is None or not any(h.strip() for h in header):
            raise InvalidInputError(f"{p.name} is empty (a CSV file needs a header row naming its fields)")
        missing = [name for name in fields if name not in header]
        if missing:
            raise InvalidInputError(
                f"{p.name}: no field {missing[0]!r} in the first line (the header row, {len(header)} columns); a CSV "
                "file must start with a header row naming its fields (check --text-field / --label-fields)"
            )
        if len(set(header)) != len(header):
            raise InvalidInputError(f"{p.name}: the header row names a column twice; give each column its own name")
        seen = False
        for row in reader:
            if not row:
                continue
            seen = True
            where = f"{p.name}, line {reader.line_num}"
            if len(row) != len(header):
                raise InvalidInputError(f"{where}: {len(row)} columns, the header row has {len(header)}")
            if add(dict(zip(header, row, strict=True)), where, "the record"):
                break
    except csv.Error:
        raise InvalidInputError(f"{p.name}, line {reader.line_num}: not valid CSV (check the quoting)") from None
    if not seen:
        raise InvalidInputError(f"{p.name} holds no records (only a header row)")
    return refs


def partition(references: Sequence[Reference], batch_size: int, seed: int | None) -> tuple[list[list[int]], int]:
    """Disjoint batches of ``batch_size`` record indices, and the number of records left out.

    Records are grouped by their public labels (groups in order of first appearance), each group is shuffled with
    ``random.Random(seed)`` and cut into batches; a group's remainder (< B) is left out. Data-independent: the text of a
    record plays no part.

    >>> refs = [Reference("a", {"s": "1"}), Reference("b", {"s": "2"}), Reference("c", {"s": "1"})]
    >>> partition(refs, 2, seed=0)
    ([[0, 2]], 1)
    """
    groups: dict[tuple[tuple[str, str], ...], list[int]] = {}
    for i, ref in enumerate(references):
        groups.setdefault(tuple(sorted(ref.labels.items())), []).append(i)
    rng = random.Random(0 if seed is None else seed)
    batches, left = [], 0
    for members in groups.values():
        members = list(members)
        rng.shuffle(members)
        full = len(members) // batch_size * batch_size
        batches.extend(members[j:j + batch_size] for j in range(0, full, batch_size))
        left += len(members) - full
    return batches, left


@dataclass
class SyntheticText:
    """One synthetic text (from one batch)."""

    text: str
    labels: Mapping[str, str]
    batch: int
    tokens: int
    finish_reason: str
    private_tokens: int | None = None
    data_dependent: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = {"text": self.text, "labels": dict(self.labels), "batch": self.batch, "tokens": self.tokens,
               "finish_reason": self.finish_reason}
        if self.private_tokens is not None:
            out["private_tokens"] = self.private_tokens
        if self.data_dependent:
            out["data_dependent"] = dict(self.data_dependent)
        return out


@dataclass
class SynthesisResult:
    """Output of :func:`synthesize`: the texts, the ex-ante guarantee (per reference), settings and timing."""

    texts: list[SyntheticText]
    guarantee: Guarantee
    method: str
    settings: dict[str, Any]
    references_used: int
    references_left_out: int
    seconds: float
    lm_calls_per_token: int

    @property
    def generated_tokens(self) -> int:
        return sum(t.tokens for t in self.texts)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    def header(self) -> dict[str, Any]:
        """The record written first in an output file: guarantee, settings and counts (no private text)."""
        return {"dpinfer": {"kind": "synthesis", "method": self.method, "guarantee": self.guarantee.to_dict(),
                            "settings": self.settings, "references_used": self.references_used,
                            "references_left_out": self.references_left_out, "texts": len(self.texts),
                            "lm_calls_per_token": self.lm_calls_per_token,
                            "tokens_per_second": round(self.tokens_per_second, 3)}}

    def jsonl_lines(self) -> list[str]:
        """The lines of the output file: the header, then one JSON object per text (each ending in a newline).
        The header leaves out the throughput: timing depends on the references' lengths (a side channel)."""
        from dpinfer._json import plain

        head = self.header()
        head["dpinfer"].pop("tokens_per_second", None)
        return [json.dumps(plain(rec), ensure_ascii=False) + "\n"
                for rec in (head, *(t.to_dict() for t in self.texts))]

    def write_jsonl(self, path: str | Path) -> None:
        """Write :meth:`jsonl_lines` to ``path`` atomically: a temporary file in the same folder, then
        :func:`os.replace`; on any error or interruption the temporary file is removed (no partial file)."""
        from dpinfer.validation import atomic_open

        lines = self.jsonl_lines()
        with atomic_open(path) as f:
            f.writelines(lines)

    def to_dict(self) -> dict[str, Any]:
        return {**self.header()["dpinfer"], "texts": [t.to_dict() for t in self.texts]}


def _check_positive(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ConfigurationError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _encode_reference(lm: LM, text: str, max_tokens: int | None) -> str:
    if max_tokens is None:
        return text
    ids = lm.encode(text)
    return text if len(ids) <= max_tokens else lm.decode(ids[:max_tokens], skip_special_tokens=False)


def batch_contexts(lm: LM, template: PromptTemplate, batch: Sequence[Reference],
                   max_reference_tokens: int | None = SYNTH.max_reference_tokens) -> list[list[int]]:
    """Token ids of the public prompt (row 0) and of one private prompt per reference (rows 1..B).

    The labels of the batch's first reference fill the templates (a batch shares its labels). An empty reference is
    the null reference ⊥ of the adjacency: its row is the public prompt. References are cut to
    ``max_reference_tokens`` tokens.
    """
    labels = batch[0].labels
    prefix = template.render_prefix(labels)
    public = lm.encode(lm.instruction_prompt(template.render_public(labels)) + prefix)
    rows = [public]
    for ref in batch:
        if not ref.text.strip():
            rows.append(public)
            continue
        body = _encode_reference(lm, ref.text, max_reference_tokens)
        rows.append(lm.encode(lm.instruction_prompt(template.render_private(body, labels)) + prefix))
    return rows


REFERENCE_SLACK = 8
"""Tokens added to ``max_reference_tokens`` in :func:`public_pad_width` for merges at the template boundaries."""


def public_pad_width(lm: LM, template: PromptTemplate, labels: Mapping[str, str],
                     max_reference_tokens: int | None) -> int | None:
    """The engine's padding width for a batch, from PUBLIC parameters only (rule 2: the public row's computation never
    sees the private rows' lengths): the private template with an empty reference, plus ``max_reference_tokens`` and
    :data:`REFERENCE_SLACK`. A private context longer than that still decodes exactly (in a second batch, slower).
    ``None`` when references are not cut (no public bound: the engine pads to the public row)."""
    if max_reference_tokens is None:
        return None
    empty = lm.encode(lm.instruction_prompt(template.render_private("", labels)) + template.render_prefix(labels))
    return len(empty) + max_reference_tokens + REFERENCE_SLACK


@dataclass(frozen=True)
class BuildArgs:
    """What a builder reads to construct a synthesis mechanism: parameters only (no reference, no model)."""

    epsilon: float
    delta: float
    batch_size: int
    max_new_tokens: int
    top_k: int | None
    temperature: float
    options: dict[str, Any]


def _build_calibrated(name: str, *keys: str) -> Callable[[BuildArgs], Mechanism]:
    """``cls.calibrated(Budget(ε, δ), Spec(T_max, batch_size=B, temperature=τ, <keys>, **options))``."""
    def build(a: BuildArgs) -> Mechanism:
        from dpinfer.mechanisms import REGISTRY

        extra = {k: getattr(a, k) for k in keys}
        return REGISTRY.get(name).cls.calibrated(Budget(a.epsilon, a.delta), Spec(
            a.max_new_tokens, batch_size=a.batch_size, temperature=a.temperature, **extra, **a.options))

    return build


BUILDERS: dict[str, Callable[[BuildArgs], Mechanism]] = {
    "invisibleink": _build_calibrated("invisibleink", "top_k"),
    "amin": _build_calibrated("amin"),
    "adapmixed": _build_calibrated("adapmixed", "top_k"),
}
"""Synthesis-specific construction per registered mechanism. One registered for ``"synthesize"`` without an entry is
built as ``cls.calibrated(Budget(ε, δ), Spec(T_max, batch_size=, temperature=, **options))``."""


def build_mechanism(method: str, *, lm: LM, epsilon: float | None, delta: float, batch_size: int, max_new_tokens: int,
                    top_k: int | None, temperature: float, options: Mapping[str, Any] | None = None) -> Any:
    """The calibrated mechanism of ``method`` (a baseline: its registered mechanism, the plain sampler)."""
    from dpinfer.mechanisms import get_mechanism
    from dpinfer.methods import baseline
    from dpinfer.validation import check_method

    check_method("synthesize", method)
    b = baseline("synthesize", method)
    if b is not None:
        return get_mechanism(b.mechanism, temperature=temperature, top_k=top_k, mode="joint")
    eps = _check_positive(epsilon, "epsilon")
    args = BuildArgs(epsilon=eps, delta=delta, batch_size=batch_size, max_new_tokens=max_new_tokens, top_k=top_k,
                     temperature=temperature, options=dict(options or {}))
    return BUILDERS.get(method, _build_calibrated(method))(args)


def check_synth_budget(*, method: str, epsilon: float | None, delta: float, batch_size: int, max_new_tokens: int,
                       top_k: int | None, temperature: float, options: Mapping[str, Any] | None = None) -> None:
    """Calibrate the synthesis mechanism from the parameters alone (refuses an unreachable ε before the model loads)."""
    build_mechanism(method, lm=None, epsilon=epsilon, delta=delta, batch_size=batch_size,  # type: ignore[arg-type]
                    max_new_tokens=max_new_tokens, top_k=top_k, temperature=temperature, options=options)


def _public_guarantee(delta: float, t_max: int) -> Guarantee:
    from dpinfer.accounting import Guarantee, PureDp

    return Guarantee(epsilon=0.0, delta=delta, mechanism="public", loss=PureDp(0.0),
                     adjacency="any change to the references (the public prompt reads none)",
                     parameters={"T_max": t_max}, max_new_tokens=t_max)


@dataclass
class SynthesisPlan:
    """What :func:`plan_synthesis` decides before any model loads: the checked references, the partition into batches
    (after ``max_texts``), the template, the calibrated mechanism and the ex-ante guarantee.

    The seed is kept here for the sampling only: :meth:`header` and :attr:`settings` never carry it."""

    references: list[Reference]
    batches: list[list[int]]
    template: PromptTemplate
    method: str
    mechanism: Any
    guarantee: Guarantee
    settings: dict[str, Any]
    """The public settings, in output order, without the model (:meth:`settings_for` adds it)."""
    public: bool
    max_new_tokens: int
    max_reference_tokens: int | None
    batch_size: int
    seed: int | None = field(default=None, repr=False)

    @property
    def references_used(self) -> int:
        return 0 if self.public else sum(len(m) for m in self.batches)

    @property
    def references_left_out(self) -> int:
        return len(self.references) - self.references_used

    @property
    def lm_calls_per_token(self) -> int:
        return 1 if self.public else self.batch_size + 1

    def settings_for(self, model: str) -> dict[str, Any]:
        """:attr:`settings` with the model's name (``lm.name``) in its place."""
        out: dict[str, Any] = {}
        for key, value in self.settings.items():
            out[key] = value
            if key == "temperature":
                out["model"] = model
        return out

    def header(self, model: str, extra_settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The first line of an output file, without the throughput (timing is a side channel): the guarantee, the
        settings (with ``extra_settings``, e.g. the command's label fields and ``--limit``), the number of references
        read, used and left out, the number of texts planned (one per batch). Never a reference or the seed."""
        return {"dpinfer": {"kind": "synthesis", "method": self.method, "guarantee": self.guarantee.to_dict(),
                            "settings": {**self.settings_for(model), **dict(extra_settings or {})},
                            "references": len(self.references), "references_used": self.references_used,
                            "references_left_out": self.references_left_out, "texts": len(self.batches),
                            "lm_calls_per_token": self.lm_calls_per_token}}

    def partition_sha256(self) -> str:
        """SHA-256 over the partition: each batch's references (text and labels) in batch order. Two runs with the
        same digest give every batch index the same references; a changed corpus, seed or label changes it.

        DERIVED FROM THE PRIVATE CORPUS (a guess of the whole corpus can be checked against it): keep it private,
        never in a release (``dpinfer synth`` keeps it in a private sidecar file next to ``--out``)."""
        import hashlib

        h = hashlib.sha256(b"dpinfer synthesis partition v1\0")
        for b, members in enumerate(self.batches):
            h.update(f"batch {b} of {len(members)}\0".encode())
            for i in members:
                ref = self.references[i]
                item = json.dumps([ref.text, sorted(ref.labels.items())], ensure_ascii=False).encode("utf-8")
                h.update(len(item).to_bytes(8, "big"))
                h.update(item)
        return h.hexdigest()


def plan_synthesis(
    references: Sequence[Reference | str],
    *,
    method: str = SYNTH.method,
    epsilon: float | None = None,
    delta: float = SYNTH.delta,
    batch_size: int = SYNTH.batch_size,
    max_new_tokens: int = SYNTH.max_new_tokens,
    top_k: int | None = SYNTH.top_k,
    temperature: float = SYNTH.temperature,
    prompt_template: PromptTemplate | str | None = None,
    seed: int | None = None,
    max_texts: int | None = None,
    max_reference_tokens: int | None = SYNTH.max_reference_tokens,
    options: Mapping[str, Any] | None = None,
) -> SynthesisPlan:
    """Every check, the partition, the calibrated mechanism and the guarantee of :func:`synthesize`, without a model
    (the arguments are :func:`synthesize`'s)."""
    from dpinfer.methods import is_baseline
    from dpinfer.validation import check_corpus_size, check_synth_params

    check_synth_params(method=method, epsilon=epsilon, delta=delta, batch_size=batch_size,
                       max_new_tokens=max_new_tokens, top_k=top_k, temperature=temperature, seed=seed,
                       max_texts=max_texts, max_reference_tokens=max_reference_tokens)
    public = is_baseline("synthesize", method)  # the public prompt only: reads no reference
    if isinstance(references, (str, bytes)) or not isinstance(references, Sequence):
        raise InvalidInputError(f"references must be a list of Reference objects or strings, got "
                                f"{type(references).__name__}")
    for i, r in enumerate(references):
        if isinstance(r, Reference):
            if not isinstance(r.text, str) or not isinstance(r.labels, Mapping):
                raise InvalidInputError(f"reference {i}: Reference.text must be a string and .labels a mapping")
        elif not isinstance(r, str):
            raise InvalidInputError(f"reference {i} must be a Reference or a string, got {type(r).__name__}")
    refs = [r if isinstance(r, Reference) else Reference(r) for r in references]
    if not refs:
        raise InvalidInputError("the reference corpus is empty (no references)")
    check_corpus_size(method=method, references=len(refs), batch_size=batch_size)
    if isinstance(prompt_template, str):
        if prompt_template not in TEMPLATES:
            raise ConfigurationError(f"unknown prompt template {prompt_template!r}; choose one of "
                                     f"{', '.join(TEMPLATES)} or pass a PromptTemplate")
        template = TEMPLATES[prompt_template]
    else:
        template = prompt_template or TEMPLATES[SYNTH.template]
    missing = template.fields() - set(refs[0].labels)
    if missing:
        raise ConfigurationError(f"the prompt template uses label field(s) {sorted(missing)} that the records do not "
                                 "carry; pass them with --label-fields / label_fields")
    # ``public`` reads no reference but writes one text per would-be batch, for a like-for-like number of texts
    batches, _ = partition(refs, batch_size, seed)
    if not batches:
        raise InvalidInputError(f"no label group holds B = {batch_size} references; lower --batch-size")
    if max_texts is not None:
        batches = batches[:max_texts]
    # calibrated from the parameters alone, before the model loads (an unreachable ε is refused at once)
    mech = build_mechanism(method, lm=None, epsilon=epsilon, delta=delta, batch_size=batch_size,  # type: ignore
                           max_new_tokens=max_new_tokens, top_k=top_k, temperature=temperature, options=options)
    guarantee = _public_guarantee(delta, max_new_tokens) if public else mech.guarantee(max_new_tokens)
    if seed is not None:
        guarantee = dataclasses.replace(guarantee, seeded=True)
    settings = {"epsilon": epsilon, "delta": delta, "batch_size": batch_size, "max_new_tokens": max_new_tokens,
                "top_k": top_k, "temperature": temperature,  # the model goes here (settings_for); never the seed
                "max_reference_tokens": max_reference_tokens,
                "prompt_template": next((k for k, v in TEMPLATES.items() if v == template), "custom"),
                "prompt_template_sha256": template_sha256(template),
                "max_texts": max_texts, "options": dict(options or {})}
    return SynthesisPlan(references=refs, batches=batches, template=template, method=method, mechanism=mech,
                         guarantee=guarantee, settings=settings, public=public, max_new_tokens=max_new_tokens,
                         max_reference_tokens=max_reference_tokens, batch_size=batch_size, seed=seed)


def template_sha256(template: PromptTemplate) -> str:
    """SHA-256 of a (public) prompt template: tells two ``custom`` templates apart in an output's settings."""
    import hashlib

    body = json.dumps([template.private, template.public, template.response_prefix], ensure_ascii=False)
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def synthesize_iter(plan: SynthesisPlan, *, lm: LM | str | None = None, skip_batches: Iterable[int] = (),
                    progress: Callable[[int, int], None] | None = None, runtime: Any = None
                    ) -> Iterator[SyntheticText]:
    """The texts of ``plan``'s batches, each as soon as its batch finishes (not in batch order), but for the batch
    indices in ``skip_batches`` (already released: a resumed job plans only the missing batches).

    Every batch still to do is planned (its contexts and its own copy of the calibrated mechanism: jobs share no
    state) and all go through one ``Engine.run_jobs`` call. A batch's sampling seed comes from the plan's seed and its
    index in the plan, so a batch draws the same randomness whichever other batches run with it (the engine's
    batched rounding aside: :mod:`dpinfer.engine.runner`). ``progress(done, total)`` counts the skipped batches as
    done. ``runtime``: a :class:`~dpinfer.runtime.Runtime` whose model and engine to use instead of ``lm`` (a
    server's engine batches the job with its other requests)."""
    from dpinfer.engine import Engine, EngineJob
    from dpinfer.models import resolve_lm

    skip = set()
    for b in skip_batches:
        if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < len(plan.batches):
            raise ConfigurationError(f"skip_batches holds {b!r}, not a batch index of this plan (0 to "
                                     f"{len(plan.batches) - 1})")
        skip.add(b)
    todo = [b for b in range(len(plan.batches)) if b not in skip]
    if not todo:
        return
    model = runtime.lm if runtime is not None else resolve_lm(lm)
    engine = runtime.engine if runtime is not None else Engine(model)
    base_seed = 0 if plan.seed is None else int(plan.seed)
    refs = plan.references
    jobs = []
    for b in todo:
        members = plan.batches[b]
        labels = refs[members[0]].labels
        contexts = batch_contexts(model, plan.template, [refs[i] for i in members], plan.max_reference_tokens)
        if plan.public:
            contexts = contexts[:1]
        jobs.append(EngineJob(contexts=contexts, mechanism=copy.deepcopy(plan.mechanism),
                              max_new_tokens=plan.max_new_tokens,
                              pad_width=public_pad_width(model, plan.template, labels, plan.max_reference_tokens),
                              seed=None if plan.seed is None else base_seed * 1_000_003 + b))
    finished = len(skip)
    if progress is not None:
        progress(finished, len(plan.batches))  # the total is known before the first batch runs
    for j, out in engine.run_jobs(jobs):
        b = todo[j]
        job_mech = jobs[j].mechanism
        labels = refs[plan.batches[b][0]].labels
        ids = out.sequences[0]
        dd: dict[str, Any] = job_mech.diagnostics(out.steps)  # data-dependent: diagnostics only
        private = dd.pop("private_tokens", None)
        jobs[j] = dataclasses.replace(jobs[j], contexts=())  # free the finished batch's private contexts
        finished += 1
        yield SyntheticText(text=model.decode(ids).strip(), labels=dict(labels), batch=b, tokens=len(ids),
                            finish_reason=out.finish_reasons[0], private_tokens=private, data_dependent=dd)
        if progress is not None:
            progress(finished, len(plan.batches))


@charged("corpus", what="synthesize")
def synthesize(
    references: Sequence[Reference | str],
    *,
    lm: LM | str | None = None,
    method: str = SYNTH.method,
    epsilon: float | None = None,
    delta: float = SYNTH.delta,
    batch_size: int = SYNTH.batch_size,
    max_new_tokens: int = SYNTH.max_new_tokens,
    top_k: int | None = SYNTH.top_k,
    temperature: float = SYNTH.temperature,
    prompt_template: PromptTemplate | str | None = None,
    seed: int | None = None,
    max_texts: int | None = None,
    max_reference_tokens: int | None = SYNTH.max_reference_tokens,
    options: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
    skip_batches: Iterable[int] = (),
    on_text: Callable[[SyntheticText], None] | None = None,
    ledger: Any = None,
    unit: str | None = None,
) -> SynthesisResult:
    """Generate one synthetic text per disjoint batch of ``batch_size`` references (see the module docstring).

    :func:`plan_synthesis` (every check, the partition, the guarantee; no model) then :func:`synthesize_iter`.

    Args:
        references: the private records (:class:`Reference`, or plain strings without labels).
        lm: model (default: the embedded SmolLM2-135M-Instruct).
        method: ``invisibleink`` | ``amin`` | ``adapmixed`` | ``public``.
        epsilon: target ε per reference (for ``adapmixed``: the budget of its data-dependent accounting).
        delta: δ.
        batch_size: B references per text (the engine steps B + 1 contexts; compute ≈ B + 1 LM calls per token).
        max_new_tokens: ``T_max`` per text (the guarantee is computed for it).
        top_k: Top-k⁺ parameter (InvisibleInk), public support (AdaPMixED) or plain top-k (public); None = full
            vocabulary.
        temperature: τ.
        prompt_template: a :class:`PromptTemplate` or the name of one in :data:`TEMPLATES` (default ``"generic"``).
        seed: for tests and benchmarks only: seeds the partition and the sampling. Without it (the default) the noise
            comes from the operating system's secure generator. With it the guarantee holds only while the seed stays
            secret (``guarantee.seeded``); the seed is never written into the result or the output file.
        max_texts: stop after this many batches (the guarantee is unchanged: it holds per reference).
        max_reference_tokens: cut each reference to this many tokens (None: no cut).
        options: extra mechanism parameters (e.g. ``{"svt_noise": 0.3}`` for ``amin``).
        progress: called as ``progress(batches_done, batches_total)``.
        skip_batches: batch indices already released (by an earlier, interrupted run of the same plan): not run
            again, not in the result. Rerunning a batch would release its references twice; the partition is
            deterministic (the seed, the labels and the order of the references) only for the same references.
        on_text: called with each text as soon as its batch finishes (in the order they finish), e.g. to append it
            to a file.
        ledger: a :class:`~dpinfer.Ledger` (or its path) this run is charged to, once, at its guarantee (every
            reference pays each run's per-reference loss), before the model loads (:mod:`dpinfer.pipelines.budget`).
            A resumed run (``skip_batches`` not empty) is not charged again: the run it resumes was.
        unit: the corpus's unit on the ledger (name it, e.g. ``"yelp-2024"``); required with a ledger.

    Returns:
        The texts of the batches run, in batch order.
    """
    plan = plan_synthesis(references, method=method, epsilon=epsilon, delta=delta, batch_size=batch_size,
                          max_new_tokens=max_new_tokens, top_k=top_k, temperature=temperature,
                          prompt_template=prompt_template, seed=seed, max_texts=max_texts,
                          max_reference_tokens=max_reference_tokens, options=options)
    from dpinfer.models import resolve_lm

    skip_batches = set(skip_batches)
    spend = current_spend()
    if spend is not None and not skip_batches:  # the run's cost, from its parameters: before the model loads
        spend.settle(plan.guarantee)
    model = resolve_lm(lm)
    t0 = time.perf_counter()
    done: dict[int, SyntheticText] = {}
    for text in synthesize_iter(plan, lm=model, skip_batches=skip_batches, progress=progress):
        done[text.batch] = text
        if on_text is not None:
            on_text(text)
    seconds = time.perf_counter() - t0
    return SynthesisResult(texts=[done[b] for b in sorted(done)], guarantee=plan.guarantee, method=method,
                           settings=plan.settings_for(model.name), references_used=plan.references_used,
                           references_left_out=plan.references_left_out, seconds=seconds,
                           lm_calls_per_token=plan.lm_calls_per_token)
