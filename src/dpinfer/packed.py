"""Float32 linears of a few rows on CPU: oneDNN's packed-weight kernel (``load_model`` applies it by default on CPU).

A decode step of K rows multiplies a ``(K, in)`` input by every weight matrix. For 2 ≤ K ≲ 50 rows PyTorch's default
CPU kernel (MKL ``sgemm``) is slow on small batches: on the 2-core development machine (AMD EPYC, AVX2, one thread) a
step of the output head (49,152 × 576) costs about 2× one row for K = 2 and 3× for K = 5-10, i.e. it is computed
nearly row by row, although the weights are read once. oneDNN's matmul on weights reordered once into its blocked
layout (``torch.ops.mkldnn._reorder_linear_weight``, the kernel ``torch.compile``'s CPU freezing uses) computes the
same products with the weights read once: the head's K = 2-10 step then costs about one row's, and a decoder layer's
about 0.6-0.8× of MKL's.

:func:`pack_linears` gives every ``nn.Linear`` of a model that twin, in place: the module stays the same object
(its class becomes ``PackedLinear`` (:func:`packed_linear_cls`), a subclass of ``nn.Linear``; weights, ties,
``state_dict`` unchanged) and its ``forward`` uses the packed kernel for inputs of 2 to :data:`PACKED_MAX_ROWS`
rows (any number ≥ 2 for the output head, :data:`PACKED_HEAD_FEATURES`), without autograd, on float32 CPU tensors;
one row (a single decode row, a matrix-vector product either way) and long inputs (prompt processing) keep
``F.linear``, bit for bit. A layer's packed copy is made the first time it is used (the copies of the embedded
model's 211 layers take about 1 s of CPU and 0.5 GB): a job that never steps two rows at once, such as plain
generation of one text, never makes them.

Rows stay independent: a row's output is computed from that row and the weights only (no statistic of the batch:
float32 throughout, tested bit for bit against different neighbours), so stepping a public row beside private rows
cannot move it (rule 2). The products differ from MKL's by float32 rounding (a different summation order), as any
batch of a different size already does. If the weights are changed or moved after packing (``weight.data_ptr()`` or
its version counter moves), the layer falls back to ``F.linear`` for good.
"""

from __future__ import annotations

import functools
from typing import Any

PACKED_MAX_ROWS = 48
"""Most rows for which a decoder layer uses the packed kernel (measured: at 64 and more rows MKL is as fast)."""

PACKED_HEAD_FEATURES = 8192
"""A layer with at least this many outputs (the vocabulary head) uses the packed kernel for any number of rows ≥ 2."""

PACK_MAX_BYTES = 2 << 30
"""Largest model (bytes of float32 linear weights) that is packed: the packed copy doubles the weights' memory, which
a small model such as the embedded one (0.5 GB) affords and a 7B model on CPU (28 GB) may not."""

PACK_HINT_ROWS = 10
"""The row count oneDNN chooses its weight layout for (DP-GTR's stage 1 decodes 10 rows)."""


def packing_available() -> bool:
    """Whether this torch build has oneDNN's packed linear (CPU builds with MKL-DNN)."""
    import torch

    ops = getattr(torch.ops, "mkldnn", None)
    return bool(torch.backends.mkldnn.is_available()) and ops is not None and all(
        hasattr(ops, name) for name in ("_reorder_linear_weight", "_linear_pointwise"))


def _signature(weight: Any) -> tuple[Any, ...]:
    return (weight.data_ptr(), weight._version, weight.dtype, weight.device, tuple(weight.shape))


@functools.cache
def packed_linear_cls() -> type:
    """:class:`PackedLinear` (made on first use, so that importing dpinfer does not import torch)."""
    import torch

    class PackedLinear(torch.nn.Linear):
        """An ``nn.Linear`` with a oneDNN packed copy of its weights for inputs of a few rows (module docstring)."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            state = self.__dict__.get("_dpinfer_packed")
            if state is not None and x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() >= 1:
                rows = x.numel() // max(1, x.shape[-1])
                packed, signature, max_rows = state
                grad = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
                if 2 <= rows <= max_rows and not grad and not torch.compiler.is_compiling():
                    if signature == _signature(self.weight):
                        if packed is None:  # first use: pack now (two threads at once would both store the same)
                            packed = _pack(self.weight)
                            self.__dict__["_dpinfer_packed"] = (packed, signature, max_rows)
                        return torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "none", [], "")
                    self.__dict__["_dpinfer_packed"] = None  # weights changed or moved: F.linear from now on
            return torch.nn.functional.linear(x, self.weight, self.bias)

    return PackedLinear


def pack_linears(model: Any, *, eager: bool = False) -> int:
    """Give every float32 CPU ``nn.Linear`` of ``model`` (the output head included) the packed twin, in place, made
    at the layer's first use of it (``eager``: now); returns the number of layers packed (0 when this torch build has
    no oneDNN, or when the weights exceed :data:`PACK_MAX_BYTES`: the copy would double them)."""
    import torch

    if not packing_available():
        return 0
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear
               and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]
    if sum(m.weight.numel() * m.weight.element_size() for m in {id(m.weight): m for m in linears}.values()) \
            > PACK_MAX_BYTES:
        return 0
    cls = packed_linear_cls()
    for module in linears:
        w = module.weight
        max_rows = (1 << 62) if module.out_features >= PACKED_HEAD_FEATURES else PACKED_MAX_ROWS
        module.__class__ = cls
        module.__dict__["_dpinfer_packed"] = (_pack(w) if eager else None, _signature(w), max_rows)
    return len(linears)


def pack_now(model: Any) -> int:
    """Make the packed copies :func:`pack_linears` left for first use now (e.g. to pay for them before a first
    request rather than during it); returns how many were made."""
    count = 0
    for module in model.modules():
        state = module.__dict__.get("_dpinfer_packed")
        if state is not None and state[0] is None and state[1] == _signature(module.weight):
            module.__dict__["_dpinfer_packed"] = (_pack(module.weight), *state[1:])
            count += 1
    return count


def _pack(weight: Any) -> Any:
    """oneDNN's packed copy of a float32 CPU weight (a normal tensor, also when made under inference mode)."""
    import torch

    with torch.inference_mode(False), torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_HINT_ROWS)


__all__ = ["PACKED_HEAD_FEATURES", "PACKED_MAX_ROWS", "PACK_MAX_BYTES", "pack_linears", "pack_now",
           "packed_linear_cls", "packing_available"]
