"""Annotated traces: the same Kineto trace with gpuprof's results as events Perfetto and
chrome://tracing show in place, on a process of its own named "gpuprof".

Formats :func:`gpuprof.views.annotation_data` and computes nothing new. The tracks are:

* ``roofline class · stream S``: one span per kernel of stream S, named by its class (compute,
  memory, latency, unknown, communication), with the bound, % of roofline, TFLOP/s and GB/s as args;
* ``#N <finding id> · stream S`` (or ``· idle gaps``): one span per kernel, copy or idle gap
  the finding claims, named by the finding's id and its saving per step, with the title, the
  item and the µs it counts there as args.

Items of one stream never overlap, so each track holds properly nested (flat) spans. The
original events are written back byte for byte (each decoded as raw JSON and re-emitted), so
every tool that read the trace reads it the same way; the new events use category ``gpuprof``,
which Kineto readers (HTA, gpuprof's loader) do not bucket as CPU or GPU activity.
"""

from __future__ import annotations

import gzip
import io
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

CATEGORY = "gpuprof"
#: The name of a kernel span outside the profiled steps (warm-up, the profiler's flush), which
#: gpuprof does not analyse: never "unknown", which names a kernel without a cost model.
OUTSIDE = "outside steps"
_CLASS_TID = 1  # roofline-class tracks are tids 1..; findings' tracks start at _FINDING_TID
_FINDING_TID = 1000


class _Top(msgspec.Struct):
    traceEvents: list[msgspec.Raw] = []
    baseTimeNanoseconds: Any = None


def origin_us(t0_epoch_ns: int, base_ns: int | None) -> float:
    """What to add to a gpuprof time (µs since the rank's origin) to get the file's ``ts``."""
    return (t0_epoch_ns - base_ns) / 1000.0 if base_ns is not None else t0_epoch_ns / 1000.0


def _pid(events: list[msgspec.Raw]) -> int:
    """A pid no event of the trace uses (Kineto pids are process ids, or device ids for GPUs)."""
    class _Pid(msgspec.Struct):
        pid: Any = None

    pids = msgspec.json.decode(b"[" + b",".join(events) + b"]", type=list[_Pid]) if events else []
    used = [p.pid for p in pids if isinstance(p.pid, int)]
    return max(used, default=0) + 1


def _meta(pid: int, tid: int | None, name: str, value: Any) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "M", "name": name, "pid": pid, "args": {"name" if "name" in name else "sort_index": value}}
    if tid is not None:
        ev["tid"] = tid
    return ev


def _r(x: np.ndarray) -> list[float]:
    return [float(v) for v in np.round(x, 3)]


