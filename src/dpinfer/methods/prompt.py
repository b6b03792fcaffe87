"""The prompt-protection methods (``dpinfer protect-prompt --method``, :func:`dpinfer.protect_prompt`).

Each entry's builder, ``build(config, runtime)``, returns what runs after stage 1 (the pipeline's DP-Prompt rewrites
of the prompt, the only stage that reads it): how many rewrites it needs, its public settings and guarantee
parameters, and ``finish(...)``, which turns each prompt's released rewrites into its protected prompt.

>>> TABLE.names(), TABLE.default
(['dp-gtr', 'dp-prompt'], 'dp-gtr')
"""

from __future__ import annotations

from dpinfer.defaults import PROTECT
from dpinfer.methods.table import Method, MethodTable

TABLE = MethodTable("prompt", [
    Method("dp-gtr", "prompt", build="dpinfer.protect.gtr:build", mechanism="dp-prompt", contexts="original",
           protects="prompt",
           summary="DP-GTR (Li et al. 2025): n DP-Prompt rewrites, keywords to avoid, a final prompt from the "
                   "lowest-perplexity rewrites"),
    Method("dp-prompt", "prompt", build="dpinfer.protect.rewrite:build", mechanism="dp-prompt",
           contexts="original", protects="prompt", baseline=True,
           summary="DP-Prompt (Utpala et al. 2023): one rewrite, released as it is (the baseline)"),
], default=PROTECT.method)
