"""The small per-rank summary that crosses ranks (:class:`RankPart`): what the report and the
cross-rank analysis need of a rank, some kilobytes to a few MB however big its trace, so that a
job of many ranks is analysed without ever holding every rank's frames in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpuprof.collectives import collective_table
from gpuprof.hostcost import event_cost_us
from gpuprof.idle import loader_us_per_step
from gpuprof.rank import RankResult
from gpuprof.timeline import StepSummary
from gpuprof.trace.model import TraceMeta
from gpuprof.trace.names import text


@dataclass(frozen=True)
class RankPart:
    """What the report and the cross-rank analysis need of one rank: small, whatever the trace."""

    meta: TraceMeta
    steps: pd.DataFrame  # the trace's step windows
    summary: StepSummary
    kernels: pd.DataFrame  # per kernel name: sums over the profiled steps (see kernel_sums)
    collectives: pd.DataFrame  # gpuprof.collectives.collective_table
    has_gpu: bool
    event_cost_us: float  # the profiler's cost per recorded host event (0 when the real step time is unknown)
    runtime_us_per_step: float  # CUDA runtime/driver call time per step on the host
    unprofiled_step_ms: float | None = None
    nvml: pd.DataFrame | None = None
    #: host time per profiled step inside DataLoader spans (gpuprof.idle.loader_us_per_step)
    loader_us_per_step: float = 0.0
    host_events_per_step: float = 0.0  # recorded host events per profiled step (gpuprof.hostcost.event_cost_us)
    nvml_period_s: float = 0.05

    @property
    def rank(self) -> int:
        return self.meta.rank

    @property
    def n_steps(self) -> int:
        return max(len(self.steps), 1)


def runtime_us_per_step(r: RankResult) -> float:
    rt = r.trace.runtime
    return float(rt.loc[rt["step"] >= 0, "dur"].sum()) / max(len(r.trace.steps), 1)


#: Per-name sums of one rank's kernels; kernel_table() turns several ranks' sums into the report's table.
SUM_COLUMNS = ["count", "total_us", "m_dur", "flops", "bytes", "m_roof", "e_dur", "e_roof", "e_count"]


def kernel_sums(r: RankResult) -> pd.DataFrame:
    """One row per kernel name over the rank's profiled steps: count, time, and the modelled
    FLOPs, bytes, roofline time and the time they cover (kernels the cost model knows); the
    time in each roofline class; engine, math dtype, op and the input shapes of the op that
    launched the name's first instance."""
    # the columns read below, not the two wide frames: the row filter would copy every column
    k = pd.concat([r.trace.kernels[["name", "step", "dur", "op"]],
                   r.roofline[["t_roof_us", "flops", "bytes", "model_error", "model_error_pct", "engine", "math_dtype",
                               "op_name", "bound"]]], axis=1)
    if (k["step"] >= 0).any():
        k = k[k["step"] >= 0]
    cols = ["name", *SUM_COLUMNS, "any_model", "engine", "math_dtype", "op", "shapes"]
    if k.empty:
        return pd.DataFrame(columns=cols)
    modelled = np.isfinite(k["t_roof_us"].to_numpy()) & np.isfinite(k["flops"].to_numpy())
    k = k.assign(
        name=k["name"].cat.remove_unused_categories() if isinstance(k["name"].dtype, pd.CategoricalDtype)
        else k["name"].astype(str),
        m_dur=np.where(modelled, k["dur"], 0.0),
        m_flops=np.where(modelled, k["flops"], 0.0),
        m_bytes=np.where(modelled, k["bytes"], 0.0),
        m_roof=np.where(modelled, k["t_roof_us"], 0.0),
        modelled=modelled,
        # instances above their roofline (roofline.MODEL_ERROR_PCT): their time and impossible roofline time
        e_dur=np.where(k["model_error"], k["dur"], 0.0),
        e_roof=np.where(k["model_error"], k["model_error_pct"] * k["dur"] / 100.0, 0.0),
        e_count=k["model_error"].astype(np.int64),
    )
    g = k.groupby("name", sort=False, observed=True)
    # one grouped pass per kind of reduction (a named aggregation per column costs a pass each)
    t = g[["dur", "m_dur", "m_flops", "m_bytes", "m_roof", "e_dur", "e_roof", "e_count"]].sum()
    t.columns = ["total_us", "m_dur", "flops", "bytes", "m_roof", "e_dur", "e_roof", "e_count"]
    t.insert(0, "count", g.size())
    t["any_model"] = g["modelled"].any()
    first = g[["engine", "math_dtype", "op_name", "op"]].first()
    first.columns = ["engine", "math_dtype", "op", "first_op"]
    t = t.join(first)
    ops = r.trace.ops
    dims = ops["input_dims"].to_numpy() if len(ops) else np.array([], dtype=object)
    rows = t["first_op"].to_numpy()
    shapes = [dims[int(i)] if 0 <= i < len(dims) else None for i in rows]
    t["shapes"] = [s.decode("utf-8", "replace") if isinstance(s, bytes) else s for s in shapes]
    bound = k.groupby(["name", text(k["bound"])], observed=True)["dur"].sum().unstack(fill_value=0)
    bound.columns = [f"bound:{c}" for c in bound.columns]
    t = t.drop(columns="first_op").join(bound)
    t.index = t.index.astype(object).astype(str)
    return t.reset_index()


