"""FLOPs and bytes per CPU op, from the shapes and dtypes torch.profiler records (``record_shapes``).

Bytes are the fewest a kernel must move through device memory: each input read once, each output
written once. FLOPs count a multiply-add as two. Backward ops are modelled where they appear as
their own aten ops (``mm`` under ``MmBackward0`` is an ``mm``). Ops without a rule get no
numbers (NaN), never a guess; :func:`coverage` says how much GPU time that leaves unmodelled.

Assumption stated once: Kineto records no dtype for ``TensorList`` arguments (foreach ops,
``cat``), so their elements are taken as 4-byte floats, the usual optimizer-state type, and the
cost says so (``elt_assumed``); the roofline rescales it where the kernel's own name states the
element size (:func:`kernel_elt_bytes`: ``OpaqueType<2u>`` in a bf16 ``cat``).

Work is per unique (name, shapes, types, scalars) signature, so a trace with millions of ops
costs as many rule evaluations as it has distinct signatures.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

ELT_BYTES = {
    "double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1,
    "c10::complex<float>": 8, "c10::complex<double>": 16,
}
DTYPE_NAME = {
    "double": "fp64", "float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8", "signed char": "int8", "unsigned char": "uint8", "long int": "int64",
    "int": "int32", "bool": "bool",
}
TENSORLIST_ELT = 4

#: Families whose FLOPs count as model FLOPs for MFU (matrix work a tensor core can do).
MATMUL_FAMILIES = ("gemm", "attention", "conv")


@dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float
    dtype: str  # math dtype of the main inputs: bf16, fp16, fp32, fp8, int8, ...
    family: str  # gemm, attention, conv, elementwise, reduction, norm, softmax, embedding, loss, copy, optimizer
    elt_assumed: bool = False  # bytes counted at TENSORLIST_ELT per element (dtype not recorded)


Rule = Callable[[list[Any], list[Any], list[Any]], "Cost | None"]
_RULES: dict[str, Rule] = {}


def rule(*names: str) -> Callable[[Rule], Rule]:
    def add(fn: Rule) -> Rule:
        for n in names:
            _RULES[n] = fn
        return fn
    return add


def _numel(shape: Any) -> int:
    return math.prod(shape) if isinstance(shape, list) and all(isinstance(x, int) for x in shape) else 0


def _is_shape(x: Any) -> bool:
    return isinstance(x, list) and len(x) > 0 and all(isinstance(v, int) for v in x)


def _tensors(dims: list[Any], types: list[Any]) -> list[tuple[list[int], str]]:
    """(shape, type) of each tensor argument (scalars and empty shapes are not tensors here)."""
    out = []
    for d, t in zip(dims, types):
        if isinstance(t, str) and t in ELT_BYTES and _is_shape(d):
            out.append((d, t))
    return out


def _nbytes(shape: list[int], t: str) -> int:
    return _numel(shape) * ELT_BYTES.get(t, 4)


def _stored(shape: list[int], stride: Any) -> int:
    """Distinct elements a tensor reads: an expanded (stride-0) dimension is stored once."""
    if not (isinstance(stride, list) and len(stride) == len(shape) and all(isinstance(x, int) for x in stride)):
        return _numel(shape)
    return math.prod(n for n, st in zip(shape, stride) if st != 0)


def _stored_bytes(dims: list[Any], types: list[Any], strides: list[Any]) -> list[int]:
    """Bytes each tensor argument really occupies (0 for non-tensors), honouring expanded strides."""
    out = []
    for i, (d, t) in enumerate(zip(dims, types)):
        st = strides[i] if i < len(strides) else None
        ok = isinstance(t, str) and t in ELT_BYTES and _is_shape(d)
        out.append(_stored(d, st) * ELT_BYTES[t] if ok else 0)
    return out


def _broadcast(shapes: list[list[int]]) -> list[int]:
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, v in enumerate([1] * (rank - len(s)) + s):
            out[i] = max(out[i], v)
    return out


def _dt(t: str) -> str:
    return DTYPE_NAME.get(t, t)


def _flag(concrete: list[Any], idx: int) -> bool | None:
    if idx < len(concrete) and isinstance(concrete[idx], str) and concrete[idx] in ("True", "False"):
        return bool(concrete[idx] == "True")
    return None


def _ints(text: Any) -> list[int] | None:
    if not isinstance(text, str):
        return None
    nums = re.findall(r"-?\d+", text)
    return [int(x) for x in nums] if nums else None


# --- matrix products -------------------------------------------------------------------------

def _gemm(m: int, n: int, k: int, batch: int, a_t: str, out_t: str, extra_bytes: int = 0) -> Cost:
    e, eo = ELT_BYTES.get(a_t, 4), ELT_BYTES.get(out_t, 4)
    return Cost(2.0 * batch * m * n * k, float(batch * (m * k + k * n) * e + batch * m * n * eo + extra_bytes), _dt(a_t), "gemm")


def gemm_mnk(name: str, dims: Any) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a GEMM op from its recorded Input Dims, or None if not a GEMM."""
    if not isinstance(dims, list):
        return None
    try:
        if name in ("aten::mm", "aten::_scaled_mm", "aten::_int_mm") and len(dims[0]) == 2:
            (m, k), (_, n) = dims[0], dims[1]
            return 1, m, n, k
        if name == "aten::addmm" and len(dims[1]) == 2:
            (m, k), (_, n) = dims[1], dims[2]
            return 1, m, n, k
        if name == "aten::bmm" and len(dims[0]) == 3:
            (b, m, k), (_, _, n) = dims[0], dims[1]
            return b, m, n, k
        if name == "aten::baddbmm" and len(dims[1]) == 3:
            (b, m, k), (_, _, n) = dims[1], dims[2]
            return b, m, n, k
    except (IndexError, TypeError, ValueError):
        return None
    return None


