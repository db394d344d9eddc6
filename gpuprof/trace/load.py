"""Decode Kineto chrome-trace JSON (``.json`` or gzip) into a :class:`RankTrace`.

Decoding uses msgspec with typed structs: only the fields gpuprof reads are materialised, which
is several times faster and smaller than ``json.load`` into dicts on multi-GB traces. Events are
bucketed by category once; every later step works on whole columns.
"""

from __future__ import annotations

import gc
import gzip
import re
import zlib
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from gpuprof.errors import TraceError
from gpuprof.trace.links import attach_links
from gpuprof.trace.model import RankTrace

_NO_RAW = msgspec.Raw(b"")


class _Args(msgspec.Struct, omit_defaults=True):
    external_id: Any = msgspec.field(default=None, name="External id")
    correlation: Any = None
    stream: Any = None
    device: Any = None
    grid: Any = None
    block: Any = None
    registers: Any = msgspec.field(default=None, name="registers per thread")
    shared_memory: Any = msgspec.field(default=None, name="shared memory")
    occupancy: Any = msgspec.field(default=None, name="est. achieved occupancy %")
    # Shapes stay raw JSON text until an analysis needs them: most ops' shapes are never read.
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    input_strides: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Strides")
    concrete_inputs: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    sequence_number: Any = msgspec.field(default=None, name="Sequence number")
    fwd_thread_id: Any = msgspec.field(default=None, name="Fwd thread id")
    bytes: Any = None
    collective_name: Any = msgspec.field(default=None, name="Collective name")
    in_msg_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_msg_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_id: Any = msgspec.field(default=None, name="Process Group ID")
    name: Any = None


class _Event(msgspec.Struct):
    ph: Any = None
    cat: Any = None
    name: Any = ""
    pid: Any = 0
    tid: Any = 0
    ts: Any = None
    dur: Any = 0.0
    args: _Args | None = None


class _TraceFile(msgspec.Struct):
    traceEvents: list[_Event] | None = None
    schemaVersion: Any = None
    deviceProperties: Any = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    traceName: Any = None
    record_shapes: Any = None
    with_stack: Any = None


_DECODER = msgspec.json.Decoder(_TraceFile | list[_Event])
_RANK_IN_NAME = re.compile(r"(?:rank|_r|-r)[_-]?(\d+)", re.IGNORECASE)
_COMM_KERNEL = re.compile(r"nccl|rccl|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter|sendrecv", re.IGNORECASE)
_MEMCPY_NAME = re.compile(r"^Memcpy (\w+) \((\w+) -> (\w+)\)")


