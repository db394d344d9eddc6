"""The pipeline: one path from trace files to the :class:`~gpuprof.analysis.Result`, however
many ranks and wherever they are worked on.

Each rank is a job (:mod:`gpuprof.jobs`) run on an executor (:mod:`gpuprof.executors`: this
process, local worker processes, or a Dask cluster). First every rank is summarised
(:func:`gpuprof.jobs.part_job`); the driver then checks that the traces belong together, settles
the GPU and the unprofiled step time, plans the cross-rank findings from the parts
(``analyzers.distributed``) and prices them on the job's replay (:func:`gpuprof.pricing.price_cross`);
then each rank is analysed (:func:`gpuprof.jobs.rank_job`) and its contributions merged into the
ranked findings. The in-memory case (one trace, a small job, ``keep_traces``) is the same path on
an executor in this process that keeps the frames (its ``store``): each rank loaded once.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpuprof import pricing
from gpuprof.analysis import Result
from gpuprof.claims import merge, rank_findings, split_notes
from gpuprof.errors import UsageError
from gpuprof.executors import IN_PROCESS_MAX_BYTES, Executor, in_process, job_bytes, local_workers
from gpuprof.findings import Finding
from gpuprof.jobs import (Job, RankOutcome, graph_job, host_free_job, job_key, kept_ranks, load_rank, part_job,
                          rank_job, slow_job)
from gpuprof.parts import RankPart
from gpuprof.rank import RankView
from gpuprof.runfolder import list_traces, rank_samples, run_nvml
from gpuprof.specs import resolve
from gpuprof.steptime import (INPUT_WAIT_ID, InputWaits, impossible, input_wait_finding, input_waits,
                              recorded_waits_by_rank, waits_beyond, with_unprofiled_step, without_unprofiled_step)
from gpuprof.trace.model import TraceMeta


def run(seq: list[str | Path], unprofiled_step_ms: float | None, gpu: str | None, gpu_spec: str | None,
        analyzers: Sequence[str] | None, cache: bool, workers: int | None, dask: str | None,
        keep_traces: bool | None, progress: Callable[[int, int, str], None] | None,
        folder: Path | None, manifest: dict[str, Any], as_ranks: bool, drop_impossible: bool = False,
        input_wait_ms: float | None = None, input_wait_noise_ms: float = 0.0, input_wait_given: bool = False
        ) -> Result:
    """Analyse the traces ``seq`` names (see :func:`gpuprof.api.analyze`) with the unprofiled step
    time settled (``unprofiled_step_ms``, or None when unknown; with ``drop_impossible``, None as
    well where the ranks' summaries show it impossible). ``input_wait_ms``: the run's DataLoader
    waits per unprofiled step (:func:`gpuprof.steptime.recorded_input_wait`); waits the profiled
    steps missed are priced apart and the rest on the step without them
    (:class:`gpuprof.steptime.InputWaits`), where they are more than ``input_wait_noise_ms`` (the
    unprofiled step's own standard error); ``input_wait_given``: the user gave the waits (the run's
    window is then not theirs to describe)."""
    files, skipped = list_traces(seq)
    run_folder = str(folder) if folder is not None and len(seq) == 1 else None
    jobs = [Job(str(Path(f).resolve()), i, cache, gpu, gpu_spec, unprofiled_step_ms) for i, f in enumerate(files)]
    keep = len(jobs) == 1 if keep_traces is None else keep_traces
    small = not dask and len(files) > 1 and in_process(job_bytes(files))
    if small and workers is None:
        workers = 1  # worker processes would not pay (see executors.in_process)
    here = keep or (small and local_workers(len(jobs), workers) == 1)  # each rank loaded once, frames kept
    with contextlib.ExitStack() as stack:
        if not here and not cache and not dask:
            # Ranks are loaded again after their summary (findings): without the user's cache, a
            # private one for this call spares the second parse. Dask workers may be elsewhere: not there.
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpuprof-cache-"))
            jobs = [replace(j, cache=True, cache_root=tmp) for j in jobs]
        ex = stack.enter_context(Executor(len(jobs), 1 if here else workers, None if here else dask, progress,
                                          keep=here))
        out = _analyse(ex, jobs, gpu, gpu_spec, analyzers, unprofiled_step_ms, manifest, folder,
                       as_ranks=as_ranks or (len(seq) == 1 and bool(manifest.get("traces"))),
                       drop_impossible=drop_impossible, keep_traces=keep, input_wait_ms=input_wait_ms,
                       input_wait_noise_ms=input_wait_noise_ms, input_wait_given=input_wait_given)
    if not cache:  # loading again later (Analysis.ranks) must not look for the private cache
        out = replace(out, jobs=tuple(replace(j, cache=False, cache_root=None) for j in out.jobs))
    return replace(out, folder=run_folder, notices=(*skipped, *out.notices))


def _analyse(ex: Executor, jobs: list[Job], gpu: str | None, gpu_spec: str | None, analyzers: Sequence[str] | None,
             unprofiled_step_ms: float | None, manifest: dict[str, Any], folder: Path | None, as_ranks: bool,
             drop_impossible: bool, keep_traces: bool, input_wait_ms: float | None = None,
             input_wait_noise_ms: float = 0.0, input_wait_given: bool = False) -> Result:
    from gpuprof.analyzers import distributed, select

    samples, period, gpu_of = run_nvml(folder, manifest)
    firsts = ex.map(part_job, jobs, stage="summarised")
    metas = [p.meta for p, _ in firsts]
    if not as_ranks:
        check_ranks(metas, [p.steps for p, _ in firsts])
    ranks = [m.rank for m in metas]
    if len(set(ranks)) != len(ranks):  # e.g. several single-GPU traces: keep them apart by order
        jobs = [j if i == 0 else replace(j, rank=i) for i, j in enumerate(jobs)]
        metas = [m if i == 0 else replace(m, rank=i) for i, m in enumerate(metas)]
    order = sorted(range(len(jobs)), key=lambda i: metas[i].rank)
    jobs = [jobs[i] for i in order]
    spec = resolve([d for m in metas for d in m.device_properties], gpu=gpu, spec_file=gpu_spec)
    parts = tuple(replace(firsts[i][0], meta=metas[i], collectives=firsts[i][0].collectives.assign(rank=metas[i].rank),
                          nvml=rank_samples(metas[i], firsts[i][0].steps, samples, gpu_of), nvml_period_s=period)
                  for i in order)
    if drop_impossible and impossible(parts, unprofiled_step_ms):
        parts = tuple(without_unprofiled_step(p) for p in parts)
        jobs = [replace(j, unprofiled_step_ms=None) for j in jobs]
        unprofiled_step_ms = None
    waits = None
    rank_graphs: list[Any] | None = None  # each rank's graph, where built before the cross-rank replay
    if input_wait_ms is not None and unprofiled_step_ms is not None:
        by_rank = {} if input_wait_given else recorded_waits_by_rank(manifest)
        wait, traced, _ = waits_beyond(parts, input_wait_ms, by_rank)
        beyond = wait - traced > max(input_wait_noise_ms, 0.0)
        floors: list[float | None] = []  # the graphs only where it may pay
        if beyond and len(jobs) == 1:
            floors = ex.map(host_free_job, jobs, stage="replayed")
        elif beyond:  # ranks wait for each other: the job's least step is its joined graph's
            from gpuprof.replay.job import host_free_ms

            rank_graphs = ex.map(graph_job, jobs, stage="replayed")  # the cross-rank replay's too
            floors = [host_free_ms(rank_graphs)]
        waits = input_waits(parts, unprofiled_step_ms, input_wait_ms, floors, input_wait_noise_ms, by_rank)
    if waits is not None:  # every fix is priced on the step the profiled steps stand for
        unprofiled_step_ms = waits.typical_ms
        parts = tuple(with_unprofiled_step(p, unprofiled_step_ms) for p in parts)
        jobs = [replace(j, unprofiled_step_ms=unprofiled_step_ms) for j in jobs]
    active, skipped = select(parts, spec, analyzers)
    names = [a.name for a in active]
    job_of = {p.rank: j for p, j in zip(parts, jobs)}
    cross = distributed.plan(parts, lambda slow, waits, waiting: ex.call(slow_job, job_of[slow], waits, waiting), names)
    job_cost: list[float | None] = [None]
    # each rank's graph where the job's replay built it in this process, with the job's replayed
    # step on them and the job graph they were joined to: the ranks' plans and the projection
    # share them (no graph built or joined twice)
    built: list[tuple[list[Any], float, Any] | None] = [None]

    def replay(categories: Sequence[str]) -> dict[str, list[float]]:
        figures, job_cost[0], made = job_replay(ex, jobs, unprofiled_step_ms, categories, rank_graphs)
        if made is not None and ex.store is not None and figures:
            built[0] = made[0], next(iter(figures.values()))[0], made[1]
        return figures

    pricing.price_cross(cross, parts, replay)
    alone = len(parts) == 1
    graphs = built[0][0] if built[0] is not None else [None] * len(parts)
    outcomes: list[RankOutcome] = ex.map(rank_job, jobs, parts, [names] * len(parts),
                                         [cross.get(p.rank, []) for p in parts], [alone] * len(parts), graphs,
                                         stage="analysed")
    frames = kept_ranks(ex.store, jobs, parts)  # loaded here and still held: the views read them
    contribs = [c for o in outcomes for c in o.contributions]
    found = findings_of(parts, contribs)
    if waits is not None:
        found = with_input_waits(found, waits, {} if input_wait_given else manifest)
    fixes, notes = split_notes(found)
    plans = tuple(o.plan for o in outcomes) if all(o.plan is not None or not o.claims for o in outcomes) else None
    if alone:
        figures = {"replay_step_time_ms": outcomes[0].replay_ms,
                   **(outcomes[0].figures or pricing.projection(None, fixes))}
    else:
        replayed = [o.replay_ms for o in outcomes]
        ok = [x for x in replayed if x is not None]
        figures = {"replay_step_time_ms": float(np.mean(ok)) if ok and len(ok) == len(replayed) else None,
                   **_job_projection(jobs, parts, outcomes, fixes, frames, keep_traces, job_cost[0],
                                     built[0] if all(p.unprofiled_step_ms == unprofiled_step_ms for p in parts) else None)}
    if waits is not None:  # the projection as the program runs, with its waits
        figures.update(pricing.with_input_waits(figures, waits, fixes))
    return Result(parts=parts, spec=spec, findings=tuple(fixes), notes=tuple(notes), skipped=tuple(skipped),
                  run=manifest, jobs=tuple(jobs), frames=frames, claims=tuple(o.claims for o in outcomes),
                  replay_step_time_ms=figures.pop("replay_step_time_ms"), projection=figures,
                  plans=plans if frames is not None else None, job_cost_us=job_cost[0], keep_traces=keep_traces,
                  input_waits=waits)


def findings_of(parts: Sequence[RankPart], contribs: Sequence[Any]) -> list[Finding]:
    """Ranked findings from the ranks' contributions: a finding's saving per step is the largest
    over ranks, in % of that rank's unprofiled step (else its traced one)."""
    return rank_findings(merge(contribs, {p.rank: p.n_steps for p in parts},
                               {p.rank: p.unprofiled_step_ms or p.summary.step_time_ms for p in parts}))


def with_input_waits(found: Sequence[Finding], waits: InputWaits, manifest: dict[str, Any]) -> list[Finding]:
    """``found`` (priced on the step without the waits) with the waits' own finding first, every
    share in % of the program's real mean step: the loader gives a batch every ``unprofiled_ms``,
    so until it keeps up no other fix shortens the step, and each of them says so in its evidence
    (``priced_after``)."""
    u = waits.unprofiled_ms
    after = {"priced_after": INPUT_WAIT_ID, "while_the_loader_sets_the_pace_ms": 0.0}
    out = [replace(f, estimated_savings_pct=100.0 * f.estimated_savings_ms / u, severity=None,
                   evidence={**f.evidence, **after}) for f in found]
    # first whatever it saves: while the loader sets the pace no other fix shortens the step
    return [input_wait_finding(waits, manifest), *rank_findings(out)]


def _job_projection(jobs: Sequence[Job], parts: Sequence[RankPart], outcomes: Sequence[RankOutcome],
                    findings: Sequence[Finding], frames: Sequence[Any] | None, keep_traces: bool,
                    cost_us: float | None, built: tuple[list[Any], float, Any] | None = None) -> dict[str, Any]:
    """Several ranks: the projection on the job graph (:func:`gpuprof.pricing.job_projection`),
    made only where the job is at most ``IN_PROCESS_MAX_BYTES`` (its ``frames`` held here, else
    loaded again) or the user kept its frames (``keep_traces``) and they are here: a bigger job
    has none whether this process or workers analysed it, so that its report does not depend on
    the machine's CPUs (:func:`gpuprof.executors.in_process`). ``built``: the ranks' graphs the
    cross-rank replay made here, the job's step it replayed on them and the job graph it joined
    them to, deflated by ``cost_us`` (what the projection starts from)."""
    kept = keep_traces and frames is not None  # (no second look at the files then)
    if not (kept or (bool(jobs) and job_bytes([Path(j.path) for j in jobs]) <= IN_PROCESS_MAX_BYTES)):
        return dict(pricing.NO_PROJECTION)
    if not [f for f in findings if f.confidence in pricing.PROJECTED_CONFIDENCE]:
        return dict(pricing.NO_PROJECTION)
    ranks = frames if frames is not None else tuple(load_rank(j, p.nvml, p.nvml_period_s)[0] for j, p in zip(jobs, parts))
    plans = [o.plan for o in outcomes]
    if any(p is None and o.claims for p, o in zip(plans, outcomes)):
        plans = list(plans_of(ranks, parts, [o.claims for o in outcomes], jobs))
    graphs, before, joined = built if built is not None else (None, None, None)
    return pricing.job_projection(plans, [r.trace for r in ranks], parts, findings, cost_us, graphs, before, joined)


def plans_of(ranks: Sequence[Any], parts: Sequence[RankPart], claims: Sequence[Any], jobs: Sequence[Job]
             ) -> tuple[Any, ...]:
    """Each rank's replay plan made again from its kept claims (no analyzer runs): where the
    rank was analysed in another process, which cannot send its plan back."""
    from gpuprof.replay import fixes

    out = []
    for r, p, c, j in zip(ranks, parts, claims, jobs):
        spec = resolve(r.trace.meta.device_properties, gpu=j.gpu, spec_file=j.gpu_spec)
        out.append(fixes.plan(RankView(r, spec), c, p.unprofiled_step_ms))
    return tuple(out)


def job_replay(ex: Executor, jobs: Sequence[Job], unprofiled_step_ms: float | None, categories: Sequence[str],
               graphs: list[Any] | None = None) -> tuple[dict[str, list[float]], float, tuple[list[Any], Any] | None]:
    """The cross-rank findings' replay (gpuprof.replay.job.fix_steps), the job's profiler cost
    per recorded host event it was deflated by (:func:`gpuprof.replay.job.job_cost`) and the ranks'
    graphs (:class:`gpuprof.replay.job.RankGraph`) with the job graph joined from them, deflated
    (None where the results cache had the figures): each rank's graph built by the workers, joined
    here once; filed in the results cache under every rank's content, so an unchanged job is not
    loaded again for it. ``graphs``: the ranks' graphs (:func:`graph_job`) where built already."""
    from gpuprof.replay.job import fix_steps, joined_job
    from gpuprof.trace import cache as pcache

    def key() -> str | None:
        keys = [job_key(j, "graph") for j in jobs]
        return pcache.result_key("job_replay", tuple(keys), unprofiled_step_ms, tuple(categories)) if all(keys) else None

    kind = tuple[dict[str, list[float]], float]
    root = Path(jobs[0].cache_root) if jobs and jobs[0].cache_root else None
    before = key()
    if before is not None:
        hit: tuple[dict[str, list[float]], float] | None = pcache.get_result(before, kind, root)
        if hit is not None:
            return (*hit, None)
    graphs = ex.map(graph_job, jobs) if graphs is None else graphs
    g, cost = joined_job(graphs, unprofiled_step_ms)
    out = (fix_steps(graphs, unprofiled_step_ms, categories, cost, g), cost)
    if before is not None and key() == before:  # the files did not change meanwhile
        pcache.put_result(before, out, kind, root)
    return (*out, (graphs, g))


def check_ranks(metas: Sequence[TraceMeta], steps: Sequence[pd.DataFrame]) -> None:
    """Refuse traces that do not look like the ranks of one job (a file named twice is refused
    before, by :func:`gpuprof.runfolder.list_traces`): traces without ``distributedInfo`` (torch.distributed was not running), ranks that repeat or do not
    agree on the world size, different GPU models, different numbers of profiled steps, or
    profiled windows that never overlap in time (ranks of one job step together; two recordings
    of one program do not). Merging unrelated programs would average their step times into a
    figure of neither."""
    if len(metas) < 2:
        return
    n_steps = [len(s) for s in steps]
    names = [f"{Path(m.path).parent.name}/{Path(m.path).name}" for m in metas]

    def refuse(why: str) -> None:
        raise UsageError(f"{why}; they are not analysed together as ranks of one job (pass --as-ranks if they "
                         f"are, or report them one at a time): {', '.join(names)}")

    missing = [n for n, m in zip(names, metas) if not m.distributed_info]
    if missing:
        refuse(f"{', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no distributedInfo "
               "(torch.distributed was not running)")
    ranks = [m.rank for m in metas]
    if len(set(ranks)) != len(ranks):
        refuse(f"several traces claim the same rank ({', '.join(str(r) for r in ranks)})")
    worlds = {m.world_size for m in metas}
    if len(worlds) != 1:
        refuse(f"their world sizes differ ({', '.join(str(w) for w in sorted(worlds))})")
    gpus = {m.gpu_name for m in metas}
    if len(gpus) != 1:
        refuse(f"they ran on different GPU models ({', '.join(sorted(str(g) for g in gpus))})")
    if len(set(n_steps)) != 1:
        refuse(f"their profiled step counts differ ({', '.join(str(n) for n in n_steps)})")
    windows = [(m.t0_epoch_ns + s["start"].min() * 1000.0, m.t0_epoch_ns + s["end"].max() * 1000.0)
               for m, s in zip(metas, steps) if len(s)]
    if len(windows) == len(metas) and max(w[0] for w in windows) >= min(w[1] for w in windows):
        refuse("their profiled steps never overlap in time (recorded at different times)")
