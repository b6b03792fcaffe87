"""Benchmarks behind ``dpinfer bench ...``: each prints what it measured, with its baseline, from one run."""
