"""Plain (non-private) generation on the engine: :func:`generate`, :func:`generate_many`, :func:`stream`; one request
planned as one engine job by :func:`plan_generate` (the server's chat completions without privacy run the same plan).

The prompt string is used exactly as given (no chat template, no special tokens added); pass ``messages=`` to have
the model's chat template applied instead. Defaults: :data:`dpinfer.defaults.GENERATE` (256 new tokens, τ = 0.7,
top-p = 0.9), the same as ``dpinfer generate``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dpinfer.accounting.charge import Charges
from dpinfer.defaults import GENERATE
from dpinfer.engine import Engine, EngineOutput, Job
from dpinfer.errors import ConfigurationError, ContextTooLongError, InvalidInputError
from dpinfer.mechanisms.sampler import Sampler
from dpinfer.models import LM, resolve_lm
from dpinfer.task import Plan

if TYPE_CHECKING:
    from dpinfer.accounting import Guarantee
    from dpinfer.runtime import Runtime


@dataclass
class GenerationResult:
    """Output of :func:`generate`. ``guarantee`` says plainly that plain generation has no privacy guarantee."""

    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    guarantee: Guarantee
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.text


def _check_prompt(prompt: object, messages: object) -> None:
    """The prompt (or chat messages) checked before any model loads: types first, then emptiness."""
    from dpinfer.validation import check_text

    if (prompt is None) == (messages is None):
        raise ConfigurationError("give exactly one of prompt= or messages=")
    if prompt is not None:
        check_text(prompt, "the prompt")
        return
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise InvalidInputError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise InvalidInputError(f"message {i} must be a dict with string 'role' and 'content'")
    if not any(m["content"].strip() for m in messages):
        raise InvalidInputError("the messages are empty (only white space)")


def _prompt_ids(lm: LM, prompt: str | None, messages: Sequence[dict[str, str]] | None) -> list[int]:
    _check_prompt(prompt, messages)
    text = lm.chat_prompt(messages) if messages is not None else prompt
    return lm.encode(text)  # type: ignore[arg-type]


def _check_params(max_new_tokens: object, temperature: object, top_k: object, top_p: object, seed: object) -> None:
    from dpinfer.validation import check_generate_params

    check_generate_params(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)


def _sampler(temperature: float, top_k: int | None, top_p: float | None) -> Sampler:
    return Sampler(temperature=temperature, top_k=top_k, top_p=top_p, mode="independent")


def plan_generate(lm: LM, prompt: str | None = None, *, messages: Sequence[dict[str, str]] | None = None,
                  max_new_tokens: int = GENERATE.max_new_tokens, temperature: float = GENERATE.temperature,
                  top_k: int | None = GENERATE.top_k, top_p: float | None = GENERATE.top_p,
                  seed: int | None = None) -> Job:
    """A plain generation planned as one engine job, before any token: every check, the prompt's tokens, the
    sampler; refused in one line when the prompt plus ``max_new_tokens`` passes the model's context window. No privacy
    here, so the row's own length may set the public width a slot engine batches on (``pad_width``)."""
    _check_prompt(prompt, messages)
    _check_params(max_new_tokens, temperature, top_k, top_p, seed)
    ids = _prompt_ids(lm, prompt, messages)
    if len(ids) + max_new_tokens > lm.context_window:
        raise ContextTooLongError(f"the prompt ({len(ids)} tokens) plus max_new_tokens={max_new_tokens} exceeds the "
                                  f"model's context window ({lm.context_window}); shorten it or ask for fewer tokens")
    return Job(contexts=[ids], mechanism=_sampler(temperature, top_k, top_p), max_new_tokens=max_new_tokens,
               seed=seed, pad_width=len(ids))


@dataclass(frozen=True)
class GenerateSettings:
    """The settings of one plain generation (:func:`plan_generate`'s keywords)."""

    max_new_tokens: int = GENERATE.max_new_tokens
    temperature: float = GENERATE.temperature
    top_k: int | None = GENERATE.top_k
    top_p: float | None = GENERATE.top_p
    seed: int | None = None


@dataclass(frozen=True)
class GenerateInputs:
    """What plain generation continues: a ``prompt`` used verbatim, or chat ``messages``."""

    prompt: str | None = None
    messages: Sequence[dict[str, str]] | None = None


@dataclass(frozen=True, kw_only=True, eq=False)
class GeneratePlan(Plan):
    """One plain generation planned (:data:`TASK`): one job, no guarantee, nothing charged."""

    lm: LM


class GenerateTask:
    """Plain generation as a :class:`~dpinfer.task.Task` (no privacy: no guarantee, no charge)."""

    name = "generate"

    def plan(self, config: GenerateSettings, inputs: GenerateInputs, runtime: Runtime) -> GeneratePlan:
        c = config
        job = plan_generate(runtime.lm, inputs.prompt, messages=inputs.messages, max_new_tokens=c.max_new_tokens,
                            temperature=c.temperature, top_k=c.top_k, top_p=c.top_p, seed=c.seed)
        return GeneratePlan(jobs=(job,), guarantee=None, charges=Charges(None), lm=runtime.lm)

    def finish(self, plan: GeneratePlan, outputs: Sequence[EngineOutput]) -> GenerationResult:
        job = plan.job
        return _result(plan.lm, outputs[0], 0, job.mechanism, job.max_new_tokens)  # type: ignore[arg-type]


