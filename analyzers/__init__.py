"""The analyzer registry: every analyzer gpuprof runs, listed explicitly, in one place.

An analyzer is a pure function ``(analysis) -> list[Finding]`` that reads the trace model and
roofline frames and never mutates them. Each declares what it needs (GPU events, shapes, several
ranks, NVML samples); when a trace lacks it, the analyzer is skipped and the report says why.
Findings are ranked by estimated saving, best first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuprof.analyzers import (
    attention_fusion,
    distributed,
    elementwise_fusion,
    host_gaps,
    nvml,
    optimizer_fusion,
    precision,
    shape_alignment,
    transfers,
)
from gpuprof.analyzers._base import Candidate, finalize, release_views

from gpuprof.findings import Finding

if TYPE_CHECKING:
    from gpuprof.api import Analysis


@dataclass(frozen=True)
class Analyzer:
    name: str
    run: Callable[[Analysis], list[Candidate]]
    needs: tuple[str, ...] = ()  # "gpu", "shapes", "multi_rank", "spec"


#: Every analyzer, in the order they run. Add new ones here.
REGISTRY: tuple[Analyzer, ...] = (
    Analyzer("precision", precision.run, ("gpu", "shapes", "spec")),
    Analyzer("shape_alignment", shape_alignment.run, ("gpu", "shapes", "spec")),
    Analyzer("attention_fusion", attention_fusion.run, ("gpu", "shapes", "spec")),
    Analyzer("elementwise_fusion", elementwise_fusion.run, ("gpu", "shapes", "spec")),
    Analyzer("optimizer_fusion", optimizer_fusion.run, ("gpu", "shapes", "spec")),
    Analyzer("input_pipeline", host_gaps.input_pipeline, ("gpu",)),
    Analyzer("host_sync", host_gaps.host_sync, ("gpu",)),
    Analyzer("launch_overhead", host_gaps.launch_overhead, ("gpu",)),
    Analyzer("pageable_memcpy", transfers.pageable_memcpy, ("gpu",)),
    Analyzer("memory_bound_decode", transfers.memory_bound_decode, ("gpu", "shapes", "spec")),
    Analyzer("exposed_communication", distributed.exposed_communication, ("gpu",)),
    Analyzer("rank_imbalance", distributed.rank_imbalance, ("gpu", "multi_rank")),
    Analyzer("gpu_throttling", nvml.gpu_throttling, ("gpu", "nvml")),
    Analyzer("memory_capacity", nvml.memory_capacity, ("nvml",)),
)


def _unmet(analysis: Analysis, needs: tuple[str, ...]) -> str | None:
    ranks = analysis.ranks
    if "gpu" in needs and not any(r.trace.has_gpu for r in ranks):
        return "the trace has no GPU events"
    if "shapes" in needs and not any(r.trace.meta.record_shapes for r in ranks):
        return "the trace has no input shapes (record_shapes=False)"
    if "multi_rank" in needs and len(ranks) < 2:
        return "needs traces of two or more ranks"
    if "nvml" in needs and not any(r.nvml is not None and len(r.nvml) for r in ranks):
        return "no NVML samples (record the run with `gpuprof record` on a GPU machine)"
    if "spec" in needs and analysis.spec is None:
        return "the GPU is unknown (pass --gpu NAME or --gpu-spec FILE)"
    return None


#: Ranking weight of a low-confidence saving: host time measured under the profiler, which ran
#: the host 1.5-2.2x slower on the real traces of docs/accuracy.md. Only the order uses it; the
#: reported saving is the estimate itself.
LOW_CONFIDENCE_WEIGHT = 0.5


def rank_findings(findings: Sequence[Finding]) -> list[Finding]:
    """Best first: by estimated saving, low-confidence ones weighed at ``LOW_CONFIDENCE_WEIGHT``,
    so a bare trace's profiler-inflated host time does not outrank a defect of similar size we
    can stand behind; then by id for a stable order."""
    def key(f: Finding) -> tuple[float, str]:
        w = LOW_CONFIDENCE_WEIGHT if f.confidence == "low" else 1.0
        return (-f.estimated_savings_ms * w, f.id)

    return sorted(findings, key=key)


def run_analyzers(analysis: Analysis, only: Sequence[str] | None = None,
                  registry: Sequence[Analyzer] | None = None) -> tuple[list[Finding], list[dict[str, str]]]:
    """Run the registered analyzers (or those named in ``only``); return ranked findings and skips."""
    candidates: list[Candidate] = []
    skipped: list[dict[str, str]] = []
    for a in (REGISTRY if registry is None else registry):
        if only is not None and a.name not in only:
            continue
        why = _unmet(analysis, a.needs)
        if why:
            skipped.append({"analyzer": a.name, "reason": why})
            continue
        candidates.extend(a.run(analysis))
    try:
        return rank_findings(finalize(analysis, candidates)), skipped
    finally:
        release_views(analysis)
