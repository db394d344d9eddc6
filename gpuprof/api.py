"""The public API: ``gpuprof.analyze(path_or_paths) -> Analysis``.

A path is a Kineto trace file (``.json`` or ``.json.gz``), a folder of per-rank trace files, or
a run folder written by ``gpuprof record`` (it has a ``manifest.json``). Nothing is re-run:
analysis only reads what was recorded. :class:`Analysis` is the pipeline's
:class:`~gpuprof.analysis.Result` with the frames on demand, the reports and ``what_if``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from gpuprof import document, pipeline, pricing, steptime
from gpuprof.analysis import Result
from gpuprof.errors import GpuprofError, UsageError
from gpuprof.executors import Executor
from gpuprof.jobs import Job, load_rank, load_trace_cached
from gpuprof.rank import RankResult
from gpuprof.runfolder import manifest_of
from gpuprof.trace.model import RankTrace


class Analysis(Result):
    """Everything gpuprof found in a set of traces (:class:`~gpuprof.analysis.Result`: per-rank
    summaries, the ranked findings and their claims, the replayed figures) and, on demand, the
    full frames (``ranks``, ``kernels``, ``ops``, ...), the reports and ``what_if``."""

    @classmethod
    def of(cls, result: Result) -> Analysis:
        return cls(**{f.name: getattr(result, f.name) for f in fields(Result)})

    # --- frames ----------------------------------------------------------------------------
    @cached_property
    def ranks(self) -> tuple[RankResult, ...]:
        """Every rank's frames: those the analysis kept in this process (a single trace, a job
        small enough, ``keep_traces=True``), else loaded again, through the parse cache, on
        first use."""
        if self.frames is not None:
            return self.frames
        return tuple(load_rank(j, p.nvml, p.nvml_period_s)[0] for j, p in zip(self.jobs, self.parts))

    def rank(self, rank: int) -> RankResult:
        """One rank's frames (loading only that rank when they are not here)."""
        i = next(i for i, p in enumerate(self.parts) if p.rank == rank)
        if self.frames is not None or "ranks" in self.__dict__:
            return self.ranks[i]
        return load_rank(self.jobs[i], self.parts[i].nvml, self.parts[i].nvml_period_s)[0]

    @cached_property
    def kernels(self) -> pd.DataFrame:
        """Every kernel instance with its roofline columns and a ``rank`` column."""
        parts = [pd.concat([r.trace.kernels, r.roofline], axis=1).assign(rank=r.trace.meta.rank) for r in self.ranks]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    @property
    def ops(self) -> pd.DataFrame:
        return pd.concat([r.trace.ops.assign(rank=r.trace.meta.rank) for r in self.ranks], ignore_index=True)

    @property
    def memcpys(self) -> pd.DataFrame:
        return pd.concat([r.trace.memcpys.assign(rank=r.trace.meta.rank) for r in self.ranks], ignore_index=True)

    # --- what if ---------------------------------------------------------------------------
    def _plans(self) -> tuple[Any, ...]:
        """Each rank's replay plan: the one its findings were priced on where this process kept
        it, else made again from the rank's kept claims (no analyzer runs)."""
        plans = self.plans if self.plans is not None else (None,) * len(self.parts)
        if all(p is not None or not c for p, c in zip(plans, self.claims)):
            return plans
        again = pipeline.plans_of(self.ranks, self.parts, self.claims, self.jobs)
        return tuple(p if p is not None else a for p, a in zip(plans, again))

    def what_if(self, ids: Sequence[str]) -> dict[str, Any]:
        """Replayed step time (ms, steady state) with the fixes of the findings ``ids`` applied
        together, beside the unchanged replay, and the time per step by class after them.
        Ids that are not this analysis's replayable findings are listed in ``not_applied``.
        Several ranks: the job is replayed across ranks (gpuprof.replay.job) and the step time is
        the slowest rank's; ``by_class_ms`` is not computed there."""
        plans = self._plans()
        if len(self.parts) > 1:
            out = pricing.what_if_job(plans, [r.trace for r in self.ranks], self.parts, self.findings, list(ids),
                                      self.job_cost_us)
        elif plans[0] is None:
            raise GpuprofError("what-if needs one rank whose trace replays (several ranks: analyse one rank's trace)")
        else:
            out = pricing.what_if_rank(plans[0], ids)
        w = self.input_waits
        if w is not None:  # replayed on the step without the DataLoader waits: the program has them
            fixed = steptime.INPUT_WAIT_ID in ids
            out = {**out, "before_ms": out["before_ms"] + w.saving_ms,
                   "step_time_ms": pricing.as_run(out["step_time_ms"], w, fixed),
                   "applied": sorted({*out["applied"], steptime.INPUT_WAIT_ID} if fixed else out["applied"]),
                   "not_applied": [i for i in out["not_applied"] if i != steptime.INPUT_WAIT_ID]}
        return out

    # --- output ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON report's document (schema_version 1)."""
        return document.to_dict(self)

    def detail(self, max_nvml_points: int = 4000) -> dict[str, Any]:
        """Plain data the HTML report draws beyond the JSON document (:func:`gpuprof.document.detail`)."""
        return document.detail(self, self.ranks, max_nvml_points)

    def views_detail(self, max_items: int = 12000, max_operators: int = 300) -> dict[str, Any]:
        """The timeline of one step, the operators table and memory over the steps, as plain data."""
        return document.views_detail(self, self.ranks, max_items, max_operators)

    def per_step(self) -> list[dict[str, Any]]:
        """Per rank and step: its time and the ms of each class (what the step bars draw)."""
        return document.per_step(self)

    def operators_table(self, top: int = 300) -> list[dict[str, Any]]:
        """The heaviest CPU ops by GPU time (:func:`gpuprof.views.operators`), as records."""
        return document.operators_table(self.ranks, top)

    def to_html(self, path: str | Path | None = None) -> str:
        """The offline HTML report; written to ``path`` when given (which must not exist)."""
        from gpuprof.reports.html import render_html

        text: str = render_html(self.to_dict(), self.detail())
        if path is not None:
            with open(path, "x", encoding="utf-8") as f:
                f.write(text)
        return text

    def to_json(self, indent: int | None = 1) -> str:
        from gpuprof.reports.json_report import render_json

        text: str = render_json(self.to_dict(), indent=indent)
        return text

    def to_text(self, color: bool = False, width: int | None = None) -> str:
        """The terminal summary, wrapped to ``width`` columns (default 100)."""
        from gpuprof.reports.text import render_text

        ops = self.operators_table(5) if len(self.parts) == 1 or self.keep_traces else []
        text: str = render_text(self.to_dict(), color=color, width=width,
                                views={"per_step": self.per_step(), "operators": ops})
        return text


