"""precision: matrix work in a wider type than the GPU's tensor cores need.

``GP-PREC-001`` — Trigger: GEMM, attention or convolution kernels on FP32 data, running on CUDA
cores or as TF32. The fix follows the GPU (:attr:`gpuprof.specs.GpuSpec.half_dtype`): BF16 autocast
(and TF32 for what stays FP32) where the part has BF16 (Ampere and newer, CDNA2 and newer); FP16
autocast with a ``GradScaler`` (FP16's range needs the loss scaled in training) where it has FP16
tensor cores only (V100, T4, RTX 20xx: no BF16, no TF32, so neither is advised there).
Estimate: each such kernel keeps its achieved fraction of the roofline after the fix, so its time
becomes ``dur × t_roof(half) / t_roof(now)``, at that 16-bit type's tensor peak and with half the
bytes; the replay (gpuprof.replay.fixes) adds the host work autocast brings, one weight cast
per call of each forward convolution/linear op, forward and in training backward, at the trace's
own host cost per recorded op, which a host-bound step pays in full. Evidence: the kernels, their
engine, TFLOP/s and roofline position, and the dtype priced.

``GP-PREC-002`` (FP8) — Why: on Hopper and newer the tensor cores run FP8 at twice the BF16 rate;
a step whose time is mostly BF16/FP16 GEMMs at their compute roof can nearly halve it. Trigger: a
GPU with FP8 tensor cores (:attr:`gpuprof.specs.GpuSpec.fp8_tensor_cores`) and compute-bound
BF16/FP16 tensor-core GEMMs holding at least ``FP8_MIN_STEP_SHARE`` of the (unprofiled) step: the
GEMMs set the step. Estimate: each such GEMM keeps its achieved fraction of the roofline at the FP8
peak with its operands in one byte (on the H200 here, ``torch._scaled_mm`` ran the held-out FP8
pair's shapes at 1.42-1.50 PFLOP/s against 0.78-0.80 for BF16, 1.8-1.9x:
``sample_traces/h200/heldout/scaled_mm_check.json``), plus the scaling casts fused into the
neighbouring kernels as ``torch.compile`` or Transformer Engine do (each operand read once more
and written in FP8: about the GEMM's own bytes moved once more at the memory roof). Casts run as
separate eager kernels cost far more (an amax reduction and a cast per operand per product: the
eager ``_scaled_mm`` twin of that pair realised -0.5 %), which the evidence and the fix say.

FP32 CNNs (convolutions carry at least ``CNN_CONV_SHARE`` of the matrix time): where the trace shows
NCHW (what :mod:`gpuprof.analyzers.memory_format` reads: layout transforms, NCHW batch-norm/pooling
kernels, NCHW/NHWC copies) the fix is the CNN recipe, autocast *and* channels-last together, and
the estimate assumes both; a channels-last FP32 CNN is told autocast alone. Besides the matrix
kernels, the FP32 memory-bound activation kernels (elementwise, norm, pooling, reductions, copies)
move half the bytes in bf16 (same achieved bandwidth, half the time), and channels-last removes
the cuDNN layout transforms (:mod:`gpuprof.analyzers.memory_format`). Batch norm is the exception
on NVIDIA GPUs: FP32 runs cuDNN's kernels (NHWC ones in a channels-last model), bf16 activations
PyTorch's channels-last ones, which are not twice as fast; it is priced from the measured layout
table (bf16 channels-last over FP32 time at the nearest shape,
:func:`gpuprof.analyzers.memory_format.autocast_bn_ratios`). Held-out SE-ResNeXt-26d showed it:
its bf16 twin's batch norms took 0.82x the FP32 ones' time, and halving them had put the
estimate 28 % over the realised saving with both twins GPU-bound.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from gpuprof.claims import Candidate
from gpuprof.analyzers._base import ms, top_names
from gpuprof.analyzers.memory_format import CHANNELS_LAST, autocast_bn_ratios, bn_sizes, layout_conversions, nchw_parts, nearest_ratio
from gpuprof.idle import has_backward
from gpuprof.roofline import per_name

if TYPE_CHECKING:
    from gpuprof.rank import RankView

MATMUL = ("gemm", "attention", "conv")
CNN_CONV_SHARE = 0.25
#: FP8 is advised where compute-bound 16-bit GEMMs hold at least half the step: below that, FP8
#: halves a minority of the step and its casts and scales take a larger share of what it saves.
FP8_MIN_STEP_SHARE = 0.5
ACTIVATION = ("elementwise", "norm", "reduction", "copy", "pool", "softmax")
#: Batch-norm kernels, cuDNN's (``batchnorm_fwtr_nhwc``, ``bn_fw_tr_1C11``) and PyTorch's (``batch_norm_*``).
BATCH_NORM_KERNEL = re.compile(r"batch_?norm|\bbn_|_bn_", re.IGNORECASE)


def run(v: RankView) -> list[Candidate]:
    return fp32(v) + fp8(v)


def _training(v: RankView) -> bool:
    return has_backward(v.trace.ops)


def _autocast_advice(half: str, training: bool, tf32: bool) -> str:
    """How to run forward and loss in the GPU's 16-bit type."""
    if half == "bf16":
        return ("un forward and loss under `with torch.autocast('cuda', dtype=torch.bfloat16):` (keep the "
                "optimizer in FP32)" + ("; if you must stay in FP32, at least allow TF32: "
                                        "`torch.backends.cuda.matmul.allow_tf32 = True; "
                                        "torch.backends.cudnn.allow_tf32 = True`" if tf32 else ""))
    scaler = (" with a gradient scaler, since FP16's range needs the loss scaled: `scaler = "
              "torch.cuda.amp.GradScaler()` (`torch.amp.GradScaler('cuda')` in recent PyTorch), then "
              "`scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()`") if training else ""
    return ("un forward and loss under `with torch.autocast('cuda', dtype=torch.float16):`" + scaler
            + ". FP16 is the 16-bit type this GPU's tensor cores run")


