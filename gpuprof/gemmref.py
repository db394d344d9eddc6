"""What an aligned GEMM of a given size and dtype reaches on a GPU: the reference a slow GEMM is
measured against when the trace holds no aligned twin to learn from.

The reference is measured, never assumed. ``gpuprof calibrate --gemm-table`` times ``(m, k) @ (k, n)``
GEMMs over a grid of sizes per dtype (aligned, and with every dimension one less). Where it comes from:

* a ``--gpu-spec`` file with a ``gemm_table``: that GPU's own aligned rows, as measured;
* otherwise the table measured on an H200 and shipped with gpuprof (``gpuprof/data/h200_gemm_table.json``),
  read as *efficiency of the H200's datasheet peak* at each size and multiplied by this GPU's
  datasheet peak for the dtype. On the H200 and H100 SXM (same datasheet peaks) that is the
  table itself; on other GPUs it is a fallback (same efficiency of peak at the same size), and
  the finding's evidence says so.

Between grid points the rate is interpolated linearly in log TFLOP/s over log m, log n, log k,
and clamped at the grid's edges (a GEMM larger than 16384 gets the largest size's rate). The
table's timings are CUDA events around single calls, so its smallest GEMMs (25 µs at 256³) include
launch latency: their reference is slower than the kernel alone, which makes savings on small
GEMMs conservative, never inflated. FP8/INT8 have no rows: they take bf16's efficiency of peak.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from gpuprof.specs import BUILTIN, GpuSpec

SHIPPED = "h200_gemm_table.json"
_SHIPPED_GPU = "H200-SXM"  # the datasheet whose peaks the shipped table's efficiencies are of
_AS_BF16 = ("fp8", "int8")

Row = tuple[str, int, int, int, float]


@dataclass(frozen=True)
class _Grid:
    axes: tuple[np.ndarray, np.ndarray, np.ndarray]  # log2 m, n, k (sorted)
    log_tflops: np.ndarray  # [m, n, k]


@dataclass(frozen=True)
class Reference:
    """Aligned-GEMM TFLOP/s by dtype and size on one GPU; ``source`` says where it comes from."""

    grids: dict[str, _Grid]
    scale: dict[str, float]  # per math dtype: multiplier on the table's rate
    table_dtype: dict[str, str]  # math dtype -> the table's dtype it is read from
    source: str

    def tflops(self, dtype: str, m: int, n: int, k: int) -> float:
        """Reference TFLOP/s for an (m, k) @ (k, n) GEMM in ``dtype``; NaN where there is none."""
        src = self.table_dtype.get(dtype)
        g = self.grids.get(src) if src else None
        if g is None or min(m, n, k) <= 0:
            return float("nan")
        v = _trilinear(g, (np.log2(m), np.log2(n), np.log2(k)))
        return float(2.0 ** v * self.scale[dtype])


def _trilinear(g: _Grid, x: tuple[float, float, float]) -> float:
    idx, wts = [], []
    for ax, v in zip(g.axes, x):
        v = min(max(v, float(ax[0])), float(ax[-1]))
        hi = int(np.clip(np.searchsorted(ax, v), 1, len(ax) - 1)) if len(ax) > 1 else 0
        lo = max(hi - 1, 0)
        w = (v - ax[lo]) / (ax[hi] - ax[lo]) if hi != lo else 0.0
        idx.append((lo, hi))
        wts.append((1.0 - w, w))
    out = 0.0
    for a in (0, 1):
        for b in (0, 1):
            for c in (0, 1):
                out += wts[0][a] * wts[1][b] * wts[2][c] * g.log_tflops[idx[0][a], idx[1][b], idx[2][c]]
    return out


def grids_of(rows: tuple[Row, ...]) -> dict[str, _Grid]:
    """One full m × n × k grid per dtype from aligned rows; a dtype whose rows do not fill a grid
    is left out (it cannot be interpolated without inventing the missing cells)."""
    out: dict[str, _Grid] = {}
    for d in sorted({r[0] for r in rows}):
        rs = [r for r in rows if r[0] == d]
        ms, ns, ks = (np.array(sorted({r[i] for r in rs}), dtype=float) for i in (1, 2, 3))
        cube = np.full((len(ms), len(ns), len(ks)), np.nan)
        for _, m, n, k, t in rs:
            cube[np.searchsorted(ms, m), np.searchsorted(ns, n), np.searchsorted(ks, k)] = np.log2(t)
        if np.isfinite(cube).all():
            out[d] = _Grid((np.log2(ms), np.log2(ns), np.log2(ks)), cube)
    return out


@lru_cache(maxsize=1)
def shipped_rows() -> tuple[Row, ...]:
    """The aligned rows of the table measured on an H200 and shipped as package data."""
    text = resources.files("gpuprof").joinpath("data", SHIPPED).read_text(encoding="utf-8")
    return tuple((str(r["dtype"]), int(r["m"]), int(r["n"]), int(r["k"]), float(r["tflops"]))
                 for r in json.loads(text)["gemm_table"] if r.get("aligned"))


def reference(spec: GpuSpec) -> Reference:
    """The aligned-GEMM reference for ``spec`` (see the module docstring)."""
    return _reference(spec.key, spec.name, spec.gemm_table, tuple(sorted(spec.peaks_tflops.items())))


@lru_cache(maxsize=16)
def _reference(key: str, name: str, own: tuple[Row, ...], peaks: tuple[tuple[str, float], ...]) -> Reference:
    have = dict(peaks)
    dtypes = ("bf16", "fp16", "tf32", "fp32", *_AS_BF16)
    if own:
        grids = grids_of(own)
        table_dtype = {d: (d if d in grids else "bf16") for d in dtypes if d in grids or d in _AS_BF16}
        scale = {d: (1.0 if d == t else have.get(d, 0.0) / have["bf16"] if have.get("bf16") else 0.0)
                 for d, t in table_dtype.items()}
        return Reference(grids, scale, table_dtype, f"aligned GEMMs measured on {name} (spec file gemm_table)")
    grids = grids_of(shipped_rows())
    ref_peaks = BUILTIN[_SHIPPED_GPU].peaks_tflops
    table_dtype = {d: (d if d in grids else "bf16") for d in dtypes}
    # Efficiency of the H200's datasheet peak at this size, times this GPU's datasheet peak.
    base = BUILTIN.get(key)
    mine = base.peaks_tflops if base is not None else have
    scale = {d: mine[d] / ref_peaks[t] for d, t in table_dtype.items() if ref_peaks.get(t) and mine.get(d)}
    table_dtype = {d: t for d, t in table_dtype.items() if d in scale}
    same = all(abs(scale.get(d, 0.0) - 1.0) < 1e-9 for d in ("bf16", "fp16", "tf32"))
    source = ("aligned GEMMs measured on an NVIDIA H200 (gpuprof/data/h200_gemm_table.json)" if same else
              f"the H200-measured efficiency of peak at this size x {name}'s datasheet peak (fallback: no "
              f"GEMM table measured on this GPU; `gpuprof calibrate --gemm-table` makes one for --gpu-spec)")
    return Reference(grids, scale, table_dtype, source)
