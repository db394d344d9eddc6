"""Links (kernel → launch → op → ancestors) and step windows on the GPU timeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gpuprof.trace.links import nest
from gpuprof.trace.load import load_trace
from tests.conftest import SAMPLES, TraceBuilder, simple_training_trace


def test_nesting_depth_and_parent() -> None:
    # SYNTHETIC: thread 1: A[0,100) > B[10,50) > C[20,30); D[50,90) starts as B ends; thread 2: E[0,10)
    ops = pd.DataFrame({"name": list("ABCDE"), "ts": [0.0, 10, 20, 50, 0], "dur": [100.0, 40, 10, 40, 10],
                        "pid": [1, 1, 1, 1, 1], "tid": [1, 1, 1, 1, 2]})
    ops["end"] = ops["ts"] + ops["dur"]
    depth, parent = nest(ops)
    assert depth.tolist() == [0, 1, 2, 1, 0]
    assert parent.tolist() == [-1, 0, 1, 0, -1]


def test_kernel_links_through_runtime_when_kernel_lacks_external_id(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 500)
    ext = b.op("aten::mm", 10, 50, [[64, 64], [64, 64]], ["float", "float"])
    b.launch("sgemm_kernel", 20, 100, 30, ext, kernel_ext=False, api="cuLaunchKernelEx")
    t = load_trace(b.write(tmp_path / "t.json"))
    k = t.kernels.iloc[0]
    assert k["op"] == 0 and k["launch_api"] == "cuLaunchKernelEx" and k["launch_ts"] == 20.0


def test_gpu_step_time_when_cpu_runs_ahead(tmp_path: Path) -> None:
    """SYNTHETIC: the CPU launches each 1 ms step in 0.2 ms; the GPU takes 3 ms per step.

    CPU spans would say 1 ms; the GPU timeline says 3 ms."""
    b = TraceBuilder()
    for s in range(3):
        t = s * 1000.0
        b.annotation(f"ProfilerStep#{s}", t, 999)
        ext = b.op("aten::mm", t + 10, 20, [[8192, 8192], [8192, 8192]], ["c10::BFloat16", "c10::BFloat16"])
        b.launch("nvjet_sm90_tst_big", t + 12, 100 + s * 3000.0, 2990.0, ext, grid=(132, 1, 1))
    t = load_trace(b.write(tmp_path / "t.json"))
    assert np.allclose(t.steps["time"].iloc[1:], 3000.0)
    assert t.steps["time"].iloc[0] > 2990.0  # starts at its CPU span: the GPU was idle before


def test_step_window_counts_input_stall(tmp_path: Path) -> None:
    """SYNTHETIC: each step loads data on the CPU for 800 µs before launching 100 µs of GPU work."""
    b = TraceBuilder()
    for s in range(3):
        t = s * 1000.0
        b.annotation(f"ProfilerStep#{s}", t, 999)
        ext = b.op("aten::add", t + 800, 20, [[1024], [1024], []], ["float", "float", "Scalar"])
        b.launch("elementwise_kernel", t + 805, t + 810, 100.0, ext)
    t = load_trace(b.write(tmp_path / "t.json"))
    assert np.allclose(t.steps["time"].iloc[1:], 910.0)  # previous GPU end → own GPU end: stall included


def test_untraced_backlog_is_not_charged_to_the_first_step(tmp_path: Path) -> None:
    """SYNTHETIC: kernels launched before the window (no launch event) still run at its start."""
    b = simple_training_trace(TraceBuilder(), gpu_lag=2000.0)
    b.launch("leftover_kernel", -50, 0, 2040.0, None)  # launch event outside window: drop it below
    doc_events = [e for e in b.events if not (e["cat"] == "cuda_runtime" and e["ts"] == b.offset - 50)]
    b.events = doc_events
    t = load_trace(b.write(tmp_path / "t.json"))
    assert t.steps["start"].iloc[0] >= 2040.0 - 1e-6


def test_optimizer_annotation_steps_and_whole_trace_fallback(tmp_path: Path) -> None:
    b = TraceBuilder()
    for s in range(2):
        ext = b.op("aten::mm", s * 100 + 10, 20, [[64, 64], [64, 64]], ["float", "float"])
        b.launch("k", s * 100 + 12, s * 100 + 40, 10, ext)
        b.annotation("Optimizer.step#AdamW.step", s * 100 + 60, 30)
    t = load_trace(b.write(tmp_path / "o.json"))
    assert t.meta.steps_source == "optimizer" and len(t.steps) == 2

    b2 = TraceBuilder()
    ext = b2.op("aten::mm", 10, 20, [[64, 64], [64, 64]], ["float", "float"])
    b2.launch("k", 12, 40, 10, ext)
    t2 = load_trace(b2.write(tmp_path / "w.json"))
    assert t2.meta.steps_source == "whole trace" and len(t2.steps) == 1
    assert any("whole trace" in w for w in t2.meta.warnings)


def test_real_fp32_trace_step_time_matches_unprofiled_timing() -> None:
    """The FP32 GPT's GPU step time in the trace vs. the same program timed without the profiler."""
    import json

    t = load_trace(SAMPLES / "gpt_fp32.json.gz")
    measured = json.loads((SAMPLES / "timings" / "gpt_fp32.json").read_text())["step_ms"]
    assert abs(t.steps["time"].mean() / 1000 - measured) / measured < 0.03
    cpu_spans = (t.steps["cpu_end"] - t.steps["cpu_start"]).mean() / 1000
    assert cpu_spans < 0.6 * measured  # the CPU spans alone would badly understate it