def read_bytes(path: Path) -> bytes:
    """File contents, gunzipped when they start with the gzip magic (whatever the file is called)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceError("no such file", str(path)) from None
    except IsADirectoryError:
        raise TraceError("is a folder, not a trace file", str(path)) from None
    except OSError as e:
        raise TraceError(f"cannot read ({e.strerror})", str(path)) from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except EOFError:
            raise TraceError("truncated gzip stream (was the run killed while the trace was written?)", str(path)) from None
        except (OSError, zlib.error) as e:
            raise TraceError(f"corrupt gzip data ({e})", str(path)) from None
    return data


def _decode(path: Path, data: bytes) -> _TraceFile:
    if not data.strip():
        raise TraceError("empty file", str(path))
    gc_was_on = gc.isenabled()
    gc.disable()  # millions of small acyclic objects: collection passes would only cost time
    try:
        doc = _DECODER.decode(data)
    except msgspec.DecodeError as e:
        msg = str(e)
        if "truncated" in msg.lower():
            raise TraceError("truncated JSON (was the run killed while the trace was written?)", str(path)) from None
        raise TraceError(f"not a Kineto trace: {msg}", str(path)) from None
    finally:
        if gc_was_on:
            gc.enable()
    if isinstance(doc, list):  # a bare chrome-trace event array
        doc = _TraceFile(traceEvents=doc)
    if doc.traceEvents is None:
        raise TraceError("not a Kineto trace: no 'traceEvents' list", str(path))
    return doc


def _num(values: list[Any], dtype: str = "float64") -> np.ndarray:
    """Column of numbers; anything not a number (None, strings) becomes NaN/-1."""
    if dtype == "int64":
        return np.fromiter((v if type(v) is int else -1 for v in values), dtype=np.int64, count=len(values))
    return np.fromiter(
        (v if type(v) in (int, float) else np.nan for v in values), dtype=np.float64, count=len(values)
    )


def _raw_text(raw: msgspec.Raw) -> bytes | None:
    """JSON of a raw argument (copied, so the file's buffer can be freed); None if absent."""
    return bytes(raw) if len(raw) else None


def parse_arg(text: bytes | str | None) -> Any:
    """Parse an op argument column value (``input_dims``, ``concrete_inputs``, ...) to Python."""
    if text is None:
        return None
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        return None


def _xyz(values: list[Any]) -> np.ndarray:
    out = np.full((len(values), 3), -1, dtype=np.int64)
    ok = [i for i, v in enumerate(values) if isinstance(v, list) and len(v) == 3 and all(type(x) is int for x in v)]
    if ok:
        out[ok] = [values[i] for i in ok]
    return out


def _base(evs: list[_Event], t_origin: float) -> dict[str, Any]:
    ts = _num([e.ts for e in evs])
    dur = _num([e.dur for e in evs])
    dur = np.where(np.isfinite(dur) & (dur > 0), dur, 0.0)
    ts = ts - t_origin
    return {
        "name": pd.Categorical([e.name if isinstance(e.name, str) else str(e.name) for e in evs]),
        "ts": ts,
        "dur": dur,
        "end": ts + dur,
    }


def _args(evs: list[_Event]) -> list[_Args]:
    empty = _Args()
    return [e.args or empty for e in evs]


def _gpu_frame(evs: list[_Event], t_origin: float) -> pd.DataFrame:
    a = _args(evs)
    cols = _base(evs, t_origin)
    cols.update(
        device=_num([x.device for x in a], "int64"),
        stream=_num([x.stream for x in a], "int64"),
        correlation=_num([x.correlation for x in a], "int64"),
        external_id=_num([x.external_id for x in a], "int64"),
    )
    # GPU events on pid = device when args lack it (older traces)
    pid = _num([e.pid for e in evs], "int64")
    cols["device"] = np.where(cols["device"] >= 0, cols["device"], pid)
    return pd.DataFrame(cols)


def _kernels(evs: list[_Event], t_origin: float) -> pd.DataFrame:
    df = _gpu_frame(evs, t_origin)
    a = _args(evs)
    grid, block = _xyz([x.grid for x in a]), _xyz([x.block for x in a])
    for i, axis in enumerate("xyz"):
        df[f"grid_{axis}"] = grid[:, i]
        df[f"block_{axis}"] = block[:, i]
    df["blocks"] = np.where(grid.min(axis=1) > 0, grid.prod(axis=1), -1)
    df["threads_per_block"] = np.where(block.min(axis=1) > 0, block.prod(axis=1), -1)
    df["registers"] = _num([x.registers for x in a], "int64")
    df["shared_mem"] = _num([x.shared_memory for x in a], "int64")
    occ = _num([x.occupancy for x in a])
    df["occupancy"] = np.where(occ > 0, occ, np.nan)  # 0 means "not computed" (cluster launches)
    names = df["name"].cat.categories
    comm_cats = np.fromiter((bool(_COMM_KERNEL.search(n)) for n in names), dtype=bool, count=len(names))
    codes = df["name"].cat.codes.to_numpy()
    df["is_comm"] = comm_cats[codes] if len(names) else np.zeros(len(df), dtype=bool)
    df["collective"] = pd.Categorical([x.collective_name if isinstance(x.collective_name, str) else None for x in a])
    df["coll_dtype"] = pd.Categorical([x.dtype if isinstance(x.dtype, str) else None for x in a])
    df["in_nelems"] = _num([x.in_msg_nelems for x in a])
    df["out_nelems"] = _num([x.out_msg_nelems for x in a])
    df["group_size"] = _num([x.group_size for x in a], "int64")
    df["process_group"] = pd.Categorical(
        [str(x.pg_name) if x.pg_name is not None else (str(x.pg_id) if x.pg_id is not None else None) for x in a]
    )
    return df


def _memcpys(evs: list[_Event], t_origin: float) -> pd.DataFrame:
    df = _gpu_frame(evs, t_origin)
    df["bytes"] = _num([x.bytes for x in _args(evs)])
    names = df["name"].cat.categories
    parsed = [_MEMCPY_NAME.match(n) for n in names]
    codes = df["name"].cat.codes.to_numpy()

    def col(i: int, memset: str) -> pd.Categorical:
        per_name = np.array([m.group(i) if m else (memset if n.startswith("Memset") else "Unknown")
                             for m, n in zip(parsed, names)], dtype=object)
        return pd.Categorical(per_name[codes] if len(names) else [])

    df["kind"] = col(1, "Memset")
    df["src"] = col(2, "Device")
    df["dst"] = col(3, "Device")
    return df


def _ops(evs: list[_Event], t_origin: float) -> pd.DataFrame:
    a = _args(evs)
    df = pd.DataFrame(_base(evs, t_origin))
    df["pid"] = _num([e.pid for e in evs], "int64")
    df["tid"] = _num([e.tid for e in evs], "int64")
    df["external_id"] = _num([x.external_id for x in a], "int64")
    df["sequence_number"] = _num([x.sequence_number for x in a], "int64")
    df["fwd_thread_id"] = _num([x.fwd_thread_id for x in a], "int64")
    for col, field in (("input_dims", "input_dims"), ("input_types", "input_type"),
                       ("input_strides", "input_strides"), ("concrete_inputs", "concrete_inputs")):
        df[col] = pd.Series([_raw_text(getattr(x, field)) for x in a], dtype=object)
    return df


def _runtime(evs: list[_Event], apis: list[str], t_origin: float) -> pd.DataFrame:
    a = _args(evs)
    df = pd.DataFrame(_base(evs, t_origin))
    df["api"] = pd.Categorical(apis)
    df["pid"] = _num([e.pid for e in evs], "int64")
    df["tid"] = _num([e.tid for e in evs], "int64")
    df["correlation"] = _num([x.correlation for x in a], "int64")
    df["external_id"] = _num([x.external_id for x in a], "int64")
    return df


def _annotations(evs: list[_Event], on_gpu: list[bool], t_origin: float) -> pd.DataFrame:
    a = _args(evs)
    df = pd.DataFrame(_base(evs, t_origin))
    df["pid"] = _num([e.pid for e in evs], "int64")
    df["tid"] = _num([e.tid for e in evs], "int64")
    df["on_gpu"] = np.array(on_gpu, dtype=bool)
    df["device"] = _num([x.device for x in a], "int64")
    df["stream"] = _num([x.stream for x in a], "int64")
    df["external_id"] = _num([x.external_id for x in a], "int64")
    return df


_BUCKETS = {
    "kernel": "kernels",
    "gpu_memcpy": "memcpys",
    "gpu_memset": "memcpys",
    "cpu_op": "ops",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "user_annotation": "annotations",
    "gpu_user_annotation": "annotations",
}


def _rank_of(doc: _TraceFile, path: Path, fallback: int) -> tuple[int, int]:
    info = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    rank, world = info.get("rank"), info.get("world_size")
    if isinstance(rank, int):
        return rank, world if isinstance(world, int) and world > 0 else 1
    m = _RANK_IN_NAME.search(path.name)
    if m:
        return int(m.group(1)), world if isinstance(world, int) and world > 0 else 1
    return fallback, world if isinstance(world, int) and world > 0 else 1


def load_trace(path: str | Path, fallback_rank: int = 0) -> RankTrace:
    """Load one Kineto trace file into a :class:`RankTrace`; raises :class:`TraceError` on bad input."""
    p = Path(path)
    doc = _decode(p, read_bytes(p))
    events = doc.traceEvents or []
    buckets: dict[str, list[_Event]] = {b: [] for b in set(_BUCKETS.values())}
    apis: list[str] = []
    on_gpu: list[bool] = []
    first_ts = np.inf
    for e in events:
        if e.ph != "X":
            continue
        b = _BUCKETS.get(e.cat)
        if b is None:
            continue
        if not isinstance(e.ts, (int, float)):
            raise TraceError(f"a {e.cat} event has a non-numeric 'ts' ({e.ts!r})", str(p))
        first_ts = min(first_ts, e.ts)
        buckets[b].append(e)
        if b == "runtime":
            apis.append("driver" if e.cat == "cuda_driver" else "runtime")
        elif b == "annotations":
            on_gpu.append(e.cat == "gpu_user_annotation")
    if not np.isfinite(first_ts):
        raise TraceError("empty trace: no CPU ops, kernels or annotations (was the profiler ever active?)", str(p))

    base_ns = doc.baseTimeNanoseconds if isinstance(doc.baseTimeNanoseconds, int) else None
    if base_ns is not None:
        t0_epoch_ns, origin = base_ns + int(round(first_ts * 1000.0)), "baseTimeNanoseconds"
    else:
        t0_epoch_ns, origin = int(round(first_ts * 1000.0)), "absolute-us"

    kernels = _kernels(buckets["kernels"], first_ts)
    memcpys = _memcpys(buckets["memcpys"], first_ts)
    ops = _ops(buckets["ops"], first_ts)
    runtime = _runtime(buckets["runtime"], apis, first_ts)
    annotations = _annotations(buckets["annotations"], on_gpu, first_ts)

    warnings: list[str] = []
    if len(kernels) + len(memcpys) == 0:
        warnings.append("no GPU events (kernels or memcpys): GPU analyses are skipped; was CUDA activity profiled?")
    has_shapes = bool(ops["input_dims"].notna().any()) if len(ops) else False
    if len(ops) and not has_shapes:
        warnings.append("no Input Dims (record_shapes=False): FLOP/byte models and shape findings are unavailable")
    rank, world = _rank_of(doc, p, fallback_rank)
    props = doc.deviceProperties if isinstance(doc.deviceProperties, list) else []
    meta_kwargs = dict(
        path=str(p), rank=rank, world_size=world,
        device_properties=[d for d in props if isinstance(d, dict)],
        distributed_info=doc.distributedInfo if isinstance(doc.distributedInfo, dict) else None,
        t0_epoch_ns=t0_epoch_ns, time_origin=origin, schema_version=doc.schemaVersion,
        trace_name=doc.traceName if isinstance(doc.traceName, str) else None,
        record_shapes=bool(doc.record_shapes) or has_shapes, with_stack=bool(doc.with_stack),
        events=len(events),
    )
    return attach_links(kernels, memcpys, ops, runtime, annotations, meta_kwargs, warnings)
