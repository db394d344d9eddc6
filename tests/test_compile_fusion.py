"""Issue #12 item 4, what torch.compile realises, on real H200 eager/compiled twins
(sample_traces/h200/depth_pairs.json, class "what torch.compile realises"): the eager trace raises
the compile finding (first where compile is the biggest realised fix), its estimate of compile
applied alone (replayed: gpuprof.replay.fixes) is within ±20 % of the realised saving (the ResNet-50 pair, whose saving is smaller
than its timing noise: widened by that noise), and the compiled twin never raises it.
Realised savings are differences of unprofiled step times (sample_traces/h200/timings). Plus
unit tests of the Inductor model on synthetic traces built here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import gpuprof
from benchmarks.pairs import H200, depth_pairs, realised_noise_ms, step_ms, trace_path
from gpuprof.analyzers import compile_fusion
from tests.conftest import TraceBuilder, views
from tests.conftest import sample_analysis as analysis

PAIRS = [(bad, good) for _, _, bad, good in depth_pairs(("compile",))]
def compile_finding(name: str) -> gpuprof.Finding | None:
    return next((f for f in analysis(name).findings if f.category == "compile"), None)


def timing(name: str) -> dict[str, object]:
    doc: dict[str, object] = json.loads((H200 / "timings" / f"{name}.json").read_text())
    return doc


def same_session(bad: str, good: str) -> bool:
    """Whether both step times were measured in one device session: the lent machine's host speed
    differs between sessions (gpt_bf16 8.90 ms on 2026-11-30, 12.83 ms in session2), so a host-bound
    pair's realised saving only means something within one (sample_traces/README.md)."""
    return timing(bad).get("session") == timing(good).get("session")


def test_the_three_compiled_twins_are_paired() -> None:
    assert {("llama_bf16", "llama_compile"), ("gpt_bf16", "gpt_compile"),
            ("resnet50_bf16_cl", "resnet50_bf16_cl_compile")} <= set(PAIRS)


@pytest.mark.parametrize("bad,good", PAIRS)
def test_compiled_twin_does_not_raise_compile(bad: str, good: str) -> None:
    assert compile_finding(good) is None
    a = analysis(good)
    (v,) = views(a)
    assert compile_fusion.already_compiled(v)


@pytest.mark.parametrize("bad,good", PAIRS)
def test_compile_estimate_matches_what_compile_realised(bad: str, good: str) -> None:
    f = compile_finding(bad)
    assert f is not None and "torch.compile(model)" in f.recommendation
    cats = [x.category for x in analysis(bad).findings]
    assert "compile" in cats[:3], cats
    alone = f.evidence["estimated_saving_alone_ms"]
    realised = step_ms(bad) - step_ms(good)
    if not same_session(bad, good):
        pass  # gpt_compile predates session2's gpt_bf16: ranking and twin checks only
    elif realised >= 0.1 * step_ms(bad):
        # compile is this program's biggest realised fix: ranked first, within ±20 %
        assert cats[0] == "compile", cats
        assert alone == pytest.approx(realised, rel=0.2), (alone, realised)
    else:
        # a saving smaller than the pair's own timing noise (half-range of each member's windows):
        # within ±20 % widened by that noise, as tests/test_analyzers.py does
        noise = realised_noise_ms(bad, good)
        assert noise > realised and abs(alone - realised) <= 0.2 * realised + noise, (alone, realised, noise)
    # the reported saving is what it adds to the findings that claim before it, never more than alone
    assert f.estimated_savings_ms <= alone + 1e-6
    ev = f.evidence
    assert ev["kernels_after_per_step"] < ev["kernels_per_step"]
    # one way to estimate: the replay of the Inductor kernels and the compiled host, both figures
    assert ev["estimate"] == "replay" and ev["replay_before_ms"] > ev["replay_after_ms"]


def test_kernel_count_after_compile_matches_the_compiled_twins() -> None:
    """The Inductor model's kernels per step against the compiled twins' own kernel counts."""
    for bad, good in PAIRS:
        predicted = compile_finding(bad).evidence["kernels_after_per_step"]  # type: ignore[union-attr]
        k = analysis(good).kernels
        actual = float((k["step"] >= 0).sum()) / analysis(good).summary["steps"]
        assert predicted == pytest.approx(actual, rel=0.15), (bad, predicted, actual)


def test_hand_fusion_pair_keeps_elementwise_fusion_first() -> None:
    """gpt_naive_elementwise's fix is hand fusion (fused LayerNorm/GELU), not compile: the
    elementwise finding claims its kernels before compile does and keeps its whole estimate."""
    a = analysis("gpt_naive_elementwise")
    assert a.findings[0].category == "elementwise_fusion"
    only = gpuprof.analyze(trace_path("gpt_naive_elementwise"), step_ms=step_ms("gpt_naive_elementwise"),
                           analyzers=["elementwise_fusion"])
    assert a.findings[0].estimated_savings_ms == pytest.approx(only.findings[0].estimated_savings_ms, rel=1e-6)
    f = compile_finding("gpt_naive_elementwise")
    assert f is not None and f.evidence["estimated_saving_alone_ms"] > f.estimated_savings_ms


