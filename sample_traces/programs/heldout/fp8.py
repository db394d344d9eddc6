"""FP8 matrix products through ``torch._scaled_mm`` with tensorwise dynamic scaling (the recipe of
torchao's float8 training, written out in eager PyTorch): forward operands in e4m3, the output
gradient in e5m2, each scaled by its own amax to the format's range, the products in bf16.

``_scaled_mm(a, b, scale_a, scale_b)`` computes ``(a * scale_a) @ (b * scale_b)``: ``a`` row-major,
``b`` column-major (both checked here, as the CUDA kernel requires; the CPU kernel would not
complain), every dimension a multiple of 16, the scales float32 scalars (the inverse of the
quantisation scale). Shared by fp8_mlp.py and scaled_mm_check.py.
"""

from __future__ import annotations

import math

import torch
from torch import nn

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# a margin of 2**-7 below the format's largest value: x * (max / amax) rounded to bf16 stays in range
# without a clamp pass (bf16's relative rounding is 2**-8; e4m3fn has no infinity, so an overflow
# would be NaN)
_MARGIN = 1.0 - 2.0 ** -7


def quantize(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` in ``dtype`` scaled by max/amax (row-major), and the float32 scale that undoes it."""
    amax = torch.linalg.vector_norm(x.detach(), ord=math.inf).float().clamp(min=1e-12)
    scale = (torch.finfo(dtype).max * _MARGIN) / amax
    return (x * scale).to(dtype).contiguous(), scale.reciprocal()


def col_major(t: torch.Tensor) -> torch.Tensor:
    """The same matrix laid out column-major (what ``_scaled_mm`` needs of its second operand)."""
    return t.t().contiguous().t()


def scaled_mm(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, fast_accum: bool = False,
              out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    assert a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], (a.shape, b.shape)
    assert a.stride(1) == 1 and b.stride(0) == 1, f"need row-major a, column-major b: {a.stride()} {b.stride()}"
    assert all(n % 16 == 0 for n in (*a.shape, b.shape[1])), (a.shape, b.shape)
    out = torch._scaled_mm(a, b, sa, sb, out_dtype=out_dtype, use_fast_accum=fast_accum)
    return out[0] if isinstance(out, tuple) else out  # torch < 2.4 returned (out, amax)


class _Fp8Matmul(torch.autograd.Function):
    """``x @ w.T`` with both operands in e4m3; backward: ``g @ w`` and ``g.T @ x`` with ``g`` in e5m2."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        x8, sx = quantize(x, E4M3)
        w8, sw = quantize(w, E4M3)
        ctx.save_for_backward(x8, sx, w8, sw)
        return scaled_mm(x8, w8.t(), sx, sw, fast_accum=True)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        x8, sx, w8, sw = ctx.saved_tensors
        g8, sg = quantize(g, E5M2)
        gx = scaled_mm(g8, col_major(w8), sg, sw)
        gw = scaled_mm(g8.t().contiguous(), col_major(x8), sg, sx)
        return gx, gw


class Fp8Linear(nn.Linear):
    """``nn.Linear`` without bias whose product runs in FP8 (its weight stays an fp32 master copy,
    quantised every forward, as autocast casts it to bf16 every forward)."""

    def __init__(self, din: int, dout: int) -> None:
        super().__init__(din, dout, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _Fp8Matmul.apply(x.reshape(-1, x.shape[-1]), self.weight)
        return y.reshape(*x.shape[:-1], self.out_features)
