"""The native path of the trace loader: the events scanned to columns in C
(:mod:`gpuprof.trace.columnar`), then cut into buckets with numpy (:func:`from_columns`), to the
columns the msgspec path (:mod:`gpuprof.trace.chunks`) builds, value for value.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpuprof.trace import columnar
from gpuprof.trace.kineto import (ANNOTATIONS, BUCKET_NAMES, BUCKET_OF, BUCKETS, CAT_CODE, MAX_ABS_TS_US, MAX_DUR_US,
                                  OPS, RECORD_FUNCTIONS, Parts, to_int64)

#: Fields each bucket's columns read (``[memory]`` instants as a bucket of their own): an event of
#: that bucket with a value its column cannot hold in one of them (``columnar.Scanned.rare``) sends
#: the file to the msgspec path, whose chunk-wise conversions give such values their meaning.
_READS = {
    "kernels": ("ts", "dur", "pid", "device", "stream", "correlation", "external_id", "external_id_lc", "grid",
                "block", "registers", "shared_memory", "occupancy", "in_msg_nelems", "out_msg_nelems",
                "group_size", "seq"),
    "memcpys": ("ts", "dur", "pid", "device", "stream", "correlation", "external_id", "external_id_lc", "bytes"),
    "ops": ("ts", "dur", "pid", "tid", "external_id", "external_id_lc", "sequence_number", "fwd_thread_id"),
    "runtime": ("ts", "dur", "pid", "tid", "correlation", "external_id", "external_id_lc"),
    "annotations": ("ts", "dur", "pid", "tid", "device", "stream", "external_id", "external_id_lc"),
    "python": ("ts", "dur", "tid"),
    "memory": ("ts", "alloc_bytes", "total_allocated", "total_reserved", "device_id", "device_type", "pid", "tid"),
}
#: Per bucket code (``BUCKET_NAMES`` order, then ``[memory]``, then no bucket) the rare bits it reads.
_READ_BITS = np.array([sum(columnar.RARE_BITS.get(f, 0) for f in _READS[b]) for b in BUCKET_NAMES]
                      + [sum(columnar.RARE_BITS.get(f, 0) for f in _READS["memory"]), 0], dtype=np.uint32)


def _objects(values: Any, n: int) -> np.ndarray:
    """A 1-d object array of ``n`` values, then None (so id -1 reads None)."""
    out = np.empty(n + 1, dtype=object)
    out[:n] = values if isinstance(values, np.ndarray) else np.fromiter(values, dtype=object, count=n)
    out[n] = None
    return out


def from_columns(box: list[bytes]) -> Parts | None:
    """The native path: the events scanned to columns in C (:mod:`gpuprof.trace.columnar`), then
    cut into buckets with numpy: the columns :func:`from_chunks` builds, value for value, or None
    where this path does not apply (then :func:`from_chunks` loads the file, and words its errors).

    ``box`` holds the file's bytes; it is emptied once this path can no longer give up, so that the
    buffer is freed before the columns are built (else it would set the peak: 760 vs 730 MB at 300 MB)."""
    s = columnar.scan(box[0])
    if s is None:
        return None
    head = s.head
    index: dict[str, int] = {}  # each distinct name (raw texts that decode alike are one name)
    sid = np.fromiter((index.setdefault(n, len(index)) for n in s.names), dtype=np.int64, count=len(s.names))[s.name]
    distinct = list(index)
    cats = s.cat.astype(np.int64)
    bucket = BUCKET_OF[cats]
    bucket[s.ph != 1] = -1
    recorded = np.fromiter((u.startswith(RECORD_FUNCTIONS) for u in distinct), dtype=bool, count=len(distinct))
    if recorded.any():
        bucket[(bucket == OPS) & recorded[sid]] = ANNOTATIONS
    is_memory = np.fromiter((u == "[memory]" for u in distinct), dtype=bool, count=len(distinct))
    memory_rows = is_memory[sid] & (s.ph == 2) & (bucket < 0)
    kind = np.where(bucket >= 0, bucket, len(BUCKET_NAMES) + 1)
    kind[memory_rows] = len(BUCKET_NAMES)
    if (s.rare & _READ_BITS[kind]).any():
        return None
    timed = (bucket >= 0) & (bucket != BUCKET_NAMES.index("python"))  # python frames: no time check
    dur_all = s.num["dur"]
    dur_all = np.where(np.isfinite(dur_all) & (dur_all > 0), dur_all, 0.0)
    if not ((np.abs(s.num["ts"][timed]) < MAX_ABS_TS_US).all() and (dur_all[timed] < MAX_DUR_US).all()):
        return None  # a time no profiler writes: refused by the msgspec path, in its words and chunk order
    del dur_all, timed
    box.clear()  # no way back to the msgspec path from here: the file's buffer can go
    strs = s.str_values
    coll = _objects((v if type(v) is str else None for v in strs), len(strs))
    unset = np.fromiter((v is None for v in strs), dtype=bool, count=len(strs))
    pg = _objects((None if v is None else str(v) for v in strs), len(strs))
    seen: dict[bytes, bytes | None] = {b"": None}
    raws = _objects((seen.setdefault(t, t) for t in s.raw_texts), len(s.raw_texts))
    none_set = np.r_[unset, True]

    chunks: dict[str, list[dict[str, Any]]] = {b: [] for b in set(BUCKETS.values())}
    names: dict[str, dict[str, int]] = {b: {} for b in chunks}
    for b in BUCKET_NAMES:
        rows = np.flatnonzero(bucket == BUCKET_NAMES.index(b))
        if not len(rows):
            continue
        codes, uniq = pd.factorize(sid[rows])
        names[b] = {distinct[u]: i for i, u in enumerate(uniq.tolist())}

        def num(f: str) -> np.ndarray:
            out: np.ndarray = s.num[f][rows]
            return out

        dur = num("dur")
        cols: dict[str, Any] = {"name": codes.astype(np.int32), "ts": num("ts"),
                                "dur": np.where(np.isfinite(dur) & (dur > 0), dur, 0.0)}
        ext = to_int64(num("external_id"))
        if (ext < 0).any():
            ext = np.where(ext >= 0, ext, to_int64(num("external_id_lc")))
        if b in ("kernels", "memcpys"):
            device = to_int64(num("device"))
            cols["device"] = np.where(device >= 0, device, to_int64(num("pid")))
            cols["stream"] = to_int64(num("stream"))
            cols["correlation"] = to_int64(num("correlation"))
            cols["external_id"] = ext
        if b == "kernels":
            grid, block = s.grid[rows], s.block[rows]
            for i, axis in enumerate("xyz"):
                cols[f"grid_{axis}"] = grid[:, i]
                cols[f"block_{axis}"] = block[:, i]
            cols["blocks"] = np.where(grid.min(axis=1) > 0, grid.prod(axis=1), -1)
            cols["threads_per_block"] = np.where(block.min(axis=1) > 0, block.prod(axis=1), -1)
            cols["registers"] = to_int64(num("registers"))
            cols["shared_mem"] = to_int64(num("shared_memory"))
            occ = num("occupancy")
            cols["occupancy"] = np.where(occ > 0, occ, np.nan)
            cols["collective"] = coll[s.strs["collective_name"][rows]].tolist()
            cols["coll_dtype"] = coll[s.strs["dtype"][rows]].tolist()
            cols["in_nelems"] = num("in_msg_nelems")
            cols["out_nelems"] = num("out_msg_nelems")
            cols["group_size"] = to_int64(num("group_size"))
            pg_name, pg_id = s.strs["pg_name"][rows], s.strs["pg_id"][rows]
            cols["process_group"] = pg[np.where(none_set[pg_name], pg_id, pg_name)].tolist()
            cols["coll_seq"] = to_int64(num("seq"))
        elif b == "memcpys":
            cols["bytes"] = num("bytes")
        elif b == "python":
            cols["tid"] = to_int64(num("tid"))
        else:  # ops, runtime, annotations
            if b == "runtime":
                cols["api"] = np.where(cats[rows] == CAT_CODE["cuda_driver"], "driver", "runtime").astype(object)
            cols["pid"] = to_int64(num("pid"))
            cols["tid"] = to_int64(num("tid"))
            if b == "ops":
                cols["external_id"] = ext
                cols["sequence_number"] = to_int64(num("sequence_number"))
                cols["fwd_thread_id"] = to_int64(num("fwd_thread_id"))
                dims = s.raws["input_dims"][rows]
                legacy = s.raws["input_dims_lc"][rows]
                cols["input_dims"] = raws[np.where(dims >= 0, dims, legacy)]  # torch 1.8 wrote "Input dims"
                cols["input_types"] = raws[s.raws["input_type"][rows]]
                cols["input_strides"] = raws[s.raws["input_strides"][rows]]
                cols["concrete_inputs"] = raws[s.raws["concrete_inputs"][rows]]
            elif b == "runtime":
                cols["correlation"] = to_int64(num("correlation"))
                cols["external_id"] = ext
            else:
                cols["on_gpu"] = cats[rows] == CAT_CODE["gpu_user_annotation"]
                cols["device"] = to_int64(num("device"))
                cols["stream"] = to_int64(num("stream"))
                cols["external_id"] = ext
        chunks[b].append(cols)
    memory: list[dict[str, np.ndarray]] = []
    rows = np.flatnonzero(memory_rows)
    if len(rows):
        memory.append({
            "ts": s.num["ts"][rows], "bytes": s.num["alloc_bytes"][rows],
            "total_allocated": s.num["total_allocated"][rows], "total_reserved": s.num["total_reserved"][rows],
            "device": to_int64(s.num["device_id"][rows]), "device_type": to_int64(s.num["device_type"][rows]),
            "pid": to_int64(s.num["pid"][rows]), "tid": to_int64(s.num["tid"][rows]),
        })
    return head, s.events, chunks, names, memory
