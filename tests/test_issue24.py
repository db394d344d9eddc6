"""Issue #24 on real H200 traces: the model changes behind the held-out pairs' misses and the new
rules (kv_cache, batching), each with a bad trace that must raise it and good ones that must not.
The held-out traces (sample_traces/h200/heldout/) check the rules here; no threshold is fitted on them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gpuprof
from benchmarks.pairs import realised_ms, step_ms, trace_path
from gpuprof.jobs import load_trace_cached
from gpuprof.replay import build
from tests.conftest import TraceBuilder


def analysed(name: str, with_step: bool = True) -> gpuprof.Analysis:
    return gpuprof.analyze(trace_path(name), step_ms=step_ms(name) if with_step else None, cache=False)


def finding(a: gpuprof.Analysis, category: str) -> gpuprof.Finding | None:
    return next((f for f in a.findings if f.category == category), None)


# --- pageable copies: the call waits for its copy, the op syncs its stream ----------------------

def test_a_copy_call_that_always_waited_costs_a_call_when_it_does_not() -> None:
    """ho_unet_pageable: every cudaMemcpyAsync is a 28 MB pageable copy that waited (7.5 ms behind
    the GPU, then 3.3 ms of copy); its own cost without the wait is a call's, not the 10.8 ms."""
    t = load_trace_cached(trace_path("ho_unet_pageable"), 0, False)
    g = build([t])
    copy = (g.h_name == "cudaMemcpyAsync") & (g.h_wait >= 0)
    assert copy.sum() >= 6
    assert float(np.max(g.h_dur[copy])) < 100.0
    assert float(np.min((g.h_end - g.h_ts)[copy])) > 3000.0


@pytest.mark.parametrize("name,good", [("vision_pageable", "vision_pinned"), ("ho_unet_pageable", "ho_unet"),
                                       ("ho_whisper_pageable", "ho_whisper")])
def test_pageable_copies_own_the_syncs_of_their_op(name: str, good: str) -> None:
    """A blocking `.to()` of a pageable batch syncs inside its own op: pageable_memcpy claims that
    wait, host_sync does not name `aten::to` for it; ho_unet_pageable raised no pageable finding
    before (its copy calls' waits were read as their own cost)."""
    a = analysed(name)
    f = finding(a, "pageable_memcpy")
    assert f is not None and f.evidence["estimate"] == "replay"
    assert f.evidence["copy_sync_idle_ms_per_step"] > 0
    s = finding(a, "host_sync")
    assert s is None or "aten::to" not in s.evidence["syncing_ops"]
    if name == "vision_pageable":  # the tuned pair: within ±20 % of what pinning realised
        assert f.estimated_savings_ms == pytest.approx(realised_ms(name, good), rel=0.2)


# --- optimizer_fusion: per-parameter update kernels whatever launched them ---------------------

@pytest.mark.parametrize("name,params", [("ho_effnetb0_sgdloop", 213), ("ho_mixer_sgdloop", 102)])
def test_a_hand_written_sgd_loop_is_an_unfused_optimizer(name: str, params: int) -> None:
    """No torch.optim, no Optimizer.step annotation: the same four elementwise ops once per
    parameter after backward, said in the evidence; the model's fusions leave those kernels to it."""
    from gpuprof.hostops import update_loops

    t = load_trace_cached(trace_path(name), 0, False)
    loops = update_loops(t)
    assert len(loops) == 3 and set(loops["repeats"]) == {params} and set(loops["period"]) == {4}
    assert not t.annotations["name"].astype(str).str.startswith("Optimizer.step#").any()
    f = finding(analysed(name), "optimizer_fusion")
    assert f is not None and f.evidence["estimate"] == "replay"
    assert f.evidence["parameter_tensors"] == params and "no Optimizer.step annotation" in f.evidence["seen"]
    assert "aten::mul_" in f.evidence["ops_per_parameter"] and "foreach=True" in f.recommendation


@pytest.mark.parametrize("name", ["ho_effnetb0_cl", "ho_mixer", "gpt_bf16", "resnet50_bf16_cl", "llama_bf16",
                                  "gpt_adamw_forloop", "ho_neox_adamw_forloop", "decode_b1", "ho_qwen2_nocache"])
def test_no_update_loop_where_none_was_written(name: str) -> None:
    """torch.optim's steps (foreach, fused, or a for-loop inside Optimizer.step: the annotated
    reading's), and inference, hold no unannotated per-parameter loop."""
    from gpuprof.hostops import update_loops

    assert update_loops(load_trace_cached(trace_path(name), 0, False)).empty


