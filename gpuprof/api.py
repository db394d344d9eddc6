"""The public API: ``gpuprof.analyze(path_or_paths) -> Analysis``.

A path is a Kineto trace file (``.json`` or ``.json.gz``), a folder of per-rank trace files, or
a run folder written by ``gpuprof record`` (it has a ``manifest.json``). Nothing is re-run:
analysis only reads what was recorded.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import gpuprof
from gpuprof import cache_keys
from gpuprof.errors import GpuprofError, TraceError, UsageError
from gpuprof.findings import Finding
from gpuprof.ranks import (
    Job,
    RankPart,
    RankResult,
    cached,
    digest,
    job_key,
    kept_ranks,
    kernel_table,
    load_rank,
    load_trace_cached,
    part_job,
    part_of,
    result_of,
    with_rank,
)
from gpuprof.ranks import resident as ranks_resident
from gpuprof.specs import GpuSpec, resolve
from gpuprof.timeline import CLASSES
from gpuprof.trace.model import RankTrace, TraceMeta

TRACE_SUFFIXES = cache_keys.TRACE_SUFFIXES
SCHEMA_VERSION = 1


def _is_trace_name(p: Path) -> bool:
    # The recorder's own files sit beside the traces: rank records (*.meta.json), the manifest and
    # half-written files (*.tmp); none of them is a trace.
    name = p.name
    return (p.is_file() and name.endswith(TRACE_SUFFIXES) and name != "manifest.json"
            and not name.endswith(".meta.json"))


def _bad_field(manifest: Path, fld: str, want: str, got: Any) -> TraceError:
    shown = repr(got)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return TraceError(f"run manifest field '{fld}' must be {want}, got {shown}", str(manifest))


def _inside(folder: Path, rel: Any, manifest: Path, fld: str) -> Path:
    """``folder / rel`` resolved, refused unless it stays inside the run folder: a manifest from
    someone else must not make gpuprof read ``../../etc/passwd``, an absolute path or a symlink
    that leads out."""
    if not isinstance(rel, str) or not rel:
        raise _bad_field(manifest, fld, "a path inside the run folder", rel)
    try:
        root = folder.resolve()
        real = (folder / rel).resolve()
    except (OSError, RuntimeError, ValueError) as e:  # symlink loops, NUL bytes
        raise TraceError(f"run manifest field '{fld}' is not a usable path ({e.__class__.__name__})",
                         str(manifest)) from None
    if real != root and not real.is_relative_to(root):
        raise TraceError(f"run manifest field '{fld}' points outside the run folder ({rel!r}); refused",
                         str(manifest))
    return real


def _number(doc: dict[str, Any], key: str, manifest: Path, fld: str, positive: bool = True) -> float | None:
    v = doc.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(float(v)) \
            or (positive and not float(v) > 0):
        raise _bad_field(manifest, fld, "a positive number" if positive else "a number", v)
    return float(v)


def _check_manifest(doc: Any, manifest: Path) -> dict[str, Any]:
    """The fields of a manifest that analysis reads, with their types checked (one-line errors)."""
    if not isinstance(doc, dict):
        raise TraceError(f"not a gpuprof run manifest (a JSON object expected, got {type(doc).__name__})",
                         str(manifest))
    traces = doc.get("traces", [])
    if not isinstance(traces, list):
        raise _bad_field(manifest, "traces", "a list", traces)
    for i, t in enumerate(traces):
        if not isinstance(t, dict):
            raise _bad_field(manifest, f"traces[{i}]", "an object with a 'path'", t)
    ranks = doc.get("ranks", [])
    if not isinstance(ranks, list):
        raise _bad_field(manifest, "ranks", "a list", ranks)
    for i, r in enumerate(ranks):
        if not isinstance(r, dict):
            raise _bad_field(manifest, f"ranks[{i}]", "an object", r)
        for key in ("rank", "cuda_device"):
            v = r.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise _bad_field(manifest, f"ranks[{i}].{key}", "a non-negative integer", v)
        vis = r.get("cuda_visible_devices")
        if vis is not None and not isinstance(vis, str):
            raise _bad_field(manifest, f"ranks[{i}].cuda_visible_devices", "a string", vis)
    nv = doc.get("nvml")
    if nv is not None and not isinstance(nv, dict):
        raise _bad_field(manifest, "nvml", "an object", nv)
    if isinstance(nv, dict):
        _number(nv, "hz", manifest, "nvml.hz")
        if nv.get("path") is not None and not isinstance(nv.get("path"), str):
            raise _bad_field(manifest, "nvml.path", "a path inside the run folder", nv.get("path"))
    _number(doc, "unprofiled_step_ms", manifest, "unprofiled_step_ms")
    return doc


def _rebuilt_manifest(folder: Path) -> dict[str, Any] | None:
    """A run folder whose recorder was killed before writing ``manifest.json``: the traces and
    rank records it left (``traces/``), else None (not a run folder)."""
    from gpuprof.record.manifest import collect_ranks

    tdir = folder / "traces"
    if not tdir.is_dir() or any(_is_trace_name(f) for f in folder.iterdir()):
        return None  # a folder of traces that happens to hold a traces/ folder too
    if not (folder / "nvml.csv").is_file() and not any(tdir.glob("*.meta.json")):
        return None  # nothing the recorder writes: not a run folder
    ranks = [r for r in collect_ranks(folder) if isinstance(r, dict) and "error" not in r]
    listed = {f.name: f for f in tdir.iterdir() if _is_trace_name(f)}
    traces = [{"rank": i, "path": f"traces/{name}"} for i, name in enumerate(sorted(listed))]
    timed = [float(r["unprofiled_step_ms"]) for r in ranks if isinstance(r.get("unprofiled_step_ms"), (int, float))
             and not isinstance(r.get("unprofiled_step_ms"), bool) and np.isfinite(r["unprofiled_step_ms"])
             and r["unprofiled_step_ms"] > 0]
    doc: dict[str, Any] = {"traces": traces, "ranks": ranks, "rebuilt": "no manifest.json",
                           "unprofiled_step_ms": float(np.mean(timed)) if timed else None}
    if (folder / "nvml.csv").is_file():
        doc["nvml"] = {"path": "nvml.csv"}  # the sampling rate is read off the samples
    return doc


def run_manifest(folder: Path) -> tuple[dict[str, Any] | None, Path]:
    """The run folder's manifest (types checked, secrets redacted) and its path; rebuilt from
    what the recorder left when it has none; None for a plain folder of traces."""
    from gpuprof import files
    from gpuprof.redact import redact_manifest

    manifest = folder / "manifest.json"
    if not os.path.lexists(manifest):
        return _rebuilt_manifest(folder), manifest
    try:  # a regular file inside the run folder, bounded (a FIFO would block, /dev/zero never end)
        doc = json.loads(files.read(manifest, inside=folder, max_bytes=files.SMALL_FILE_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else f"{e.__class__.__name__}: {e}"
        raise TraceError(f"unreadable run manifest ({reason})", str(manifest)) from None
    return redact_manifest(_check_manifest(doc, manifest)), manifest


def find_traces(paths: Sequence[str | Path]) -> list[Path]:
    """Trace files named by ``paths``: files as given; folders by manifest, else every trace file."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise TraceError("no such file or folder", str(p))
        if p.is_file():
            out.append(p)
            continue
        if not p.is_dir():  # a FIFO, a device: one line saying so (reading it could block or never end)
            from gpuprof.files import read_file

            read_file(p)
        doc, manifest = run_manifest(p)
        if doc is not None:
            listed = [_inside(p, t.get("path"), manifest, f"traces[{i}].path") for i, t in enumerate(doc["traces"])]
            if not listed:
                raise TraceError("the run folder's manifest lists no traces (did the program reach the profiled steps?)"
                                 if manifest.is_file() else "run folder without manifest.json holds no traces",
                                 str(manifest if manifest.is_file() else p))
            out.extend(listed)
            continue
        found = sorted(f for f in p.iterdir() if _is_trace_name(f))
        if not found:
            raise TraceError("folder holds no trace files (*.json, *.json.gz)", str(p))
        out.extend(found)
    return out


