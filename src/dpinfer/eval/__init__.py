"""Evaluation: metrics for released text (perplexity, LOSS attack, leaks)."""
