"""The run folder's ``manifest.json``: what was run, where the traces are, what went wrong.

Schema (``schema_version`` 1): command, cwd, start_ns/end_ns (Unix ns), exit_code, signal, host,
gpus [{index, name, uuid, driver}], torch, cuda, world_size, profiler {schedule, record_shapes,
with_stack, skip_steps, timed_steps, teardown_cupti {value, set_by}}, traces [{rank (absent when the process had none), pid, path}],
unprofiled_step_ms (mean over ranks of the step time measured outside the profiled window),
unprofiled_timing {method: "cuda_events" (the GPU timeline, one CUDA event at each end of the
timed window) | "host_clock" (programs that do not use CUDA) | null (not timed), why, ranks},
unprofiled_input_wait_ms (mean over ranks of the host time per step, over the same steps, that the
training loop's thread spent inside DataLoader ``__next__`` calls; absent where no rank iterated a
DataLoader: gpuprof.steptime prices the waits the profiled steps missed),
after_profiling_step_ms (mean over ranks of the step time measured in the steps after the profiler
stopped: the same as unprofiled_step_ms when the profiler left the program as it found it),
ranks [per-rank records, one per process that stepped, each named by its ``name``],
processes_without_steps [{pid, program}] (only when no process stepped), nvml {path, hz,
samples, metrics, unavailable}, failures [str].
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from gpuprof.redact import redact_manifest

SCHEMA_VERSION = 1
META_GLOB = "*.meta.json"  # one per process that stepped: rank{R}, pid{PID}, rank{R}.pid{PID} (hook._claim)
PROCS_DIR = ".procs"  # notes from processes that imported torch but never stepped (read, then removed)


def write_json_atomic(path: Path, doc: dict[str, Any]) -> None:
    """Write JSON so that a reader never sees half a file (write, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _record(p: Path, run_dir: Path) -> Any:
    """A JSON record of the run folder, read the one way gpuprof reads files (a regular file inside
    the folder, bounded: :func:`gpuprof.files.read`); a FIFO, a device or a link out of the folder
    is refused, never read."""
    from gpuprof import files

    return json.loads(files.read(p, inside=run_dir, max_bytes=files.SMALL_FILE_BYTES).decode("utf-8"))


def collect_ranks(run_dir: Path) -> list[dict[str, Any]]:
    from gpuprof.errors import GpuprofError

    out = []
    for p in sorted((run_dir / "traces").glob(META_GLOB)):
        try:
            rec = _record(p, run_dir)
            out.append(rec if isinstance(rec, dict) else {"meta_file": p.name, "error": "unreadable rank record"})
        except (OSError, ValueError, RecursionError, GpuprofError) as e:
            why = str(e).split(": ", 1)[-1] if isinstance(e, GpuprofError) else "unreadable rank record"
            out.append({"meta_file": p.name, "error": why})
    return out


def collect_idle(run_dir: Path) -> list[dict[str, Any]]:
    """Notes of the processes that imported torch without stepping; the folder is then removed
    (it holds only these notes, which the launcher asked the processes to write)."""
    d = run_dir / PROCS_DIR
    out = []
    from gpuprof.errors import GpuprofError

    for p in sorted(d.glob("pid*.json")) if d.is_dir() else []:
        try:
            rec = _record(p, run_dir)
            if isinstance(rec, dict):
                out.append(rec)
            p.unlink()
        except (OSError, ValueError, RecursionError, GpuprofError):
            pass
    with contextlib.suppress(OSError):
        d.rmdir()
    return out


def _who(r: dict[str, Any]) -> str:
    return f"rank {r['rank']}" if isinstance(r.get("rank"), int) else f"pid {r.get('pid')}"


def _no_steps(idle: list[dict[str, Any]]) -> str:
    if not idle:
        return ("no process of the program imported torch, so there was nothing to profile (a program that "
                "resets PYTHONPATH, or runs python with -I or -E, does not load gpuprof's bootstrap)")
    procs = ", ".join(f"{p.get('program') or '?'} (pid {p.get('pid')})" for p in idle[:4])
    procs += f" and {len(idle) - 4} more" if len(idle) > 4 else ""
    own = next((p["own_profiler"]["what"] for p in idle if isinstance(p.get("own_profiler"), dict)), None)
    if own:
        return (f"torch was imported by {procs}, which ran its own profiler ({own}) and never stepped an "
                f"optimizer; gpuprof stood aside")
    return (f"torch was imported by {procs}, but no step was seen: the program never called step() on a "
            f"torch.optim optimizer. In a loop without one, call gpuprof.step() at the end of each step "
            f"(import gpuprof; it does nothing outside gpuprof record)")


def build(run_dir: Path, base: dict[str, Any], ranks: list[dict[str, Any]],
          idle: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The manifest from the parent's own facts, the ranks' records and the idle processes' notes."""
    traces = []
    failures = list(base.get("failures", []))
    stood_aside = []
    for r in ranks:
        failures.extend(f"{_who(r)}: {e}" for e in r.get("failures", []))
        own = r.get("own_profiler")
        if r.get("status") == "stood_aside" and isinstance(own, dict):
            stood_aside.append(r)
            failures.append(f"{_who(r)}: the program ran its own profiler ({own.get('what')}, entered at step "
                            f"{own.get('at_step')}); gpuprof stood aside so that it works as without gpuprof: "
                            f"no gpuprof trace from this process (report the program's own trace instead)")
        t = r.get("trace")  # the first cycle's (later cycles are listed in the rank's record)
        if t and (run_dir / t).is_file():
            entry = {"rank": r["rank"]} if isinstance(r.get("rank"), int) else {}
            traces.append({**entry, "pid": r.get("pid"), "path": t})
        elif t:
            failures.append(f"{_who(r)}: trace {t} missing")
    timed = [r["unprofiled_step_ms"] for r in ranks if isinstance(r.get("unprofiled_step_ms"), (int, float))]
    methods = sorted({str((r.get("unprofiled_timing") or {}).get("method")) for r in ranks
                      if isinstance(r.get("unprofiled_step_ms"), (int, float))})
    why = next(((r.get("unprofiled_timing") or {}).get("why") for r in ranks
                if (r.get("unprofiled_timing") or {}).get("why")), None)
    waits: list[Any] = [(r.get("unprofiled_timing") or {}).get("loader_wait_ms") for r in ranks
                        if isinstance(r.get("unprofiled_step_ms"), (int, float))]
    after = [r["after_profiling_step_ms"] for r in ranks if isinstance(r.get("after_profiling_step_ms"), (int, float))]
    first = next((r for r in ranks if r.get("torch")), {})
    if not ranks:
        failures.append(_no_steps(idle or []))
    elif not traces and len(stood_aside) < len(ranks):
        failures.append("no trace written (see the rank notes above)")
    doc = {
        "schema_version": SCHEMA_VERSION,
        **{k: v for k, v in base.items() if k != "failures"},
        "torch": first.get("torch"), "cuda": first.get("cuda"),
        "world_size": max([r.get("world_size", 1) for r in ranks] or [1]),
        # by rank, a rank's first claimant first; processes without a rank after, by pid
        "traces": sorted(traces, key=lambda t: ("rank" not in t, t.get("rank", 0), ".pid" in t["path"],
                                                t.get("pid") or 0, t["path"])),
        "unprofiled_step_ms": sum(timed) / len(timed) if timed else None,
        "unprofiled_timing": {"method": methods[0] if len(methods) == 1 else (methods or None), "why": why,
                              "ranks": len(timed)},
        **({"unprofiled_input_wait_ms": float(sum(waits)) / len(waits)}
           if waits and all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in waits) else {}),
        "after_profiling_step_ms": sum(after) / len(after) if after else None,
        "ranks": ranks,
        "failures": failures,
    }
    if not ranks:
        doc["processes_without_steps"] = [{"pid": p.get("pid"), "program": p.get("program")} for p in idle or []]
    return redact_manifest(doc)
