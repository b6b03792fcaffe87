"""The settings of a synthesis run (:func:`dpinfer.synthesize`, ``dpinfer synth``): :class:`SynthConfig` and the
prompt templates (:class:`PromptTemplate`, :data:`TEMPLATES`).

Every field is public (the seed aside, which is never written next to a release). A :class:`SynthConfig` checks its
fields when it is built (:mod:`dpinfer.checks`); what depends on the method (is it one of the task's methods, does it
need ε) is checked by the method table (:mod:`dpinfer.methods.synthesize`).

>>> SynthConfig(epsilon=10).batch_size == SYNTH.batch_size
True
>>> SynthConfig(epsilon=10, batch_size=0)
Traceback (most recent call last):
...
dpinfer.errors.ConfigurationError: batch_size must be an integer ≥ 1, got 0
"""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dpinfer.checks import check_delta, check_seed, check_temperature, int_at_least, positive_number
from dpinfer.configs.base import Config, option
from dpinfer.defaults import SYNTH
from dpinfer.errors import ConfigurationError


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

    def sha256(self) -> str:
        """SHA-256 of the (public) template: tells two ``custom`` templates apart in an output's settings."""
        body = json.dumps([self.private, self.public, self.response_prefix], ensure_ascii=False)
        return hashlib.sha256(body.encode("utf-8")).hexdigest()

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


def template_sha256(template: PromptTemplate) -> str:
    """SHA-256 of a (public) prompt template (:meth:`PromptTemplate.sha256`)."""
    return template.sha256()


@dataclass(frozen=True)
class SynthConfig(Config):
    """Every setting of :func:`dpinfer.synthesize` but the references, the model and the callbacks (the same keywords,
    the same defaults: :data:`dpinfer.defaults.SYNTH`). Built once, checked once (``spelling="cli"``: messages name the
    command-line options); :meth:`settings` is its public part as written next to a release. The fields declared with
    :func:`~dpinfer.configs.base.option` carry the ``--help`` of their ``dpinfer synth`` option."""

    method: str = option(SYNTH.method, cli=False, request=True)
    """A method of :data:`dpinfer.methods.synthesize.TABLE` (``--method``)."""
    epsilon: float | None = option(None, type=float, request=True,
                                   help="target ε per reference (required but for public)")
    """Target ε per reference (for ``adapmixed``: the budget of its data-dependent accounting); None only for a
    baseline that reads no reference."""
    delta: float = option(SYNTH.delta, request=True, help="δ (default {default})")
    batch_size: int = option(SYNTH.batch_size, request=True,
                             help="B references per text (compute ≈ B + 1 LM calls per token; default {default})")
    max_new_tokens: int = option(SYNTH.max_new_tokens, request=True, help="T_max per text (default {default})")
    top_k: int | None = option(SYNTH.top_k, type=int, help="k of Top-k+ (default {default}; 0 = full vocabulary)")
    temperature: float = option(SYNTH.temperature, help="τ (default {default})")
    prompt_template: PromptTemplate | str | None = None
    """A :class:`PromptTemplate` or a name of :data:`TEMPLATES` (``--template`` / ``--template-file``)."""
    seed: int | None = field(default=None, repr=False)
    """Tests and benchmarks only; never in :meth:`settings` (nor anywhere next to a release)."""
    max_texts: int | None = option(None, type=int, request=True, help="stop after this many texts")
    max_reference_tokens: int | None = option(SYNTH.max_reference_tokens, type=int,
                                              help="cut each reference to this many tokens (default {default}; "
                                                   "0 = no cut)")
    options: Mapping[str, Any] = option(cli=False, default_factory=dict)
    """Extra mechanism parameters (e.g. ``{"svt_noise": 0.3}`` for ``amin``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        n = self.name
        if not isinstance(self.method, str) or not self.method:
            raise ConfigurationError(f"{n('method')} must be the name of a method, got {self.method!r}")
        if self.epsilon is not None:
            positive_number(self.epsilon, n("epsilon"))
        check_delta(self.delta, n("delta"))
        int_at_least(self.batch_size, n("batch_size"), 1)
        int_at_least(self.max_new_tokens, n("max_new_tokens"), 1)
        if self.top_k is not None:
            int_at_least(self.top_k, n("top_k"), 1, " (or None)")
        check_temperature(self.temperature, n("temperature"), allow_zero=True)  # > 0 unless the method samples none
        check_seed(self.seed, n("seed"))
        if self.max_texts is not None:
            int_at_least(self.max_texts, n("max_texts"), 1)
        if self.max_reference_tokens is not None:
            int_at_least(self.max_reference_tokens, n("max_reference_tokens"), 1, " (None: no cut)")
        if not isinstance(self.options, Mapping):
            raise ConfigurationError(f"options must be a mapping of mechanism parameters, got {self.options!r}")
        object.__setattr__(self, "options", dict(self.options))
        self.template  # an unknown template name is refused here  # noqa: B018

    @property
    def template(self) -> PromptTemplate:
        """The prompt template (a name of :data:`TEMPLATES` resolved; None: ``SYNTH.template``)."""
        t = self.prompt_template
        if t is None:
            return TEMPLATES[SYNTH.template]
        if isinstance(t, PromptTemplate):
            return t
        if isinstance(t, str) and t in TEMPLATES:
            return TEMPLATES[t]
        raise ConfigurationError(f"unknown prompt template {t!r}; choose one of {', '.join(TEMPLATES)} or pass a "
                                 "PromptTemplate")

    def settings(self, model: str | None = None) -> dict[str, Any]:
        """The public settings in output order (the ``model``'s name after the temperature, when given), never the
        seed."""
        template = self.template
        return {"epsilon": self.epsilon, "delta": self.delta, "batch_size": self.batch_size,
                "max_new_tokens": self.max_new_tokens, "top_k": self.top_k, "temperature": self.temperature,
                **({} if model is None else {"model": model}), "max_reference_tokens": self.max_reference_tokens,
                "prompt_template": next((k for k, v in TEMPLATES.items() if v == template), "custom"),
                "prompt_template_sha256": template.sha256(), "max_texts": self.max_texts, "options": dict(self.options)}
