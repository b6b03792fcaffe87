"""The output file of ``dpinfer synth --out``, under its older import path: it lives in :mod:`dpinfer.jobs.synth`
(this name is the same module object, so patching one patches the other)."""

import sys

from dpinfer.jobs import synth

sys.modules[__name__] = synth
