"""Dynamic int8 decoding on CPU (``load_model(..., quantize="int8")``): every ``nn.Linear`` of the decoder gets an
int8 twin (weights per output channel, each input row quantised with its own scale) that the decode steps call,
sibling projections fused into one kernel call; prompt processing keeps the float32 layers.

Each input row is quantised with its own scale (:func:`_int8_call`): a row's output reads only that row, never a
statistic of the batch (rule 2).
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from typing import Any

from dpinfer.errors import ConfigurationError
from dpinfer.packed import packed_linear_cls

QUANTIZE_CHOICES = ("int8",)
"""Accepted ``quantize`` values (None: no quantisation)."""


def check_quantize(quantize: str | None, device: Any, dtype: Any) -> None:
    import torch

    if quantize is None:
        return
    if quantize not in QUANTIZE_CHOICES:
        raise ConfigurationError(f"unknown quantize {quantize!r}; accepted values: {', '.join(QUANTIZE_CHOICES)} "
                                 "(or None for no quantisation)")
    if device.type != "cpu":
        raise ConfigurationError(f"quantize={quantize!r} is CPU-only (PyTorch dynamic int8 kernels); on {device.type} "
                                 "leave quantize unset and use the default bfloat16/float16 weights")
    if dtype != torch.float32:
        raise ConfigurationError(f"quantize={quantize!r} needs float32 weights, got dtype {dtype}")


#: sibling projections that read the same input tensor (Llama-type attention and gated MLP): their int8 decode twins
#: are fused into one kernel call per group (:class:`_FusedInt8`)
FUSED_SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class _FusedInt8:
    """One dynamic int8 linear for sibling projections that read the same input (q/k/v, gate/up).

    The int8 call quantises each input row with its own scale (:func:`_int8_call`) and the weights per output channel,
    so one call on the concatenated weights gives every sibling exactly the output of its own call (same row scales,
    same per-channel weight scales, exact int32 accumulation): fewer, larger kernel calls per decode step. The first
    sibling called with an input computes all outputs; the others take their slice if they are called with the SAME
    tensor object (identity, not equality), otherwise they recompute. Not a module: the siblings keep their own
    float32 layers.
    """

    def __init__(self, quantized: tuple[Any, Any], sizes: list[int], bias: Any = None) -> None:
        self.int8_call = _int8_call(quantized[0], bias, quantized[1])
        self.sizes = sizes
        self._last: tuple[Any, tuple[Any, ...]] | None = None

    def output(self, index: int, x: Any) -> Any:
        last = self._last  # one read: safe if two threads share the model
        if last is None or last[0] is not x:
            last = (x, tuple(self.int8_call(x).split(self.sizes, dim=-1)))
            self._last = last
        return last[1][index]


def _int8_call(qlinear: Any, bias: Any, row_sums: Any) -> Any:
    """``x ↦ W x + b`` on the int8 weights of ``qlinear`` with ONE ACTIVATION SCALE PER ROW: row ``i`` of the output
    depends on row ``i`` of ``x`` only, bit for bit, whatever the other rows hold and however many there are.

    PyTorch's dynamic int8 kernel (fbgemm/onednn ``quantized::linear_dynamic``) picks one uint8 scale and zero point
    per call from the min and max of the WHOLE input (and 0), so a batched call would let one row's values move every
    other row's rounding (a public row's logits would depend on the private rows stepped with it). Here each row is
    mapped onto ``[0, 1]`` by its own range, ``x = lo + d · u`` (``u = (x − lo) / d`` is exactly 0 at the row's
    minimum and exactly 1 at its maximum), and ``qlinear`` carries two extra zero weight columns, fed with ``1`` and
    ``0`` (range pins, for rows that are constant): the kernel's range is ``[0, 1]`` in every call, so its scale
    (1/127 with ``reduce_range``) and zero point (0) are constants and every row uses all 128 codes. The output row
    is ``d · (Wq u) + lo · (Wq 1)`` with the row sums of the int8 weights ``Wq`` (the weights' rounding then applies
    to ``x`` itself, not to the offset; ``row_sums`` from :func:`_quantized`), plus the bias (kept out of
    ``qlinear``). One kernel call for all rows (the weights are read once), called directly: the same op and arguments
    as the module's ``forward`` (``reduce_range=True``) without its per-call Python checks.
    """
    import torch

    op = torch.ops.quantized.linear_dynamic.default
    if qlinear._packed_params.dtype != torch.qint8 or (qlinear.version or 0) < 4:
        raise ConfigurationError("int8 quantisation needs torch's qint8 dynamic Linear (module version ≥ 4)")
    packed = qlinear._packed_params._packed_params
    pins: dict[tuple[Any, ...], Any] = {}  # (shape, dtype) -> the (..., 2) block of [1, 0] pins

    def call(x: Any) -> Any:
        lo, hi = torch.aminmax(x, dim=-1, keepdim=True)
        d = hi.sub_(lo).clamp_min_(1e-30)  # a constant row: u = 0
        key = (x.shape[:-1], x.dtype)
        pin = pins.get(key)
        if pin is None:
            pin = pins.setdefault(key, torch.tensor([1.0, 0.0], dtype=x.dtype).expand(*x.shape[:-1], 2))
        y = op(torch.cat([x.sub(lo).div_(d), pin], dim=-1), packed, True).mul_(d).addcmul_(lo, row_sums)
        return y if bias is None else y.add_(bias)

    return call


def _quantized(weight: Any) -> tuple[Any, Any]:
    """The dynamic int8 layer of ``weight`` (``(out, in)``) with two extra zero input columns (the range pins of
    :func:`_int8_call`) and no bias, quantised per output channel with PyTorch's per-channel dynamic qconfig (what
    ``torch.ao.nn.quantized.dynamic.Linear.from_float`` does, without building a float layer first), and the row sums of
    its int8 weights (float32)."""
    import torch
    from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear
    from torch.ao.nn.quantized.modules.utils import _quantize_weight
    from torch.ao.quantization import per_channel_dynamic_qconfig

    w = weight.detach().float()
    pinned = torch.cat([w, w.new_zeros(w.shape[0], 2)], dim=1)
    observer = per_channel_dynamic_qconfig.weight()
    observer(pinned)
    qweight = _quantize_weight(pinned, observer)
    qlinear = DynamicInt8Linear(1, 1, bias_=False, dtype=torch.qint8)  # 1 x 1: its placeholder weights pack at once
    qlinear.in_features, qlinear.out_features = pinned.shape[1], pinned.shape[0]
    qlinear.set_weight_bias(qweight, None)
    return qlinear, qweight.dequantize()[:, :-2].double().sum(1).float()


@functools.cache
def _decode_int8_linear_cls() -> type:
    import torch

    class DecodeInt8Linear(torch.nn.Module):
        """An ``nn.Linear`` with a dynamic int8 twin: one-position inputs (decode steps, shape ``(..., 1, in)``)
        use the int8 kernel, longer inputs (prompt processing) the float32 layer.

        The int8 call quantises each row with its own scale (:func:`_int8_call`: rows never share a quantisation
        scale, so stepping a public row with private rows cannot move its output). Within one row, SmolLM2 (like
        most LLMs) has a few activation channels hundreds of times larger than the rest at some prompt positions,
        which would wipe out the resolution of every other token of a prompt chunk quantised with one scale: prompt
        processing stays float32. ``int8_linear`` is the quantised layer with two extra zero input columns (the
        range pins of :func:`_int8_call`) and no bias. Siblings that read the same input share one fused int8 call
        (``fused``, :class:`_FusedInt8`); then ``int8_linear`` is None.
        """

        def __init__(self, linear: Any, quantized: tuple[Any, Any] | None = None) -> None:
            super().__init__()
            self.float_linear = linear
            self.set_int8(quantized)
            self.__dict__["fused"] = None  # (group, index); kept out of the module tree (shared by siblings)

        def set_int8(self, quantized: tuple[Any, Any] | None) -> None:
            """``quantized``: the int8 layer and its weights' row sums (:func:`_quantized`), or None (fused)."""
            self.int8_linear = None if quantized is None else quantized[0]
            lin = self.float_linear
            self.__dict__["int8_call"] = (None if quantized is None  # the kernel, not a module
                                          else _int8_call(quantized[0], None if lin.bias is None
                                                          else lin.bias.detach(), quantized[1]))

        @property
        def weight(self) -> Any:  # what callers of get_output_embeddings().weight expect
            return self.float_linear.weight

        @property
        def in_features(self) -> int:
            return int(self.float_linear.in_features)

        @property
        def out_features(self) -> int:
            return int(self.float_linear.out_features)

        def forward(self, x: Any) -> Any:
            if x.dim() < 3 or x.shape[-2] == 1:
                fused = self.__dict__["fused"]
                if fused is not None:
                    return fused[0].output(fused[1], x)
                return self.__dict__["int8_call"](x)
            return self.float_linear(x)

    return DecodeInt8Linear