TASK = GenerateTask()
"""Plain generation's task object (:mod:`dpinfer.task`)."""


def _result(lm: LM, out: EngineOutput, row: int, mechanism: Sampler, max_new_tokens: int) -> GenerationResult:
    ids = out.sequences[row]
    return GenerationResult(
        text=lm.decode(ids), token_ids=ids, finish_reason=out.finish_reasons[row],
        prompt_tokens=out.prompt_lengths[row], guarantee=mechanism.guarantee(max_new_tokens),
        seconds=out.prefill_seconds + out.decode_seconds,
        details={"prefill_seconds": out.prefill_seconds, "decode_seconds": out.decode_seconds},
    )


def generate(prompt: str | None = None, *, messages: Sequence[dict[str, str]] | None = None, lm: LM | str | None = None,
             max_new_tokens: int = GENERATE.max_new_tokens, temperature: float = GENERATE.temperature,
             top_k: int | None = GENERATE.top_k, top_p: float | None = GENERATE.top_p,
             seed: int | None = None) -> GenerationResult:
    """Generate a continuation of ``prompt`` (used verbatim) or of chat ``messages``.

    ``temperature=0`` is greedy decoding and matches ``lm.model.generate(..., do_sample=False)`` token for token.
    The same ``seed`` gives the same output.

    >>> # dpinfer.generate("The capital of France is", temperature=0, max_new_tokens=5).text
    """
    _check_prompt(prompt, messages)
    _check_params(max_new_tokens, temperature, top_k, top_p, seed)
    model = resolve_lm(lm)
    job = plan_generate(model, prompt, messages=messages, max_new_tokens=max_new_tokens, temperature=temperature,
                        top_k=top_k, top_p=top_p, seed=seed)
    out = Engine(model).run(job)
    return _result(model, out, 0, job.mechanism, max_new_tokens)  # type: ignore[arg-type]


def generate_many(prompts: Sequence[str], *, lm: LM | str | None = None,
                  max_new_tokens: int = GENERATE.max_new_tokens, temperature: float = GENERATE.temperature,
                  top_k: int | None = GENERATE.top_k, top_p: float | None = GENERATE.top_p,
                  seed: int | None = None) -> list[GenerationResult]:
    """Batched plain generation: one continuation per prompt, all rows stepped together (independent mode)."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise InvalidInputError(f"generate_many needs a non-empty list of prompt strings, got {type(prompts).__name__}"
                                f"{' (empty)' if isinstance(prompts, Sequence) and not prompts else ''}")
    for p in prompts:
        _check_prompt(p, None)
    _check_params(max_new_tokens, temperature, top_k, top_p, seed)
    model = resolve_lm(lm)
    rows = [_prompt_ids(model, p, None) for p in prompts]
    mech = _sampler(temperature, top_k, top_p)
    out = Engine(model).generate(rows, mech, max_new_tokens=max_new_tokens, seed=seed)
    return [_result(model, out, i, mech, max_new_tokens) for i in range(len(rows))]


class TextStreamer:
    """Incremental detokenisation: feed token ids, get the new text (held back while a character is incomplete)."""

    def __init__(self, lm: LM) -> None:
        self.lm, self.ids, self.emitted = lm, [], 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.lm.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        delta, self.emitted = text[self.emitted:], len(text)
        return delta

    def flush(self) -> str:
        """The text still held back at the end (a last character left incomplete), so that the pieces add up to the
        decoded text."""
        text = self.lm.decode(self.ids)
        delta, self.emitted = text[self.emitted:], len(text)
        return delta


def stream(prompt: str | None = None, *, messages: Sequence[dict[str, str]] | None = None,
           lm: LM | str | None = None, max_new_tokens: int = GENERATE.max_new_tokens,
           temperature: float = GENERATE.temperature, top_k: int | None = GENERATE.top_k,
           top_p: float | None = GENERATE.top_p, seed: int | None = None) -> Iterator[str]:
    """Like :func:`generate` but yields the text piece by piece as tokens are produced."""
    _check_prompt(prompt, messages)
    _check_params(max_new_tokens, temperature, top_k, top_p, seed)
    model = resolve_lm(lm)
    job = plan_generate(model, prompt, messages=messages, max_new_tokens=max_new_tokens, temperature=temperature,
                        top_k=top_k, top_p=top_p, seed=seed)
    streamer = TextStreamer(model)
    for event in Engine(model).stream(job):
        tok = event.tokens[0]
        if tok >= 0 and tok not in model.eos_token_ids:
            piece = streamer.push(tok)
            if piece:
                yield piece
    tail = streamer.flush()
    if tail:
        yield tail
