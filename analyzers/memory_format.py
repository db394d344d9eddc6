"""memory_format: convolutions run in NCHW, so cuDNN transposes activations to NHWC and back around
each convolution, and the normalisation/pooling kernels take their slower NCHW paths.

Trigger: a trace with convolution kernels and cuDNN layout transforms (``nchwToNhwcKernel`` /
``nhwcToNchwKernel``; the roofline's family ``layout``) or NCHW variants of layout-sensitive
kernels (batch norm, pooling, upsampling kernels without ``channels_last``/``nhwc`` in the name).
A channels-last model (its kernels say ``channels_last``/``nhwc``, no transforms) never raises it;
neither does a model without convolutions.
Estimate: with ``channels_last`` the transforms disappear, with the launch gaps in front of them,
and so do the copies that convert 4-D activations between the two layouts (``.contiguous()`` of
an NCHW tensor permuted to NHWC, as ConvNeXt's LayerNorm/Linear blocks do: dense strides in the
other order; in a channels-last model the permuted view is already dense).
The NCHW kernels' excess over their channels-last cost is priced from a measurement: channels-last
variants of the same kernels in the same program (at their roofline efficiency), else for batch
norm the measured layout table (``benchmarks/layout_table.py``: channels-last over NCHW time of
``BatchNorm2d`` forward+backward kernels at the nearest measured shape and that dtype, replayed
from a CUDA graph so that no launch time is inside the timing, shipped as
``gpuprof/data/layout_table.json``; it names the GPU it was measured on); otherwise it is
reported (with what it would be at the roofline, an upper bound) but not claimed.

The fix is a replay transformation (gpuprof.replay.fixes; its replayed saving is the estimate, with
the host floor and bounds every replayed fix gets): the transforms and conversion copies go with
their launches and the host work before each that was their op's own (a convolution around
cuDNN's transposes still runs: the work before its first call, and the idle gap that work leaves,
stay), and the NCHW kernels run at their channels-last time. On a host-bound CNN (ConvNeXt-T, GPU busy 26 of 34 ms) the GPU saving is hidden and the
launches that go are what shortens the step; on a GPU-bound one (ResNet-50 NCHW) the GPU saving
is, up to the host's floor.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from gpuprof.claims import Candidate
from gpuprof.analyzers._base import gpu_side_confidence, ms, per_shape, top_names

from gpuprof.roofline import per_name

if TYPE_CHECKING:
    from gpuprof.rank import RankView
    pass

#: Kernels whose NCHW path is slower than their channels-last one (strided per-channel work).
LAYOUT_SENSITIVE = re.compile(r"batch_norm|\bbn_|_bn_|pool|upsample|group_norm", re.IGNORECASE)
CHANNELS_LAST = re.compile(r"channels_last|nhwc", re.IGNORECASE)
BATCH_NORM = re.compile(r"batch_norm|\bbn_|_bn_", re.IGNORECASE)
LAYOUT_TABLE = "layout_table.json"
#: Per dtype: the measured shapes as (log2 channels, log2 N·H·W) rows, and their channels-last /
#: NCHW time ratios (at most 1).
Ratios = dict[str, tuple[np.ndarray, np.ndarray]]


@lru_cache(maxsize=1)
def _layout_table() -> dict[str, Any] | None:
    """The shipped layout table (``benchmarks/layout_table.py``), None where there is none."""
    f = resources.files("gpuprof").joinpath("data", LAYOUT_TABLE)
    if not f.is_file():
        return None
    doc: dict[str, Any] = json.loads(f.read_text(encoding="utf-8"))
    return doc


def _shape_points(rows: list[dict[str, Any]]) -> np.ndarray:
    """Each layout-table row's shape as (log2 C, log2 N·H·W), the space :func:`nearest_ratio` searches."""
    out: np.ndarray = np.log2([[float(r["c"]), float(r["n"]) * float(r["h"]) * float(r["w"])] for r in rows])
    return out


@lru_cache(maxsize=1)
def layout_ratios() -> Ratios | None:
    """Per dtype: each measured shape (log2 C, log2 N·H·W) and its channels-last / NCHW batch-norm
    time (at most 1), from the measured layout table shipped as package data; None until it has
    been measured. The shape, not the element count, is the key: NCHW batch norm reduces each
    channel's N·H·W plane with a stride, so equal element counts differ (ResNet-50's 64×56×56 at
    0.25 and 1024×14×14 at 0.83 in bf16, both 12.8M elements per batch of 64)."""
    doc = _layout_table()
    if doc is None:
        return None
    rows = [r for r in doc["rows"] if r.get("op") == "batch_norm"]
    out: Ratios = {}
    for d in sorted({str(r["dtype"]) for r in rows}):
        rs = [r for r in rows if r["dtype"] == d]
        out[d] = (_shape_points(rs), np.array([min(1.0, float(r["cl_us"]) / float(r["nchw_us"])) for r in rs]))
    return out