def _trace_job(job: Job, store: Any = None) -> RankTrace:
    return load_trace_cached(Path(job.path), job.fallback_rank, job.cache)


def load_traces(files: Sequence[Path], cache: bool = True, workers: int | None = None,
                dask: str | None = None) -> list[RankTrace]:
    """Load trace files through the parse cache (unless ``cache`` is False). Several files are
    parsed in parallel: by up to ``workers`` local processes (default and most: one per CPU,
    at most one per file; 1 parses in this process), or on a Dask cluster when ``dask`` is a scheduler
    address, or ``"local"`` for a local one (needs ``pip install 'gpuprof[dask]'``)."""
    jobs = [Job(str(Path(f).resolve()), i, cache) for i, f in enumerate(files)]
    with Executor(len(jobs), workers, dask) as ex:
        return ex.map(_trace_job, jobs)


def analyze(paths: str | Path | Sequence[str | Path], gpu: str | None = None, gpu_spec: str | None = None,
            analyzers: Sequence[str] | None = None, step_ms: float | None = None, cache: bool = True,
            workers: int | None = None, dask: str | None = None, keep_traces: bool | None = None,
            progress: Callable[[int, int, str], None] | None = None, as_ranks: bool = False,
            input_wait_ms: float | None = None) -> Analysis:
    """Load and analyse traces. ``gpu`` overrides the trace's device name (e.g. ``"H100-SXM"``);
    ``gpu_spec`` is a spec file (``gpuprof calibrate`` output); ``analyzers`` restricts which run;
    ``step_ms`` is the step time measured *without* the profiler (from training logs), which
    corrects host-side estimates for the profiler's own host overhead. A run folder from
    ``gpuprof record`` carries it in its manifest (``unprofiled_step_ms``). ``cache`` reads and
    writes the parse cache and the results cache (:mod:`gpuprof.trace.cache`): a second analysis
    of an unchanged trace with the same options loads no frames until they are asked for.

    Several rank traces are worked on in parallel: by up to ``workers`` local processes (most: one
    per CPU; 1 works in this process; default: one per CPU, or this process alone for a job of at
    most ``IN_PROCESS_MAX_BYTES`` or, on fewer than three CPUs, one that fits half the memory
    available (:func:`gpuprof.executors.in_process`), where each rank is then loaded once), or on a Dask cluster
    (``dask``: a scheduler address, or ``"local"``). Unless ``keep_traces`` (default: only for a
    single trace), each rank is reduced where it is loaded to a small summary
    (:mod:`gpuprof.jobs`) and only those cross to this process, so memory here does not grow
    with the traces (past that bound); ``Analysis.ranks`` then loads the frames again on first
    use. ``progress(done, total, stage)``, when given, is called as ranks finish each stage
    ("summarised", "analysed"; "replayed" where a run folder's DataLoader waits need the traces' GPU floor).

    The unprofiled step time is checked against the trace (:mod:`gpuprof.steptime`): ``step_ms``
    that is not a finite positive number, or below the GPU's busy time per step (no step is
    shorter than its kernels; not checked without step markers), is a :class:`UsageError`; a run
    folder's recorded figure below it is reported in ``warnings`` and not used; either far above
    the traced step is warned of.

    ``input_wait_ms`` is the time per step the training loop spent waiting for its DataLoader,
    measured over the same steps as ``step_ms`` (e.g. Lightning's profiler's
    ``train_dataloader_next`` mean); a run folder carries it (``unprofiled_input_wait_ms``). Waits
    beyond those the profiled steps show are then a finding of their own and every other fix is
    priced on the step without them (:class:`gpuprof.steptime.InputWaits`).

    Several traces are analysed as ranks of one job only when they look like one (see
    :func:`gpuprof.pipeline.check_ranks`) or ``as_ranks`` says so; otherwise a
    :class:`UsageError` says why."""
    seq = [paths] if isinstance(paths, (str, Path)) else list(paths)
    folder, manifest = manifest_of(seq)
    unprofiled = steptime.settle(step_ms, manifest)
    if input_wait_ms is not None and unprofiled is None:
        raise UsageError("--input-wait-ms needs the step time measured over the same steps: give --step-ms too "
                         "(a run folder of gpuprof record carries both)")
    # A run folder's own figure that is impossible is dropped as soon as the ranks' summaries show
    # it (before any analyzer runs): the analysis is then the one without an unprofiled step time.
    result = pipeline.run(seq, unprofiled, gpu, gpu_spec, analyzers, cache, workers, dask, keep_traces, progress,
                          folder, manifest, as_ranks, drop_impossible=step_ms is None,
                          input_wait_ms=steptime.recorded_input_wait(step_ms, manifest, input_wait_ms),
                          input_wait_noise_ms=steptime.recorded_step_sem(manifest)
                          if step_ms is None and input_wait_ms is None else 0.0,
                          input_wait_given=input_wait_ms is not None)
    # with DataLoader waits the profiled steps missed, the traced step stands for the step without them
    compared = result.input_waits.typical_ms if result.input_waits is not None else unprofiled
    notices = steptime.check(result.parts, compared, given=step_ms is not None)
    if step_ms is None and unprofiled is not None and all(p.unprofiled_step_ms is not None for p in result.parts):
        notices = (*notices, *steptime.unsettled(manifest))  # the run's own figure, used: how well it is known
    return Analysis.of(replace(result, notices=(*result.notices, *notices)) if notices else result)


__all__ = ["Analysis", "GpuprofError", "RankResult", "analyze", "load_traces"]
