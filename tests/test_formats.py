"""Every trace format a user brings (issue 10, "Trace formats"): torch 1.8-1.9 Kineto, the 2.0-2.3
External-id links, GPU-only traces, CUDA/HIP graphs, ROCm call names and communication kernels.

Real traces: ``../shared/traces/public`` (public repositories; MANIFEST.json says where each came
from); those tests skip where it is absent. Edge cases use SYNTHETIC traces built in the test code
(each says so), never edited real ones. Expected numbers for real traces are counted from the raw
JSON in the test itself, not taken from gpuprof.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from gpuprof.cli import main
from gpuprof.trace import names
from gpuprof.trace.load import load_trace
from gpuprof.trace.model import RankTrace
from tests.conftest import SAMPLES, TraceBuilder

PUBLIC = Path(__file__).parents[1] / ".." / "shared" / "traces" / "public"
TRACES = sorted(p.relative_to(PUBLIC).as_posix() for p in PUBLIC.rglob("*")
                if p.is_file() and p.name not in ("MANIFEST.json", "README.md")) if PUBLIC.is_dir() else []


def public(rel: str) -> Path:
    if not PUBLIC.is_dir():
        pytest.skip(f"{PUBLIC} is absent (the shared corpus of public traces)")
    return PUBLIC / rel


def raw_events(p: Path) -> list[dict[str, Any]]:
    data = p.read_bytes()
    doc = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    return doc if isinstance(doc, list) else list(doc["traceEvents"])


def linked_inside(t: RankTrace) -> tuple[int, int, int]:
    """Kernels with a launch call; of those, linked to an op; of those, to an op that holds the
    call on the call's thread."""
    k, ops, rt = t.kernels, t.ops, t.runtime
    launched = k[k["launch_ts"].notna()]
    lk = launched[launched["op"] >= 0]
    o = ops.iloc[lk["op"].to_numpy()]
    rt_tid = rt.drop_duplicates("correlation").set_index("correlation")["tid"]
    inside = ((o["ts"].to_numpy() <= lk["launch_ts"].to_numpy()) & (lk["launch_ts"].to_numpy() <= o["end"].to_numpy())
              & (o["tid"].to_numpy() == rt_tid.reindex(lk["correlation"]).to_numpy()))
    return len(launched), len(lk), int(inside.sum())


def report_json(p: Path, tmp_path: Path) -> dict[str, Any]:
    """`gpuprof report P --format json`: checks exit 0 and returns the document."""
    out = tmp_path / f"{p.name}.report.json"
    r = CliRunner().invoke(main, ["report", str(p), "--format", "json", "-o", str(out), "--no-cache"])
    assert r.exit_code == 0, (r.output, r.exception)
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


# --- every public trace ------------------------------------------------------------------------

def _check_schema(doc: dict[str, Any]) -> None:
    assert doc["schema_version"] == 1
    assert set(doc) >= {"tool", "source", "gpu", "summary", "kernels", "findings", "analyzers_skipped", "warnings"}
    s = doc["summary"]
    assert isinstance(s["steps"], int) and s["steps"] >= 1
    assert isinstance(s["step_time_ms"], float) and s["step_time_ms"] > 0
    assert sum(s["breakdown_pct"].values()) == pytest.approx(100.0)
    for k in doc["kernels"]:
        assert set(k) >= {"name", "count", "total_us", "bound"} and k["count"] > 0
    for f in doc["findings"]:
        assert set(f) >= {"id", "category", "title", "estimated_savings_ms"}
    for skip in doc["analyzers_skipped"]:
        assert skip["reason"]


@pytest.mark.parametrize("rel", TRACES or ["(corpus absent)"])
def test_every_public_trace_reports_json(rel: str, tmp_path: Path) -> None:
    p = public(rel)
    _check_schema(report_json(p, tmp_path))
    t = load_trace(p)
    n_kernels = sum(1 for e in raw_events(p) if e.get("ph") == "X" and str(e.get("cat")).lower() == "kernel")
    assert len(t.kernels) == n_kernels  # every kernel event, whichever spelling of the category