def _activations_saved(v: RankView, act: pd.DataFrame) -> tuple[pd.Series, np.ndarray]:
    """What bf16 saves on each FP32 activation kernel of a CNN: half its time (half the bytes at the
    same bandwidth), except batch norm on an NVIDIA GPU, which autocast moves from cuDNN's FP32
    kernels to PyTorch's bf16 channels-last ones: there the measured layout table's bf16
    channels-last over FP32 time at the nearest shape, FP32 in the layout the kernel ran in
    (:func:`gpuprof.analyzers.memory_format.autocast_bn_ratios`). Also which kernels were priced
    from the table."""
    ratio = np.full(len(act), 0.5)
    ok = np.zeros(len(act), dtype=bool)
    ratios = autocast_bn_ratios() if v.spec is not None and v.spec.vendor == "nvidia" else None
    bn = (per_name(act["name"], lambda n: bool(BATCH_NORM_KERNEL.search(n)), dtype=bool)
          if ratios is not None and len(act) else ok)
    if bn.any():
        assert ratios is not None
        cl = per_name(act["name"], lambda n: bool(CHANNELS_LAST.search(n)), dtype=bool)
        cp = bn_sizes(v, act)
        ok = bn & np.isfinite(cp).all(axis=1)
        for lay, m in (("cl", ok & cl), ("nchw", ok & ~cl)):
            if m.any():
                ratio[m] = nearest_ratio(*ratios[lay], cp[m, 0], cp[m, 1])
    out: pd.Series = act["dur"] * (1.0 - ratio)
    return out, ok