@dataclass(frozen=True)
class Analysis:
    """Everything gpuprof found in a set of traces: per-rank summaries (``parts``), the findings,
    and on demand the full frames (``ranks``, ``kernels``, ``ops``, ...)."""

    parts: tuple[RankPart, ...]
    spec: GpuSpec | None
    findings: tuple[Finding, ...] = field(default_factory=tuple)
    skipped: tuple[dict[str, str], ...] = field(default_factory=tuple)
    run: dict[str, Any] = field(default_factory=dict)  # the run folder's manifest, when there is one
    jobs: tuple[Job, ...] = field(default_factory=tuple)  # how to load each rank again, in parts' order
    results: tuple[RankResult, ...] | None = None  # the ranks' frames, when kept in memory
    notices: tuple[str, ...] = ()  # what the analysis itself warns of (an impossible step time, ...)
    notes: tuple[Finding, ...] = ()  # findings that save (next to) nothing: not fixes, listed apart
    folder: str | None = None  # the run folder analysed, when it was one
    #: The summary's replayed figures (replay and projected step times), read from the results
    #: cache: with them a cached report needs no frames (else computed from the frames on first use).
    replayed: dict[str, Any] | None = None
    #: Where to file those figures once computed: the single trace's job, its result-key inputs
    #: and contributions (the figures join them in that one results-cache entry).
    replay_cache: tuple[Job, tuple[Any, ...], list[Any]] | None = None
    #: The ranks' frames as a job analysed in this process loaded them (one small enough, see
    #: ``IN_PROCESS_MAX_BYTES``): what ``ranks`` gives without loading them again. Unlike
    #: ``results``, the report reads as for ranks analysed apart.
    frames: tuple[RankResult, ...] | None = field(default=None, repr=False, compare=False)
    #: Several ranks: each rank's unchanged trace replayed alone (its mean step window, ms; None
    #: where it has no graph), computed where the rank was analysed (``findings_job``), so the
    #: summary's ``replay_step_time_ms`` needs no frames here. See :meth:`_replay_step_ms`.
    rank_replay_ms: tuple[float | None, ...] | None = None

    # --- frames ----------------------------------------------------------------------------
    @cached_property
    def ranks(self) -> tuple[RankResult, ...]:
        """Every rank's frames. Kept in memory for a single trace (or ``keep_traces=True``) and
        for a small job analysed in this process; otherwise loaded again here, through the parse
        cache, on first use."""
        if self.results is not None:
            return self.results
        if self.frames is not None:
            return self.frames
        return tuple(load_rank(j, p.nvml, p.nvml_period_s)[0] for j, p in zip(self.jobs, self.parts))

    def one_rank(self, rank: int) -> Analysis:
        """The analysis of one rank alone, its frames in memory (what per-rank analyzers see)."""
        i = next(i for i, p in enumerate(self.parts) if p.rank == rank)
        if self.results is not None or self.frames is not None or "ranks" in self.__dict__:  # frames already here
            r = self.ranks[i]
        else:  # only this rank's frames, not every rank's
            r = load_rank(self.jobs[i], self.parts[i].nvml, self.parts[i].nvml_period_s)[0]
        return Analysis(parts=(self.parts[i],), spec=self.spec, run=self.run,
                        jobs=self.jobs[i:i + 1], results=(r,))

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

    # --- summary ---------------------------------------------------------------------------
    @cached_property
    def summary(self) -> dict[str, Any]:
        """Step time, GPU busy %, breakdown and MFU, averaged over ranks (per-rank in ``per_rank``)."""
        s = [p.summary for p in self.parts]
        mfus = [x.mfu_pct for x in s if x.mfu_pct is not None]
        keys = (*CLASSES, "idle")
        out: dict[str, Any] = {
            "steps": int(max(len(p.steps) for p in self.parts)),
            "step_time_ms": float(np.mean([x.step_time_ms for x in s])),
            **self._replay_figures(),
            "gpu_busy_pct": float(np.mean([x.gpu_busy_pct for x in s])),
            "mfu_pct": float(np.mean(mfus)) if mfus else None,
            "breakdown_pct": {k: float(np.mean([x.breakdown_pct[k] for x in s])) for k in keys},
            "steps_source": self.parts[0].meta.steps_source,
            "model_flops_per_step": float(np.mean([x.model_flops_per_step for x in s])),
            "mfu_basis": s[0].mfu_basis,
            "cost_model_coverage_pct": float(np.mean([x.coverage_pct for x in s])),
            "unprofiled_step_time_ms": self.parts[0].unprofiled_step_ms,
            "mfu_unprofiled_pct": (float(np.mean(mfus)) * float(np.mean([x.step_time_ms for x in s]))
                                   / self.parts[0].unprofiled_step_ms
                                   if mfus and self.parts[0].unprofiled_step_ms else None),
            "gpu_kernel_time_ms": float(np.mean([100.0 - x.breakdown_pct["idle"] for x in s]) / 100.0
                                        * np.mean([x.step_time_ms for x in s])),
        }
        if len(s) > 1:
            out["per_rank"] = [{"rank": p.rank, "step_time_ms": p.summary.step_time_ms,
                                "gpu_busy_pct": p.summary.gpu_busy_pct,
                                "communication_pct": p.summary.breakdown_pct["communication"]} for p in self.parts]
        return out

    def _replay_figures(self) -> dict[str, Any]:
        """``replay_step_time_ms`` and the projection (``_projection``): from the results cache
        when it had them, else replayed now (and filed there, under the bytes the frames came from)."""
        if self.replayed is not None:
            return dict(self.replayed)
        out: dict[str, Any] = {"replay_step_time_ms": self._replay_step_ms(), **self._projection()}
        if self.replay_cache is not None:
            from gpuprof.trace import cache as pcache

            job, single, contribs = self.replay_cache
            content = self.ranks[0].trace.meta.content_key if len(self.ranks) == 1 else None
            key = job_key(job, *single, content=content) if content else None
            if key is not None:  # the entry the analysis was filed in, now with the figures
                pcache.put_result(key, (self.parts, self.spec, contribs, out), _single_result_type())
        return out

    def _plan(self) -> Any:
        """The one rank's fix plan (gpuprof.replay.fixes): the one made while the findings were
        computed, else made again by running the per-rank analyzers. None for several ranks (as
        ``replay_step_time_ms``) or where the trace cannot be replayed."""
        if len(self.parts) != 1:
            return None
        from gpuprof.replay import fixes

        (r,) = self.ranks
        p = fixes.cached_plan(r.trace)
        if p is None:
            from gpuprof.analyzers import rank_contributions, select

            active, _ = select(self.parts, self.spec)
            rank_contributions(self.one_rank(self.parts[0].rank), active)
            p = fixes.cached_plan(r.trace)
        return p

    def what_if(self, ids: Sequence[str]) -> dict[str, Any]:
        """Replayed step time (ms, steady state) with the fixes of the findings ``ids`` applied
        together, beside the unchanged replay, and the time per step by class after them.
        Ids that are not this analysis's replayable findings are listed in ``not_applied``.
        Several ranks: the job is replayed across ranks (gpuprof.replay.ranks) and the step time is
        the slowest rank's; ``by_class_ms`` is not computed there."""
        if len(self.parts) > 1:
            from gpuprof.analyzers import distributed

            if sum(p.meta.events for p in self.parts) > distributed.JOB_REPLAY_MAX_EVENTS:
                raise GpuprofError(f"what-if: the job's trace events are more than the cross-rank replay builds in one "
                                   f"process ({distributed.JOB_REPLAY_MAX_EVENTS:,})")
            return self._what_if_job(list(ids))
        p = self._plan()
        if p is None:
            raise GpuprofError("what-if needs one rank whose trace replays (several ranks: analyse one rank's trace)")
        ids = list(ids)
        return {"before_ms": p.before_ms, "step_time_ms": p.after_ms(ids), "by_class_ms": p.by_class_ms(ids),
                "applied": sorted(i for i in set(ids) if i in p.units),
                "not_applied": sorted(i for i in set(ids) if i not in p.units)}

    def _what_if_job(self, ids: list[str]) -> dict[str, Any]:
        """:meth:`what_if` for several ranks: each rank's findings applied to its part of the job
        graph as for one rank (its units, gpuprof.replay.fixes), the cross-rank ones by their
        cross-rank transformation; step times are the slowest rank's steady-state step. Each rank's
        plan is the one its findings were priced with where it is at hand (the ranks analysed in
        this process), else made again with the cross-rank claims, as in the analysis."""
        from gpuprof.analyzers import distributed, rank_contributions, select
        from gpuprof.replay import fixes
        from gpuprof.replay.ranks import cross_fix, fix_steps, job, rank_graph, slowest_ms

        ranks = self.ranks
        plans = [fixes.cached_plan(r.trace) for r in ranks]
        if any(p is None for p in plans):
            active, _ = select(self.parts, self.spec)
            results = {r.trace.meta.rank: r for r in ranks}
            # each rank's units after the cross-rank findings' claims, as in the analysis (a slow
            # rank's idle gaps inside the others' waits belong to rank_imbalance, not to
            # launch_overhead), their claim order from the job's replay as there
            cross = distributed.plan(self.parts, lambda slow, waits, waiting: distributed.slow_detail(
                results[slow], waits, waiting), [a.name for a in active], replay=lambda cats: fix_steps(
                [rank_graph(r.trace) for r in ranks], self.parts[0].unprofiled_step_ms, cats))
            for k, part in enumerate(self.parts):
                if plans[k] is None:
                    rank_contributions(self.one_rank(part.rank), active, cross.get(part.rank, ()))
                    plans[k] = fixes.cached_plan(ranks[k].trace)
        # the graphs the findings were priced on (as traced), joined: no rank's graph built twice
        rank_graphs = [rank_graph(r.trace, p.raw if p is not None else None) for r, p in zip(ranks, plans)]
        g = job(rank_graphs, self.parts[0].unprofiled_step_ms)
        before = slowest_ms(g)
        by_id = {f.id: f for f in self.findings}
        applied: set[str] = set()
        after = g
        for p in plans:
            if p is None:
                continue
            for i in sorted(set(ids) & set(p.units)):
                after = fixes.apply(after, p.view, p.categories[i], p.units[i])
                applied.add(i)
        for i in sorted(set(ids)):
            cat = by_id[i].category if i in by_id else None
            if cat in ("rank_imbalance", "exposed_communication"):
                after = cross_fix(cat, after, rank_graphs)
                applied.add(i)
        return {"before_ms": before, "step_time_ms": slowest_ms(after), "by_class_ms": None,
                "applied": sorted(applied), "not_applied": sorted(set(ids) - applied)}

    def _job_projection(self) -> dict[str, Any]:
        """:meth:`_projection` for several ranks: :meth:`what_if` of every high- and
        medium-confidence finding it can apply, so the two agree by construction. The job graph
        is built in this process, as for the cross-rank findings: not above
        ``distributed.JOB_REPLAY_MAX_EVENTS``, and only where the ranks' frames are here or a job
        that small (``IN_PROCESS_MAX_BYTES``) may be loaded again (the bounded many-rank path keeps
        frames out of this process)."""
        none: dict[str, Any] = {"projected_step_time_ms": None, "projected_findings": []}
        ids = [f.id for f in self.findings if f.confidence in ("high", "medium")]
        if not ids:
            return none
        here = self.results is not None or self.frames is not None or "ranks" in self.__dict__
        if not here and not (self.jobs and job_bytes([Path(j.path) for j in self.jobs]) <= IN_PROCESS_MAX_BYTES):
            return none
        try:
            w = self.what_if(ids)  # refuses a job above distributed.JOB_REPLAY_MAX_EVENTS
        except GpuprofError:
            return none
        applied = [i for i in ids if i in w["applied"]]
        if not applied:
            return none
        return {"projected_step_time_ms": _f(w["step_time_ms"]), "projected_findings": applied,
                "projected_from_ms": _f(w["before_ms"])}

    def _projection(self) -> dict[str, Any]:
        """``projected_step_time_ms``: every high- and medium-confidence fix applied in one replay,
        and which findings that is (``projected_findings``, in the report's order)."""
        none: dict[str, Any] = {"projected_step_time_ms": None, "projected_findings": []}
        if len(self.parts) > 1:
            return self._job_projection()
        if not self.findings:
            return none
        try:
            p = self._plan()
        except GpuprofError:
            return none
        if p is None:
            return none
        ids = [f.id for f in self.findings if f.confidence in ("high", "medium") and f.id in p.units]
        if not ids:
            return none
        return {"projected_step_time_ms": _f(p.after_ms(ids)), "projected_findings": ids,
                "projected_from_ms": _f(p.before_ms)}

    def _replay_step_ms(self) -> float | None:
        """The unchanged trace's step time replayed from its dependency graph (gpuprof.replay):
        its gap to ``step_time_ms`` is the replay's own error.

        Several ranks: the mean over ranks of each rank's replayed step windows, as
        ``step_time_ms`` is the mean of their traced ones. Each rank's graph replays alone to the
        same times as in the job graph: a coupled collective ends its transfer time after the last
        rank's arrival, that time being each rank's own traced end less the arrival
        (gpuprof.replay.ranks), so where nothing is changed the coupling moves no rank
        (``tests/test_replay_ranks.py`` holds the two equal). The figure is therefore a per-rank
        quantity, computed where each rank is analysed (``rank_replay_ms``), and no job graph is
        built for it however many ranks there are."""
        if len(self.parts) > 1:
            got_ranks = self.rank_replay_ms
            if got_ranks is None:
                got_ranks = tuple(rank_replay_ms(r.trace) for r in self.ranks)
            ok = [x for x in got_ranks if x is not None]
            return float(np.mean(ok)) if ok and len(ok) == len(got_ranks) else None
        try:
            return rank_replay_ms(self.ranks[0].trace)
        except GpuprofError:
            return None

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

    # --- output ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON report's document (schema_version 1)."""
        from gpuprof.analyzers import LOW_CONFIDENCE_WEIGHT, NEGLIGIBLE_PCT, RANKING, ranked_saving_ms

        spec = self.spec
        meta = self.parts[0].meta
        table = self.kernel_table
        rank_steps = sum(p.n_steps for p in self.parts)  # total_us is summed over every rank's profiled steps
        kernels = [
            {"name": r["name"], "count": int(r["count"]), "total_us": _f(r["total_us"]),
             "ms_per_step": _f(r["total_us"] / 1000.0 / rank_steps), "flops": _f(r["flops"]),
             "bytes": _f(r["bytes"]), "achieved_tflops": _f(r["achieved_tflops"]),
             "achieved_gbps": _f(r["achieved_gbps"]), "bound": str(r["bound"]), "roofline_pct": _f(r["roofline_pct"]),
             "cost_model_error": bool(r["cost_model_error"]),
             "cost_model_error_count": int(r["cost_model_error_count"]),
             "cost_model_error_pct": _f(r["cost_model_error_pct"]),
             "engine": r["engine"] or None,
             "math_dtype": r["math_dtype"] if isinstance(r["math_dtype"], str) else None,
             "op": r["op"] if isinstance(r["op"], str) else None,
             "shapes": r["shapes"] if isinstance(r["shapes"], str) else None}
            for r in table.to_dict("records")
        ]
        summary = self.summary
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "gpuprof", "version": gpuprof.__version__},
            "source": {"paths": [p.meta.path for p in self.parts], "run_folder": self.folder,
                       "ranks": [p.rank for p in self.parts],
                       "world_size": meta.world_size, "time_origin": meta.time_origin},
            "gpu": {
                "name": spec.name if spec else (meta.gpu_name or "unknown"),
                "device_name": meta.gpu_name,
                "spec": {
                    "fp32_tflops": _f(spec.peak("fp32")) if spec else None,
                    "tf32_tflops": _f(spec.peaks_tflops.get("tf32")) if spec else None,
                    "bf16_tflops": _f(spec.peaks_tflops.get("bf16")) if spec else None,
                    "fp8_tflops": _f(spec.peaks_tflops.get("fp8")) if spec else None,
                    "hbm_gbps": _f(spec.hbm_gbps) if spec else None,
                    "sm_count": spec.sm_count if spec else None,
                    "source": spec.source if spec else None,
                },
            },
            "summary": _clean(summary),
            "kernels": kernels,
            "nvml": _clean(self.nvml_summary),
            "findings": [{**f.to_dict(), "ranked_by_ms": round(ranked_saving_ms(f), 4)} for f in self.findings],
            "ranking": {"by": RANKING, "low_confidence_weight": LOW_CONFIDENCE_WEIGHT,
                        "negligible_below_pct": NEGLIGIBLE_PCT},
            "notes": [f.to_dict() for f in self.notes],
            "analyzers_skipped": list(self.skipped),
            "warnings": self.warnings,
        }

    def detail(self, max_nvml_points: int = 4000) -> dict[str, Any]:
        """Plain data the HTML report draws beyond the JSON document: per-step time by class,
        the GPU's roofs, NVML series (down-sampled to ``max_nvml_points`` rows) and run facts."""
        per_step = self.per_step()
        roofs = {}
        if self.spec is not None:
            roofs = {"hbm_gbps": self.spec.hbm_gbps, "peaks_tflops": dict(self.spec.peaks_tflops)}
        nv = self.nvml
        series: list[dict[str, Any]] = []
        if len(nv):
            keep = nv.iloc[:: max(1, len(nv) // max_nvml_points)]
            t0 = int(nv["ts_ns"].min())
            series = [{k: (None if pd.isna(v) else (float(v) if k != "in_window" else bool(v)))
                       for k, v in row.items() if k in ("gpu", "rank", "util_gpu_pct", "sm_clock_mhz", "power_w",
                                                          "mem_used_mb", "clock_event_reasons", "in_window",
                                                          "gpm_tensor_util_pct", "sm_clock_max_mhz", "power_limit_w")}
                      | {"t_s": (int(row["ts_ns"]) - t0) / 1e9} for row in keep.to_dict("records")]
        run = {k: self.run.get(k) for k in ("command", "torch", "cuda", "host", "exit_code", "world_size")}
        detail: dict[str, Any] = _clean({"per_step": per_step, "roofs": roofs, "nvml_series": series, "run": run,
                                         **self.views_detail()})
        return detail

    def views_detail(self, max_items: int = 12000, max_operators: int = 300) -> dict[str, Any]:
        """The timeline of one step, the operators table and memory over the steps
        (:mod:`gpuprof.views`), as plain data for the HTML report."""
        from gpuprof import views

        if not any(p.has_gpu for p in self.parts) and not len(self.ops):
            return {"timeline": {}, "operators": [], "memory": {}}
        c = views.claims(self)
        return {"timeline": views.timeline(self, max_items=max_items, claims_frame=c),
                "operators": self.operators_table(max_operators),
                "memory": views.memory(self)}

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

        ops = self.operators_table(5) if len(self.parts) == 1 or self.results is not None else []
        text: str = render_text(self.to_dict(), color=color, width=width,
                                views={"per_step": self.per_step(), "operators": ops})
        return text

    def per_step(self) -> list[dict[str, Any]]:
        """Per rank and step: its time and the ms of each class (what the step bars draw)."""
        steps = self.steps
        cols = [c for c in steps.columns if c.endswith("_us") and c != "time_us"]
        out: list[dict[str, Any]] = _clean([
            {"rank": int(r["rank"]), "step": int(r["step"]), "time_ms": float(r["time"]) / 1000.0,
             **{c[:-3]: float(r[c]) / 1000.0 for c in cols if pd.notna(r[c])}}
            for r in steps.to_dict("records") if pd.notna(r.get("time_us"))])
        return out

    def operators_table(self, top: int = 300) -> list[dict[str, Any]]:
        """The heaviest CPU ops by GPU time (:func:`gpuprof.views.operators`), as records."""
        from gpuprof import views

        out: list[dict[str, Any]] = _clean(views.operators(self, top=top).to_dict("records"))
        return out


def _f(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if np.isfinite(v) else None


def rank_replay_ms(trace: RankTrace) -> float | None:
    """One rank's unchanged trace replayed alone (gpuprof.replay): its mean step window (ms), from
    the graph its findings were priced on when that is at hand; None where it cannot be replayed."""
    from gpuprof.replay import fixes, replay, run

    try:
        p = fixes.cached_plan(trace)  # the graph the findings were priced on
        got = run(p.raw).step_time_ms if p is not None else replay(trace).step_time_ms
    except GpuprofError:
        return None
    return got if np.isfinite(got) else None


def _clean(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _clean(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_clean(v) for v in d]
    if isinstance(d, (float, np.floating)):
        return _f(d)
    if isinstance(d, np.integer):
        return int(d)
    return d


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask, which containers and batch schedulers set)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def local_workers(n: int, workers: int | None) -> int:
    """Local processes for ``n`` ranks: ``workers`` (default: one per CPU), at most one per rank
    and per CPU; 1 works in this process."""
    cpus = cpu_count()
    return max(1, min(n, workers or cpus, cpus))


#: A job of several ranks whose traces hold at most this many bytes of JSON (a gzipped file
#: counted at its uncompressed size) is analysed in this process by default, each rank loaded
#: once and kept until its findings are made. Each worker process costs its own imports
#: (numpy, pandas, pyarrow: ~0.5 s of CPU and ~120 MB before any trace) and a second load of
#: each rank it summarised. In this process every rank's frames are held (about half the JSON;
#: less than a single trace of that size holds at its peak): 8 ranks of 12-14 MB of JSON made from
#: ddp_manual_allreduce peaked at 241-244 MB in all, against 637-653 MB with two worker
#: processes, and took 24-27 % less CPU (docs/performance.md). Bigger jobs go to worker processes,
#: which hold one rank at a time; ``--workers N`` asks for them whatever the size.
IN_PROCESS_MAX_BYTES = 256 * 2**20


def job_bytes(files: Sequence[Path]) -> int:
    """The JSON bytes of ``files``: a gzipped file's uncompressed size from its trailer (ISIZE,
    modulo 4 GiB, so never counted below 4x its compressed size; Kineto JSON compresses ~15x)."""
    total = 0
    for f in files:
        try:
            size = Path(f).stat().st_size
            if str(f).endswith(".gz") and size >= 18:
                with open(f, "rb") as fh:
                    fh.seek(-4, os.SEEK_END)
                    size = max(int.from_bytes(fh.read(4), "little"), 4 * size)
        except OSError:
            continue  # loading it says what is wrong
        total += size
    return total


#: Seconds a Dask run may go without a scheduler connection or without any worker before it
#: fails with one line (``$GPUPROF_DASK_TIMEOUT_S``); a worker lost meanwhile is not an error:
#: the scheduler runs its tasks again elsewhere.
DASK_TIMEOUT_S = 60.0
_DASK_POLL_S = 1.0


def _dask_timeout() -> float:
    try:
        return float(os.environ.get("GPUPROF_DASK_TIMEOUT_S", DASK_TIMEOUT_S))
    except ValueError:
        return DASK_TIMEOUT_S


def _on_dask_worker(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` on a Dask worker; an error about the input names this worker, since a path
    the driver sees may be missing on the worker (traces must be on a shared file system)."""
    try:
        return fn(*args)
    except GpuprofError as e:
        from dask.distributed import get_worker

        try:
            where = get_worker().address
        except ValueError:  # not on a worker after all
            raise e from None
        raise type(e)(f"{e} (read on Dask worker {where})") from None


def _label(arg: Any) -> str:
    return str(getattr(arg, "path", arg))


class _Exec:
    """Where per-rank work runs: this process, local worker processes, or a Dask cluster.

    Local processes are capped at the CPUs this process may use: more only add memory (each
    holds a rank's frames) and no speed."""

    def __init__(self, n: int, workers: int | None, dask: str | None,
                 progress: Callable[[int, int, str], None] | None = None) -> None:
        self.progress = progress
        self.client: Any = None
        self.cluster: Any = None
        self.pool: Any = None
        self.address = dask
        w = local_workers(n, workers)
        if dask:
            try:
                from dask.distributed import Client, LocalCluster
            except ImportError:
                raise GpuprofError("--dask needs dask.distributed: pip install 'gpuprof[dask]'") from None
            try:
                if dask == "local":
                    self.cluster = LocalCluster(  # type: ignore[no-untyped-call]
                        n_workers=w, threads_per_worker=1, processes=True,
                        dashboard_address=None, silence_logs=logging.CRITICAL)  # a bad trace: one line, ours
                    self.client = Client(self.cluster)  # type: ignore[no-untyped-call]
                else:
                    self.client = Client(dask, timeout="10s")  # type: ignore[no-untyped-call]
            except OSError as e:
                raise GpuprofError(f"cannot reach the Dask scheduler {dask!r} ({e})") from None
            return
        if w > 1:
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(max_workers=w)

    def map(self, fn: Any, *args: Sequence[Any], stage: str = "") -> list[Any]:
        """``fn`` over the argument lists, results in order; ``progress(done, total, stage)`` is
        called as results arrive (when several)."""
        n = len(args[0]) if args else 0
        report = self.progress if self.progress is not None and stage and n > 1 else None
        if self.client is not None:
            return self._dask_map(fn, args, n, report, stage)
        if self.pool is not None:
            from concurrent.futures import as_completed

            pending = [self.pool.submit(fn, *a) for a in zip(*args)]
            if report is not None:
                for i, _ in enumerate(as_completed(pending), 1):
                    report(i, n, stage)
            return [f.result() for f in pending]
        out = []
        for i, a in enumerate(zip(*args), 1):
            out.append(fn(*a))
            if report is not None:
                report(i, n, stage)
        return out

    def _dask_map(self, fn: Any, args: Sequence[Sequence[Any]], n: int,
                  report: Callable[[int, int, str], None] | None, stage: str) -> list[Any]:
        """The tasks on the cluster, watched: a task's error is raised as soon as it arrives, and
        a cluster without a scheduler connection or without workers for ``$GPUPROF_DASK_TIMEOUT_S``
        fails with one line instead of waiting for ever."""
        import time
        from functools import partial

        from dask.distributed import KilledWorker, wait

        futures = self.client.map(partial(_on_dask_worker, fn), *args, pure=False)
        label = {f.key: _label(a) for f, a in zip(futures, args[0])}
        limit = _dask_timeout()
        remaining, done, stalled_since = list(futures), 0, None
        while remaining:
            try:
                got = wait(remaining, timeout=_DASK_POLL_S, return_when="FIRST_COMPLETED")  # type: ignore[no-untyped-call]
                finished, remaining = list(got.done), list(got.not_done)
            except TimeoutError:
                finished = []
            for f in finished:
                if f.status == "error":
                    try:
                        f.result()
                    except KilledWorker:
                        raise GpuprofError(f"{label[f.key]}: Dask workers died while analysing it, more often than "
                                           "the scheduler retries a task (distributed.scheduler.allowed-failures); "
                                           "the trace may need more memory than a worker has") from None
                elif f.status == "cancelled":
                    raise GpuprofError(f"{label[f.key]}: its task was cancelled on the Dask cluster {self.address!r}")
            done += len(finished)
            if report is not None:
                for i in range(done - len(finished) + 1, done + 1):
                    report(i, n, stage)
            if not remaining:
                break
            connected = self.client.status == "running"
            workers = len(self.client.scheduler_info().get("workers", {})) if connected else 0
            if connected and workers:
                stalled_since = None
            elif stalled_since is None:
                stalled_since = time.monotonic()
            elif time.monotonic() - stalled_since > limit:
                why = "has no workers" if connected else "is unreachable"
                raise GpuprofError(f"the Dask cluster {self.address!r} {why} since {limit:.0f} s; {len(remaining)} of "
                                   f"{n} ranks unfinished (GPUPROF_DASK_TIMEOUT_S sets how long to wait)")
        return list(self.client.gather(futures))

    def call(self, fn: Any, *args: Any) -> Any:
        return self.map(fn, *[[a] for a in args])[0]

    def __enter__(self) -> _Exec:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown()
        if self.client is not None:
            self.client.close(timeout=10)
        if self.cluster is not None:
            self.cluster.close()


def _trace_job(job: Job) -> RankTrace:
    return load_trace_cached(Path(job.path), job.fallback_rank, job.cache)


def load_traces(files: Sequence[Path], cache: bool = True, workers: int | None = None,
                dask: str | None = None) -> list[RankTrace]:
    """Load trace files through the parse cache (unless ``cache`` is False). Several files are
    parsed in parallel: by up to ``workers`` local processes (default and most: one per CPU,
    at most one per file; 1 parses in this process), or on a Dask cluster when ``dask`` is a scheduler
    address, or ``"local"`` for a local one (needs ``pip install 'gpuprof[dask]'``)."""
    jobs = [Job(str(Path(f).resolve()), i, cache) for i, f in enumerate(files)]
    with _Exec(len(jobs), workers, dask) as ex:
        return ex.map(_trace_job, jobs)


def findings_job(job: Job, part: RankPart, active: Sequence[str], cross: Sequence[Any]
                 ) -> tuple[list[Any], float | None]:
    """Worker, second pass: load the rank again (parse cache), run the per-rank analyzers named
    in ``active`` with the rank's share of the cross-rank findings, and return its contributions
    and its unchanged trace's replayed step (:func:`rank_replay_ms`, on the graph just priced)."""
    from gpuprof.analyzers import REGISTRY, rank_contributions

    from gpuprof.analyzers._base import Contribution

    def compute() -> tuple[tuple[list[Any], float | None], str | None]:
        r, spec = load_rank(job, part.nvml, part.nvml_period_s)
        one = Analysis(parts=(part,), spec=spec, jobs=(job,), results=(r,))
        out: list[Any] = rank_contributions(one, [a for a in REGISTRY if a.name in active], cross)
        content = r.trace.meta.content_key
        # file changed between passes: keep no copy
        return (out, rank_replay_ms(r.trace)), content if content == part.meta.content_key else None

    extra = (tuple(active), digest(part.nvml), part.nvml_period_s, digest(list(cross)))
    kind = tuple[list[Contribution], float | None]
    got: tuple[list[Any], float | None] = cached(
        job, job_key(job, "contributions+replay", *extra), compute, kind,
        lambda content: job_key(job, "contributions+replay", *extra, content=content))
    return got


def graph_job(job: Job) -> Any:
    """Worker: one rank's dependency graph, ready to join the others' (gpuprof.replay.ranks)."""
    from gpuprof.replay.ranks import rank_graph

    r, _ = load_rank(job)
    return rank_graph(r.trace)


def _job_replay(ex: _Exec, jobs: Sequence[Job], real_step_ms: float | None, categories: Sequence[str]
                ) -> dict[str, list[float]]:
    """The cross-rank findings' replay (gpuprof.replay.ranks.fix_steps): each rank's graph built
    by the workers, joined here; filed in the results cache under every rank's content, so an
    unchanged job is not loaded again for it."""
    from gpuprof.replay.ranks import fix_steps
    from gpuprof.trace import cache as pcache

    def key() -> str | None:
        keys = [job_key(j, "graph") for j in jobs]
        return pcache.result_key("job_replay", tuple(keys), real_step_ms, tuple(categories)) if all(keys) else None

    kind = dict[str, list[float]]
    root = Path(jobs[0].cache_root) if jobs and jobs[0].cache_root else None
    before = key()
    if before is not None:
        hit: dict[str, list[float]] | None = pcache.get_result(before, kind, root)
        if hit is not None:
            return hit
    out = fix_steps(ex.map(graph_job, jobs), real_step_ms, categories)
    if before is not None and key() == before:  # the files did not change meanwhile
        pcache.put_result(before, out, kind, root)
    return out


def slow_job(job: Job, waits: pd.DataFrame, waiting: int) -> dict[str, Any]:
    from gpuprof.analyzers.distributed import slow_detail

    r, _ = load_rank(job)
    out: dict[str, Any] = slow_detail(r, waits, waiting)
    return out


def analyze(paths: str | Path | Sequence[str | Path], gpu: str | None = None, gpu_spec: str | None = None,
            analyzers: Sequence[str] | None = None, step_ms: float | None = None, cache: bool = True,
            workers: int | None = None, dask: str | None = None, keep_traces: bool | None = None,
            progress: Callable[[int, int, str], None] | None = None, as_ranks: bool = False) -> Analysis:
    """Load and analyse traces. ``gpu`` overrides the trace's device name (e.g. ``"H100-SXM"``);
    ``gpu_spec`` is a spec file (``gpuprof calibrate`` output); ``analyzers`` restricts which run;
    ``step_ms`` is the step time measured *without* the profiler (from training logs), which
    corrects host-side estimates for the profiler's own host overhead. A run folder from
    ``gpuprof record`` carries it in its manifest (``unprofiled_step_ms``). ``cache`` reads and
    writes the parse cache and the results cache (:mod:`gpuprof.trace.cache`): a second analysis
    of an unchanged trace with the same options loads no frames until they are asked for.

    Several rank traces are worked on in parallel: by up to ``workers`` local processes (most: one
    per CPU; 1 works in this process; default: one per CPU, or this process alone for a job of at
    most ``IN_PROCESS_MAX_BYTES``, where each rank is then loaded once), or on a Dask cluster
    (``dask``: a scheduler address, or ``"local"``). Unless ``keep_traces`` (default: only for a
    single trace), each rank is reduced where it is loaded to a small summary
    (:mod:`gpuprof.ranks`) and only those cross to this process, so memory here does not grow
    with the traces (past that bound); ``Analysis.ranks`` then loads the frames again on first
    use. ``progress(done, total, stage)``, when given, is called as ranks finish each stage
    ("loaded", "summarised", "analysed").

    The real step time is checked against the trace: ``step_ms`` that is not a finite positive
    number, or below the GPU's busy time per step (no step is shorter than its kernels; less
    ``WORK_TOLERANCE`` for timing noise; not checked without step markers), is a
    :class:`UsageError`; a run folder's recorded figure below it is reported in ``warnings`` and
    not used; either far above the traced step (``FAR_ABOVE_TRACED``) is warned of.

    Several traces are analysed as ranks of one job only when they look like one (see
    :func:`check_ranks`) or ``as_ranks`` says so; otherwise a :class:`UsageError` says why."""
    seq = [paths] if isinstance(paths, (str, Path)) else list(paths)
    folder, manifest = _manifest(seq)
    if step_ms is not None and not (math.isfinite(step_ms) and step_ms > 0):
        raise UsageError(f"--step-ms must be a finite positive number of milliseconds, got {step_ms:g}")
    recorded = manifest.get("unprofiled_step_ms")
    if not (isinstance(recorded, (int, float)) and math.isfinite(recorded) and recorded > 0):
        recorded = None
    real = step_ms if step_ms is not None else (float(recorded) if recorded is not None else None)
    # A run folder's own figure that is impossible is dropped as soon as the ranks' summaries show
    # it (before any analyzer runs): the analysis is then the one without a real step time.
    a = _analyze_real(seq, real, gpu, gpu_spec, analyzers, cache, workers, dask, keep_traces, progress, folder,
                      manifest, as_ranks, drop_impossible=step_ms is None)
    if real is None or any(p.meta.steps_source == "whole trace" for p in a.parts):
        return a  # without step markers the trace's one "step" is not the program's: nothing to compare
    busy = max(work_ms_per_step(p) for p in a.parts)
    traced = max(p.summary.step_time_ms for p in a.parts)
    if _impossible(a.parts, real):
        if step_ms is not None:
            raise UsageError(f"--step-ms {step_ms:g} is below the GPU's busy time per step in the trace "
                             f"({busy:.2f} ms, communication aside): no step can be shorter than its kernels; "
                             "give the step time measured without the profiler")
        return replace(a, notices=(f"the run's recorded unprofiled step time ({real:.2f} ms) is below the GPU's "
                                   f"busy time per step in the trace ({busy:.2f} ms, communication aside), so it "
                                   "cannot be right and is not used (pass --step-ms with the real step time)",))
    if real > FAR_ABOVE_TRACED * traced:
        what = "--step-ms" if step_ms is not None else "the run's recorded unprofiled step time"
        return replace(a, notices=(f"{what} ({real:.2f} ms) is {real / traced:.1f}x the traced step "
                                   f"({traced:.2f} ms); the profiler only adds time, so it is likely of another "
                                   "program or setting, or counts more than one step",))
    return a


def _impossible(parts: Sequence[RankPart], real: float | None) -> bool:
    """Whether a real step time is below the GPU's own work per step on some rank (see ``analyze``)."""
    if real is None or any(p.meta.steps_source == "whole trace" for p in parts):
        return False
    return real < max(work_ms_per_step(p) for p in parts) * (1.0 - WORK_TOLERANCE)


def _without_step(part: RankPart) -> RankPart:
    """``part`` as computed without a real step time (its profiler cost per event needs one)."""
    return replace(part, unprofiled_step_ms=None, event_cost_us=0.0)


def work_ms_per_step(part: RankPart) -> float:
    """The GPU's own work per step on one rank: time it ran kernels or copies other than
    communication. A real step cannot be shorter; exposed communication can (an NCCL kernel spins
    while it waits for a peer, longer under the profiler), so it is not counted."""
    b = part.summary.breakdown_pct
    return part.summary.step_time_ms * (100.0 - b["idle"] - b["communication"]) / 100.0


#: How far below the traced GPU work per step a real step time may be before it is impossible:
#: kernel times under the profiler run a little long (mlp_graph, a CUDA graph replay: 0.42 ms of
#: kernels per traced step, 0.41 ms per step without the profiler).
WORK_TOLERANCE = 0.05

#: A real step this many times the traced one is worth a warning: the profiler only makes steps
#: longer, and the unprofiled timings of sample_traces/ spread by up to 19 % run to run.
FAR_ABOVE_TRACED = 1.5


def _analyze_real(seq: list[str | Path], step_ms: float | None, gpu: str | None, gpu_spec: str | None,
                  analyzers: Sequence[str] | None, cache: bool, workers: int | None, dask: str | None,
                  keep_traces: bool | None, progress: Callable[[int, int, str], None] | None,
                  folder: Path | None, manifest: dict[str, Any], as_ranks: bool, drop_impossible: bool = False
                  ) -> Analysis:
    """:func:`analyze` with the real step time settled (``step_ms``, or None when unknown; with
    ``drop_impossible``, None as well where the ranks' summaries show it impossible)."""
    files = find_traces(seq)
    run_folder = str(folder) if folder is not None and len(seq) == 1 else None
    jobs = [Job(str(Path(f).resolve()), i, cache, gpu, gpu_spec, step_ms) for i, f in enumerate(files)]
    keep = len(jobs) == 1 if keep_traces is None else keep_traces
    samples, period, gpu_of = _run_nvml(folder, manifest)
    small = not dask and len(files) > 1 and job_bytes(files) <= IN_PROCESS_MAX_BYTES
    if small and workers is None:
        workers = 1  # worker processes would not pay (see IN_PROCESS_MAX_BYTES)
    resident = small and not keep and local_workers(len(jobs), workers) == 1
    with contextlib.ExitStack() as stack:
        if resident:  # each rank loaded once, its frames kept for the later passes
            stack.enter_context(ranks_resident())
        elif not keep and not cache and not dask:
            # Ranks are loaded again after their summary (findings): without the user's cache, a
            # private one for this call spares the second parse. Dask workers may be elsewhere: not there.
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="gpuprof-cache-"))
            jobs = [replace(j, cache=True, cache_root=tmp) for j in jobs]
        a = _analyze_jobs(jobs, keep, gpu, gpu_spec, analyzers, step_ms, workers, dask, manifest, samples,
                          period, gpu_of, whole_result_cache=keep_traces is None, progress=progress,
                          as_ranks=as_ranks or (len(seq) == 1 and bool(manifest.get("traces"))),
                          drop_impossible=drop_impossible)
    if not cache:  # loading again later (Analysis.ranks) must not look for the private cache
        a = replace(a, jobs=tuple(replace(j, cache=False, cache_root=None) for j in a.jobs))
    return replace(a, folder=run_folder)


def _analyze_jobs(jobs: list[Job], keep: bool, gpu: str | None, gpu_spec: str | None,
                  analyzers: Sequence[str] | None, step_ms: float | None, workers: int | None, dask: str | None,
                  manifest: dict[str, Any], samples: pd.DataFrame | None, period: float,
                  gpu_of: dict[int, int], whole_result_cache: bool = False,
                  progress: Callable[[int, int, str], None] | None = None, as_ranks: bool = True,
                  drop_impossible: bool = False) -> Analysis:
    from gpuprof.analyzers import contributions_in_memory, distributed, findings_of, select
    from gpuprof.trace import cache as pcache

    SingleResult = _single_result_type()
    result_key = None
    single: tuple[Any, ...] = ()
    if whole_result_cache and keep and len(jobs) == 1:  # one trace: a hit skips loading it at all
        single = ("single", tuple(analyzers) if analyzers is not None else None, digest(samples),
                  tuple(sorted(gpu_of.items())), period)
        result_key = job_key(jobs[0], *single)
        hit = pcache.get_result(result_key, SingleResult) if result_key else None
        if hit is not None:
            parts_hit, spec_hit, contribs_hit, figures = hit
            _, skipped_hit = select(parts_hit, spec_hit, analyzers)
            fixes, notes = _findings(findings_of(parts_hit, contribs_hit))
            return Analysis(parts=parts_hit, spec=spec_hit, findings=fixes, notes=notes,
                            skipped=tuple(skipped_hit), run=manifest, jobs=tuple(jobs), replayed=figures,
                            replay_cache=(jobs[0], single, contribs_hit) if figures is None else None)
    with _Exec(len(jobs), workers, dask, progress) as ex:
        if keep:
            traces = ex.map(_trace_job, jobs, stage="loaded")
            metas = [t.meta for t in traces]
        else:
            firsts = ex.map(part_job, jobs, stage="summarised")
            metas = [p.meta for p, _ in firsts]
        if not as_ranks:
            check_ranks(metas, [t.steps for t in traces] if keep else [p.steps for p, _ in firsts])
        ranks = [m.rank for m in metas]
        if len(set(ranks)) != len(ranks):  # e.g. several single-GPU traces: keep them apart by order
            jobs = [j if i == 0 else replace(j, rank=i) for i, j in enumerate(jobs)]
            metas = [m if i == 0 else replace(m, rank=i) for i, m in enumerate(metas)]
        order = sorted(range(len(jobs)), key=lambda i: metas[i].rank)
        jobs = [jobs[i] for i in order]
        spec = resolve([d for m in metas for d in m.device_properties], gpu=gpu, spec_file=gpu_spec)
        if keep:
            results = []
            for i in order:
                t = traces[i] if traces[i].meta.rank == metas[i].rank else with_rank(traces[i], metas[i].rank)
                results.append(result_of(t, spec, step_ms, _rank_samples(t.meta, t.steps, samples, gpu_of), period))
            key_job = jobs[0]  # (the results are filed under the options asked for)
            parts = tuple(part_of(r) for r in results)
            if drop_impossible and _impossible(parts, step_ms):
                results = [replace(r, unprofiled_step_ms=None) for r in results]
                parts = tuple(_without_step(p) for p in parts)
                jobs = [replace(j, step_ms=None) for j in jobs]
            base = Analysis(parts=parts, spec=spec, run=manifest, jobs=tuple(jobs), results=tuple(results))
            contribs, skipped = contributions_in_memory(base, only=analyzers)
            content = traces[0].meta.content_key
            store_key = job_key(key_job, *single, content=content) if result_key and content else None
            if store_key is not None:  # filed under the bytes it was computed from
                pcache.put_result(store_key, (base.parts, spec, contribs, None), SingleResult)
            fixes, notes = _findings(findings_of(base.parts, contribs))
            return replace(base, findings=fixes, notes=notes, skipped=tuple(skipped),
                           replay_cache=(key_job, single, contribs) if store_key is not None else None)
        parts = tuple(replace(firsts[i][0], meta=metas[i],
                              collectives=firsts[i][0].collectives.assign(rank=metas[i].rank),
                              nvml=_rank_samples(metas[i], firsts[i][0].steps, samples, gpu_of), nvml_period_s=period)
                      for i in order)
        if drop_impossible and _impossible(parts, step_ms):
            parts = tuple(_without_step(p) for p in parts)
            jobs = [replace(j, step_ms=None) for j in jobs]
        active, skipped = select(parts, spec, analyzers)
        names = [a.name for a in active]
        job_of = {p.rank: j for p, j in zip(parts, jobs)}
        cross = distributed.plan(parts, lambda slow, waits, waiting: ex.call(slow_job, job_of[slow], waits, waiting),
                                 names, replay=lambda cats: _job_replay(ex, jobs, step_ms, cats))
        done = ex.map(findings_job, jobs, parts, [names] * len(parts), [cross.get(p.rank, []) for p in parts],
                      stage="analysed")
        contribs = [c for c, _ in done]
        # loaded here and still held: kept for the views (their claims were kept with the traces)
        frames = kept_ranks(jobs, parts)
    fixes, notes = _findings(findings_of(parts, [c for cs in contribs for c in cs]))
    return Analysis(parts=parts, spec=spec, findings=fixes, notes=notes, skipped=tuple(skipped), run=manifest,
                    jobs=tuple(jobs), frames=frames, rank_replay_ms=tuple(x for _, x in done))


#: The summary's replayed figures as the results cache holds them (None: not computed yet).
ReplayFigures = dict[str, float | list[str] | None] | None


def _single_result_type() -> Any:
    from gpuprof.analyzers._base import Contribution

    return tuple[tuple[RankPart, ...], GpuSpec | None, list[Contribution], ReplayFigures]


def _findings(ranked: list[Finding]) -> tuple[tuple[Finding, ...], tuple[Finding, ...]]:
    """The ranked findings as (fixes, notes): notes are those that save nothing measurable."""
    from gpuprof.analyzers import split_notes

    fixes, notes = split_notes(ranked)
    return tuple(fixes), tuple(notes)


def check_ranks(metas: Sequence[TraceMeta], steps: Sequence[pd.DataFrame]) -> None:
    """Refuse traces that do not look like the ranks of one job: a file given twice, traces
    without ``distributedInfo`` (torch.distributed was not running), ranks that repeat or do not
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

    paths = [str(Path(m.path).resolve()) for m in metas]
    if len(set(paths)) != len(paths):
        refuse("the same trace file is given more than once")
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


def _manifest(paths: Sequence[str | Path]) -> tuple[Path | None, dict[str, Any]]:
    """The first run folder among ``paths`` and its manifest (checked; see :func:`run_manifest`)."""
    for p in paths:
        if Path(p).is_dir():
            doc, _ = run_manifest(Path(p))
            if doc is not None:
                return Path(p), doc
    return None, {}


def _sample_period(samples: pd.DataFrame) -> float | None:
    """Seconds between one GPU's samples (median), for a run whose manifest does not say."""
    ts = pd.to_numeric(samples["ts_ns"], errors="coerce")
    gaps = ts.groupby(samples["gpu"]).diff().dropna()
    gaps = gaps[gaps > 0]
    return float(gaps.median()) / 1e9 if len(gaps) else None


def _run_nvml(folder: Path | None, doc: dict[str, Any]) -> tuple[pd.DataFrame | None, float, dict[int, int]]:
    """NVML samples of a run folder, the sampling period, and each rank's physical GPU index
    (the manifest's types were checked by :func:`run_manifest`)."""
    from gpuprof.nvml_data import load_csv

    nv = doc.get("nvml") or {}
    if folder is None or not nv.get("path"):
        return None, 0.05, {}
    path = _inside(folder, nv["path"], folder / "manifest.json", "nvml.path")
    if not path.is_file():
        return None, 0.05, {}
    gpu_of = {}
    for r in doc.get("ranks", []):
        dev, vis = r.get("cuda_device"), r.get("cuda_visible_devices")
        if isinstance(dev, int):
            ids = [x for x in str(vis).split(",") if x.strip().isdigit()] if vis else []
            gpu_of[int(r.get("rank") or 0)] = int(ids[dev]) if dev < len(ids) else dev
    samples = load_csv(path, inside=folder)
    hz = nv.get("hz")
    period = 1.0 / float(hz) if hz else (_sample_period(samples) or 0.05)
    return samples, period, gpu_of


def _rank_samples(meta: TraceMeta, steps: pd.DataFrame, samples: pd.DataFrame | None,
                  gpu_of: dict[int, int]) -> pd.DataFrame | None:
    if samples is None or steps.empty:
        return None
    gpu = gpu_of.get(meta.rank, meta.rank)
    start = meta.t0_epoch_ns + int(steps["start"].min() * 1000)
    end = meta.t0_epoch_ns + int(steps["end"].max() * 1000)
    w = samples[samples["gpu"] == gpu]
    return w.assign(rank=meta.rank, in_window=(w["ts_ns"] >= start) & (w["ts_ns"] <= end))


__all__ = ["Analysis", "GpuprofError", "RankResult", "analyze", "find_traces"]