def test_non_kineto_json_keeps_the_one_line_error(tmp_path: Path) -> None:
    p = tmp_path / "chrome.json"  # SYNTHETIC: a chrome trace of no profiler we know
    p.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "v8", "name": "GC", "ts": 1, "dur": 2}]}))
    r = CliRunner().invoke(main, ["report", str(p), "--format", "json", "-o", str(tmp_path / "o.json")])
    assert r.exit_code == 3 and r.output.count("\n") == 1 and str(p) in r.output and "Traceback" not in r.output


# --- torch 1.8-1.9 -----------------------------------------------------------------------------

@pytest.mark.parametrize("rel", ["kineto/nw0_jan2021.pt.trace.json.gz", "tb/nw0_old.pt.trace.json.gz",
                                 "tb/nw0_a.pt.trace.json.gz", "tb/nw4_a.pt.trace.json.gz"])
def test_torch18_19_profiler_api_traces(rel: str) -> None:
    """Capitalised categories, string tids, lower-case "external id", ProfilerStep as an Operator."""
    p = public(rel)
    ev = raw_events(p)
    t = load_trace(p)
    cats = Counter(e.get("cat") for e in ev if e.get("ph") == "X")
    assert len(t.memcpys) == cats["Memcpy"] + cats["Memset"]
    assert len(t.runtime) == cats["Runtime"]
    steps = sorted(int(e["name"].split("#")[1]) for e in ev if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert t.meta.steps_source == "ProfilerStep" and t.steps["step"].tolist() == steps == list(range(5, 11))
    # record_function ranges are annotations, as torch >= 1.10 writes them; aten ops stay ops
    assert len(t.ops) + len(t.annotations) == cats["Operator"]
    assert t.annotations["name"].astype(str).str.startswith("enumerate(DataLoader)#").sum() == 6
    raw_tids = {int(e["tid"]) for e in ev if e.get("cat") == "Operator"}
    assert set(t.ops["tid"].unique()) == raw_tids and len(raw_tids) == 2  # main + autograd thread kept apart
    launched, linked, inside = linked_inside(t)
    assert launched > 0.9 * len(t.kernels) and linked > 0.98 * launched
    assert inside == linked  # every link: the op holds the launch call
    copies = t.memcpys[(t.memcpys["kind"] == "HtoD") & (t.memcpys["op"] >= 0)]
    assert len(copies) and set(t.ops["name"].astype(str).to_numpy()[copies["op"]]) <= {"aten::copy_", "aten::to",
                                                                                        "aten::_to_copy"}
    assert t.meta.time_origin == "absolute-us" and t.meta.t0_epoch_ns > 1.6e18  # Unix µs of late 2020 / 2021


def test_legacy_autograd_profiler_trace_steps_by_optimizer() -> None:
    """tb/ag0: torch.autograd.profiler, no ProfilerStep: six Optimizer.step spans give five steps
    between them (the open-ended window before the first, 4.5 s of set-up and cuDNN autotuning,
    is left out and said so)."""
    p = public("tb/ag0.pt.trace.json.gz")
    n_opt = sum(1 for e in raw_events(p) if e.get("name") == "Optimizer.step#SGD.step")
    t = load_trace(p)
    assert t.meta.steps_source == "optimizer" and n_opt == 6 and len(t.steps) == n_opt - 1
    assert any("left out" in w for w in t.meta.warnings)
    assert (t.steps["kernels"] > 1000).all()
    assert any("Input type" in w for w in t.meta.warnings) and not t.meta.record_shapes


def test_synthetic_jan2021_layout(tmp_path: Path) -> None:
    """SYNTHETIC: the Jan-2021 layout (bare JSON array), capitalised categories, string pid/tid,
    "external id", "Input dims" and computeProperties in a document form."""
    ts0 = 1_610_000_000_000_000
    ev: list[dict[str, Any]] = [
        {"ph": "X", "cat": "Operator", "name": "ProfilerStep#1", "pid": 7, "tid": "99", "ts": ts0, "dur": 100,
         "args": {"External id": 1}},
        {"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 7, "tid": "99", "ts": ts0 + 10, "dur": 50,
         "args": {"External id": 2, "Input dims": [[8, 8], [8, 8]]}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": "99", "ts": ts0 + 20, "dur": 5,
         "args": {"correlation": 50, "external id": 2}},
        {"ph": "X", "cat": "Kernel", "name": "volta_sgemm_32x32_nn", "pid": 0, "tid": "stream 7", "ts": ts0 + 30,
         "dur": 9, "args": {"device": 0, "stream": 7, "correlation": 50, "external id": 2}},
    ]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(ev))
    t = load_trace(bare)
    assert len(t.kernels) == 1 and t.kernels["op"].tolist() == [0] and t.ops["tid"].tolist() == [99]
    assert t.kernels["external_id"].tolist() == [2] and t.kernels["stream"].tolist() == [7]
    assert t.meta.steps_source == "ProfilerStep" and t.ops["input_dims"].iloc[0] == b"[[8, 8], [8, 8]]"
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps({"schemaVersion": 1, "computeProperties": [{"id": 0, "name": "Tesla V100-SXM2-16GB"}],
                               "traceEvents": ev}))
    assert load_trace(doc).meta.gpu_name == "Tesla V100-SXM2-16GB"