def fp32(v: RankView) -> list[Candidate]:
    spec = v.spec
    assert spec is not None
    out: list[Candidate] = []
    k = v.kernels
    half = spec.half_dtype
    if half is None:  # no 16-bit tensor math on this part: nothing faster to move to
        return out
    # FP32 *data*: bf16 inputs on a CUDA-core kernel (cuDNN's choice for 3-channel convs) are not this.
    sel = k[k["family"].astype(str).isin(MATMUL) & (k["dtype"] == "fp32") & np.isfinite(k["t_roof_us"])]
    if sel.empty:
        return out
    half_roof = np.fmax(sel["flops"] / (spec.peak(half) * 1e12), sel["bytes"] / 2 / (spec.hbm_gbps * 1e9)) * 1e6
    after = sel["dur"] * half_roof / sel["t_roof_us"]
    saved = (sel["dur"] - after).clip(lower=0)
    units = v.kernel_units(sel.index, saved)
    conv_time = sel.loc[sel["family"].astype(str) == "conv", "dur"].sum()
    cnn = conv_time >= CNN_CONV_SHARE * sel["dur"].sum()
    cnn_ms = 0.0
    bn_ms = (0.0, 0.0)
    nchw = False
    if cnn:
        fam = k["family"].astype(str)
        act = k[fam.isin(ACTIVATION) & (k["dtype"] == "fp32") & np.isfinite(k["t_roof_us"])]
        xf, slow, _ = nchw_parts(v)
        # NCHW as the memory_format analyzer sees it (layout transforms, NCHW batch-norm/pooling
        # kernels, NCHW/NHWC conversion copies); a channels-last FP32 model is told autocast only
        nchw = not (xf.empty and slow.empty and layout_conversions(v).empty)
        act_saved, by_table = _activations_saved(v, act)
        bn_ms = (ms(act["dur"].to_numpy()[by_table].sum()) / v.n_steps,
                 ms(act_saved.to_numpy()[by_table].sum()) / v.n_steps)
        extra = {**v.kernel_units(act.index, act_saved), **v.kernel_units(xf.index, xf["dur"])}
        extra.update(v.inner_gap_units(xf.index))
        units.update(extra)
        cnn_ms = ms(sum(extra.values())) / v.n_steps
    cnn_text = ""
    if cnn:
        bn_text = (", batch norm at the measured bf16 channels-last / FP32 time for its size "
                   "(benchmarks/layout_table.py: autocast moves it off cuDNN's FP32 kernels, and not to "
                   "half the time)" if bn_ms[0] > 0 else "")
        cnn_text = ("; a CNN: FP32 activation kernels at half the bytes" + bn_text if not nchw else
                    "; a CNN: assumes autocast AND channels_last together (FP32 activation kernels at half the "
                    "bytes" + bn_text + (", cuDNN layout transforms removed" if not xf.empty else "") + ")")
    cuda = sel[sel["engine"] == "cuda"]
    frac = sel["dur"].sum() / v.n_steps / v.step_time_us * 100 if v.step_time_us else 0.0
    out.append(Candidate(
        id="GP-PREC-001", category="precision",
        title=f"{frac:.0f}% of step time is FP32 matrix math"
              + (" on CUDA cores (no tensor cores)" if len(cuda) > len(sel) / 2 else " (TF32)")
              + (f", with FP32{' NCHW' if nchw else ''} activations around the convolutions" if cnn else ""),
        confidence="high",
        recommendation=("A CNN: convert the model and inputs to channels-last "
                        "(`model.to(memory_format=torch.channels_last)`, inputs likewise) and r" if nchw else "R")
                       + _autocast_advice(half, _training(v), spec.has("tf32")) + "."
                       + (" On this GPU large GEMMs can go further with FP8 (Transformer Engine, torchao float8 "
                          "with torch.compile)." if spec.fp8_tensor_cores else ""),
        units=units,
        evidence={
            "rank": v.rank,
            "fp32_matmul_ms_per_step": round(ms(sel["dur"].sum()) / v.n_steps, 3),
            "on_cuda_cores_ms_per_step": round(ms(cuda["dur"].sum()) / v.n_steps, 3),
            "achieved_tflops": round(float(sel["flops"].sum() / (sel["dur"].sum() * 1e-6) / 1e12), 1),
            "estimated_ms_per_step_after": round(ms(after.sum()) / v.n_steps, 3),
            "kernels": top_names(sel),
            # what a CNN's activations (and layout transforms, when NCHW) add to the saving
            "cnn_amp_channels_last_ms_per_step": round(cnn_ms, 3) if nchw else None,
            "cnn_amp_activations_ms_per_step": round(cnn_ms, 3) if cnn and not nchw else None,
            # FP32 batch norms priced from the measured table: their time, and what bf16 saves of it
            "cnn_amp_batch_norm_ms_per_step": round(bn_ms[0], 3) if bn_ms[0] > 0 else None,
            "cnn_amp_batch_norm_saved_ms_per_step": round(bn_ms[1], 3) if bn_ms[0] > 0 else None,
            "priced_dtype": half, "priced_peak_tflops": spec.peak(half),
            "estimate": f"each kernel keeps its % of roofline at the {half} tensor-core peak "
                        f"({spec.peak(half):g} TFLOP/s on the {spec.name}) with half the "
                        "bytes; autocast's weight casts added to the host (replayed)" + cnn_text,
        },
    ))
    return out