# --- kv_cache and batching: the new rules, a bad trace each that must raise them, good ones not --

NOT_KV = ["ho_qwen2_cache", "ho_decoder_cache", "decode_b1", "decode_b64", "gpt_decode_b1", "gpt_decode_b1_graph",
          "llama_generate_b1", "llama_generate_b1_static", "gpt_bf16", "llama_bf16", "resnet50_bf16_cl",
          "ho_deberta_per_request", "ho_mnv3_per_request", "ho_vits16", "ho_neox", "ho3_gpt2_cache", "ho3_gemma"]
NOT_BATCHING = ["ho_deberta_batched", "ho_mnv3_batched", "ho_qwen2_nocache", "ho_qwen2_cache", "ho_decoder_nocache",
                "decode_b1", "decode_b64", "gpt_decode_b1", "gpt_decode_b1_graph", "llama_generate_b1",
                "llama_generate_b1_static", "mlp_eager", "tiny_eager", "gpt_bf16", "resnet50_bf16_cl", "ho_mixer"]


@pytest.mark.parametrize("name", ["ho_qwen2_nocache", "ho_decoder_nocache"])
def test_decoding_without_a_cache_names_the_kv_cache_first(name: str) -> None:
    a = analysed(name)
    f = a.findings[0]
    assert f.category == "kv_cache" and f.evidence["estimate"] == "replay"
    assert f.evidence["passes_per_step"] == 8 and f.evidence["tokens_first_pass"] == 1024
    assert f.evidence["tokens_last_pass"] == 1031
    assert "past_key_values" in f.recommendation and "static cache" in f.recommendation.lower()
    # the GPU work of the seven passes after the prefill mostly goes; the host stays
    assert f.evidence["gpu_ms_per_step_cached"] < 0.25 * f.evidence["gpu_ms_per_step_passes_after_first"]
    launch = finding(a, "launch_overhead")
    assert launch is None or launch.estimated_savings_ms < f.estimated_savings_ms


def test_a_third_decoder_is_seen_decoding_without_a_cache() -> None:
    """Held-out round 3 (transformers GPT-2, a family nothing here was tuned on): the rule sees the
    eight growing passes. Not asserted first: with its unprofiled step time the estimate ranks it
    fourth (0.8 ms against 10.4 realised; docs/accuracy.md says why: its host-bound cached twin)."""
    f = finding(analysed("ho3_gpt2_nocache"), "kv_cache")
    assert f is not None and f.evidence["passes_per_step"] == 8
    assert f.evidence["tokens_first_pass"] == 1024 and f.evidence["tokens_last_pass"] == 1031


@pytest.mark.parametrize("name", NOT_KV)
def test_no_kv_cache_finding_where_a_cache_is_kept_or_nothing_decodes(name: str) -> None:
    assert finding(analysed(name), "kv_cache") is None


@pytest.mark.parametrize("name,requests", [("ho_deberta_per_request", 8), ("ho_mnv3_per_request", 16)])
def test_requests_served_one_at_a_time_name_batching_first(name: str, requests: int) -> None:
    """Not CUDA graphs: batching removes most launches itself, and graphs claim what it leaves."""
    a = analysed(name)
    f = a.findings[0]
    assert f.category == "batching" and f.evidence["estimate"] == "replay"
    assert f.evidence["requests_per_step"] == requests
    assert "batch" in f.recommendation.lower() and "CUDA graph" in f.recommendation
    launch = finding(a, "launch_overhead")
    assert launch is None or "first_fix" in launch.evidence


@pytest.mark.parametrize("name", NOT_BATCHING)
def test_no_batching_finding_for_one_forward_per_step_decode_or_training(name: str) -> None:
    assert finding(analysed(name), "batching") is None


# --- precision per architecture ----------------------------------------------------------------

V100 = "/work/shared/traces/public/tb/nw4_a.pt.trace.json.gz"


def test_v100_is_told_fp16_with_a_grad_scaler_priced_at_the_fp16_rate() -> None:
    """A public ResNet-50 training trace on a V100 (the TensorBoard plugin's sample): no BF16 and no
    TF32 on that part, so FP16 autocast with a GradScaler, priced at the FP16 tensor rate."""
    import re
    from pathlib import Path

    if not Path(V100).is_file():
        pytest.skip(f"the shared public corpus is not here ({V100})")
    a = gpuprof.analyze(V100, cache=False)
    assert a.spec is not None and "V100" in a.spec.name
    f = finding(a, "precision")
    assert f is not None and f.evidence["priced_dtype"] == "fp16"
    assert f.evidence["priced_peak_tflops"] == a.spec.peak("fp16") > 4 * a.spec.peak("fp32")
    assert "torch.float16" in f.recommendation and "GradScaler" in f.recommendation
    for x in list(a.findings) + list(a.notes):
        assert not re.search(r"bf16|bfloat16|tf32", x.title + x.recommendation, re.I), x.id


