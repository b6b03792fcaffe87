"""Prompt protection's task package (DP-GTR, Li et al. 2025, and its baseline DP-Prompt; ALGORITHMS §4), beside
:mod:`dpinfer.rag`: its stages.

* :mod:`dpinfer.protect.stage1`: stage 1, the only stage that reads the prompt (``n`` DP-Prompt paraphrases);
* :mod:`dpinfer.protect.gtr`: DP-GTR after stage 1 (exemplars by perplexity, keywords, the final prompt);
* :mod:`dpinfer.protect.keywords`: the keywords counted over the rewrites and released (top K, or JEM);
* :mod:`dpinfer.protect.stage3`: stage 3, the final prompt from the exemplars with the keywords suppressed;
* :mod:`dpinfer.protect.rewrite`: DP-Prompt, the first rewrite as it is (the baseline).

Everything after stage 1 reads the released rewrites only. The method table that names them stays in
:mod:`dpinfer.methods.prompt`; the plan step (stage 1 as engine jobs), the guarantee and the release are
:mod:`dpinfer.pipelines.protect_prompt`'s
(:func:`~dpinfer.pipelines.protect_prompt.plan_protect` → :func:`~dpinfer.pipelines.protect_prompt.finish_protect`).
"""
