"""Plain generation planned once (:func:`dpinfer.generation.plan_generate`): the library's generate/stream and the
server's chat completions without privacy run the same plan."""

from __future__ import annotations

import pytest

from dpinfer.errors import ContextTooLongError, InvalidInputError
from dpinfer.generation import plan_generate


def test_a_plan_checks_first_and_refuses_a_prompt_past_the_context_window(tiny_lm) -> None:
    messages = [{"role": "user", "content": "Hello there."}]
    job = plan_generate(tiny_lm, messages=messages, max_new_tokens=4, temperature=0.7, top_k=None, top_p=0.9)
    ids = tiny_lm.encode(tiny_lm.chat_prompt(messages))
    assert [list(c) for c in job.contexts] == [ids] and job.pad_width == len(ids) and job.max_new_tokens == 4
    with pytest.raises(ContextTooLongError, match="context window"):
        plan_generate(tiny_lm, "word " * 200, max_new_tokens=tiny_lm.context_window)
    with pytest.raises(InvalidInputError):
        plan_generate(tiny_lm, messages=[{"role": "user", "content": "  "}], max_new_tokens=4)