@lru_cache(maxsize=1)
def autocast_bn_ratios() -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """Per layout the FP32 model's batch norms run in (``cl``, ``nchw``): each measured shape
    (log2 C, log2 N·H·W) and the bf16 channels-last batch-norm time over the FP32 one in that
    layout (at most 1), from the shipped layout table; None until it has been measured. This is
    what the FP32 CNN's autocast recipe (channels-last for an NCHW model) does to its batch norms:
    with bf16 activations PyTorch runs its own channels-last kernels where FP32 took cuDNN's NHWC
    ones, and those are not twice as fast (0.79-1.23x of FP32 channels-last over the table's
    shapes), so half the bytes is not half the time."""
    doc = _layout_table()
    if doc is None:
        return None
    rows = [r for r in doc["rows"] if r.get("op") == "batch_norm"]

    def shape(r: dict[str, Any]) -> tuple[int, int, int, int]:
        return int(r["n"]), int(r["c"]), int(r["h"]), int(r["w"])

    bf16 = {shape(r): float(r["cl_us"]) for r in rows if r["dtype"] == "bf16"}
    fp32 = [r for r in rows if r["dtype"] == "fp32" and shape(r) in bf16]
    if not fp32:
        return None
    pts = _shape_points(fp32)
    return {lay: (pts, np.array([min(1.0, bf16[shape(r)] / float(r[f"{lay}_us"])) for r in fp32]))
            for lay in ("cl", "nchw")}


def bn_sizes(v: RankView, k: pd.DataFrame) -> np.ndarray:
    """(C, N·H·W) of each kernel's op's first input (NaNs where it is not 4-D), one row per kernel."""
    sizes = per_shape(v.trace.ops, k["op"].unique(), _channels_plane).reindex(k["op"].to_numpy())
    cp = np.array([x if isinstance(x, tuple) else (np.nan, np.nan) for x in sizes.tolist()], dtype=float)
    out: np.ndarray = cp.reshape(-1, 2)
    return out


def _channels_plane(dims: Any) -> tuple[float, float]:
    """(C, N·H·W) of an op's first input when it is 4-D [N, C, H, W], else NaNs."""
    first = dims[0] if isinstance(dims, list) and dims else None
    if isinstance(first, list) and len(first) == 4 and all(isinstance(x, int) and x > 0 for x in first):
        return float(first[1]), float(first[0] * first[2] * first[3])
    return float("nan"), float("nan")


def nearest_ratio(points: np.ndarray, ratio: np.ndarray, c: np.ndarray, plane: np.ndarray) -> np.ndarray:
    """Each kernel's ratio: the measured shape nearest to its (C, N·H·W) in log space (the shape
    itself where it was measured)."""
    q = np.log2(np.c_[c, plane])
    d = ((q[:, None, :] - points[None, :, :]) ** 2).sum(axis=-1)
    out: np.ndarray = ratio[np.argmin(d, axis=1)]
    return out
FIX = ("Convert the model and its inputs to channels-last: `model = model.to(memory_format=torch.channels_last)` "
       "and `images = images.to(device, memory_format=torch.channels_last)` (keep autocast on); cuDNN then runs "
       "NHWC convolutions without transposes, and batch norm/pooling take their channels-last kernels.")


