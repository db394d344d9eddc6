"""Numbers a user can trust (issue 11): step times checked against the trace, no kernel above its
roofline as fact, no zero-saving fixes, and the summaries that show confidence and ranking."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import gpuprof
from gpuprof.roofline import MODEL_ERROR_PCT, classify
from gpuprof.specs import resolve
from gpuprof.trace.load import load_trace
from tests.conftest import SAMPLES, TraceBuilder

REPORTABLE = sorted([*SAMPLES.glob("*.json.gz"), *(p for p in SAMPLES.iterdir() if p.is_dir() and p.name != "timings")])


# --- roofline: cost models and impossible points -------------------------------------------

def test_nll_loss_backward_counts_the_elements_it_writes() -> None:
    """The GPT samples' loss backward writes one element per token (grad_input is zeroed by its
    own fill kernel): it ran at 86 TB/s (1801 % of the roofline) when the whole N x vocab gradient
    was counted."""
    a = gpuprof.analyze(SAMPLES / "gpt_bf16.json.gz")
    k = a.kernel_table
    row = k[k["name"].str.contains("nll_loss_backward")].iloc[0]
    assert row["bytes"] == pytest.approx(3 * 4096 * (8 + 4))  # 3 steps x 4096 targets: index read, value written
    assert not row["cost_model_error"] and row["roofline_pct"] < 5  # one block: a latency-bound kernel


@pytest.mark.parametrize("sample,elt", [("gpt_bf16", 2), ("gpt_fp32", 4)])
def test_cat_bytes_follow_the_element_size_its_kernel_names(sample: str, elt: int) -> None:
    """``cat`` records TensorList shapes without a dtype; its kernel is OpaqueType<2u> under bf16
    autocast (166 % of the roofline when counted as 4-byte floats) and OpaqueType<4u> in FP32."""
    a = gpuprof.analyze(SAMPLES / f"{sample}.json.gz")
    k = a.kernel_table
    row = k[k["name"].str.contains("CatArrayBatchedCopy")].iloc[0]
    per_call = 2 * 3 * 8 * 512 * 768 * elt  # three [8, 512, 768] inputs read, one output written
    assert row["bytes"] == pytest.approx(per_call * row["count"])
    assert row["roofline_pct"] <= MODEL_ERROR_PCT


def test_a_kernel_above_its_roofline_is_flagged_and_left_out(tmp_path: Path) -> None:
    """SYNTHETIC: a GEMM that 'ran' at 2x the bf16 peak cannot be real; it is a cost-model error,
    not compute time, and its FLOPs do not count towards MFU."""
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 10_000)
    mm = b.op("aten::mm", 1, 5, [[8192, 8192], [8192, 8192]], ["c10::BFloat16", "c10::BFloat16"])
    b.launch("nvjet_sm90_tst_256x128", 2, 100, 555.0, mm, grid=(132, 1, 1))  # 1.1 TFLOP in 0.555 ms: 200 %
    ok = b.op("aten::mm", 10, 5, [[4096, 4096], [4096, 4096]], ["c10::BFloat16", "c10::BFloat16"])
    b.launch("nvjet_sm90_tst_128x128", 11, 1000, 300.0, ok, grid=(132, 1, 1))
    path = b.write(tmp_path / "t.json")
    t = load_trace(path)
    r = classify(t, resolve(t.meta.device_properties))
    assert r["model_error"].tolist() == [True, False]
    assert r["model_error_pct"].iloc[0] == pytest.approx(100 * 2 * 8192**3 / 989.5e12 / 555e-6, rel=1e-6)
    assert str(r["bound"].iloc[0]) == "unknown" and str(r["bound"].iloc[1]) == "compute"
    doc = gpuprof.analyze(path).to_dict()
    bad = next(k for k in doc["kernels"] if k["name"] == "nvjet_sm90_tst_256x128")
    assert bad["cost_model_error"] and bad["roofline_pct"] is None and bad["cost_model_error_pct"] > 190
    assert doc["summary"]["model_flops_per_step"] == pytest.approx(2 * 4096**3)  # only the possible GEMM
    assert doc["summary"]["breakdown_pct"]["unknown"] > 0
    assert any("above its roofline" in w for w in doc["warnings"])


@pytest.mark.parametrize("sample", REPORTABLE, ids=lambda p: p.name)
def test_no_sample_kernel_above_its_roofline_unless_flagged(sample: Path) -> None:
    doc = json.loads(gpuprof.analyze(sample).to_json())
    over = [k["name"] for k in doc["kernels"] if (k["roofline_pct"] or 0) > MODEL_ERROR_PCT]
    assert not over
    for k in doc["kernels"]:
        if k["cost_model_error"]:
            assert k["cost_model_error_pct"] > MODEL_ERROR_PCT and k["cost_model_error_count"] >= 1