# --- torch ~2.0-2.3: External id = correlation ---------------------------------------------------

@pytest.mark.parametrize("rel", ["param/linear_kineto.json.gz", "param/resnet_kineto.json.gz",
                                 "param/dlrm_kineto/worker0_step_12.1694128201545.pt.trace.json",
                                 "param/dlrm_kineto/worker1_step_12.1694128201556.pt.trace.json",
                                 "misc/sidnb13_transformer_af68c4771c1b09a4d1e797ed00f1ddda22355edc.pt.trace.json"])
def test_correlation_external_ids_link_by_nesting(rel: str) -> None:
    """Kernels whose External id is their correlation id link to the op around their launch call."""
    t = load_trace(public(rel))
    k = t.kernels
    assert (k["external_id"] == k["correlation"]).mean() > 0.99  # the 2.0-era layout this test is about
    launched, linked, inside = linked_inside(t)
    assert launched > 0.75 * len(k)
    assert inside == linked > 0.98 * launched  # was 0% (sidnb13, dlrm) or linked to foreign ops (param linear)
    gemm = k[k["name"].astype(str).str.contains("sgemm|xmma_gemm|s1688gemm") & (k["op"] >= 0)]
    op_names = set(t.ops["name"].astype(str).to_numpy()[gemm["op"]])
    # GEMM kernels belong to matmul, convolution (cuDNN runs some as sgemm) or fused-attention ops
    assert len(gemm) and all(any(w in n for w in ("mm", "linear", "matmul", "conv", "attention")) for n in op_names), \
        op_names


@pytest.mark.parametrize("name", ["gpt_bf16.json.gz", "decode_b1.json.gz", "vision_workers.json.gz",
                                  "ddp_good/rank0.json.gz"])
def test_modern_links_unchanged(name: str) -> None:
    """torch 2.4+: the kernel's External id names its op, and that is still the op it links to."""
    t = load_trace(SAMPLES / name)
    k, ops = t.kernels, t.ops
    by_ext = pd.Series(np.arange(len(ops)), index=ops["external_id"].to_numpy())
    by_ext = by_ext[~by_ext.index.duplicated()]
    expect = k["external_id"].map(by_ext).fillna(-1).astype(int).to_numpy()
    has = expect >= 0
    assert has.mean() > 0.9 and (k["op"].to_numpy()[has] == expect[has]).all()


def test_synthetic_foreign_external_id_is_not_trusted(tmp_path: Path) -> None:
    """SYNTHETIC (torch 2.0-2.3 layout): the kernel's External id equals its correlation, which is
    also the External id of an unrelated op on another thread; the launch lies inside aten::mm."""
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 500)
    mm = b.op("aten::mm", 10, 50, [[64, 64], [64, 64]], ["float", "float"])
    b._ext = 100  # the next op's External id is 100 = the launch's correlation below
    b.op("aten::foreign", 200, 10, tid=2)
    b.launch("sgemm_kernel", 20, 100, 30, 100)  # correlation 100, External id 100 on call and kernel
    b.launch("orphan_kernel", 300, 310, 5, mm)  # launched outside every op: no op, whatever its id says
    t = load_trace(b.write(tmp_path / "t.json"))
    assert t.kernels["correlation"].tolist()[0] == 100
    assert t.kernels["op"].tolist() == [0, -1]
    assert t.runtime["op"].tolist() == [0, -1]


# --- GPU-only traces ----------------------------------------------------------------------------