def test_already_compiled_traces_are_never_told_to_compile() -> None:
    """HF generate with a static cache compiles its decode step by itself (Torch-Compiled Region
    spans, triton kernels): no compile finding there either."""
    assert compile_finding("llama_generate_b1_static") is None


@pytest.mark.parametrize("dims,concrete,name,want", [
    ([[4096, 768], [], [], []], ["", "[0]", "True", ""], "aten::sum", 1),  # bias gradient
    ([[8, 512, 1024], [], [], []], ["", "[0, 1]", "True", ""], "aten::sum", 1),  # RMSNorm weight gradient
    ([[8, 512, 1024], [], [], []], ["", "[-1]", "True", ""], "aten::mean", 0),  # RMSNorm statistics per row
    ([[8, 512, 1024], [], [], []], ["", "[2]", "True", ""], "aten::sum", 0),
    ([[64, 1000], [], [], []], ["", "[0]", "True", ""], "aten::sum", 0),  # a short extent: one pass
    ([[8, 512, 768], [8, 512, 768], [], [8, 512, 1], [8, 512, 1], [768], [768], []],
     ["", "", "[768]", "", "", "", "", "[True, True, True]"], "aten::native_layer_norm_backward", 2),
    ([[64, 256, 56, 56], [256], [256], [256], [256], [], [], []],
     ["", "", "", "", "", "True", "0.1", "1e-05"], "aten::native_batch_norm", 2),
    ([[64, 256, 56, 56], [256], [256], [256], [256], [], [], []],
     ["", "", "", "", "", "False", "0.1", "1e-05"], "aten::native_batch_norm", 0),  # eval: running stats
    ([[8, 512, 1024], [8, 512, 1024], []], ["", "", "1"], "aten::add", 0),
])
def test_split_reductions(dims: list[object], concrete: list[object], name: str, want: int) -> None:
    assert compile_fusion.split_passes(name, dims, concrete) == want


def _eager_step_trace(tmp_path: Path, kernel: str = "void at::native::vectorized_elementwise_kernel<4>",
                      span: str | None = None) -> Path:
    """SYNTHETIC: two steps of matmul, then four elementwise ops on one [4096, 1024] activation
    and one cast of a [1024, 1024] weight, then a matmul; the host launches every 20 µs, so the
    step is bound by its host (GPU kernels of 2-12 µs)."""
    b = TraceBuilder()
    x = [4096, 1024]
    for s in range(2):
        t0 = s * 1000.0
        b.annotation(f"ProfilerStep#{s + 1}", t0, 1000)
        if span:
            b.annotation(span, t0 + 1, 400)
        seq = [("aten::mm", [x, [1024, 1024]], "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", 12.0)]
        seq += [(op, [x, x], kernel, 10.0) for op in ("aten::add", "aten::mul", "aten::mul", "aten::add")]
        seq += [("aten::copy_", [[1024, 1024], [1024, 1024], []], kernel, 2.0)]
        seq += [("aten::mm", [x, [1024, 1024]], "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", 12.0)]
        for i, (op, dims, kname, dur) in enumerate(seq):
            ts = t0 + 20.0 + 100.0 * i
            ext = b.op(op, ts, 15.0, dims=dims, types=["c10::BFloat16"] * len(dims))
            b.launch(kname, ts + 5, ts + 40, dur, ext)
    return b.write(tmp_path / "eager.json")


def test_synthetic_run_fuses_per_iteration_space(tmp_path: Path) -> None:
    a = gpuprof.analyze(_eager_step_trace(tmp_path), step_ms=0.8, analyzers=["compile"])
    (f,) = a.findings
    ev = f.evidence
    # the four activation ops become one kernel; the weight's cast stays its own kernel
    assert ev["kernels_per_step"] == 7 and ev["kernels_after_per_step"] == 4
    # the step is bound by its host: the replayed host keeps its cost per kernel for the 4 of 7
    # kernels left, so the step shortens by most of the host's 3/7 (not all: the last kernel's
    # latency and run after the last launch stay) and by no more than that plus the GPU's saving
    assert ev["estimate"] == "replay"
    host_share = 0.8 * 3 / 7
    assert 0.5 * host_share < f.estimated_savings_ms <= host_share + ev["gpu_ms_saved_per_step"], f.estimated_savings_ms


@pytest.mark.parametrize("kernel,span", [("triton_poi_fused_add_mul_0", None),
                                         ("void at::native::vectorized_elementwise_kernel<4>",
                                          "Torch-Compiled Region: 0/0")])
def test_synthetic_compiled_trace_is_not_told_to_compile(tmp_path: Path, kernel: str, span: str | None) -> None:
    a = gpuprof.analyze(_eager_step_trace(tmp_path, kernel, span), step_ms=0.8, analyzers=["compile"])
    assert not a.findings
