"""Scoring of ``dpinfer bench gtr`` (:mod:`dpinfer.bench.gtr`): the leakage of a protected question (ROUGE, BLEU)
and the answerers that see only the protected question and the original choices."""

from __future__ import annotations

from typing import Any


def privacy_scores(original: str, protected: str) -> dict[str, float]:
    """ROUGE-1 / ROUGE-L F1 and sentence BLEU (/100) between the original and the protected question."""
    import sacrebleu
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=False)
    r = scorer.score(original, protected)
    bleu = sacrebleu.sentence_bleu(protected, [original]).score / 100.0 if protected.strip() else 0.0
    return {"rouge1": r["rouge1"].fmeasure, "rougeL": r["rougeL"].fmeasure, "bleu": bleu}


class MiniLMAnswerer:
    """Answers a multiple-choice question by the cosine of all-MiniLM-L6-v2 embeddings (question vs each choice)."""

    name = "minilm-cosine"

    def __init__(self) -> None:
        from dpinfer.eval.embeddings import shared_embedder

        self.embedder = shared_embedder()

    def answer(self, questions: list[str], choices: list[list[str]]) -> list[int]:
        q = self.embedder.encode([x if x.strip() else "?" for x in questions])
        flat = [c for cs in choices for c in cs]
        c = self.embedder.encode(flat)
        out, at = [], 0
        for i, cs in enumerate(choices):
            sims = c[at:at + len(cs)] @ q[i]
            out.append(int(sims.argmax()))
            at += len(cs)
        return out


class LMAnswerer:
    """Answers by the mean log-likelihood of each choice after ``Question: …\\nAnswer:`` under a local causal LM."""

    def __init__(self, lm: Any) -> None:
        self.lm = lm
        self.name = f"lm-loglik ({lm.name})"

    def answer(self, questions: list[str], choices: list[list[str]]) -> list[int]:
        from dpinfer.eval.metrics import continuation_nll

        out = []
        for q, cs in zip(questions, choices, strict=True):
            ctx = self.lm.encode(self.lm.instruction_prompt(f"Question: {q}\nAnswer with one of: {', '.join(cs)}."))
            scores = []
            for c in cs:
                ids = self.lm.encode(c)
                scores.append(-continuation_nll(self.lm, [ctx], ids)[0] / max(1, len(ids)))
            out.append(max(range(len(cs)), key=lambda j: scores[j]))
        return out
