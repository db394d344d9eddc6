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
from dataclasses import dataclass, replace
from typing import Any

from gpuprof.errors import UsageError
from gpuprof.findings import Finding
from gpuprof.parts import RankPart
from gpuprof.runfolder import manifest_number

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
    recorded = _ms(manifest.get("unprofiled_step_ms"))
    return recorded if recorded else None


def impossible(parts: Sequence[RankPart], unprofiled_step_ms: float | None) -> bool:
    """Whether an unprofiled step time is below the GPU's own work per step on some rank."""
    if unprofiled_step_ms is None or any(p.meta.steps_source == "whole trace" for p in parts):
        return False
    return unprofiled_step_ms < max(work_ms_per_step(p) for p in parts) * (1.0 - WORK_TOLERANCE)


def with_unprofiled_step(part: RankPart, step_ms: float) -> RankPart:
    """``part`` as computed with ``step_ms`` as its unprofiled step (its profiler cost per event
    follows it: gpuprof.hostcost.event_cost_us)."""
    step_us = float(part.summary.steps["time_us"].mean()) if len(part.summary.steps) else 0.0
    per = part.host_events_per_step
    cost = max(0.0, step_us - step_ms * 1000.0) / per if per else 0.0
    return replace(part, unprofiled_step_ms=step_ms, event_cost_us=cost)


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


def unsettled(manifest: dict[str, Any]) -> tuple[str, ...]:
    """A notice where the run folder's unprofiled step time comes from a timing that did not
    settle (``ranks[].unprofiled_timing.converged`` false: the recorder's budget ran out, or the
    program's own profiler began, before the standard error of the steps' mean came within its
    bound): on a machine or a loop whose step wanders by 15-35 % from chunk to chunk, the figure
    every estimate is priced on is that uncertain, and a run of the same program may read several
    % apart (sample_traces/README.md, "Programs as users run them"). The rank whose figure is
    least certain is named; nothing where every timed rank converged or none says."""
    listed = manifest.get("ranks")
    ranks: list[Any] = listed if isinstance(listed, list) else []
    worst: tuple[float, str] | None = None
    for r in ranks:
        t = r.get("unprofiled_timing") if isinstance(r, dict) else None
        if not isinstance(t, dict) or t.get("converged") is not False:
            continue
        mean = _ms(r.get("unprofiled_step_ms")) or _ms(manifest.get("unprofiled_step_ms"))
        if not mean:
            continue
        sem, spread, steps = _ms(t.get("sem_ms")), _ms(t.get("spread_pct")), _count(t.get("steps"))
        bound = _ms(t.get("sem_pct"))
        pct = 100.0 * sem / mean if sem is not None else math.inf
        why = t.get("not_converged_why")
        who = f" on rank {r['rank']}" if isinstance(r.get("rank"), int) and len(ranks) > 1 else ""
        text = (f"the run's unprofiled step time{who} ({mean:.2f} ms) comes from a timing that did not settle"
                + (f" ({why[:160]})" if isinstance(why, str) and why else "") + ": "
                + (f"its {steps} timed steps' chunks spread {spread:.0f} %" if steps and spread is not None
                   else "its chunks' spread is not recorded")
                + (f" and their mean's standard error is {pct:.1f} % of it" if math.isfinite(pct) else "")
                + (f" (the recorder asks {bound:g} %)" if bound else "")
                + "; every estimate is priced on it and carries that uncertainty (another run of the program "
                  "may read several % apart: record again with --timed-steps N over more steps, or pass --step-ms "
                  "from the program's own logs)")
        if worst is None or pct > worst[0]:
            worst = (pct, text)
    return (worst[1],) if worst is not None else ()


# --- input waits the profiled steps missed ---------------------------------------------------

#: The finding for DataLoader waits of the unprofiled steps that the profiled ones did not catch.
INPUT_WAIT_ID = "GP-INPUT-003"