def kernel_table(sums: list[pd.DataFrame]) -> pd.DataFrame:
    """The report's kernel table from the ranks' :func:`kernel_sums`: one row per kernel name,
    heaviest first; achieved rates and roofline % over the modelled instances."""
    out_cols = ["name", "count", "total_us", "flops", "bytes", "achieved_tflops", "achieved_gbps", "bound",
                "roofline_pct", "cost_model_error", "cost_model_error_count", "cost_model_error_pct", "engine", "math_dtype", "op", "shapes"]
    sums = [s for s in sums if len(s)]
    if not sums:
        return pd.DataFrame(columns=out_cols)
    k = pd.concat(sums, ignore_index=True)
    bound_cols = [c for c in k.columns if c.startswith("bound:")]
    k[bound_cols] = k[bound_cols].fillna(0.0)
    g = k.groupby("name", sort=False)
    t = g[SUM_COLUMNS + bound_cols].sum()
    t["any_model"] = g["any_model"].any()
    for c in ("engine", "math_dtype", "op", "shapes"):
        t[c] = g[c].first()
    t["bound"] = t[bound_cols].idxmax(axis=1).str.slice(len("bound:"))
    has = t["any_model"] & (t["m_dur"] > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        t["achieved_tflops"] = np.where(has, t["flops"] / (t["m_dur"] * 1e-6) / 1e12, np.nan)
        t["achieved_gbps"] = np.where(has, t["bytes"] / (t["m_dur"] * 1e-6) / 1e9, np.nan)
        t["roofline_pct"] = np.where(has, 100.0 * t["m_roof"] / t["m_dur"], np.nan)
        t["cost_model_error_pct"] = np.where(t["e_dur"] > 0, 100.0 * t["e_roof"] / t["e_dur"], np.nan)
    t["cost_model_error"] = t["e_count"] > 0
    t["cost_model_error_count"] = t["e_count"].astype(np.int64)
    t["flops"] = t["flops"].where(t["any_model"])
    t["bytes"] = t["bytes"].where(t["any_model"])
    t = t.reset_index().sort_values("total_us", ascending=False, kind="stable").reset_index(drop=True)
    t["count"] = t["count"].astype(np.int64)
    return t[out_cols]



def part_of(r: RankResult) -> RankPart:
    cost, per_step = event_cost_us(r)
    return RankPart(meta=r.trace.meta, steps=r.trace.steps, summary=r.summary, kernels=kernel_sums(r),
                    collectives=collective_table(r), has_gpu=r.trace.has_gpu, event_cost_us=cost,
                    runtime_us_per_step=runtime_us_per_step(r), unprofiled_step_ms=r.unprofiled_step_ms,
                    nvml=r.nvml, nvml_period_s=r.nvml_period_s, loader_us_per_step=loader_us_per_step(r.trace),
                    host_events_per_step=per_step)