def annotation_events(rank: dict[str, Any], origin: float, pid: int) -> list[dict[str, Any]]:
    """The events added to one rank's trace (see the module docstring)."""
    out: list[dict[str, Any]] = [_meta(pid, None, "process_name", "gpuprof"),
                                 _meta(pid, None, "process_sort_index", -1),
                                 {"ph": "M", "name": "process_labels", "pid": pid,
                                  "args": {"labels": "roofline classes and findings' claims"}}]
    k = rank["kernels"]
    streams = sorted({(int(d), int(s)) for d, s in zip(k["device"].to_numpy(), k["stream"].to_numpy())})
    for i, (dev, stream) in enumerate(streams):
        tid = _CLASS_TID + i
        out += [_meta(pid, tid, "thread_name", f"roofline class · GPU {dev} stream {stream}"),
                _meta(pid, tid, "thread_sort_index", tid)]
        sel = k[(k["device"] == dev) & (k["stream"] == stream)]
        ts, dur = _r(sel["ts"].to_numpy() + origin), _r(sel["dur"].to_numpy())
        pct, tf, gb = (sel[c].to_numpy(dtype=float) for c in ("roofline_pct", "achieved_tflops", "achieved_gbps"))
        inside = sel["step"].to_numpy() >= 0 if "step" in sel else np.ones(len(sel), dtype=bool)
        for j, cls in enumerate(sel["cls"].astype(str).to_numpy()):
            if not inside[j]:  # before the first step or after the last: not analysed, not "unknown"
                out.append({"ph": "X", "cat": CATEGORY, "name": OUTSIDE, "pid": pid, "tid": tid, "ts": ts[j],
                            "dur": dur[j], "args": {"why": "outside the profiled steps: gpuprof analyses the steps"}})
                continue
            args: dict[str, Any] = {"bound": cls}
            for key, v in (("roofline_pct", pct[j]), ("achieved_tflops", tf[j]), ("achieved_gbps", gb[j])):
                if np.isfinite(v):
                    args[key] = round(float(v), 2)
            out.append({"ph": "X", "cat": CATEGORY, "name": cls, "pid": pid, "tid": tid, "ts": ts[j], "dur": dur[j],
                        "args": args})
    c = rank["claims"]
    tid = _FINDING_TID
    for f in rank["findings"]:
        mine = c[c["finding"] == f["id"]]
        label = f"{f['id']} · saves {f['saving_ms']:.2f} ms/step"
        for stream in sorted(set(mine["stream"].astype(int))):
            sel = mine[mine["stream"] == stream]
            where = "idle gaps" if stream < 0 else f"stream {stream}"
            out += [_meta(pid, tid, "thread_name", f"#{f['order']} {f['id']} · {where}"),
                    _meta(pid, tid, "thread_sort_index", tid)]
            ts = _r(sel["ts"].to_numpy() + origin)
            dur = _r(sel["end"].to_numpy() - sel["ts"].to_numpy())
            saved = _r(sel["saved_us"].to_numpy())
            for j, (kind, name) in enumerate(zip(sel["kind"].to_numpy(), sel["name"].to_numpy())):
                out.append({"ph": "X", "cat": CATEGORY, "name": label, "pid": pid, "tid": tid, "ts": ts[j],
                            "dur": dur[j], "args": {
                                "finding": f["id"], "title": f["title"], "rank_in_report": f["order"],
                                "saving_ms_per_step": round(float(f["saving_ms"]), 4),
                                "saving_pct": round(float(f["saving_pct"]), 2), "confidence": f["confidence"],
                                "item": str(kind), "item_name": str(name), "counted_us": saved[j]}})
            tid += 1
    return out


def annotated_bytes(rank: dict[str, Any], gzipped: bool) -> tuple[bytes, int]:
    """``rank['path']``'s trace with the annotation events added, as the bytes of a file (gzip
    when ``gzipped``), and how many events were added. Writing them is the caller's
    (:func:`gpuprof.files.write_new`: never over an input)."""
    from gpuprof.trace.load import read_bytes

    data = read_bytes(Path(rank["path"]))
    enc = msgspec.json.Encoder()
    if data.lstrip()[:1] == b"[":  # a bare array of events (torch 1.8, Jan 2021): it stays one
        raw = msgspec.json.decode(data, type=list[msgspec.Raw])
        added = annotation_events(rank, origin_us(int(rank["t0_epoch_ns"]), None), _pid(raw))
        body = b"[" + b",".join([*raw, *(enc.encode(e) for e in added)]) + b"]"
        del data, raw
    else:
        top = msgspec.json.decode(data, type=_Top)
        doc = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
        origin = origin_us(int(rank["t0_epoch_ns"]), top.baseTimeNanoseconds
                           if isinstance(top.baseTimeNanoseconds, int) else None)
        added = annotation_events(rank, origin, _pid(top.traceEvents))
        events = b"[" + b",".join([*top.traceEvents, *(enc.encode(e) for e in added)]) + b"]"
        doc["traceEvents"] = msgspec.Raw(events)
        body = enc.encode(doc)
        del data, top, events
    if gzipped:
        sink = io.BytesIO()
        with gzip.GzipFile(fileobj=sink, mode="wb", compresslevel=6, mtime=0) as z:
            z.write(body)
        body = sink.getvalue()
    return body, len(added)
