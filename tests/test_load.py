"""Loading Kineto traces: formats, time origins, ranks, and every kind of bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from gpuprof.errors import TraceError
from gpuprof.trace.load import load_trace
from tests.conftest import SAMPLES, TraceBuilder, simple_training_trace


def test_relative_timestamps_use_base_time(tmp_path: Path, builder: TraceBuilder) -> None:
    simple_training_trace(builder)
    t = load_trace(builder.write(tmp_path / "t.json"))
    assert t.meta.time_origin == "baseTimeNanoseconds"
    first = min(e["ts"] for e in builder.events)
    assert t.meta.t0_epoch_ns == builder.base_ns + round(first * 1000)
    assert t.ops["ts"].min() == 0.0 or t.runtime["ts"].min() == 0.0 or t.annotations["ts"].min() == 0.0
    assert len(t.kernels) == 6 and len(t.ops) == 6


def test_absolute_microsecond_traces(tmp_path: Path) -> None:
    """Traces before torch 2.4: integer absolute µs and no baseTimeNanoseconds."""
    b = TraceBuilder(offset_us=1_700_000_000_000_000)
    simple_training_trace(b)
    doc = b.document()
    del doc["baseTimeNanoseconds"]
    for e in doc["traceEvents"]:
        e["ts"] = int(e["ts"])
    p = tmp_path / "old.json"
    p.write_text(json.dumps(doc))
    t = load_trace(p)
    assert t.meta.time_origin == "absolute-us"
    assert t.meta.t0_epoch_ns == 1_700_000_000_000_000 * 1000
    assert len(t.steps) == 3


def test_gzip_and_bare_event_array(tmp_path: Path, builder: TraceBuilder) -> None:
    simple_training_trace(builder)
    t1 = load_trace(builder.write(tmp_path / "a.json.gz", gz=True))
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(builder.events))
    t2 = load_trace(bare)
    assert len(t1.kernels) == len(t2.kernels) == 6


def test_rank_from_distributed_info_then_file_name(tmp_path: Path, builder: TraceBuilder) -> None:
    simple_training_trace(builder)
    builder.top["distributedInfo"] = {"backend": "nccl", "rank": 5, "world_size": 8}
    assert load_trace(builder.write(tmp_path / "x.json")).meta.rank == 5
    b2 = simple_training_trace(TraceBuilder())
    t = load_trace(b2.write(tmp_path / "trace_rank3.json"))
    assert t.meta.rank == 3
    assert load_trace(b2.write(tmp_path / "plain.json"), fallback_rank=2).meta.rank == 2


def test_real_trace_columns(tmp_path: Path) -> None:
    t = load_trace(SAMPLES / "gpt_bf16.json.gz")
    k = t.kernels
    assert t.meta.gpu_name == "NVIDIA H200"
    assert {"name", "ts", "dur", "device", "stream", "grid_x", "block_x", "registers", "shared_mem",
            "correlation", "external_id", "launch_ts", "op", "step", "is_comm"} <= set(k.columns)
    assert (k["op"] >= 0).mean() > 0.99  # nearly every kernel links to the op that launched it
    nvjet = k[k["name"].astype(str).str.startswith("nvjet")]
    assert nvjet["occupancy"].isna().all()  # cluster launches report 0 occupancy: unknown, not zero
    ops = t.ops
    launching = ops.loc[k.loc[k["op"] >= 0, "op"].unique()]
    assert launching["input_dims"].notna().all()  # the ops that launch kernels carry their shapes
    assert (ops["depth"] >= 0).all() and (ops.loc[ops["depth"] > 0, "parent"] >= 0).all()


def test_memcpy_kinds_from_names() -> None:
    t = load_trace(SAMPLES / "vision_pageable.json.gz")
    m = t.memcpys
    htod = m[m["kind"] == "HtoD"]
    assert len(htod) and set(htod["src"]) == {"Pageable"} and set(htod["dst"]) == {"Device"}
    assert (htod["bytes"] == 128 * 3 * 224 * 224 * 4).any()
    assert set(m["kind"]) >= {"HtoD", "Memset"}


# --- bad input -----------------------------------------------------------------------------

def _bad(tmp_path: Path, name: str, data: bytes) -> str:
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(TraceError) as e:
        load_trace(p)
    msg = str(e.value)
    assert str(p) in msg and "\n" not in msg
    return msg


def test_truncated_gzip(tmp_path: Path, builder: TraceBuilder) -> None:
    simple_training_trace(builder)
    data = gzip.compress(json.dumps(builder.document()).encode())
    assert "truncated gzip" in _bad(tmp_path, "t.json.gz", data[: len(data) // 2])


def test_truncated_json(tmp_path: Path, builder: TraceBuilder) -> None:
    simple_training_trace(builder)
    data = json.dumps(builder.document()).encode()
    assert "truncated JSON" in _bad(tmp_path, "t.json", data[: len(data) - 100])


def test_not_json(tmp_path: Path) -> None:
    assert "not a Kineto trace" in _bad(tmp_path, "t.json", b"\x00\x01binary garbage")


def test_json_that_is_not_a_trace(tmp_path: Path) -> None:
    assert "no 'traceEvents'" in _bad(tmp_path, "config.json", b'{"lr": 0.1, "model": "gpt"}')
    assert "not a Kineto trace" in _bad(tmp_path, "nums.json", b"[1, 2, 3]")


def test_mistyped_fields(tmp_path: Path, builder: TraceBuilder) -> None:
    simple_training_trace(builder)
    doc = builder.document()
    doc["traceEvents"][3]["ts"] = "yesterday"
    assert "non-numeric 'ts'" in _bad(tmp_path, "t.json", json.dumps(doc).encode())
    doc["traceEvents"] = {"not": "a list"}
    assert "not a Kineto trace" in _bad(tmp_path, "t2.json", json.dumps(doc).encode())


def test_mistyped_args_degrade_to_missing(tmp_path: Path, builder: TraceBuilder) -> None:
    """A wrongly typed optional field (a string grid, a float stream) is treated as missing."""
    simple_training_trace(builder)
    for e in builder.events:
        if e["cat"] == "kernel":
            e["args"]["grid"] = "big"
            e["args"]["stream"] = 7.5
    t = load_trace(builder.write(tmp_path / "t.json"))
    assert (t.kernels["grid_x"] == -1).all() and (t.kernels["stream"] == -1).all()
    assert len(t.kernels) == 6


def test_empty_file_and_empty_trace(tmp_path: Path) -> None:
    assert "empty file" in _bad(tmp_path, "e.json", b"")
    assert "empty trace" in _bad(tmp_path, "e2.json", b'{"traceEvents": []}')


def test_missing_file_and_folder(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        load_trace(tmp_path / "nope.json")
    with pytest.raises(TraceError, match="folder"):
        load_trace(tmp_path)


def test_trace_without_gpu_events_loads_with_warning(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    b.op("aten::mm", 10, 50, [[8, 8], [8, 8]], ["float", "float"])
    t = load_trace(b.write(tmp_path / "cpu.json"))
    assert not t.has_gpu
    assert any("no GPU events" in w for w in t.meta.warnings)
    assert np.isfinite(t.steps["time"]).all()
