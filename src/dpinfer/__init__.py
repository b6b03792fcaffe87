"""dpinfer: differentially private inference with large language models.

One engine steps K contexts together; mechanisms turn K next-token distributions into one token and a privacy cost;
one accountant composes and converts. Every released output carries an ex-ante :class:`~dpinfer.accounting.Guarantee`.

Heavy modules are imported lazily, so ``import dpinfer`` is cheap.
"""

from __future__ import annotations

from dpinfer._lazy import lazy_names

__version__ = "0.1.0"

_LAZY = {
    "load_model": "dpinfer.models",
    "LM": "dpinfer.models",
    "generate": "dpinfer.generation",
    "generate_many": "dpinfer.generation",
    "stream": "dpinfer.generation",
    "GenerationResult": "dpinfer.generation",
    "Engine": "dpinfer.engine",
    "Guarantee": "dpinfer.accounting",
    "Ledger": "dpinfer.accounting.ledger",
    "sanitize": "dpinfer.pipelines.sanitize",
    "sanitize_many": "dpinfer.pipelines.sanitize_many",
    "SanitizeResult": "dpinfer.pipelines.sanitize_result",
    "SanitizeConfig": "dpinfer.configs.sanitize",
    "synthesize": "dpinfer.pipelines.synthesize",
    "SynthesisResult": "dpinfer.pipelines.synthesize",
    "SynthConfig": "dpinfer.configs.synth",
    "Reference": "dpinfer.references",
    "PromptTemplate": "dpinfer.configs.synth",
    "PrivateRAG": "dpinfer.pipelines.rag",
    "RagAnswer": "dpinfer.rag.answer",
    "protect_prompt": "dpinfer.pipelines.protect_prompt",
    "protect_prompts": "dpinfer.pipelines.protect_prompt",
    "ProtectedPrompt": "dpinfer.pipelines.protect_prompt",
    "ProtectConfig": "dpinfer.configs.protect",
}

__all__ = ["__version__", *sorted(_LAZY)]


__getattr__, __dir__ = lazy_names("dpinfer", _LAZY, globals())
