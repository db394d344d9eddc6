"""NVML samples of a run folder (``nvml.csv``, written by ``gpuprof record``) and their summary.

Samples are on the Unix clock in ns, the clock Kineto's ``baseTimeNanoseconds`` uses, so a rank's
profiled window selects its samples exactly. But the window is short (a few steps: a handful of
samples) and follows the profiler's own start-up pause, during which the GPU idles and cools; NVML
utilisation and power are also averages that lag by ~100 ms. So clocks, power, throttling and
GPM are summarised over the samples in which the GPU was working (utilisation ≥ ``BUSY_PCT``)
across the run, and memory over the whole run. Throttle reasons are NVML clock-event bits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpuprof.errors import TraceError

REASONS = {0x1: "idle", 0x2: "application clocks", 0x4: "SW power cap", 0x8: "HW slowdown",
           0x20: "SW thermal", 0x40: "HW thermal", 0x80: "power brake"}
#: Bits that mean the clock is held down while the GPU has work (not idle, not a user setting).
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
BUSY_PCT = 50


#: The columns ``gpuprof record`` writes besides ``ts_ns`` and ``gpu``; all numeric. A file from
#: another version, or edited by hand, may lack some: they read as NaN (not measured).
METRICS = ("util_gpu_pct", "util_mem_pct", "mem_used_mb", "mem_total_mb", "power_w", "power_limit_w",
           "sm_clock_mhz", "mem_clock_mhz", "sm_clock_max_mhz", "clock_event_reasons", "temp_c",
           "pcie_tx_bytes", "pcie_rx_bytes", "nvlink_tx_bytes", "nvlink_rx_bytes", "gpm_sm_util_pct",
           "gpm_sm_occupancy_pct", "gpm_tensor_util_pct", "gpm_dram_bw_util_pct")
#: Clock-event reasons are a bit mask of NVML's 64-bit reasons word.
_MAX_REASONS = 2 ** 53


def load_csv(path: Path, inside: Path | None = None) -> pd.DataFrame:
    """The samples, every known column present and numeric (absent or unreadable values NaN);
    ``ts_ns`` and ``gpu`` must be whole numbers in every row. The file is read the one way gpuprof
    reads files (:func:`gpuprof.files.read`: a regular file, inside ``inside`` when given,
    decompressed by content and bounded), never by the compression its name suggests."""
    import io

    from gpuprof import files

    data = files.read(path, inside=inside)
    try:
        df = pd.read_csv(io.BytesIO(data), low_memory=False, compression=None)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise TraceError(f"unreadable NVML samples ({e.__class__.__name__}: {e})", str(path)) from None
    for col in ("ts_ns", "gpu"):
        if col not in df.columns:
            raise TraceError(f"not a gpuprof NVML file (no '{col}' column)", str(path))
        v = pd.to_numeric(df[col], errors="coerce")
        bad = ~np.isfinite(v.to_numpy(dtype=float)) | (v.to_numpy(dtype=float) < 0) \
            | (v.to_numpy(dtype=float) >= 2.0 ** 63)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise TraceError(f"column '{col}' must hold non-negative whole numbers; row {row + 2} holds "
                             f"{str(df[col].iloc[row])[:40]!r}", str(path))
        df[col] = v.astype(np.int64)
    for col in METRICS:
        if col in df.columns:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype(np.float64)
        else:
            df[col] = np.nan
    reasons = df["clock_event_reasons"].to_numpy()
    df["clock_event_reasons"] = np.where((reasons >= 0) & (reasons < _MAX_REASONS), reasons, np.nan)
    return df


def busy(w: pd.DataFrame) -> pd.DataFrame:
    """The samples in which the GPU was working (utilisation is read less often than clocks:
    each sample takes the last utilisation read before it, per GPU)."""
    if "util_gpu_pct" not in w:
        return w
    util = pd.to_numeric(w["util_gpu_pct"], errors="coerce").groupby(w["gpu"]).ffill()
    return w[util >= BUSY_PCT]


def _gpm_mean(samples: pd.DataFrame, w: pd.DataFrame, col: str) -> float | None:
    """Mean of a GPM metric over the GPM intervals that saw the GPU busy. A GPM value covers the
    time since the previous GPM read of its GPU, not an instant: a read taken just after the work
    ended (the recorder's last row, or a slow GPM period on a short program) still measured that
    work, so an interval counts when any busy sample lies inside it."""
    if col not in samples or "ts_ns" not in samples:
        return None
    out: list[np.ndarray] = []
    for gpu, g in samples.groupby("gpu", sort=False):
        v = pd.to_numeric(g[col], errors="coerce")
        g = g[v.notna()]
        if g.empty:
            continue
        ends = pd.to_numeric(g["ts_ns"], errors="coerce").to_numpy(dtype=np.float64)
        starts = np.concatenate(([-np.inf], ends[:-1]))
        bt = np.sort(pd.to_numeric(w.loc[w["gpu"] == gpu, "ts_ns"], errors="coerce").to_numpy(dtype=np.float64))
        hit = np.searchsorted(bt, ends, side="right") > np.searchsorted(bt, starts, side="right")
        out.append(pd.to_numeric(g[col], errors="coerce").to_numpy(dtype=np.float64)[hit])
    vals = np.concatenate(out) if out else np.empty(0)
    return float(vals.mean()) if vals.size else None


def summarize(samples: pd.DataFrame, period_s: float) -> dict[str, Any]:
    """Means over busy samples, clocks vs. max, power vs. limit, throttle reasons seen and for how
    long, and peak memory over the run."""
    if samples.empty:
        return {"samples": 0}
    w = busy(samples)
    if w.empty:
        w = samples

    def mean(col: str) -> float | None:
        v = pd.to_numeric(w[col], errors="coerce") if col in w else None
        return float(v.mean()) if v is not None and v.notna().any() else None

    def top(col: str) -> float | None:
        v = pd.to_numeric(w[col], errors="coerce") if col in w else None
        return float(v.max()) if v is not None and v.notna().any() else None

    reasons = pd.to_numeric(w["clock_event_reasons"], errors="coerce").fillna(0).astype(np.int64) \
        if "clock_event_reasons" in w else pd.Series(dtype=np.int64)
    seen = {name: {"samples": int(((reasons & bit) != 0).sum()),
                   "seconds": round(float(((reasons & bit) != 0).sum()) * period_s, 3),
                   "pct_of_busy_time": round(100.0 * float(((reasons & bit) != 0).mean()), 1)}
            for bit, name in REASONS.items() if ((reasons & bit) != 0).any()}
    sm, sm_max = mean("sm_clock_mhz"), top("sm_clock_max_mhz")
    pw, limit = mean("power_w"), top("power_limit_w")
    used = float(pd.to_numeric(samples["mem_used_mb"], errors="coerce").max()) if "mem_used_mb" in samples else None
    total = top("mem_total_mb")
    return {
        "samples": int(len(samples)), "busy_samples": int(len(w)),
        "in_window_samples": int(samples["in_window"].sum()) if "in_window" in samples else None,
        "util_gpu_pct_mean": mean("util_gpu_pct"),
        "sm_clock_mhz_mean": sm, "sm_clock_mhz_max": sm_max,
        "sm_clock_pct_of_max": 100.0 * sm / sm_max if sm and sm_max else None,
        "power_w_mean": pw, "power_limit_w": limit, "power_pct_of_limit": 100.0 * pw / limit if pw and limit else None,
        "mem_used_mb_max": used, "mem_total_mb": total,
        "mem_used_pct_max": 100.0 * used / total if used and total else None,
        "temp_c_max": top("temp_c"),
        **{f"{c}_mean": _gpm_mean(samples, w, c) for c in ("gpm_sm_util_pct", "gpm_tensor_util_pct",
                                                           "gpm_dram_bw_util_pct")},
        "clock_event_reasons": seen,
    }