def _sibling_groups(model: Any) -> list[tuple[list[Any], Any, Any]]:
    """The sibling projections (:data:`FUSED_SIBLINGS`) of ``model`` that share an input and can share one int8 call:
    per group its decode twins, their concatenated float32 weights and biases (None without)."""
    import torch

    cls = _decode_int8_linear_cls()
    groups = []
    for parent in model.modules():
        for names in FUSED_SIBLINGS:
            mods = [getattr(parent, n, None) for n in names]
            if not all(type(m) is cls for m in mods):
                continue
            lins = [m.float_linear for m in mods]
            has_bias = {lin.bias is not None for lin in lins}
            if len({lin.in_features for lin in lins}) != 1 or len(has_bias) != 1:
                continue
            with torch.no_grad():
                weight = torch.cat([lin.weight for lin in lins])
                bias = torch.cat([lin.bias for lin in lins]) if has_bias.pop() else None
            groups.append((mods, weight, bias))
    return groups


def quantize_int8(model: Any, *, fuse: bool = True) -> int:
    """Give every ``nn.Linear`` of ``model`` (lm_head included) a dynamic int8 twin used for decode steps, in place.

    Weights: int8 per output channel (symmetric); activations: uint8 with one scale PER ROW, computed on the fly
    (PyTorch's fbgemm/onednn dynamic kernel, each row normalised by its own absolute maximum: see
    :func:`_int8_call`), so every row's output depends on that row only, bit for bit. Inputs with more than one
    position per row (prompt processing) keep the float32 layer, so the KV cache of the prompt is exactly the float32
    one. With ``fuse`` (default), sibling projections that read the same input (q/k/v, gate/up) share one int8 call
    with the same result (:class:`_FusedInt8`). The layers are quantised on ``torch.get_num_threads()`` threads (the
    kernels release the GIL). Returns the number of layers.
    """
    from concurrent.futures import ThreadPoolExecutor

    import torch

    cls = _decode_int8_linear_cls()
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if type(child) in (torch.nn.Linear, packed_linear_cls())]  # a packed float32 layer too
    with warnings.catch_warnings():
        # torch.ao.quantization is deprecated in favour of torchao (not a dependency); it still works in torch 2.x
        warnings.filterwarnings("ignore", message=r"torch\.ao\.quantization is deprecated", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor, torch\.quantize_per_channel",
                                category=UserWarning)
        for parent, name, child in targets:
            setattr(parent, name, cls(child))
        groups = _sibling_groups(model) if fuse else []
        fused = {id(m) for mods, _, _ in groups for m in mods}
        singles = [m for m in model.modules() if type(m) is cls and id(m) not in fused]  # each layer once
        weights = [w for _, w, _ in groups] + [m.float_linear.weight for m in singles]
        with ThreadPoolExecutor(max(1, torch.get_num_threads())) as pool:
            quantized = list(pool.map(_quantized, weights))
        for (mods, _, bias), q in zip(groups, quantized, strict=False):
            group = _FusedInt8(q, [m.out_features for m in mods], bias)
            for i, m in enumerate(mods):
                m.set_int8(None)
                m.__dict__["fused"] = (group, i)
        for m, q in zip(singles, quantized[len(groups):], strict=True):
            m.set_int8(q)  # the bias is added after rescaling
    return len(targets)


