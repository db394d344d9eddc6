"""The unprofiled step time: the program's step measured without the profiler, which takes host
time under the profiler back to the program's own (:mod:`gpuprof.hostcost`). One name everywhere:
``unprofiled_step_ms``. It comes from ``--step-ms`` (the user's, from training logs) or from a
run folder's manifest (``gpuprof record`` times steps outside the profiled window), and is
settled here (:func:`settle`) and checked once against the trace (:func:`check`): no step can be
shorter than the GPU's own work in it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gpuprof.errors import UsageError
from gpuprof.parts import RankPart

#: How far below the traced GPU work per step an unprofiled step time may be before it is
#: impossible: kernel times under the profiler run a little long (a CUDA graph replay of 0.42 ms of
#: kernels per traced step ran in 0.41 ms per step without the profiler).
WORK_TOLERANCE = 0.05

#: An unprofiled step this many times the traced one is worth a warning: the profiler only makes
#: steps longer, and unprofiled timings of one program spread by up to a fifth run to run.
FAR_ABOVE_TRACED = 1.5


def settle(step_ms: float | None, manifest: dict[str, Any]) -> float | None:
    """The unprofiled step time the analysis uses: ``step_ms`` (``--step-ms``: a
    :class:`UsageError` unless a finite positive number), else the run folder's recorded
    ``unprofiled_step_ms`` (ignored unless a finite positive number), else None."""
    if step_ms is not None and not (math.isfinite(step_ms) and step_ms > 0):
        raise UsageError(f"--step-ms must be a finite positive number of milliseconds, got {step_ms:g}")
    if step_ms is not None:
        return step_ms
    recorded = manifest.get("unprofiled_step_ms")
    if isinstance(recorded, bool) or not (isinstance(recorded, (int, float)) and math.isfinite(recorded)
                                          and recorded > 0):
        return None
    return float(recorded)


def impossible(parts: Sequence[RankPart], unprofiled_step_ms: float | None) -> bool:
    """Whether an unprofiled step time is below the GPU's own work per step on some rank."""
    if unprofiled_step_ms is None or any(p.meta.steps_source == "whole trace" for p in parts):
        return False
    return unprofiled_step_ms < max(work_ms_per_step(p) for p in parts) * (1.0 - WORK_TOLERANCE)


def without_unprofiled_step(part: RankPart) -> RankPart:
    """``part`` as computed without an unprofiled step time (its profiler cost per event needs one)."""
    return replace(part, unprofiled_step_ms=None, event_cost_us=0.0)


def work_ms_per_step(part: RankPart) -> float:
    """The GPU's own work per step on one rank: time it ran kernels or copies other than
    communication. A real step cannot be shorter; exposed communication can (an NCCL kernel spins
    while it waits for a peer, longer under the profiler), so it is not counted."""
    b = part.summary.breakdown_pct
    return part.summary.step_time_ms * (100.0 - b["idle"] - b["communication"]) / 100.0


def check(parts: Sequence[RankPart], unprofiled_step_ms: float | None, given: bool) -> tuple[str, ...]:
    """The unprofiled step time against the trace: below the GPU's busy time per step (less
    ``WORK_TOLERANCE``) it is a :class:`UsageError` when the user ``given`` it, else a notice (the
    run folder's figure, which the analysis then did not use); far above the traced step
    (``FAR_ABOVE_TRACED``) a notice. Nothing to compare without step markers (the trace's one
    "step" is not the program's)."""
    if unprofiled_step_ms is None or any(p.meta.steps_source == "whole trace" for p in parts):
        return ()
    busy = max(work_ms_per_step(p) for p in parts)
    traced = max(p.summary.step_time_ms for p in parts)
    if impossible(parts, unprofiled_step_ms):
        if given:
            raise UsageError(f"--step-ms {unprofiled_step_ms:g} is below the GPU's busy time per step in the trace "
                             f"({busy:.2f} ms, communication aside): no step can be shorter than its kernels; "
                             "give the step time measured without the profiler")
        return (f"the run's recorded unprofiled step time ({unprofiled_step_ms:.2f} ms) is below the GPU's "
                f"busy time per step in the trace ({busy:.2f} ms, communication aside), so it "
                "cannot be right and is not used (pass --step-ms with the real step time)",)
    if unprofiled_step_ms > FAR_ABOVE_TRACED * traced:
        what = "--step-ms" if given else "the run's recorded unprofiled step time"
        return (f"{what} ({unprofiled_step_ms:.2f} ms) is {unprofiled_step_ms / traced:.1f}x the traced step "
                f"({traced:.2f} ms); the profiler only adds time, so it is likely of another "
                "program or setting, or counts more than one step",)
    return ()