def nchw_parts(v: RankView) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(layout transforms, NCHW layout-sensitive kernels, their channels-last variants) of one
    rank, empty where the trace has no convolutions. Shared with the precision analyzer, whose
    FP32-CNN estimate assumes channels-last too."""
    k = v.kernels
    fam = k["family"].astype(str)
    if not (fam == "conv").any():
        empty = k.iloc[:0]
        return empty, empty, empty
    sens = per_name(k["name"], lambda n: bool(LAYOUT_SENSITIVE.search(n)), dtype=bool)
    cl = per_name(k["name"], lambda n: bool(CHANNELS_LAST.search(n)), dtype=bool)
    memoryish = ~fam.isin(["conv", "gemm", "attention", "layout"]).to_numpy()
    return k[(fam == "layout").to_numpy()], k[sens & ~cl & memoryish], k[sens & cl & memoryish]


def _dense_order(dims: Any, strides: Any) -> tuple[int, ...] | None:
    """The order of a dense tensor's dimensions in memory (outermost first), None when it is not
    dense (a broadcast, a slice) or not 4-D."""
    if not (isinstance(dims, list) and isinstance(strides, list) and len(dims) == len(strides) == 4):
        return None
    if not all(isinstance(x, int) and x > 0 for x in dims) or not all(isinstance(x, int) for x in strides):
        return None
    order = tuple(sorted(range(4), key=lambda i: (-strides[i], -dims[i])))
    expect = 1
    for i in reversed(order):
        if dims[i] > 1 and strides[i] != expect:
            return None
        expect *= dims[i]
    return order


def _is_conversion(dims: Any, strides: Any) -> bool:
    """A copy between two 4-D tensors of the same shape whose dense layouts differ: a layout
    conversion (NCHW <-> NHWC, or a permuted view made contiguous)."""
    if not (isinstance(dims, list) and isinstance(strides, list) and len(dims) >= 2 and len(strides) >= 2):
        return False
    if dims[0] != dims[1]:
        return False
    a, b = _dense_order(dims[0], strides[0]), _dense_order(dims[1], strides[1])
    return a is not None and b is not None and a != b


def layout_conversions(v: RankView) -> pd.DataFrame:
    """Copy kernels that convert 4-D tensors between dense layouts, in a trace with convolutions."""
    from gpuprof.trace.load import parse_arg

    k = v.kernels
    fam = k["family"].astype(str)
    none: pd.DataFrame = k.iloc[:0]
    if not (fam == "conv").any() or "input_strides" not in v.trace.ops.columns:
        return none
    cand: pd.DataFrame = k[(fam == "copy").to_numpy() & (k["op"].to_numpy() >= 0)]
    if cand.empty:
        return cand
    ops = v.trace.ops
    rows = cand["op"].to_numpy()
    sub = ops.iloc[rows]
    key = sub["input_dims"].astype(object).map(str) + "\x00" + sub["input_strides"].astype(object).map(str)
    codes, uniq = pd.factorize(key.to_numpy())
    first = np.unique(codes, return_index=True)[1]
    hit = np.array([_is_conversion(parse_arg(sub["input_dims"].iloc[i]), parse_arg(sub["input_strides"].iloc[i]))
                    for i in first], dtype=bool)
    hits: pd.DataFrame = cand[hit[codes]] if len(hit) else none
    return hits


def nchw_savings(v: RankView, ratios: Ratios | None = None, vendor: str = "nvidia"
                 ) -> tuple[pd.DataFrame, np.ndarray, float, str]:
    """Kernels channels-last would remove or speed up, the µs each would save, what the NCHW
    kernels would save more at their roofline (reported, not claimed), and how they were priced.
    ``ratios`` defaults to the shipped layout table (:func:`layout_ratios`), which was measured on
    an NVIDIA GPU with PyTorch's CUDA batch-norm kernels: it is not applied to other vendors'
    GPUs (ROCm's MIOpen batch norm is another implementation), where the kernels stay unclaimed."""
    xf, slow, fast = nchw_parts(v)
    shipped = ratios is None
    if ratios is None:
        ratios = layout_ratios() if vendor == "nvidia" else None
    dur = slow["dur"].to_numpy(dtype=float)
    t_roof = slow["t_roof_us"].to_numpy(dtype=float)
    roof = np.isfinite(t_roof) & (t_roof > 0)
    after = dur.copy()
    how = "not claimed (nothing measured says how fast their channels-last kernels run)"
    eff = float(fast["t_roof_us"].sum() / fast["dur"].sum()) if len(fast) and fast["dur"].sum() > 0 else np.nan
    if np.isfinite(eff) and eff > 0:
        after = np.where(roof, t_roof / eff, dur)
        how = "at the roofline efficiency of the channels-last variants in this trace"
    elif ratios and len(slow):
        bn = per_name(slow["name"], lambda n: bool(BATCH_NORM.search(n)), dtype=bool)
        cp = bn_sizes(v, slow)
        ratio = np.full(len(slow), 1.0)
        for d, (pts, q) in ratios.items():
            m = bn & (slow["dtype"].astype(str).to_numpy() == d) & np.isfinite(cp).all(axis=1)
            if m.any() and len(q):
                ratio[m] = nearest_ratio(pts, q, cp[m, 0], cp[m, 1])
        after = np.maximum(dur * ratio, np.where(roof, t_roof, 0.0))
        gpu = (_layout_table() or {}).get("name") if shipped else None
        source = "benchmarks/layout_table.py" + (f", measured on {gpu}" if gpu else "")
        how = f"batch norm at the measured channels-last/NCHW time ratio for its size ({source})"
    saved_slow = np.clip(dur - after, 0, None)
    at_roof = float(np.clip(dur - np.where(roof, t_roof, dur), 0, None).sum() - saved_slow.sum())
    rows = pd.concat([xf, slow])
    return rows, np.r_[xf["dur"].to_numpy(), saved_slow], max(at_roof, 0.0), how


def _leads(v: RankView, gone: pd.DataFrame) -> np.ndarray:
    """Rows of ``gone`` that are their op's first kernel (by launch) while the op launches a kernel
    that stays: the work before them is the op's dispatch, which the fix leaves in place."""
    k = v.trace.kernels
    if not len(gone) or not len(k) or "op" not in k.columns:
        return np.zeros(0, dtype=np.int64)
    op = k["op"].to_numpy()
    rows = gone.index.to_numpy(dtype=np.int64)
    g_op = op[rows]
    has = op >= 0
    n_all = np.bincount(op[has], minlength=int(op.max()) + 1 if has.any() else 0)
    n_gone = np.bincount(g_op[g_op >= 0], minlength=len(n_all))
    first = pd.Series(k["launch_ts"].to_numpy(dtype=float)[has]).groupby(op[has]).min()
    lt = k["launch_ts"].to_numpy(dtype=float)[rows]
    ok = g_op >= 0
    lead = np.zeros(len(rows), dtype=bool)
    lead[ok] = (n_all[g_op[ok]] > n_gone[g_op[ok]]) & (lt[ok] <= first.reindex(g_op[ok]).to_numpy())
    out: np.ndarray = rows[lead]
    return out


def run(v: RankView) -> list[Candidate]:
    out: list[Candidate] = []
    xf, slow, _ = nchw_parts(v)
    if xf.empty and slow.empty:
        return out
    rows, saved, at_roof, how = nchw_savings(v, vendor=v.spec.vendor if v.spec else "")
    conv = layout_conversions(v)
    conv = conv[~conv.index.isin(rows.index)]
    rows = pd.concat([rows, conv])
    saved = np.r_[saved, conv["dur"].to_numpy(dtype=float)]
    n = v.n_steps
    gone = pd.concat([xf, conv])
    # the fix's units: the kernels that go (their launches, and the host work before each that was
    # their op's own, go with them in the replay), the NCHW kernels at their channels-last time,
    # and the launch gaps before the kernels that go, less those before an op's first kernel where
    # the op keeps a kernel (the convolution's dispatch stays, and the gap with it); the replay of
    # those (gpuprof.replay.fixes) is the estimate
    units = {**v.kernel_units(rows.index, saved), **v.inner_gap_units(gone.index, exclude_first=_leads(v, gone))}
    g_k = float(np.sum(saved)) / n
    if not units:
        return out
    confidence, idle_ms = gpu_side_confidence(v, g_k)
    if confidence == "medium":  # host-bound: the launches that go are the saving, a host-side figure
        confidence = v.host_confidence("medium")
    out.append(Candidate(
        id="GP-MEMFMT-001", category="memory_format",
        title=f"Convolutions run in NCHW: {ms(xf['dur'].sum()) / n:.2f} ms per step of cuDNN layout "
              f"transposes, {ms(slow['dur'].sum()) / n:.2f} ms of NCHW batch-norm/pooling kernels and "
              f"{ms(conv['dur'].sum()) / n:.2f} ms of NCHW/NHWC copies ({len(gone) / n:.0f} launches per step)",
        confidence=confidence,
        recommendation=FIX,
        units=units,
        evidence={
            "rank": v.rank,
            "layout_transform_ms_per_step": round(ms(xf["dur"].sum()) / n, 3),
            "layout_transforms_per_step": round(len(xf) / n, 1),
            "layout_conversion_copies_ms_per_step": round(ms(conv["dur"].sum()) / n, 3),
            "layout_conversion_copies_per_step": round(len(conv) / n, 1),
            "nchw_kernels_ms_per_step": round(ms(slow["dur"].sum()) / n, 3),
            "nchw_kernels_extra_saving_at_roofline_ms_per_step": round(ms(at_roof) / n, 3),
            "nchw_kernels_priced": how,
            "gpu_ms_saved_per_step": round(ms(g_k), 3),
            "launches_removed_per_step": round(len(gone) / n, 1),
            "gpu_idle_ms_per_step": idle_ms,
            "transform_kernels": top_names(xf) if len(xf) else [],
            "nchw_kernels": top_names(slow) if len(slow) else [],
            "conversion_kernels": top_names(conv) if len(conv) else [],
            "estimate": "the layout transforms, NCHW/NHWC copies and the launch gaps before them go; NCHW "
                        f"batch-norm/pooling kernels: {how}; the launches of the kernels that go and the host work before "
                        "each leave the host chain",
        },
    ))
    return out
