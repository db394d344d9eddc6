"""Run folders (``gpuprof record``'s ``manifest.json``, ``traces/``, ``nvml.csv``) and the trace
files a user names: which files to analyse, the manifest's fields type-checked, the NVML samples
and which of them belong to each rank.

A path is a Kineto trace file (``.json`` or ``.json.gz``), a folder of per-rank trace files, or a
run folder (it has a ``manifest.json``; one whose recorder was killed before writing it is read
from what it left in ``traces/``). Everything a manifest names must stay inside its folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpuprof import cache_keys
from gpuprof.errors import TraceError
from gpuprof.trace.model import TraceMeta

TRACE_SUFFIXES = cache_keys.TRACE_SUFFIXES


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


def manifest_number(v: Any) -> float | None:
    """A manifest's value as a finite float, else None: manifests are user data, and a string, a
    boolean, NaN or an integer too large for a float is no number."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if np.isfinite(f) else None


def _number(doc: dict[str, Any], key: str, manifest: Path, fld: str, positive: bool = True) -> float | None:
    v = doc.get(key)
    if v is None:
        return None
    f = manifest_number(v)
    if f is None or (positive and not f > 0):
        raise _bad_field(manifest, fld, "a positive number" if positive else "a number", v)
    return f


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


def _positive(v: Any) -> bool:
    f = manifest_number(v)
    return f is not None and f > 0


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
    timed = [float(r["unprofiled_step_ms"]) for r in ranks if _positive(r.get("unprofiled_step_ms"))]
    doc: dict[str, Any] = {"traces": traces, "ranks": ranks, "rebuilt": "no manifest.json",
                           "unprofiled_step_ms": float(np.mean(timed)) if timed else None}
    waits: list[float] = []
    for r in ranks:  # as the recorder's manifest has it: where every timed rank measured its waits
        t = r.get("unprofiled_timing")
        if not _positive(r.get("unprofiled_step_ms")):
            continue  # the ranks `timed` counts, no other
        w = t.get("loader_wait_ms") if isinstance(t, dict) else None
        f = manifest_number(w)
        if f is not None and f >= 0:
            waits.append(f)
    if timed and len(waits) == len(timed):
        doc["unprofiled_input_wait_ms"] = float(np.mean(waits))
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


#: A file in a plain folder is read here, to tell a small JSON file that is not a trace (a config,
#: metrics, a timing record beside a tensorboard log dir's traces) from a trace, only up to this
#: size on disk; anything larger is a trace to the loader, which says what is wrong with it.
SNIFF_MAX_BYTES = 1 << 20


def _not_a_trace(p: Path) -> str | None:
    """Why ``p``, a JSON file found in a plain folder, is no trace: a small file that parses as JSON
    but holds neither a ``traceEvents`` list nor an event array. None when it may be one: it is
    large, or unreadable, or not valid JSON (a damaged trace is an error, never skipped)."""
    import msgspec

    from gpuprof.files import read

    try:
        if p.stat().st_size > SNIFF_MAX_BYTES:
            return None
        doc = msgspec.json.decode(read(p, max_bytes=SNIFF_MAX_BYTES))
    except (OSError, TraceError, msgspec.DecodeError, RecursionError):
        return None
    if isinstance(doc, list) or (isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)):
        return None
    return "JSON without 'traceEvents'" if isinstance(doc, dict) else f"a JSON {type(doc).__name__}, not a trace"


def find_traces(paths: Sequence[str | Path]) -> list[Path]:
    """Trace files named by ``paths`` (see :func:`list_traces`)."""
    return list_traces(paths)[0]


def list_traces(paths: Sequence[str | Path]) -> tuple[list[Path], list[str]]:
    """Trace files named by ``paths``: files as given; folders by manifest, else every trace file;
    and a line for each plain folder that holds JSON files that are no traces (see
    :func:`_not_a_trace`), naming those, which are left out.

    Each file once: a trace is one rank, so a file named twice (listed twice in a manifest, given
    twice, or reached again through a link or a hard link) is refused in one line rather than
    reported as several ranks."""
    out: list[Path] = []
    skipped: list[str] = []
    named: list[tuple[str, Path]] = []  # how each file was named, for the error: (label, where)
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise TraceError("no such file or folder", str(p))
        if p.is_file():
            out.append(p)
            named.append((str(p), p))
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
            where = manifest if manifest.is_file() else p
            named.extend((f"traces[{i}].path ({t.get('path')!r})" if manifest.is_file() else str(f), where)
                         for i, (t, f) in enumerate(zip(doc["traces"], listed)))
            continue
        found = sorted(f for f in p.iterdir() if _is_trace_name(f))
        why = {f: _not_a_trace(f) for f in found}
        left = sorted((f.name, w) for f, w in why.items() if w)
        found = [f for f in found if not why[f]]
        if not found:
            raise TraceError("folder holds no trace files (*.json, *.json.gz)"
                             + (f"; not traces: {_listed(left)}" if left else ""), str(p))
        if left:
            skipped.append(f"{p}: left out {len(left)} file{'s' if len(left) > 1 else ''} that "
                           f"{'are' if len(left) > 1 else 'is'} not a trace: {_listed(left)}")
        out.extend(found)
        named.extend((str(f), f) for f in found)
    _each_once(out, named)
    return out, skipped


def _listed(left: list[tuple[str, str]], most: int = 5) -> str:
    shown = ", ".join(f"{n!r} ({w})" for n, w in left[:most])
    return shown + (f" and {len(left) - most} more" if len(left) > most else "")


def _each_once(found: list[Path], named: list[tuple[str, Path]]) -> None:
    """Refuse a file found twice (same device and inode: another spelling, a link, a hard link)."""
    seen: dict[tuple[int, int], int] = {}
    for i, f in enumerate(found):
        try:
            st = f.stat()
        except OSError:
            continue  # loading it says what is wrong
        j = seen.setdefault((st.st_dev, st.st_ino), i)
        if j == i:
            continue
        (first, _), (label, where) = named[j], named[i]
        if where.name == "manifest.json" and named[j][1] == where:
            raise TraceError(f"the run manifest lists one trace file twice, {first} and {label}: each trace is one "
                             "rank, listed once", str(where))
        raise TraceError(f"is the same trace file as {first}: each trace is one rank, named once", label)


def manifest_of(paths: Sequence[str | Path]) -> tuple[Path | None, dict[str, Any]]:
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


def run_nvml(folder: Path | None, doc: dict[str, Any]) -> tuple[pd.DataFrame | None, float, dict[int, int]]:
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


def rank_samples(meta: TraceMeta, steps: pd.DataFrame, samples: pd.DataFrame | None,
                  gpu_of: dict[int, int]) -> pd.DataFrame | None:
    if samples is None or steps.empty:
        return None
    gpu = gpu_of.get(meta.rank, meta.rank)
    start = meta.t0_epoch_ns + int(steps["start"].min() * 1000)
    end = meta.t0_epoch_ns + int(steps["end"].max() * 1000)
    w = samples[samples["gpu"] == gpu]
    return w.assign(rank=meta.rank, in_window=(w["ts_ns"] >= start) & (w["ts_ns"] <= end))
