"""The run folder's ``manifest.json``: what was run, where the traces are, what went wrong.

Schema (``schema_version`` 1): command, cwd, start_ns/end_ns (Unix ns), exit_code, signal, host,
gpus [{index, name, uuid, driver}], torch, cuda, world_size, profiler {schedule, record_shapes,
with_stack, skip_steps, timed_steps}, traces [{rank, path}], unprofiled_step_ms (mean over ranks
of the step time measured outside the profiled window), ranks [per-rank records], nvml {path, hz,
samples, metrics, unavailable}, failures [str].
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpuprof.redact import redact_manifest

SCHEMA_VERSION = 1
RANK_FILE = "rank{rank}.meta.json"


def write_json_atomic(path: Path, doc: dict[str, Any]) -> None:
    """Write JSON so that a reader never sees half a file (write, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def collect_ranks(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for p in sorted((run_dir / "traces").glob("rank*.meta.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            out.append({"meta_file": p.name, "error": "unreadable rank record"})
    return out


def build(run_dir: Path, base: dict[str, Any], ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest from the parent's own facts and the ranks' records."""
    traces = []
    failures = list(base.get("failures", []))
    for r in ranks:
        failures.extend(f"rank {r.get('rank')}: {e}" for e in r.get("failures", []))
        t = r.get("trace")
        if t and (run_dir / t).is_file():
            traces.append({"rank": r.get("rank", 0), "path": t})
        elif t:
            failures.append(f"rank {r.get('rank')}: trace {t} missing")
    timed = [r["unprofiled_step_ms"] for r in ranks if isinstance(r.get("unprofiled_step_ms"), (int, float))]
    first = next((r for r in ranks if r.get("torch")), {})
    if not ranks:
        failures.append("no process reported in: torch was never imported, or the program ended first")
    elif not traces:
        failures.append("no trace written (see the rank notes above)")
    return redact_manifest({
        "schema_version": SCHEMA_VERSION,
        **{k: v for k, v in base.items() if k != "failures"},
        "torch": first.get("torch"), "cuda": first.get("cuda"),
        "world_size": max([r.get("world_size", 1) for r in ranks] or [1]),
        "traces": sorted(traces, key=lambda t: t["rank"]),
        "unprofiled_step_ms": sum(timed) / len(timed) if timed else None,
        "ranks": ranks,
        "failures": failures,
    })