@rule("aten::mm", "aten::_scaled_mm", "aten::_int_mm")
def _mm(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    if len(dims) < 2 or not (_is_shape(dims[0]) and _is_shape(dims[1])) or len(dims[0]) != 2 or len(dims[1]) != 2:
        return None
    (m, k), (_, n) = dims[0], dims[1]
    out_t = "c10::BFloat16" if str(types[0]).startswith("c10::Float8") else ("int" if types[0] == "signed char" else types[0])
    return _gemm(m, n, k, 1, types[0], out_t)


@rule("aten::addmm")
def _addmm(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    if len(dims) < 3 or not (_is_shape(dims[1]) and _is_shape(dims[2])):
        return None
    (m, k), (_, n) = dims[1], dims[2]
    bias = _nbytes(dims[0], types[0]) if _is_shape(dims[0]) else 0
    return _gemm(m, n, k, 1, types[1], types[1], bias)


@rule("aten::bmm")
def _bmm(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    if len(dims) < 2 or not (_is_shape(dims[0]) and _is_shape(dims[1])) or len(dims[0]) != 3:
        return None
    (b, m, k), (_, _, n) = dims[0], dims[1]
    return _gemm(m, n, k, b, types[0], types[0])


@rule("aten::baddbmm")
def _baddbmm(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    if len(dims) < 3 or not (_is_shape(dims[1]) and _is_shape(dims[2])):
        return None
    (b, m, k), (_, _, n) = dims[1], dims[2]
    return _gemm(m, n, k, b, types[1], types[1], _nbytes(dims[0], types[0]) if _is_shape(dims[0]) else 0)


@rule("aten::mv", "aten::addmv")
def _mv(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    off = 1 if len(dims) > 2 and _is_shape(dims[0]) and len(dims[0]) == 1 and len(dims[1]) == 2 else 0
    if not _is_shape(dims[off]) or len(dims[off]) != 2:
        return None
    m, k = dims[off]
    return _gemm(m, 1, k, 1, types[off], types[off])


# --- attention -------------------------------------------------------------------------------
# (layout, is_causal index or custom_mask_type index, backward?) per op; layouts: BHTD or BTHD.
_ATTN = {
    "aten::_scaled_dot_product_flash_attention": ("BHTD", ("causal", 4), False),
    "aten::_scaled_dot_product_efficient_attention": ("BHTD", ("causal", 6), False),
    "aten::_scaled_dot_product_cudnn_attention": ("BHTD", ("causal", 6), False),
    "aten::_cudnn_attention_forward": ("BHTD", ("causal", 10), False),
    "aten::_flash_attention_forward": ("BTHD", ("causal", 8), False),
    "aten::_efficient_attention_forward": ("BTHD", ("mask", 9), False),
    "aten::_scaled_dot_product_flash_attention_backward": ("BHTD", ("causal", 8), True),
    "aten::_scaled_dot_product_efficient_attention_backward": ("BHTD", ("causal", 8), True),
    "aten::_scaled_dot_product_cudnn_attention_backward": ("BHTD", ("causal", 12), True),
    "aten::_cudnn_attention_backward": ("BHTD", ("causal", 14), True),
    "aten::_flash_attention_backward": ("BTHD", ("causal", 11), True),
    "aten::_efficient_attention_backward": ("BTHD", ("mask", 14), True),
}


def _attention(name: str, dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    layout, (kind, idx), backward = _ATTN[name]
    qi = 1 if backward else 0  # backward ops take grad_out first, then q, k, v
    if len(dims) < qi + 3 or not all(_is_shape(dims[qi + j]) and len(dims[qi + j]) == 4 for j in range(3)):
        return None
    q, k, v = dims[qi], dims[qi + 1], dims[qi + 2]
    if layout == "BHTD":
        b, h, tq, d = q
        tk, dv = k[2], v[3]
    else:
        b, tq, h, d = q
        tk, dv = k[1], v[3]
    if kind == "causal":
        causal = bool(_flag(concrete, idx))
    else:
        causal = idx < len(concrete) and concrete[idx] not in ("0", "", None)
    flops = 2.0 * b * h * tq * tk * (d + dv)  # QK^T and PV
    if causal and tq == tk:
        flops /= 2.0
    e = ELT_BYTES.get(types[qi], 2)
    io = b * h * (tq * d + tk * d + tk * dv + tq * dv) * e  # q, k, v in; out
    if backward:
        flops *= 2.5  # dV, dP, dS->dQ, dK, plus recomputing P: five products for the forward's two
        io *= 2  # grad_out and out read; dq, dk, dv written
    return Cost(flops, float(io), _dt(types[qi]), "attention")


for _name in _ATTN:
    _RULES[_name] = functools.partial(_attention, _name)


# --- convolution -----------------------------------------------------------------------------

def _conv_out(size: int, k: int, pad: int, stride: int, dil: int) -> int:
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def _conv_flops(x: list[int], w: list[int], stride: list[int], pad: list[int], dil: list[int]) -> tuple[float, int]:
    n, spatial = x[0], x[2:]
    kout, cin_g, ks = w[0], w[1], w[2:]
    nd = len(spatial)
    stride, pad, dil = (stride * nd)[:nd], (pad * nd)[:nd], (dil * nd)[:nd]
    out_sp = [_conv_out(spatial[i], ks[i], pad[i], stride[i], dil[i]) for i in range(nd)]
    out_numel = n * kout * math.prod(out_sp)
    return 2.0 * out_numel * cin_g * math.prod(ks), out_numel


@rule("aten::cudnn_convolution", "aten::convolution", "aten::_convolution", "aten::miopen_convolution")
def _conv(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    if len(dims) < 2 or not (_is_shape(dims[0]) and _is_shape(dims[1])) or len(dims[0]) < 3:
        return None
    # cudnn_convolution(input, weight, padding, stride, dilation, ...); convolution(input, weight, bias, stride, padding, dilation, ...)
    names = (2, 3, 4) if len(types) > 2 and types[2] == "ScalarList" else (4, 3, 5)
    pad, stride, dil = (_ints(concrete[i]) if i < len(concrete) else None for i in names)
    flops, out_numel = _conv_flops(dims[0], dims[1], stride or [1], pad or [0], dil or [1])
    e = ELT_BYTES.get(types[0], 4)
    return Cost(flops, float((_numel(dims[0]) + _numel(dims[1]) + out_numel) * e), _dt(types[0]), "conv")


@rule("aten::convolution_backward")
def _conv_bwd(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    # (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask)
    if len(dims) < 3 or not all(_is_shape(dims[i]) for i in range(3)):
        return None
    stride, pad, dil = (_ints(concrete[i]) if i < len(concrete) else None for i in (4, 5, 6))
    flops, _ = _conv_flops(dims[1], dims[2], stride or [1], pad or [0], dil or [1])
    mask = re.findall(r"True|False", concrete[10]) if len(concrete) > 10 and isinstance(concrete[10], str) else []
    want_in, want_w = (mask[0] == "True", mask[1] == "True") if len(mask) >= 2 else (True, True)
    e = ELT_BYTES.get(types[0], 4)
    moved = _numel(dims[0]) + _numel(dims[1]) + _numel(dims[2])
    moved += (_numel(dims[1]) if want_in else 0) + (_numel(dims[2]) if want_w else 0)
    return Cost(flops * (int(want_in) + int(want_w)), float(moved * e), _dt(types[0]), "conv")


# --- memory-bound ops ------------------------------------------------------------------------
ELEMENTWISE = {
    "aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::mul", "aten::mul_", "aten::div", "aten::div_",
    "aten::neg", "aten::exp", "aten::log", "aten::pow", "aten::sqrt", "aten::rsqrt", "aten::tanh", "aten::sigmoid",
    "aten::gelu", "aten::gelu_backward", "aten::silu", "aten::silu_", "aten::silu_backward", "aten::relu", "aten::relu_",
    "aten::threshold_backward", "aten::tanh_backward", "aten::sigmoid_backward", "aten::where", "aten::clamp",
    "aten::clamp_", "aten::clamp_min", "aten::clamp_min_", "aten::clamp_max", "aten::lerp", "aten::lerp_",
    "aten::addcmul", "aten::addcmul_", "aten::addcdiv", "aten::addcdiv_", "aten::masked_fill", "aten::masked_fill_",
    "aten::bitwise_not", "aten::eq", "aten::ne", "aten::lt", "aten::gt", "aten::le", "aten::ge", "aten::abs",
    "aten::sin", "aten::cos", "aten::reciprocal", "aten::maximum", "aten::minimum", "aten::native_dropout_backward",
    "aten::hardtanh", "aten::hardtanh_", "aten::leaky_relu", "aten::erf", "aten::_foreach_copy_",
}


def _elementwise(name: str, dims: list[Any], types: list[Any], strides: list[Any],
                 family: str = "elementwise") -> Cost | None:
    ts = _tensors(dims, types)
    if not ts:
        return None
    out_shape = _broadcast([s for s, _ in ts])
    out_t = max((t for _, t in ts), key=lambda t: ELT_BYTES.get(t, 4))
    if name.endswith("_"):  # in place: the first argument is the output
        out_shape, out_t = ts[0]
    out = _numel(out_shape)
    moved = sum(_stored_bytes(dims, types, strides)) + out * ELT_BYTES.get(out_t, 4)
    float_t = next((t for _, t in ts if _dt(t) in ("fp32", "bf16", "fp16", "fp64")), ts[0][1])
    return Cost(float(out), float(moved), _dt(float_t), family)


@rule("aten::copy_")
def _copy(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    if len(dims) < 2 or not (_is_shape(dims[0]) or dims[0] == []) or not isinstance(types[1], str):
        return None
    moved = _nbytes(dims[0], types[0]) + _nbytes(dims[1], types[1])
    return Cost(0.0, float(moved), _dt(types[1]), "copy")


@rule("aten::fill_", "aten::zero_")
def _fill(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    if not dims or not isinstance(dims[0], list):
        return None
    return Cost(0.0, float(_nbytes(dims[0], types[0])), _dt(types[0]), "copy")


@rule("aten::sum", "aten::mean", "aten::amax", "aten::amin", "aten::max", "aten::min", "aten::argmax",
      "aten::argmin", "aten::linalg_vector_norm", "aten::norm", "aten::var_mean", "aten::var", "aten::std",
      "aten::prod", "aten::any", "aten::all")
def _reduction(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    if not dims or not _is_shape(dims[0]):
        return None
    shape, t = dims[0], types[0]
    reduced = _ints(concrete[1]) if len(concrete) > 1 else None
    out = _numel(shape)
    if reduced is not None and all(-len(shape) <= r < len(shape) for r in reduced):
        for r in set(x % len(shape) for x in reduced):
            out //= max(shape[r], 1)
    else:
        out = 1
    return Cost(float(_numel(shape)), float(_nbytes(shape, t) + out * ELT_BYTES.get(t, 4)), _dt(t), "reduction")


@rule("aten::_softmax", "aten::_log_softmax", "aten::_safe_softmax")
def _softmax(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    if not dims or not _is_shape(dims[0]):
        return None
    b = _nbytes(dims[0], types[0])
    return Cost(5.0 * _numel(dims[0]), 2.0 * b, _dt(types[0]), "softmax")


@rule("aten::_softmax_backward_data", "aten::_log_softmax_backward_data")
def _softmax_bwd(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    if len(dims) < 2 or not _is_shape(dims[0]):
        return None
    b = _nbytes(dims[0], types[0])
    return Cost(4.0 * _numel(dims[0]), 3.0 * b, _dt(types[0]), "softmax")


@rule("aten::native_layer_norm", "aten::_fused_rms_norm", "aten::native_group_norm")
def _norm(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    if not dims or not _is_shape(dims[0]):
        return None
    params = sum(_nbytes(s, t) for s, t in _tensors(dims[1:], types[1:]))
    x = _nbytes(dims[0], types[0])
    return Cost(8.0 * _numel(dims[0]), float(2 * x + params), _dt(types[0]), "norm")


@rule("aten::native_layer_norm_backward", "aten::_fused_rms_norm_backward", "aten::native_group_norm_backward")
def _norm_bwd(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    if len(dims) < 2 or not _is_shape(dims[0]):
        return None
    x = _nbytes(dims[0], types[0])
    params = sum(_nbytes(s, t) for s, t in _tensors(dims[2:], types[2:]) if _numel(s) < _numel(dims[0]))
    return Cost(10.0 * _numel(dims[0]), float(3 * x + 2 * params), _dt(types[0]), "norm")


@rule("aten::native_batch_norm", "aten::cudnn_batch_norm", "aten::_native_batch_norm_legit")
def _bn(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    if not dims or not _is_shape(dims[0]):
        return None
    x = _nbytes(dims[0], types[0])
    return Cost(8.0 * _numel(dims[0]), float(3 * x), _dt(types[0]), "norm")  # statistics pass, then normalise


@rule("aten::native_batch_norm_backward", "aten::cudnn_batch_norm_backward")
def _bn_bwd(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    if len(dims) < 2 or not _is_shape(dims[0]):
        return None
    x = _nbytes(dims[0], types[0])
    return Cost(10.0 * _numel(dims[0]), float(5 * x), _dt(types[0]), "norm")  # reduce pass (dy, x), then dx


@rule("aten::native_dropout")
def _dropout(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    if not dims or not _is_shape(dims[0]):
        return None
    n = _numel(dims[0])
    return Cost(float(n), float(2 * _nbytes(dims[0], types[0]) + n), _dt(types[0]), "elementwise")


@rule("aten::index_select")
def _index_select(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    if len(dims) < 3 or not _is_shape(dims[0]) or not isinstance(dims[2], list):
        return None
    rows = _numel(dims[2])
    width = _numel(dims[0]) // max(dims[0][0], 1)
    return Cost(0.0, float(2 * rows * width * ELT_BYTES.get(types[0], 4) + rows * 8), _dt(types[0]), "embedding")


@rule("aten::embedding_dense_backward")
def _embedding_bwd(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    if len(dims) < 3 or not _is_shape(dims[0]):
        return None
    num_weights = _ints(concrete[2]) if len(concrete) > 2 else None
    d = dims[0][-1]
    e = ELT_BYTES.get(types[0], 4)
    table = (num_weights[0] if num_weights else 0) * d * e
    return Cost(float(_numel(dims[0])), float(_nbytes(dims[0], types[0]) + _numel(dims[1]) * 8 + 2 * table),
                _dt(types[0]), "embedding")


def _gather(dims: list[Any], types: list[Any], concrete: list[Any], strides: list[Any]) -> Cost | None:
    """gather/scatter_add(self, dim, index, ...): reads |index| values and the index, writes |index|."""
    if len(dims) < 3 or not _is_shape(dims[2]):
        return None
    n, e = _numel(dims[2]), ELT_BYTES.get(types[0], 4)
    index = _stored(dims[2], strides[2] if len(strides) > 2 else None) * 8
    return Cost(0.0, float(index + 2 * n * e), _dt(types[0]), "embedding")


_STRIDED: dict[str, Callable[[list[Any], list[Any], list[Any], list[Any]], Cost | None]] = {
    n: _gather for n in ("aten::gather", "aten::scatter_add_", "aten::scatter_add", "aten::index_add_")}


@rule("aten::nll_loss_forward", "aten::nll_loss2d_forward")
def _nll(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    if len(dims) < 2 or not _is_shape(dims[1]):
        return None
    n = _numel(dims[1])
    return Cost(float(n), float(n * (8 + ELT_BYTES.get(types[0], 4))), _dt(types[0]), "loss")


@rule("aten::nll_loss_backward", "aten::nll_loss2d_backward")
def _nll_bwd(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    # (grad_output, self, target, weight, reduction, ignore_index, total_weight). grad_input is
    # zeroed by its own fill kernel first; this kernel reads each target and writes one element
    # per target (grad_input[i, target[i]]), not the whole N x C gradient.
    if len(dims) < 3 or not _is_shape(dims[1]) or not _is_shape(dims[2]):
        return None
    n = _numel(dims[2])
    return Cost(float(n), float(n * (8 + ELT_BYTES.get(types[1], 4))), _dt(types[1]), "loss")


def _tensorlists(dims: list[Any], types: list[Any]) -> list[int]:
    """Total elements of each TensorList argument that recorded its shapes."""
    return [sum(_numel(s) for s in d) for d, t in zip(dims, types)
            if t == "TensorList" and isinstance(d, list) and d and all(_is_shape(s) for s in d)]


def _foreach(name: str, dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    lists = _tensorlists(dims, types)
    if not lists:
        return None
    written = lists[0]
    return Cost(float(written), float((sum(lists) + written) * TENSORLIST_ELT), "fp32", "optimizer", True)


@rule("aten::cat")
def _cat(dims: list[Any], types: list[Any], concrete: list[Any]) -> Cost | None:
    lists = _tensorlists(dims, types)
    return Cost(0.0, float(2 * lists[0] * TENSORLIST_ELT), "fp32", "copy", True) if lists else None


_KERNEL_ELT = re.compile(r"OpaqueType<(\d+)u?>|Functor<(float|double|c10::BFloat16|c10::Half)\b")
_ELT_OF_NAME = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2}


def kernel_elt_bytes(name: str) -> float:
    """The element size a kernel's template arguments state (NaN when they do not): the copy
    kernels of ``cat`` are instantiated on ``OpaqueType<bytes>``, foreach kernels on
    ``...Functor<dtype, ...>``."""
    m = _KERNEL_ELT.search(name)
    if m is None:
        return float("nan")
    return float(m.group(1)) if m.group(1) else float(_ELT_OF_NAME[m.group(2)])


def cost_of(name: str, dims: Any, types: Any, concrete: Any, strides: Any = None) -> Cost | None:
    """The cost of one op from its recorded arguments, or None when no rule applies.

    ``strides`` (Kineto's "Input Strides") lets memory-bound rules count an expanded tensor's
    stored elements once instead of its broadcast size.
    """
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    concrete = concrete if isinstance(concrete, list) else []
    strides = strides if isinstance(strides, list) else []
    fn = _RULES.get(name)
    try:
        if fn is not None:
            return fn(dims, types, concrete)
        if name in _STRIDED:
            return _STRIDED[name](dims, types, concrete, strides)
        if name in ELEMENTWISE:
            return _elementwise(name, dims, types, strides)
        if name.startswith("aten::_foreach_") or name.startswith("aten::_fused_adam"):
            return _foreach(name, dims, types, concrete)
    except (IndexError, TypeError, ValueError, ZeroDivisionError, OverflowError):
        return None  # shapes not of the form the rule expects (or beyond float range): no model rather than a wrong one
    return None


def op_costs(ops: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """flops, bytes, dtype and family for the given op rows (NaN/None where no rule applies).

    Arguments arrive as the JSON Kineto recorded; each distinct (name, arguments) signature
    is parsed and modelled once, and its cost broadcast to every row of that signature.
    """
    from gpuprof.trace.load import parse_arg

    rows = np.unique(rows[rows >= 0])
    sub = ops.iloc[rows]
    cols = ("name", "input_dims", "input_types", "concrete_inputs", "input_strides")
    # which signature each row has (``which``) and each signature's first row (``first``)
    which = np.zeros(len(rows), dtype=np.int64)
    for col in cols:
        codes = _codes(sub[col])
        # (a pair of codes as one integer, renumbered at once: the key stays below rows**2)
        which, _ = pd.factorize(which * (int(codes.max(initial=-1)) + 2) + (codes + 1))
    _, first = np.unique(which, return_index=True)
    names, dims, types, conc, strd = (sub[col].to_numpy()[first] for col in cols)
    n = len(first)
    flops = np.full(n, np.nan)
    nbytes = np.full(n, np.nan)
    dtype = np.empty(n, dtype=object)
    family = np.empty(n, dtype=object)
    assumed = np.zeros(n, dtype=bool)
    for i in range(n):  # once per distinct signature
        c = cost_of(str(names[i]), _arg(dims[i], parse_arg), _arg(types[i], parse_arg),
                    _arg(conc[i], parse_arg), _arg(strd[i], parse_arg))
        if c is not None:
            flops[i], nbytes[i], dtype[i], family[i], assumed[i] = c.flops, c.bytes, c.dtype, c.family, c.elt_assumed
    return pd.DataFrame({"flops": flops[which], "bytes": nbytes[which], "dtype": dtype[which],
                         "family": family[which], "elt_assumed": assumed[which]}, index=rows)


def _codes(col: pd.Series) -> np.ndarray:
    """Equal values of ``col`` share a code, as a dict keyed by the values would. Missing values
    (None, NaN) share code -1: the cost is the same for each (no rule's name, arguments that are
    not lists), so they need not be told apart."""
    codes, _ = pd.factorize(col)
    return codes.astype(np.int64, copy=False)


def _arg(value: Any, parse: Callable[[Any], Any]) -> Any:
    return parse(value) if isinstance(value, (bytes, str)) else value
