"""What the pipeline found in a job's traces (:class:`Result`): plain data, filled in once by
:mod:`gpuprof.pipeline` and never re-run. The public :class:`gpuprof.Analysis` adds the frames on
demand, the reports and ``what_if`` on top of it (:mod:`gpuprof.api`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gpuprof.claims import Claimed
from gpuprof.findings import Finding
from gpuprof.jobs import Job
from gpuprof.parts import RankPart, kernel_table
from gpuprof.rank import RankResult
from gpuprof.specs import GpuSpec
from gpuprof.timeline import CLASSES

if TYPE_CHECKING:
    from gpuprof.replay.fixes import Plan
    from gpuprof.steptime import InputWaits


@dataclass(frozen=True)
class Result:
    """Everything gpuprof found in a set of traces.

    ``parts`` are the ranks' small summaries (:class:`~gpuprof.parts.RankPart`), in rank order;
    ``findings`` the ranked fixes and ``notes`` those that save next to nothing; ``claims`` each
    rank's claims after the findings shared its units (what the views draw and the projection
    prices); ``replay_step_time_ms`` the unchanged traces replayed and ``projection`` every high-
    and medium-confidence fix replayed together. ``frames`` are the ranks' frames where this
    process kept them (one trace, a small job, ``keep_traces``), ``plans`` their replay plans;
    elsewhere both are None and the frames are loaded again on demand (``jobs`` says how)."""

    parts: tuple[RankPart, ...]
    spec: GpuSpec | None
    findings: tuple[Finding, ...] = ()
    notes: tuple[Finding, ...] = ()
    skipped: tuple[dict[str, str], ...] = ()
    run: dict[str, Any] = field(default_factory=dict)  # the run folder's manifest, when there is one
    jobs: tuple[Job, ...] = ()  # how to load each rank again, in parts' order
    frames: tuple[RankResult, ...] | None = field(default=None, repr=False, compare=False)
    claims: tuple[tuple[Claimed, ...], ...] = field(default=(), repr=False, compare=False)
    replay_step_time_ms: float | None = None
    projection: dict[str, Any] = field(default_factory=dict)
    plans: tuple[Plan | None, ...] | None = field(default=None, repr=False, compare=False)
    job_cost_us: float | None = None  # the job's profiler cost per host event, where its replay found it
    keep_traces: bool = False  # the frames were kept on request (a single trace, or keep_traces=True)
    notices: tuple[str, ...] = ()  # what the analysis itself warns of (an impossible step time, ...)
    folder: str | None = None  # the run folder analysed, when it was one
    #: DataLoader waits of the unprofiled steps that the profiled ones missed, priced apart (the
    #: parts' ``unprofiled_step_ms`` is then the step without them: gpuprof.steptime.InputWaits)
    input_waits: InputWaits | None = None

    @property
    def nvml(self) -> pd.DataFrame:
        """NVML samples of each rank's GPU over the run, ``in_window`` marking the profiled steps."""
        parts = [p.nvml for p in self.parts if p.nvml is not None]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    @property
    def nvml_summary(self) -> list[dict[str, Any]]:
        from gpuprof.nvml_data import summarize as nvml_summarize

        return [{"rank": p.rank, "gpu": int(p.nvml["gpu"].iloc[0]) if len(p.nvml) else None,
                 **nvml_summarize(p.nvml, p.nvml_period_s)} for p in self.parts if p.nvml is not None]

    @property
    def steps(self) -> pd.DataFrame:
        """Per rank and step: window on the GPU timeline and time by class (µs)."""
        parts = []
        for p in self.parts:
            s = p.steps.merge(p.summary.steps, on="step", how="left")
            parts.append(s.assign(rank=p.rank))
        return pd.concat(parts, ignore_index=True)

    @cached_property
    def kernel_table(self) -> pd.DataFrame:
        """One row per kernel name as the trace spells it, heaviest first, over the profiled steps."""
        return kernel_table([p.kernels for p in self.parts])

    @cached_property
    def summary(self) -> dict[str, Any]:
        """Step time, GPU busy %, breakdown and MFU, averaged over ranks (per-rank in ``per_rank``)."""
        s = [p.summary for p in self.parts]
        mfus = [x.mfu_pct for x in s if x.mfu_pct is not None]
        keys = (*CLASSES, "idle")
        unprofiled = self.input_waits.unprofiled_ms if self.input_waits is not None else self.parts[0].unprofiled_step_ms
        out: dict[str, Any] = {
            "steps": int(max(len(p.steps) for p in self.parts)),
            "step_time_ms": float(np.mean([x.step_time_ms for x in s])),
            "replay_step_time_ms": self.replay_step_time_ms,
            **self.projection,
            "gpu_busy_pct": float(np.mean([x.gpu_busy_pct for x in s])),
            "mfu_pct": float(np.mean(mfus)) if mfus else None,
            "breakdown_pct": {k: float(np.mean([x.breakdown_pct[k] for x in s])) for k in keys},
            "steps_source": self.parts[0].meta.steps_source,
            "model_flops_per_step": float(np.mean([x.model_flops_per_step for x in s])),
            "mfu_basis": s[0].mfu_basis,
            "cost_model_coverage_pct": float(np.mean([x.coverage_pct for x in s])),
            "unprofiled_step_time_ms": unprofiled,
            "mfu_unprofiled_pct": (float(np.mean(mfus)) * float(np.mean([x.step_time_ms for x in s])) / unprofiled
                                   if mfus and unprofiled else None),
            "gpu_kernel_time_ms": float(np.mean([100.0 - x.breakdown_pct["idle"] for x in s]) / 100.0
                                        * np.mean([x.step_time_ms for x in s])),
        }
        w = self.input_waits
        if w is not None:
            out["input_wait"] = {"loader_wait_ms_per_step": w.wait_ms, "traced_loader_ms_per_step": w.traced_ms,
                                 "typical_step_time_ms": w.typical_ms, "host_free_step_ms": w.floor_ms,
                                 **({"rank": w.rank} if w.rank is not None else {})}
        if len(s) > 1:
            out["per_rank"] = [{"rank": p.rank, "step_time_ms": p.summary.step_time_ms,
                                "gpu_busy_pct": p.summary.gpu_busy_pct,
                                "communication_pct": p.summary.breakdown_pct["communication"]} for p in self.parts]
        return out

    @property
    def warnings(self) -> list[str]:
        seen: list[str] = []
        for p in self.parts:
            for w in p.meta.warnings:
                if w not in seen:
                    seen.append(w)
        if self.run.get("rebuilt"):
            seen.append("the run folder has no manifest.json (the recorder was stopped before it finished): "
                        "traces and rank records were read from traces/")
        if self.run.get("redacted"):
            seen.append(f"{self.run['redacted']} value(s) in the run's command line and records looked like secrets "
                        f"(tokens, keys, passwords) and are shown as <redacted>")
        if self.spec is None:
            seen.append("unknown GPU: no roofline (pass --gpu NAME or --gpu-spec FILE); kernels are 'unknown'")
        t = self.kernel_table
        bad = t[t["cost_model_error"].astype(bool)] if "cost_model_error" in t else t.iloc[:0]
        if len(bad):
            from gpuprof.roofline import MODEL_ERROR_PCT

            n = int(bad["cost_model_error_count"].sum())
            seen.append(f"cost-model error: {n} instance{'s' if n != 1 else ''} of {len(bad)} kernel "
                        f"name{'s' if len(bad) != 1 else ''} each ran above its roofline (> {MODEL_ERROR_PCT:.0f} %), "
                        "which no kernel can: the FLOP/byte model or the GPU peaks do not hold for them (e.g. data "
                        "already in L2). They are flagged in the kernel table, counted as 'unknown' time and left "
                        "out of MFU")
        seen.extend(self.notices)
        return seen
