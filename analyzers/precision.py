"""precision: matrix work in FP32 (CUDA cores, or TF32) that bf16 tensor cores would do faster.

Trigger: GEMM, attention or convolution kernels on FP32 data, running on CUDA cores or as TF32.
Estimate: each such kernel keeps its achieved fraction of the roofline after the fix, so its time
becomes ``dur × t_roof(bf16) / t_roof(now)``, with bf16's peak and half the bytes. Only kernels
where the GPU was the bottleneck count (see ``_base``). Evidence: the kernels, their engine,
TFLOP/s and roofline position.

FP32 CNNs (convolutions carry at least ``CNN_CONV_SHARE`` of the matrix time): the fix is the CNN
recipe, autocast *and* channels-last together, and the estimate assumes both: besides the matrix
kernels, the FP32 memory-bound activation kernels (elementwise, norm, pooling, reductions, copies)
move half the bytes in bf16 (same achieved bandwidth, half the time), and channels-last removes
the cuDNN layout transforms (:mod:`gpuprof.analyzers.memory_format`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from gpuprof.claims import Candidate
from gpuprof.analyzers._base import ms, top_names
from gpuprof.analyzers.memory_format import nchw_parts

if TYPE_CHECKING:
    from gpuprof.rank import RankView

MATMUL = ("gemm", "attention", "conv")
CNN_CONV_SHARE = 0.25
ACTIVATION = ("elementwise", "norm", "reduction", "copy", "pool", "softmax")


def run(v: RankView) -> list[Candidate]:
    spec = v.spec
    assert spec is not None
    out: list[Candidate] = []
    k = v.kernels
    # FP32 *data*: bf16 inputs on a CUDA-core kernel (cuDNN's choice for 3-channel convs) are not this.
    sel = k[k["family"].astype(str).isin(MATMUL) & (k["dtype"] == "fp32") & np.isfinite(k["t_roof_us"])]
    if sel.empty:
        return out
    bf16_roof = np.fmax(sel["flops"] / (spec.peak("bf16") * 1e12), sel["bytes"] / 2 / (spec.hbm_gbps * 1e9)) * 1e6
    after = sel["dur"] * bf16_roof / sel["t_roof_us"]
    saved = (sel["dur"] - after).clip(lower=0)
    units = v.kernel_units(sel.index, saved)
    conv_time = sel.loc[sel["family"].astype(str) == "conv", "dur"].sum()
    cnn = conv_time >= CNN_CONV_SHARE * sel["dur"].sum()
    cnn_ms = 0.0
    if cnn:
        fam = k["family"].astype(str)
        act = k[fam.isin(ACTIVATION) & (k["dtype"] == "fp32") & np.isfinite(k["t_roof_us"])]
        xf, _, _ = nchw_parts(v)
        extra = {**v.kernel_units(act.index, act["dur"] / 2), **v.kernel_units(xf.index, xf["dur"])}
        extra.update(v.inner_gap_units(xf.index))
        units.update(extra)
        cnn_ms = ms(sum(extra.values())) / v.n_steps
    cuda = sel[sel["engine"] == "cuda"]
    frac = sel["dur"].sum() / v.n_steps / v.step_time_us * 100 if v.step_time_us else 0.0
    out.append(Candidate(
        id="GP-PREC-001", category="precision",
        title=f"{frac:.0f}% of step time is FP32 matrix math"
              + (" on CUDA cores (no tensor cores)" if len(cuda) > len(sel) / 2 else " (TF32)")
              + (", with FP32 NCHW activations around the convolutions" if cnn else ""),
        confidence="high",
        recommendation=("A CNN: convert the model and inputs to channels-last "
                        "(`model.to(memory_format=torch.channels_last)`, inputs likewise) and r" if cnn else "R")
                       + "un forward and loss under `with torch.autocast('cuda', dtype=torch.bfloat16):` "
                       "(keep the optimizer in FP32); if you must stay in FP32, at least allow TF32: "
                       "`torch.backends.cuda.matmul.allow_tf32 = True; torch.backends.cudnn.allow_tf32 = True`. "
                       "On Hopper and newer, large GEMMs can go further with FP8 (Transformer Engine).",
        units=units,
        evidence={
            "rank": v.rank,
            "fp32_matmul_ms_per_step": round(ms(sel["dur"].sum()) / v.n_steps, 3),
            "on_cuda_cores_ms_per_step": round(ms(cuda["dur"].sum()) / v.n_steps, 3),
            "achieved_tflops": round(float(sel["flops"].sum() / (sel["dur"].sum() * 1e-6) / 1e12), 1),
            "estimated_ms_per_step_after": round(ms(after.sum()) / v.n_steps, 3),
            "kernels": top_names(sel),
            "cnn_amp_channels_last_ms_per_step": round(cnn_ms, 3) if cnn else None,
            "estimate": "each kernel keeps its % of roofline at the bf16 tensor-core peak with half the "
                        "bytes" + ("; a CNN: assumes autocast AND channels_last together (FP32 activation "
                                   "kernels at half the bytes, cuDNN layout transforms removed)" if cnn else ""),
        },
    ))
    return out