def test_ampere_and_newer_keep_bf16_and_tf32() -> None:
    a = analysed("gpt_fp32")
    f = finding(a, "precision")
    assert f is not None and f.evidence["priced_dtype"] == "bf16"
    assert "torch.bfloat16" in f.recommendation and "allow_tf32" in f.recommendation
    assert "GradScaler" not in f.recommendation


def test_gemm_bound_bf16_on_hopper_is_told_fp8_priced_at_the_fp8_rate() -> None:
    """ho_mlp_bf16: 74 % of the step is bf16 GEMMs at 734 TFLOP/s; FP8 with the casts fused. Its
    eager twin (ho_mlp_fp8, _scaled_mm with the casts written out) realised nothing, which the fix
    says; the estimate prices the fused recipe."""
    a = analysed("ho_mlp_bf16")
    f = a.findings[0]
    assert f.id == "GP-PREC-002" and f.category == "precision" and f.evidence["priced_dtype"] == "fp8"
    assert f.evidence["fp8_peak_tflops"] == 1979.0
    assert "Transformer Engine" in f.recommendation and "torchao" in f.recommendation
    assert "torch.compile" in f.recommendation and "eager" in f.recommendation
    assert 0.2 * step_ms("ho_mlp_bf16") < f.estimated_savings_ms < 0.5 * step_ms("ho_mlp_bf16")


@pytest.mark.parametrize("name", ["ho_mlp_fp8", "gpt_bf16", "gpt_aligned", "llama_bf16", "ho_neox", "ho_vits16",
                                  "ho_decoder_nocache"])
def test_no_fp8_advice_where_gemms_do_not_set_the_step(name: str) -> None:
    assert not any(f.id == "GP-PREC-002" for f in analysed(name).findings)


def test_a_launch_bound_training_step_that_repeats_a_sequence_keeps_its_launch_finding(tmp_path: Path) -> None:
    """SYNTHETIC training trace: each step runs one 16-kernel sequence four times over batch-1
    inputs, then a backward op, every kernel 2 µs behind a 25 µs launch. That is the shape of
    requests served one at a time, but a training step (a backward ran): the batching and kv_cache
    rules read forward-only traces, so neither fires, and launch overhead, which defers to them where
    they do, must still be named here."""
    b = TraceBuilder()
    t = 0.0
    for s in range(3):
        start = t
        b.annotation(f"ProfilerStep#{s + 3}", start, 4 * 16 * 25.0 + 60.0)
        for _ in range(4):
            for j in range(16):
                e = b.op(f"aten::op{j}", t, 20.0, [[1, 128, 64], [64]], ["float", "float"])
                b.launch(f"kernel_{j}", t + 2, t + 8, 2.0, e, grid=(4, 1, 1))
                t += 25.0
        e = b.op("autograd::engine::evaluate_function: AddBackward0", t, 20.0, [[1, 128, 64]], ["float"])
        b.launch("kernel_backward", t + 2, t + 8, 2.0, e, grid=(4, 1, 1))
        t = start + 4 * 16 * 25.0 + 61.0
    a = gpuprof.analyze(b.write(tmp_path / "repeats_training.json"), cache=False)
    cats = [f.category for f in a.findings]
    assert "batching" not in cats and "kv_cache" not in cats
    launch = finding(a, "launch_overhead")
    assert launch is not None and "first_fix" not in launch.evidence


@pytest.mark.parametrize("helper", ["_token_passes", "_request_repeats"])
def test_the_inference_searches_run_once_per_rank(helper: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a launch-bound per-request trace launch_overhead asks for the growing passes and the
    per-request repeats before the kv_cache and batching rules do (each search ran twice before
    RankView.shared); the rank's view keeps what the first search found, and batching stays first."""
    from gpuprof.analyzers import inference

    calls = []
    real = getattr(inference, helper)

    def counted(v: object) -> object:
        calls.append(v)
        return real(v)

    monkeypatch.setattr(inference, helper, counted)
    a = analysed("ho_deberta_per_request")
    assert len(calls) == 1
    assert a.findings[0].category == "batching"
