"""Engines from kernel names, bound classes, the step timeline, and GPU specs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpuprof.errors import SpecError
from gpuprof.roofline import classify, engine_of
from gpuprof.specs import BUILTIN, find_builtin, load_spec_file, resolve
from gpuprof.timeline import exclusive_time
from gpuprof.trace.load import load_trace
from tests.conftest import TraceBuilder


@pytest.mark.parametrize("name,engine", [
    ("nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_NNT", "tensor"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>(cutlass_80_simt_sgemm_128x256_8x4_nt_align1::Params)", "cuda"),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas", "cuda"),
    ("void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1>(...)", "tensor"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0", "tensor"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, cutlass::Sm80>)", "cuda"),
    ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64", "tensor"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", ""),
])
def test_engine_from_kernel_name(name: str, engine: str) -> None:
    assert engine_of(pd.Series([name], dtype="category")).iloc[0] == engine


def test_bound_classes_on_synthetic_kernels(tmp_path: Path) -> None:
    """SYNTHETIC kernels with hand-computed roofline positions on an H200 (989.5 TFLOP/s, 4.8 TB/s)."""
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 10_000)
    big = b.op("aten::mm", 1, 5, [[8192, 8192], [8192, 8192]], ["c10::BFloat16", "c10::BFloat16"])
    b.launch("nvjet_sm90_tst_256x128", 2, 100, 1400.0, big, grid=(132, 1, 1))  # 1.1 TFLOP in 1.4 ms: 79% of roof
    add = b.op("aten::add", 10, 5, [[64 << 20], [64 << 20], []], ["float", "float", "Scalar"])
    b.launch("vectorized_elementwise_kernel_add", 11, 2000, 400.0, add, grid=(65536, 1, 1))  # 805 MB at 2 TB/s
    tiny = b.op("aten::add", 20, 5, [[256], [256], []], ["float", "float", "Scalar"])
    b.launch("vectorized_elementwise_kernel_add", 21, 3000, 4.0, tiny, grid=(1, 1, 1))  # 3 KB in 4 µs
    odd = b.op("aten::my_custom_op", 30, 5, [[256]], ["float"])
    b.launch("my_kernel", 31, 4000, 50.0, odd)
    t = load_trace(b.write(tmp_path / "t.json"))
    r = classify(t, resolve(t.meta.device_properties))
    assert r["bound"].astype(str).tolist() == ["compute", "memory", "latency", "unknown"]
    assert r["roofline_pct"].iloc[0] == pytest.approx(100 * (2 * 8192**3 / 989.5e12) / 1400e-6, rel=1e-6)
    assert np.isnan(r["roofline_pct"].iloc[3]) and np.isnan(r["flops"].iloc[3])
    assert r["math_dtype"].iloc[0] == "bf16" and r["engine"].iloc[0] == "tensor"


def test_fp32_gemm_on_cuda_cores_uses_fp32_roof(tmp_path: Path) -> None:
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 10_000)
    mm = b.op("aten::mm", 1, 5, [[4096, 4096], [4096, 4096]], ["float", "float"])
    b.launch("cutlass_80_simt_sgemm_128x256_8x4_nt_align1", 2, 100, 3000.0, mm)
    t = load_trace(b.write(tmp_path / "t.json"))
    r = classify(t, resolve(t.meta.device_properties))
    assert r["math_dtype"].iloc[0] == "fp32" and r["peak_tflops"].iloc[0] == 67.0


def test_no_spec_means_unknown_not_invented(tmp_path: Path) -> None:
    b = TraceBuilder(device={"name": "Mystery GPU 9000"})
    b.annotation("ProfilerStep#1", 0, 1000)
    mm = b.op("aten::mm", 1, 5, [[64, 64], [64, 64]], ["float", "float"])
    b.launch("sgemm", 2, 10, 5.0, mm)
    t = load_trace(b.write(tmp_path / "t.json"))
    spec = resolve(t.meta.device_properties)
    assert spec is None
    assert (classify(t, spec)["bound"] == "unknown").all()


def test_exclusive_time_priorities() -> None:
    # compute [0,10), comm [5,20) overlapping, memcpy [25,30); window [0,40)
    s, e = np.array([0.0, 5.0, 25.0]), np.array([10.0, 20.0, 30.0])
    c = np.array(["compute", "communication", "memcpy"], dtype=object)
    t = exclusive_time(s, e, c, 0.0, 40.0)
    assert t["compute"] == 10 and t["communication"] == 10 and t["memcpy"] == 5 and t["idle"] == 15
    assert sum(t.values()) == 40


def test_gpu_names_and_overrides(tmp_path: Path) -> None:
    assert find_builtin("NVIDIA H200").key == "H200-SXM"  # type: ignore[union-attr]
    assert find_builtin("NVIDIA H100 80GB HBM3").key == "H100-SXM"  # type: ignore[union-attr]
    assert find_builtin("NVIDIA H100 PCIe").key == "H100-PCIE"  # type: ignore[union-attr]
    assert find_builtin("NVIDIA A100-SXM4-80GB").key == "A100-SXM4-80GB"  # type: ignore[union-attr]
    assert find_builtin("NVIDIA A100 80GB PCIe").key == "A100-PCIE-80GB"  # type: ignore[union-attr]
    assert find_builtin("NVIDIA L40S").hbm_gbps == 864  # type: ignore[union-attr]
    assert len(BUILTIN) >= 11
    assert resolve([], gpu="h100-sxm").key == "H100-SXM"  # type: ignore[union-attr]
    with pytest.raises(SpecError, match="unknown GPU"):
        resolve([], gpu="Voodoo5")


def test_spec_file_measured_ceilings(tmp_path: Path) -> None:
    p = tmp_path / "spec.json"
    p.write_text(json.dumps({"name": "NVIDIA H200", "measured": True, "peaks_tflops": {"bf16": 731.5}, "hbm_gbps": 4106.1}))
    s = load_spec_file(p)
    assert s.peak("bf16") == 731.5 and s.peak("fp32") == 67.0 and s.hbm_gbps == 4106.1
    assert "bf16" in s.measured
    for bad, msg in (("{", "not a JSON"), ('{"name": "x", "peaks_tflops": {"bf16": -1}}', "positive"),
                     ('{"name": "x", "peaks_tflops": {"bf99": 1}}', "unknown dtype"),
                     ('{"name": "Mystery", "peaks_tflops": {}}', "hbm_gbps")):
        p.write_text(bad)
        with pytest.raises(SpecError, match=msg):
            load_spec_file(p)


def test_scalar_elementwise_paths_are_issue_bound_on_hopper_only(tmp_path: Path) -> None:
    """SYNTHETIC: the same aten::add (64 Mi floats, 805 MB at 1.3 TB/s) on TensorIterator's three
    paths. The vectorised kernel is memory-bound; the legacy strided kernel and the dynamic-cast
    one are instruction-issue-bound on an H200 (compute), and memory-bound on an A100 spec."""
    b = TraceBuilder()
    b.annotation("ProfilerStep#1", 0, 10_000)
    names = ["void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int, x)",
             "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
             "CUDAFunctor_add<float> >(at::TensorIteratorBase&)::{lambda(int)#1}>(int, x)",
             "void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>, "
             "4, TrivialOffsetCalculator<2, unsigned int>>(int, x)"]
    for i, n in enumerate(names):
        add = b.op("aten::add", 10 + 1000 * i, 5, [[64 << 20], [64 << 20], []], ["float", "float", "Scalar"])
        b.launch(n, 11 + 1000 * i, 2000 + 1000 * i, 600.0, add, grid=(65536, 1, 1))
    tiny = b.op("aten::add", 5000, 5, [[256], [256], []], ["float", "float", "Scalar"])
    b.launch(names[1], 5001, 6000, 4.0, tiny, grid=(1, 1, 1))  # short and far below the roof: latency
    t = load_trace(b.write(tmp_path / "t.json"))
    r = classify(t, resolve(t.meta.device_properties))
    assert r["bound"].astype(str).tolist() == ["memory", "compute", "compute", "latency"]
    assert r["issue_bound"].tolist() == [False, True, True, False]
    assert r["roofline_pct"].iloc[1] == pytest.approx(r["roofline_pct"].iloc[0])  # still against its bytes
    a100 = next(s for s in BUILTIN.values() if s.arch == "8.0")
    assert classify(t, a100)["bound"].astype(str).tolist()[:3] == ["memory"] * 3


@pytest.mark.parametrize("dims,strides,want", [
    # ResNet-50's threshold_backward: an NCHW gradient with a channels-last activation
    ([[64, 2048, 7, 7], [64, 2048, 7, 7], []], [[100352, 49, 7, 1], [100352, 1, 14336, 2048], []], False),
    # gpt_misaligned's head split: both operands strided, both unit-stride along the last dimension
    ([[8, 4, 512, 255], [8, 4, 512, 255], []], [[524288, 131072, 256, 1], [1566720, 255, 3060, 1], []], True),
    ([[64, 2048, 7, 7], []], [[2048, 1, 0, 0], []], True),  # a broadcast (stride 0) operand
    ([[8, 512, 768], [512, 768], []], [[393216, 768, 1], [768, 1], []], True),  # aligned from the right
    ([[8, 512, 768]], [[393216, 1536, 2]], False),  # every other element: no unit stride at all
    ([[8, 512, 768]], None, True),  # no strides recorded: no evidence
])
def test_coalesced_operands(dims: list[object], strides: list[object] | None, want: bool) -> None:
    """Real shapes and strides from the shipped traces (first four), and two made up."""
    from gpuprof.roofline import coalesced
    assert coalesced(dims, strides) is want