def test_gpu_only_mi210_trace(tmp_path: Path) -> None:
    p = public("tracelens/mi210__gpu_only_trace__gpu_only_trace.json.gz")
    t = load_trace(p)
    assert len(t.ops) == 0 and len(t.kernels) == 562 and t.meta.cpu_events == 0
    assert (t.kernels["name_class"].astype(str) != "other").mean() > 0.95  # classes from names alone
    assert {"conv", "norm", "elementwise"} <= set(t.kernels["name_class"].astype(str))
    doc = report_json(p, tmp_path)
    reasons = {s["analyzer"]: s["reason"] for s in doc["analyzers_skipped"]}
    assert "GPU-only" in reasons["input_pipeline"]
    assert "launch_overhead" not in reasons  # its hipLaunchKernel calls give launch times


def test_synthetic_gpu_only_without_runtime_calls(tmp_path: Path) -> None:
    """SYNTHETIC: kernels and GPU ProfilerStep annotations only (no CPU events, no runtime calls)."""
    b = TraceBuilder()
    for s in range(2):
        b.annotation(f"ProfilerStep#{s}", s * 1000.0, 900, gpu=True)
        for i in range(3):
            b._x("kernel", "void at::native::vectorized_elementwise_kernel<4>", s * 1000.0 + 100 * i + 10, 50, 0, 7,
                 {"device": 0, "stream": 7, "correlation": 1000 + 10 * s + i})
    t = load_trace(b.write(tmp_path / "g.json"))
    assert t.meta.steps_source == "ProfilerStep (GPU)" and t.steps["kernels"].tolist() == [3, 3]
    assert t.kernels["step"].tolist() == [0, 0, 0, 1, 1, 1]
    assert t.meta.runtime_calls == 0 and t.meta.cpu_events == 0
    doc = report_json(tmp_path / "g.json", tmp_path)
    reasons = {s["analyzer"]: s["reason"] for s in doc["analyzers_skipped"]}
    assert {"input_pipeline", "host_sync", "launch_overhead"} <= set(reasons)
    assert "runtime calls" in reasons["launch_overhead"]


# --- CUDA / HIP graphs --------------------------------------------------------------------------

@pytest.mark.parametrize("rel", ["tracelens/inference__sglang_decode__sglang_Qwen3-8B_decode.json.gz",
                                 "tracelens/inference__vllm_decode_full__graph_execution.json.gz"])
def test_graph_replay_kernels_are_in_graph(rel: str) -> None:
    p = public(rel)
    ev = raw_events(p)
    graph_corr = {e["args"]["correlation"] for e in ev if e.get("name") == "hipGraphLaunch"}
    expect = sum(1 for e in ev if e.get("cat") == "kernel" and e["args"].get("correlation") in graph_corr)
    t = load_trace(p)
    k = t.kernels
    assert int(k["in_graph"].sum()) == expect > 0.9 * len(k)
    assert (k.loc[k["in_graph"], "launch_api"].astype(str) == "hipGraphLaunch").all()
    assert t.meta.graph_launch_calls == len(graph_corr) and t.meta.graph_capture_calls == 0


@pytest.mark.parametrize("rel", [
    "tracelens/inference__sglang_decode__capture_traces__bs_32_rank0.json.gz",
    "tracelens/inference__vllm_decode_full__capture_traces__graph_capture_rank_0.1773709742341309550.pt.trace.json.gz"])
def test_capture_traces_count_capture_calls(rel: str) -> None:
    p = public(rel)
    expect = sum(1 for e in raw_events(p) if e.get("name") in ("hipStreamBeginCapture", "hipStreamEndCapture",
                                                               "hipGraphInstantiateWithFlags"))
    t = load_trace(p)
    assert t.meta.graph_capture_calls == expect > 0


def test_steady_state_traces_record_no_capture() -> None:
    """Capture-info queries run in every trace (b200 eager, mi300 resnet): they are not capture."""
    for rel in ("tracelens/b200__eager_trace.json.gz", "tracelens/mi300__resnet_act_checkpoint.json.gz"):
        t = load_trace(public(rel))
        assert t.meta.graph_capture_calls == 0 and not t.kernels["in_graph"].any()
    t = load_trace(SAMPLES / "tiny_graph.json.gz")  # a CUDA graph replay recorded on an H200
    assert t.meta.graph_launch_calls == 3 and t.kernels["in_graph"].sum() == 912


