"""The analyzer registry: every analyzer gpuprof runs, listed explicitly, in one place.

An analyzer is a pure function ``(view) -> list[Candidate]`` that reads one rank's view
(:class:`gpuprof.rank.RankView`: its trace model, roofline frames and idle gaps) and never
mutates it; it describes each defect it finds and the units its fix would remove
(:class:`gpuprof.claims.Candidate`), and :mod:`gpuprof.pricing` estimates what that saves. The
cross-rank analyzers work from every rank's small collective table
(:mod:`gpuprof.analyzers.distributed`). Each declares what it needs (GPU events, shapes, several
ranks, NVML samples); when a trace lacks it, the analyzer is skipped and the report says why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuprof.analyzers import (
    allocator,
    attention_fusion,
    compile_fusion,
    distributed,
    elementwise_fusion,
    host_gaps,
    inference,
    memory_format,
    nvml,
    optimizer_fusion,
    precision,
    shape_alignment,
    transfers,
)
from gpuprof.claims import Candidate


if TYPE_CHECKING:
    from gpuprof.parts import RankPart
    from gpuprof.rank import RankView
    from gpuprof.specs import GpuSpec


@dataclass(frozen=True)
class Analyzer:
    name: str
    run: Callable[[RankView], list[Candidate]] | None  # None: a cross-rank analyzer (distributed.plan)
    needs: tuple[str, ...] = ()  # "gpu", "cpu", "runtime", "shapes", "multi_rank", "spec", "nvml"


#: Every analyzer, in the order they run. Add new ones here. The per-rank ones see one rank at a
#: time; the cross-rank ones are planned from every rank's collectives (analyzers.distributed).
REGISTRY: tuple[Analyzer, ...] = (
    Analyzer("precision", precision.run, ("gpu", "shapes", "spec")),
    Analyzer("shape_alignment", shape_alignment.run, ("gpu", "shapes", "spec")),
    Analyzer("memory_format", memory_format.run, ("gpu", "shapes", "spec")),
    Analyzer("attention_fusion", attention_fusion.run, ("gpu", "shapes", "spec")),
    Analyzer("elementwise_fusion", elementwise_fusion.run, ("gpu", "shapes", "spec")),
    Analyzer("compile", compile_fusion.run, ("gpu", "shapes", "spec")),
    Analyzer("optimizer_fusion", optimizer_fusion.run, ("gpu", "shapes", "spec")),
    Analyzer("kv_cache", inference.kv_cache, ("gpu", "cpu", "shapes", "spec")),
    Analyzer("batching", inference.batching, ("gpu", "cpu", "shapes", "spec")),
    Analyzer("input_pipeline", host_gaps.input_pipeline, ("gpu", "cpu")),
    Analyzer("host_work", host_gaps.host_work, ("gpu", "cpu")),
    Analyzer("host_stall", host_gaps.host_stall, ("gpu", "cpu")),
    Analyzer("allocator_churn", allocator.run, ("gpu", "runtime")),
    Analyzer("host_sync", host_gaps.host_sync, ("gpu", "runtime")),
    Analyzer("launch_overhead", host_gaps.launch_overhead, ("gpu", "runtime")),
    Analyzer("pageable_memcpy", transfers.pageable_memcpy, ("gpu",)),
    Analyzer("memory_bound_decode", transfers.memory_bound_decode, ("gpu", "shapes", "spec")),
    Analyzer("exposed_communication", None, ("gpu",)),
    Analyzer("rank_imbalance", None, ("gpu", "multi_rank")),
    Analyzer("gpu_throttling", nvml.gpu_throttling, ("gpu", "nvml")),
    Analyzer("memory_capacity", nvml.memory_capacity, ("nvml",)),
)


def _unmet(parts: Sequence[RankPart], spec: GpuSpec | None, needs: tuple[str, ...]) -> str | None:
    if "gpu" in needs and not any(p.has_gpu for p in parts):
        return "the trace has no GPU events"
    if "cpu" in needs and not any(p.meta.cpu_events for p in parts):
        return "the trace has no CPU ops (a GPU-only trace: profile with activities=[CPU, CUDA])"
    if "runtime" in needs and not any(p.meta.runtime_calls for p in parts):
        return "the trace has no CUDA/HIP runtime calls, so no launch or sync times"
    if "shapes" in needs and not any(p.meta.record_shapes for p in parts):
        return "the trace has no input shapes (record_shapes=False)"
    if "multi_rank" in needs and len(parts) < 2:
        return "needs traces of two or more ranks"
    if "nvml" in needs and not any(p.nvml is not None and len(p.nvml) for p in parts):
        return "no NVML samples (record the run with `gpuprof record` on a GPU machine)"
    if "spec" in needs and spec is None:
        return "the GPU is unknown (pass --gpu NAME or --gpu-spec FILE)"
    return None


def select(parts: Sequence[RankPart], spec: GpuSpec | None, only: Sequence[str] | None = None,
           registry: Sequence[Analyzer] | None = None) -> tuple[list[Analyzer], list[dict[str, str]]]:
    """The analyzers to run on this job (those named in ``only``, whose needs the traces meet)
    and, for the others that were asked for, why they were skipped."""
    active, skipped = [], []
    for a in (REGISTRY if registry is None else registry):
        if only is not None and a.name not in only:
            continue
        why = _unmet(parts, spec, a.needs)
        if why:
            skipped.append({"analyzer": a.name, "reason": why})
        else:
            active.append(a)
    return active, skipped