@dataclass(frozen=True)
class InputWaits:
    """DataLoader waits of the program's unprofiled steps that its profiled steps did not catch.

    A loop whose DataLoader workers produce batches more slowly than it consumes them waits on a
    few steps in every cycle of its workers, for long (a Lightning ResNet-18 with 4 workers on the
    H200: 16 % of its steps waited 25-60 ms, its mean step 23.1 ms against a median of 18.3): the
    recorder's unprofiled mean holds those waits, and two profiled steps may hold none. Every fix
    is priced on the trace's replay, calibrated to the unprofiled step; calibrated to a mean that
    holds waits the trace does not show, the replay's host comes out slower than the program's and
    GPU-side fixes are priced on a critical path that is not there (docs/accuracy.md, round 4). So
    the analysis prices on the step the profiled steps stand for, ``typical_ms``: the unprofiled
    step less the waits per step beyond what the trace shows (``wait_ms - traced_ms``), never below
    the least step the GPU's work allows (``floor_ms``: the trace replayed without host time); and
    the waits are a finding of their own (``GP-INPUT-003``), saving ``unprofiled_ms - typical_ms``.
    """

    unprofiled_ms: float  # the program's mean step without the profiler (the run's figure)
    wait_ms: float  # per step, the loop's time inside DataLoader ``__next__`` over the same steps
    traced_ms: float  # per profiled step, inside DataLoader spans of the trace (mean over ranks)
    floor_ms: float  # the least step the traced GPU work allows (host-free replay; several ranks: of the job)
    typical_ms: float  # the step the analysis prices every other fix on
    #: Several ranks, each with its own recorded waits: the rank whose waits the trace missed most,
    #: whose ``wait_ms`` and ``traced_ms`` these are (one rank's stall holds every rank up at the
    #: next collective); None for one rank, or a figure for the whole job (``--input-wait-ms``)
    rank: int | None = None

    @property
    def saving_ms(self) -> float:
        return self.unprofiled_ms - self.typical_ms


def recorded_input_wait(step_ms: float | None, manifest: dict[str, Any], given: float | None = None) -> float | None:
    """The DataLoader waits per unprofiled step the analysis uses: ``given`` (``--input-wait-ms``,
    measured by the user over the same steps as the step time: a :class:`UsageError` unless a
    finite number ≥ 0), else the run folder's ``unprofiled_input_wait_ms`` (ignored unless a finite
    number ≥ 0), else None. The run's figure is not used where the user gave ``--step-ms``: it was
    measured over the recorder's steps, not over whatever the user timed."""
    if given is not None:
        if not (math.isfinite(given) and given >= 0):
            raise UsageError(f"--input-wait-ms must be a finite number of milliseconds >= 0, got {given:g}")
        return float(given)
    if step_ms is not None:
        return None
    return _ms(manifest.get("unprofiled_input_wait_ms"))


def _ms(v: Any) -> float | None:
    """A manifest's figure in ms: a number (:func:`gpuprof.runfolder.manifest_number`) >= 0, else None."""
    f = manifest_number(v)
    return f if f is not None and f >= 0 else None


def _count(v: Any) -> int | None:
    """A manifest's count as an int >= 1, else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else None


#: Waits worth a finding: this share of the unprofiled step (claims.NEGLIGIBLE_PCT's, as a fraction).
WAIT_MIN_SHARE = 0.001


def recorded_step_sem(manifest: dict[str, Any]) -> float:
    """How well the run's unprofiled step is known: the mean over ranks of its timing window's
    standard error (``unprofiled_timing.sem_ms``, ms; 0 where none is recorded). Waits that the
    profiled steps missed by less than this are not told apart from the step's own noise."""
    sems = []
    ranks = manifest.get("ranks")
    for r in ranks if isinstance(ranks, list) else []:
        t = r.get("unprofiled_timing") if isinstance(r, dict) else None
        v = _ms(t.get("sem_ms")) if isinstance(t, dict) else None
        if v is not None:
            sems.append(v)
    return sum(sems) / len(sems) if sems else 0.0


def traced_loader_ms(parts: Sequence[RankPart]) -> float:
    """The profiled steps' time inside DataLoader spans per step, mean over ranks (ms)."""
    return sum(p.loader_us_per_step for p in parts) / len(parts) / 1000.0 if parts else 0.0