def _shared_tree(module: Any, linear_types: tuple[type, ...]) -> Any:
    """A copy of ``module``'s tree of submodules in which every parameter, buffer and linear layer is the original's
    own object (nothing is copied but the containers): replacing a child of a copy leaves the original as it was."""
    import copy

    if isinstance(module, linear_types):
        return module
    new = copy.copy(module)
    new._parameters = dict(module._parameters)
    new._buffers = dict(module._buffers)
    new._modules = {name: None if child is None else _shared_tree(child, linear_types)
                    for name, child in module._modules.items()}
    return new


def int8_decode_twin(model: Any) -> Any:
    """A twin of the float32 ``model`` whose decode steps run on dynamic int8 copies of its linear layers
    (:func:`quantize_int8` applied to a copy of the module tree); the weights, the embeddings, the norms and every
    float32 linear layer are ``model``'s own objects, so the twin costs the int8 copies only (about a quarter of the
    float32 weights) and its prompt processing is ``model``'s, bit for bit. ``model`` itself is left unchanged.

    For public greedy post-processing, where a decode step's float rounding is no part of a guarantee (DP-GTR's
    stage 3: :attr:`dpinfer.runtime.Runtime.int8_engine`): on the 2-core development machine a decode step of 1-10
    rows costs about half the float32 one (docs/prompt-protection.md).
    """
    import torch

    twin = _shared_tree(model, (torch.nn.Linear,))
    quantize_int8(twin)
    _SOURCES[twin] = weakref.ref(model)
    return twin


_SOURCES: weakref.WeakKeyDictionary[Any, weakref.ref[Any]] = weakref.WeakKeyDictionary()
"""Per int8 decode twin, a weak reference to the float32 model whose layers run its prompt processing (weak both
ways: :data:`_TWINS` keeps each twin as long as its model lives, so a strong reference back would keep both
forever)."""


def prompt_model(model: Any) -> Any:
    """The model whose layers process ``model``'s prompts: the float32 original of an :func:`int8_decode_twin`,
    else ``model`` itself. Two models with the same one compute the same keys and values for a prompt."""
    source = _SOURCES.get(model)
    original = None if source is None else source()
    return model if original is None else original


_TWINS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_TWINS_LOCK = threading.Lock()


def shared_int8_twin(model: Any) -> Any:
    """:func:`int8_decode_twin` of ``model``, built once per model and process (shared by every runtime on it)."""
    with _TWINS_LOCK:
        twin = _TWINS.get(model)
        if twin is None:
            twin = _TWINS[model] = int8_decode_twin(model)
    return twin