def fp8(v: RankView) -> list[Candidate]:
    spec = v.spec
    assert spec is not None
    out: list[Candidate] = []
    if not spec.fp8_tensor_cores:
        return out
    k = v.kernels
    sel = k[(k["family"].astype(str) == "gemm") & k["dtype"].isin(["bf16", "fp16"]) & (k["engine"] == "tensor")
            & (k["bound"] == "compute") & np.isfinite(k["t_roof_us"])]
    step_us = v.unprofiled_or_traced_step_us * v.n_steps
    if sel.empty or sel["dur"].sum() < FP8_MIN_STEP_SHARE * step_us:
        return out
    bw = spec.hbm_gbps * 1e3  # bytes per µs
    fp8_roof = np.fmax(sel["flops"] / (spec.peak("fp8") * 1e6), sel["bytes"] / 2 / bw)
    after = sel["dur"] * fp8_roof / sel["t_roof_us"]
    casts = sel["bytes"] / bw  # the scaling casts fused into neighbouring kernels: the GEMM's bytes once more
    saved = (sel["dur"] - after - casts).clip(lower=0)
    n = v.n_steps
    share = 100 * sel["dur"].sum() / step_us
    dtype = str(sel["dtype"].mode().iat[0])
    out.append(Candidate(
        id="GP-PREC-002", category="precision",
        title=(f"{share:.0f}% of the step is {dtype} GEMMs at their compute roof "
               f"({float(sel['flops'].sum() / (sel['dur'].sum() * 1e6)):.0f} TFLOP/s): FP8 tensor cores run them "
               f"at twice the rate on the {spec.name}"),
        confidence="medium",
        recommendation=("Train the large linear layers in FP8 with the casts fused: NVIDIA Transformer Engine "
                        "(`te.Linear` under `te.fp8_autocast()`), or torchao's float8 training "
                        "(`torchao.float8.convert_to_float8_training(model)`) with `torch.compile(model)`, which "
                        "fuses the amax and scaling casts into the neighbouring kernels; for inference, FP8 "
                        "weights and activations the same way. Writing the scaling in eager PyTorch around "
                        "`torch._scaled_mm` (an amax reduction and a cast per operand, per product) can eat the "
                        "whole gain: on this project's H200 FP8 pair such an eager twin realised -0.5 %. Check the "
                        "loss curve against BF16 (FP8's 3-bit mantissa)."),
        units=v.kernel_units(sel.index, saved),
        evidence={
            "rank": v.rank, "gemm_ms_per_step": round(ms(sel["dur"].sum()) / n, 3),
            "gemm_share_of_step_pct": round(share, 1),
            "achieved_tflops": round(float(sel["flops"].sum() / (sel["dur"].sum() * 1e6)), 1),
            "fp8_peak_tflops": spec.peak("fp8"), "priced_dtype": "fp8",
            "estimated_gemm_ms_per_step_after": round(ms(after.sum()) / n, 3),
            "fused_cast_ms_per_step": round(ms(casts.sum()) / n, 3),
            "kernels": top_names(sel),
            "checked": ("torch._scaled_mm on an H200: 1.42-1.50 PFLOP/s vs bf16 0.78-0.80 on 8192x4096x16384-class "
                        "shapes (sample_traces/h200/heldout/scaled_mm_check.json); an eager quantisation of one "
                        "operand took 0.21-0.81 ms there, 16-58 % of the bf16 product"),
            "estimate": ("each GEMM keeps its % of roofline at the FP8 tensor-core peak with one-byte operands, "
                         "plus the scaling casts fused into neighbouring kernels (the GEMM's bytes moved once more "
                         "at the memory roof); eager casts cost more"),
        }))
    return out