def recorded_waits_by_rank(manifest: dict[str, Any]) -> dict[int, float]:
    """Each rank's DataLoader waits per unprofiled step, by rank (``ranks[].rank`` and
    ``ranks[].unprofiled_timing.loader_wait_ms``); empty unless every rank that was timed recorded
    one under a rank number of its own (the job's mean is used then)."""
    ranks = manifest.get("ranks")
    out: dict[int, float] = {}
    for r in ranks if isinstance(ranks, list) else []:
        if not isinstance(r, dict) or not isinstance(r.get("unprofiled_timing"), dict):
            continue
        n, w = r.get("rank"), _ms(r["unprofiled_timing"].get("loader_wait_ms"))
        if not isinstance(n, int) or isinstance(n, bool) or w is None or n in out:
            return {}
        out[n] = w
    return out


def waits_beyond(parts: Sequence[RankPart], wait_ms: float,
                 by_rank: dict[int, float] | None = None) -> tuple[float, float, int | None]:
    """The recorded waits per step the profiled steps did not show: ``(waits, traced, rank)``.
    One rank, or no figure of each rank's (``by_rank``, :func:`recorded_waits_by_rank`, for the
    ranks of ``parts`` exactly): the job's ``wait_ms`` against the traced loader time, mean over
    ranks, and rank None. Several ranks each with its own: the rank whose waits the trace missed
    most, with its own figures. Ranks that step together wait for the slowest at the next
    collective, so a stall on one rank is a stall of the job: the mean over ranks would spread it
    thin (one of 8 ranks waiting 8 ms a step is the job waiting 8 ms, not 1)."""
    if len(parts) > 1 and by_rank and set(by_rank) == {p.rank for p in parts}:
        extra = {p.rank: (by_rank[p.rank], p.loader_us_per_step / 1000.0) for p in parts}
        worst = max(sorted(extra), key=lambda r: extra[r][0] - extra[r][1])
        return extra[worst][0], extra[worst][1], worst
    return wait_ms, traced_loader_ms(parts), None


def input_waits(parts: Sequence[RankPart], unprofiled_ms: float | None, wait_ms: float | None,
                floors_ms: Sequence[float | None], noise_ms: float = 0.0,
                by_rank: dict[int, float] | None = None) -> InputWaits | None:
    """The waits the profiled steps missed (:class:`InputWaits`; several ranks: on the rank that
    missed most, :func:`waits_beyond`), or None: no recorded wait, no unprofiled step, no graph to
    bound them by (``floors_ms``: each rank's host-free replayed step, None where it has none), or
    no more waiting than the trace shows by more than the step's own noise (``noise_ms``:
    :func:`recorded_step_sem`; a 2-worker loader that keeps up waits 0.1 ms a step in both) and
    ``WAIT_MIN_SHARE`` of the step."""
    if unprofiled_ms is None or wait_ms is None or not parts:
        return None
    wait_ms, traced, rank = waits_beyond(parts, wait_ms, by_rank)
    if wait_ms > unprofiled_ms:  # more waiting than the step lasts: not a figure of these steps
        return None
    extra = wait_ms - traced
    known = [f for f in floors_ms if f is not None and math.isfinite(f) and f >= 0]
    if extra <= max(noise_ms, 0.0) or len(known) < len(floors_ms) or not known:
        return None
    floor = max(known)
    typical = max(unprofiled_ms - extra, floor)
    if unprofiled_ms - typical < WAIT_MIN_SHARE * unprofiled_ms:
        return None
    return InputWaits(unprofiled_ms, wait_ms, traced, floor, typical, rank)