def test_synthetic_graph_launch_attributes_kernels_to_the_op_around_it(tmp_path: Path) -> None:
    """SYNTHETIC: one cudaGraphLaunch inside a user op replays three kernels (one correlation)."""
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 1000)
    b.op("CUDAGraph::replay", 10, 100)
    b._x("cuda_runtime", "cudaStreamBeginCapture", 1, 1, 10, 1, {"correlation": 1})
    b._x("cuda_runtime", "cudaStreamGetCaptureInfo_v2", 2, 1, 10, 1, {"correlation": 2})
    b._x("cuda_runtime", "cudaGraphLaunch", 20, 5, 10, 1, {"correlation": 9})
    for i in range(3):
        b._x("kernel", f"k{i}", 50 + 20 * i, 10, 0, 7, {"device": 0, "stream": 7, "correlation": 9})
    t = load_trace(b.write(tmp_path / "g.json"))
    assert t.kernels["in_graph"].all() and t.kernels["op"].tolist() == [0, 0, 0]
    assert t.meta.graph_capture_calls == 1 and t.meta.graph_launch_calls == 1
    assert t.runtime.set_index("name")["kind"].astype(str).to_dict() == {
        "cudaStreamBeginCapture": "graph_capture", "cudaStreamGetCaptureInfo_v2": "other",
        "cudaGraphLaunch": "graph_launch"}


# --- ROCm names, communication kernels ------------------------------------------------------------

def test_hip_call_kinds_on_the_no_pool_trace() -> None:
    p = public("tracelens/mi300__ddp_resnet18_no_pool__train_resnet18.json.gz")
    t = load_trace(p)
    kinds = t.runtime.groupby("name", observed=True)["kind"].first().astype(str).to_dict()
    assert kinds["hipMalloc"] == "malloc" and kinds["hipFree"] == "free"
    assert kinds["hipLaunchKernel"] == "launch" and kinds["hipExtModuleLaunchKernel"] == "launch"
    free_us = t.runtime.loc[t.runtime["kind"] == "free", "dur"].sum()
    assert free_us > 0.5 * t.steps["time"].sum()  # the documented defect: hipFree holds most of the time


def test_rccl_and_symmetric_memory_kernels_are_communication() -> None:
    t = load_trace(public("tracelens/mi300__resnet_act_checkpoint.json.gz"))
    rccl = t.kernels[t.kernels["name"].astype(str).str.startswith("ncclDevKernel")]
    assert len(rccl) == 17 and rccl["is_comm"].all() and (rccl["name_class"] == "communication").all()
    b200 = load_trace(public("tracelens/b200__eager_trace.json.gz")).kernels
    assert b200.loc[b200["name"].astype(str).str.contains("multimem_all_reduce"), "is_comm"].all()
    assert int(b200["is_comm"].sum()) == 74


def test_comm_patterns_and_call_names() -> None:
    comm = ["ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "rcclGenericKernel",
            "void deep_ep::intranode::dispatch<8, 768>(int4*, float*)", "cross_device_reduce_2stage<__nv_bfloat16, 8>",
            "void vllm::cross_device_reduce_1stage<float, 4>(...)", "a2a_dispatch_send_kernel", "all_to_all_kernel",
            "oneShotAllReduceKernel", "nvshmemi_transfer_kernel", "quickreduce::allreduce_prototype_twoshot"]
    not_comm = ["block_small_reduce_kernel", "void at::native::reduce_kernel<512, 1>", "splitKreduce_kernel",
                "_finalize_matmul_scatter_bf16", "paged_attention_ll4mi_reduce_kernel", "vectorized_gather_kernel"]
    assert all(names.comm_library(n) for n in comm), [n for n in comm if not names.comm_library(n)]
    assert not any(names.comm_library(n) for n in not_comm), [n for n in not_comm if names.comm_library(n)]
    assert names.call_kind("cuMemcpyDtoH_v2") == "sync" and "cuMemcpyDtoH_v2" in names.SYNC_CALLS
    assert names.call_kind("cudaLaunchKernel_ptsz") == names.call_kind("hipExtModuleLaunchKernel") == "launch"
    assert names.call_kind("hipMemcpyWithStream") == "sync" and names.call_kind("hipMemcpyAsync") == "other"
    assert names.call_kind("hipStreamGetCaptureInfo") == "other"
    from gpuprof.trace.names import SYNC_CALLS
    assert SYNC_CALLS is names.SYNC_CALLS


