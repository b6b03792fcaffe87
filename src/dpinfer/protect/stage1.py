"""Stage 1 of prompt protection, the only stage that reads the prompt: ``n`` DP-Prompt paraphrases of the
chat-templated prompt (:data:`~dpinfer.clip_bounds.PARAPHRASE_INSTRUCTION`), the prompt cut to a PUBLIC number of
tokens first, decoded on the engine's independent mode with :class:`~dpinfer.mechanisms.dp_prompt.DPPrompt`
(:func:`dpinfer.pipelines.protect_prompt.plan_protect` plans them as engine jobs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.clip_bounds import PARAPHRASE_INSTRUCTION
from dpinfer.defaults import PROTECT

if TYPE_CHECKING:
    from dpinfer.mechanisms.dp_prompt import DPPrompt
    from dpinfer.models import LM

DEFAULT_TEMPERATURE = PROTECT.temperature


def stage1_mechanism(*, clip: tuple[float, float], n_rewrites: int, max_new_tokens: int, delta: float,
                     epsilon: float | None = None, temperature: float | None = None) -> DPPrompt:
    """Stage 1's mechanism: :class:`DPPrompt` in independent mode covering ``n_rewrites`` rows of ``max_new_tokens``
    tokens, at ``temperature`` or calibrated to ``epsilon`` (exactly one; neither: :data:`DEFAULT_TEMPERATURE`)."""
    from dpinfer.mechanisms.dp_prompt import DPPrompt

    lo, hi = clip
    if epsilon is not None:
        return DPPrompt.calibrated(Budget(epsilon, delta),
                                   Spec(max_new_tokens, clip_min=lo, clip_max=hi, num_rewrites=n_rewrites))
    tau = DEFAULT_TEMPERATURE if temperature is None else temperature
    return DPPrompt(lo, hi, tau, num_rewrites=n_rewrites, delta=delta)


def paraphrase_ids(lm: LM, prompt: str) -> list[int]:
    """Token ids of stage 1's chat-templated paraphrase request for ``prompt``."""
    return lm.encode(lm.instruction_prompt(PARAPHRASE_INSTRUCTION.format(text=prompt)))


REQUEST_MARGIN = 4
"""Tokens allowed for the tokenizer merging the prompt's first or last token with the template around it."""


def request_bound(lm: LM, max_input_tokens: int) -> int:
    """The most tokens stage 1's paraphrase request may have: the template's own tokens + ``max_input_tokens`` +
    :data:`REQUEST_MARGIN`. Public: from the model's template and the setting, never from a prompt."""
    return len(paraphrase_ids(lm, "")) + max_input_tokens + REQUEST_MARGIN


def check_request_fits(lm: LM, *, max_input_tokens: int, max_new_tokens: int) -> None:
    """Refuse settings whose longest paraphrase request plus ``max_new_tokens`` exceeds the context window (a check on
    the settings and the model alone: the message holds no number read from a prompt)."""
    from dpinfer.errors import ContextTooLongError

    bound = request_bound(lm, max_input_tokens)
    if bound + max_new_tokens > lm.context_window:
        raise ContextTooLongError(
            f"max_input_tokens={max_input_tokens} with the paraphrase template ({bound - max_input_tokens} tokens) "
            f"and max_new_tokens={max_new_tokens} exceeds the model's context window of {lm.context_window} tokens; "
            "lower max_input_tokens or max_new_tokens"
        )


def truncate_tokens(lm: LM, text: str, max_tokens: int) -> str:
    """``text`` cut to its first ``max_tokens`` tokens (a prefix of ``text``, cut at a token boundary); as is when it
    has no more. Says nothing about whether it cut: under any-two-inputs adjacency the length is private."""
    enc = lm.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    if len(offsets) <= max_tokens:
        return text
    return text[: offsets[max_tokens - 1][1]] if max_tokens > 0 else ""


def capped_paraphrase_ids(lm: LM, prompt: str, max_input_tokens: int) -> list[int]:
    """Stage 1's request for ``prompt`` cut to ``max_input_tokens`` tokens (:func:`truncate_tokens`), at most
    :func:`request_bound` tokens long (cut further, a token at a time, in the rare case the template's merges add
    some). A prompt within the cap gives exactly :func:`paraphrase_ids`."""
    cap = max_input_tokens
    bound = request_bound(lm, max_input_tokens)
    while True:
        ids = paraphrase_ids(lm, truncate_tokens(lm, prompt, cap))
        if len(ids) <= bound or cap <= 0:
            return ids[:bound]
        cap -= 1
