"""Pipelines: sanitize (DP-Fusion) and, later, synthesize, rag and protect-prompt."""