# --- vendors' twins -----------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["Qwen_Qwen1.5-0.5B-Chat__1016005", "gaunernst_bert-small-uncased__1016001"])
def test_h100_and_mi300x_twins_compare(model: str) -> None:
    """The same program on an H100 and an MI300X: steps, kernel counts and name classes agree."""
    h = load_trace(public(f"tracelens/h100__{model}.json.gz"))
    m = load_trace(public(f"tracelens/mi300__{model}.json.gz"))
    hk, mk = h.kernels[h.kernels["step"] >= 0], m.kernels[m.kernels["step"] >= 0]
    assert len(h.steps) == len(m.steps) == 1
    assert abs(len(hk) - len(mk)) <= 0.1 * len(hk)
    hc, mc = hk["name_class"].astype(str).value_counts(), mk["name_class"].astype(str).value_counts()
    for cls in ("gemm", "attention", "elementwise"):
        assert hc.get(cls, 0) == mc.get(cls, 0) > 0, (cls, hc.to_dict(), mc.to_dict())
    assert (hk["op"] >= 0).all() and (mk["op"] >= 0).all()


def test_synthetic_trace_clock_origin(tmp_path: Path) -> None:
    """SYNTHETIC: no baseTimeNanoseconds and ts far below Unix µs (a device/monotonic clock, as in
    some HIP traces): times still start at 0 and the origin says it is not Unix time."""
    b = TraceBuilder(offset_us=6_869_181_218_001.4)
    b.annotation("ProfilerStep#1", 0, 100)
    ext = b.op("aten::add", 10, 20)
    b.launch("elementwise_kernel", 12, 40, 5, ext)
    doc = b.document()
    del doc["baseTimeNanoseconds"]
    p = tmp_path / "clock.json"
    p.write_text(json.dumps(doc))
    t = load_trace(p)
    assert t.meta.time_origin == "trace-clock-us" and t.annotations["ts"].min() == 0.0
    assert t.kernels["op"].tolist() == [0]


# --- H200 recordings of the same cases (sample_traces/h200, recorded on the project's GPU) ---------

@pytest.mark.parametrize("name", ["gpt_gpu_only.json.gz", "resnet50_gpu_only.json.gz"])
def test_h200_gpu_only_traces(name: str, tmp_path: Path) -> None:
    """activities=[CUDA] on CUDA: runtime calls but no CPU ops; GPT and ResNet-50 differ in classes."""
    t = load_trace(SAMPLES / name)
    assert len(t.ops) == 0 and t.meta.cpu_events == 0 and t.meta.runtime_calls > 0
    cls = t.kernels["name_class"].astype(str).value_counts()
    assert cls.get("other", 0) < 0.1 * len(t.kernels)
    assert (cls.get("conv", 0) > 100) == name.startswith("resnet")  # only the CNN has convolutions
    doc = report_json(SAMPLES / name, tmp_path)
    assert "input_pipeline" in {s["analyzer"] for s in doc["analyzers_skipped"]}


def test_h200_capture_graph_and_allocator_samples() -> None:
    capture = load_trace(SAMPLES / "tiny_graph_capture.json.gz")
    raw = Counter(e.get("name") for e in raw_events(SAMPLES / "tiny_graph_capture.json.gz"))
    assert capture.meta.graph_capture_calls == sum(raw[n] for n in names.GRAPH_CAPTURE_CALLS) > 0
    replay = load_trace(SAMPLES / "mlp_graph.json.gz")
    assert replay.meta.graph_capture_calls == 0 and replay.meta.graph_launch_calls == 3
    assert replay.kernels.loc[replay.kernels["step"] >= 0, "in_graph"].all()
    churn = load_trace(SAMPLES / "gpt_no_caching_allocator.json.gz").runtime
    pooled = load_trace(SAMPLES / "gpt_aligned.json.gz").runtime
    per_step = [(r.loc[r["step"] >= 0, "kind"].astype(str) == "malloc").sum() for r in (churn, pooled)]
    assert per_step[0] > 100 * max(per_step[1], 1)  # PYTORCH_NO_CUDA_MEMORY_CACHING=1: cudaMalloc every op