def input_wait_finding(w: InputWaits, manifest: dict[str, Any]) -> Finding:
    """The finding for :class:`InputWaits`: the waits themselves, from the run's own clock."""
    ranks = manifest.get("ranks")
    timed: list[dict[str, Any]] = [
        t for t in (r.get("unprofiled_timing") for r in (ranks if isinstance(ranks, list) else [])
                    if isinstance(r, dict) and (w.rank is None or r.get("rank") == w.rank))
        if isinstance(t, dict) and _ms(t.get("loader_wait_ms")) is not None]
    workers = sorted({n for n in (_count(t.get("loader_workers")) for t in timed) if n is not None})
    steps = _count(timed[0].get("steps")) if timed else None  # None: the user's own figures
    listed = timed[0].get("chunks") if timed else None
    chunks = [{"steps": c.get("steps"), "ms": _ms(c.get("ms")), "loader_wait_ms": _ms(c.get("loader_wait_ms"))}
              for c in (listed if isinstance(listed, list) else []) if isinstance(c, dict)]
    ev: dict[str, Any] = {
        "unprofiled_step_ms": round(w.unprofiled_ms, 4),
        "loader_wait_ms_per_step_unprofiled": round(w.wait_ms, 4),
        "loader_ms_per_step_traced": round(w.traced_ms, 4),
        "typical_step_ms": round(w.typical_ms, 4),
        "host_free_step_ms": round(w.floor_ms, 4),
        **({"rank": w.rank, "ranks": "the rank whose waits the profiled steps missed most: ranks that step "
                                     "together wait for it at the next collective"} if w.rank is not None else {}),
        "timed_steps": steps,
        "loader_workers": workers[0] if len(workers) == 1 else (workers or None),
        "chunks": chunks,
        "estimate": ("the unprofiled steps' time inside DataLoader __next__ beyond what the profiled steps spent "
                     "there, per step, down to no less than the trace's GPU work allows (its replay without host "
                     "time); every other fix is priced on the step without these waits"),
    }
    pct = 100.0 * w.saving_ms / w.unprofiled_ms
    # the loop takes a batch every typical_ms; its loader gives one every unprofiled_ms (it sets the
    # pace while the loop waits): that much more throughput keeps up
    factor = w.unprofiled_ms / w.typical_ms
    ev["loader_throughput_needed_x"] = round(factor, 2)
    n = ev["loader_workers"]
    if isinstance(n, int):
        ev["workers_worth_needed"] = math.ceil(n * factor - 1e-9)
        pace = (f"The loop takes a batch every {w.typical_ms:.1f} ms and its {n} workers make one every "
                f"{w.unprofiled_ms:.1f} ms: about {ev['workers_worth_needed']} workers' worth of throughput "
                f"({factor:.1f}x) keeps up. ")
    else:
        pace = (f"The loop takes a batch every {w.typical_ms:.1f} ms and gets one every {w.unprofiled_ms:.1f} ms: "
                f"{factor:.1f}x the loader's throughput keeps up. ")
    return Finding(
        id=INPUT_WAIT_ID, category="input_pipeline",
        title=(f"The training loop waits for its DataLoader"
               + (f" on rank {w.rank}" if w.rank is not None else "") + f": {w.wait_ms:.1f} ms per step "
               + (f"over {steps} steps timed without the profiler" if steps else "without the profiler")
               + f", where the profiled steps waited {w.traced_ms:.1f} ms"),
        estimated_savings_ms=w.saving_ms, estimated_savings_pct=pct, confidence="medium",
        recommendation=("Fix this first: while the loader sets the pace no other fix shortens the step (the "
                        "savings of the findings below are priced on the step without these waits). "
                        + pace + "Make batches faster: cheaper per-sample work (decode and augment once offline, or "
                        "on the GPU: torchvision.transforms.v2 on tensors, DALI), fewer, larger reads (a sharded "
                        "format instead of one file per sample), and more DataLoader workers (`num_workers`, "
                        "`persistent_workers=True`, `prefetch_factor` 2-4) as far as the CPU cores allow: workers "
                        "also take CPU from the training process's own host work. The saving is the waits' whole "
                        "share, what a loader that keeps up gives; a faster loader that still falls behind gives "
                        "part of it. The waits are intermittent (the workers fall behind and the loop catches up "
                        "every cycle), so a profiled step may show none."),
        evidence=ev)
