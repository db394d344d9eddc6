"""Functional tests on the real H200 traces in sample_traces/ (recorded by sample_traces/programs)."""

from __future__ import annotations

import json

import pytest

import gpuprof
from tests.conftest import SAMPLES


def timing(name: str) -> float:
    return float(json.loads((SAMPLES / "timings" / f"{name}.json").read_text())["step_ms"])


@pytest.fixture(scope="module")
def bf16() -> gpuprof.Analysis:
    return gpuprof.analyze(SAMPLES / "gpt_bf16.json.gz")


@pytest.fixture(scope="module")
def fp32() -> gpuprof.Analysis:
    return gpuprof.analyze(SAMPLES / "gpt_fp32.json.gz")


def test_bf16_model_flops_match_hand_count(bf16: gpuprof.Analysis) -> None:
    """6·N·tokens for the GEMMs plus causal attention, for the GPT in sample_traces/programs/gpt.py."""
    layers, d, seq, batch, vocab, heads = 6, 768, 512, 8, 50304, 12
    n_matmul = layers * (d * 3 * d + d * d + d * 4 * d + 4 * d * d) + d * vocab
    tokens = seq * batch
    attn_fwd = layers * 4 * batch * heads * seq * seq * (d // heads) / 2  # QK^T and PV, causal
    hand = 6 * n_matmul * tokens + 3.5 * attn_fwd  # backward = 2x GEMMs, 2.5x attention
    s = bf16.summary
    assert s["model_flops_per_step"] == pytest.approx(hand, rel=0.001)
    assert s["mfu_pct"] == pytest.approx(100 * hand / (s["step_time_ms"] * 1e-3 * 989.5e12), rel=0.001)


def test_fp32_gemms_run_on_cuda_cores_near_the_fp32_roof(fp32: gpuprof.Analysis) -> None:
    t = fp32.kernel_table
    top = t.head(6)
    assert (top["engine"] == "cuda").all() and (top["bound"] == "compute").all()
    assert (top["math_dtype"] == "fp32").all()
    assert top["roofline_pct"].between(40, 100).all()
    assert fp32.summary["breakdown_pct"]["compute"] > 80
    assert fp32.summary["step_time_ms"] == pytest.approx(timing("gpt_fp32"), rel=0.03)


def test_misaligned_vocab_falls_back_to_slow_kernels() -> None:
    a = gpuprof.analyze(SAMPLES / "gpt_vocab50257.json.gz")
    t = a.kernel_table
    fallback = t[t["name"].str.contains("cutlass_75_tensorop")]
    assert len(fallback) >= 3 and fallback["total_us"].sum() > 0.3 * t["total_us"].sum()
    assert (fallback["roofline_pct"] < 20).all()  # several times slower than the aligned GEMMs
    aligned = t[t["name"].str.startswith("nvjet")]
    assert aligned["roofline_pct"].median() > 50


def test_decode_gemvs_are_memory_bound() -> None:
    a = gpuprof.analyze(SAMPLES / "decode_b1.json.gz")
    t = a.kernel_table
    gemv = t[t["name"].str.startswith("nvjet")]
    assert (gemv["bound"] == "memory").all() and gemv["roofline_pct"].median() > 50
    assert a.summary["steps"] == 8 and a.summary["gpu_busy_pct"] < 50  # the host launches too slowly


def test_ddp_two_ranks_with_communication() -> None:
    a = gpuprof.analyze(SAMPLES / "ddp_slow_rank")
    s = a.summary
    assert [r["rank"] for r in s["per_rank"]] == [0, 1]
    waiting, slow = s["per_rank"]
    assert waiting["communication_pct"] > 3 * slow["communication_pct"]  # rank 0 waits for rank 1
    assert a.kernels["is_comm"].any()


def test_json_report_schema(bf16: gpuprof.Analysis) -> None:
    doc = json.loads(bf16.to_json())
    assert doc["schema_version"] == 1 and doc["tool"] == {"name": "gpuprof", "version": gpuprof.__version__}
    assert doc["source"]["ranks"] == [0] and doc["source"]["paths"][0].endswith("gpt_bf16.json.gz")
    assert doc["gpu"]["name"] == "NVIDIA H200 SXM"
    assert set(doc["gpu"]["spec"]) >= {"fp32_tflops", "tf32_tflops", "bf16_tflops", "fp8_tflops", "hbm_gbps"}
    s = doc["summary"]
    assert isinstance(s["steps"], int) and s["steps"] == 3
    for key in ("step_time_ms", "gpu_busy_pct", "mfu_pct"):
        assert isinstance(s[key], float)
    assert set(s["breakdown_pct"]) >= {"compute", "memory", "latency", "communication", "memcpy", "idle"}
    assert sum(s["breakdown_pct"].values()) == pytest.approx(100.0)
    ks = doc["kernels"]
    assert len({k["name"] for k in ks}) == len(ks)  # one row per kernel name
    assert [k["total_us"] for k in ks] == sorted((k["total_us"] for k in ks), reverse=True)
    for k in ks:
        assert set(k) >= {"name", "count", "total_us", "flops", "bytes", "achieved_tflops", "achieved_gbps",
                          "bound", "roofline_pct"}
        assert k["bound"] in ("compute", "memory", "latency", "unknown")
        assert isinstance(k["count"], int) and k["count"] > 0
    assert isinstance(doc["findings"], list)
    names_in_trace = set(bf16.ranks[0].trace.kernels["name"].astype(str))
    assert {k["name"] for k in ks} <= names_in_trace  # exactly as the trace spells them


def test_analysis_never_mutates_the_trace() -> None:
    a = gpuprof.analyze(SAMPLES / "gpt_manual_attn.json.gz")
    t = a.ranks[0].trace
    before = {n: getattr(t, n).drop(columns=[c for c in getattr(t, n).columns if getattr(t, n)[c].dtype == object])
              .copy() for n in ("kernels", "ops", "steps", "memcpys")}
    a.to_json()
    _ = a.kernel_table, a.steps, a.summary
    for n, df in before.items():
        now = getattr(t, n)[df.columns]
        assert now.equals(df), n
