"""gpuprof's kernel classes against Nsight Compute's SpeedOfLight reading
(docs/verification/ncu_compare.py), on every shipped pair of trace and ncu CSV, and the comparison's
own rules (name keys, agreement, instance matching) on small synthetic inputs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docs" / "verification" / "ncu_compare.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ncu_compare", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ncu_compare"] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


nc = _load()

#: Programs where the agreement is below the target, with the kernel that is the reason (the doc
#: says why): the test holds the rest of the program to the target without it.
BELOW_TARGET = {
    # FP32 CUDA-core GEMM, 64x64 tile: SM 78 %, L1/shared 89 % (11 points apart, ncu: memory);
    # gpuprof's roofline has no shared-memory roof and says compute at 58 % of the FP32 roof.
    "gpt_fp32": "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8",
}


@pytest.fixture(scope="module")
def results() -> list[Any]:
    pairs = nc.shipped_pairs()
    if not pairs:
        pytest.skip("no docs/measurements/ncu_*.csv.gz with its sample trace")
    return [nc.compare(t, c) for t, c in pairs]


def test_every_ncu_kernel_meets_its_trace_instance(results: list[Any]) -> None:
    """Instance matching, not by name: almost every ncu row finds its kernel in the trace."""
    for r in results:
        assert r.matched >= 0.95 * r.ncu_kernels, (r.program, r.matched, r.ncu_kernels)
        assert r.compared_us > 0


def test_classes_agree_with_ncu_on_90_pct_of_compared_time(results: list[Any]) -> None:
    for r in results:
        if r.program not in BELOW_TARGET:
            assert r.agreement() >= nc.TARGET_PCT, (r.program, round(r.agreement(), 1), r.disagreeing())
            continue
        # Below the target for the documented reason only: that kernel is the main disagreement
        # and the rest of the program meets the target.
        top = r.disagreeing(1)
        assert r.agreement() < nc.TARGET_PCT and top.index[0].startswith(BELOW_TARGET[r.program])
        rest = r.table[~r.table["key"].str.startswith(BELOW_TARGET[r.program])]
        w = rest["dur"]
        assert 100 * (w * rest["ok"]).sum() / w.sum() >= nc.TARGET_PCT, r.program


def test_fallback_gemms_agree(results: list[Any]) -> None:
    """Pre-Hopper tensor-core tiles on the H200: memory-bound in both tools (on-chip pipes)."""
    fb = pd.concat([r.table[r.table["fallback_gemm"].astype(bool)] for r in results])
    if fb.empty:
        pytest.skip("no fallback GEMM in the shipped ncu pairs")
    assert (fb["bound"] == "memory").all() and fb["ok"].all()
    assert (fb["mem"] > fb["sm"] + nc.BALANCED_PTS).all()


def test_doc_table_is_current(results: list[Any]) -> None:
    text = (ROOT / "docs" / "verification.md").read_text()
    block = text[text.index(nc.MARK_BEGIN) + len(nc.MARK_BEGIN):text.index(nc.MARK_END)].strip()
    assert block == nc.all_table(results), "run: python docs/verification/ncu_compare.py --all --write"


@pytest.mark.parametrize("kineto,ncu", [
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>(int, float, "
     "float const*, float const*, float const*, float*, float*, float*)",
     "void at::<unnamed>::vectorized_layer_norm_kernel<float, float, 0>(int, T2, const T1 *, const T1 *, "
     "const T1 *, T2 *, T2 *, T1 *)"),
    ("void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>, 4, "
     "TrivialOffsetCalculator<2, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
     "at::native::memory::LoadWithCast<2>, at::native::memory::StoreWithCast<1> >(int, at::native::CUDAFunctor_add",
     "void at::unrolled_elementwise_kernel<at::CUDAFunctor_add<float>, std::array<char *, 3>, 4, "
     "TrivialOffsetCalculator<2, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, memory::LoadWithCast<2>, "
     "memory::StoreWithCast<1>>(int, T1, T2, T4, T5, T6, T7)"),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add"
     "<float> >(at::TensorIteratorBase&, at::native::CUDAFunctor_add<float> const&)::{lambda(int)#1}>(int, x)",
     "void at::elementwise_kernel<128, 2, void at::gpu_kernel_impl_nocast<at::CUDAFunctor_add<float>>"
     "(at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]>(int, T3)"),
    ("at::cuda::philox::unpack_cudnn(at::PhiloxCudaState, long*, long*)",
     "cuda::unpack_cudnn(at::PhiloxCudaState, long *, long *)"),
])
def test_kernel_key_joins_the_two_spellings(kineto: str, ncu: str) -> None:
    """Real names of the same kernels as Kineto and ncu print them (from the shipped files)."""
    assert nc.kernel_key(kineto) == nc.kernel_key(ncu)


def test_kernel_key_keeps_different_kernels_apart() -> None:
    a = "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)"
    b = "void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)"
    assert nc.kernel_key(a) != nc.kernel_key(b)


def test_agreement_rules() -> None:
    """Hand-made readings, one per rule of the module docstring's "Agreement"."""
    rows = [  # gpuprof class, gpuprof % of roof, SM %, MEM %, agrees
        ("compute", 70, 85, 60, True),    # busy, compute busier
        ("memory", 70, 85, 60, False),    # busy, gpuprof names the other unit
        ("latency", 5, 85, 60, False),    # busy: not latency
        ("compute", 70, 70, 75, True),    # balanced agrees with either unit
        ("memory", 70, 70, 75, True),
        ("memory", 44, 56, 44, True),     # no unit busy; gpuprof also far from its roof
        ("memory", 95, 7, 41, True),      # no unit busy; gpuprof names the busier unit
        ("memory", 95, 55, 30, False),    # no unit busy, gpuprof at 95 % of the less busy unit's roof
        ("latency", 1, 0.5, 0.8, True),
    ]
    bound, roof, sm, mem, want = (np.array(c) for c in zip(*rows))
    got = nc.agrees(bound, roof.astype(float), sm.astype(float), mem.astype(float))
    assert got.tolist() == want.tolist()
    assert nc.ncu_class(np.array([85.0, 70.0, 56.0]), np.array([60.0, 75.0, 44.0])).tolist() == \
        ["compute", "balanced", "latency"]


def _synthetic_kernels() -> pd.DataFrame:
    """SYNTHETIC kernel frame: one step, a main thread (forward + optimizer) and an autograd thread
    (backward) launching in between, with the columns ncu_compare reads."""
    main_fwd = ["gemm_a", "add", "norm", "gemm_a"]
    bwd = ["gemm_b", "add", "norm_bwd", "gemm_b", "add"]
    opt = ["adam"]
    names = main_fwd + bwd + opt
    tids = [1] * len(main_fwd) + [2] * len(bwd) + [1] * len(opt)
    n = len(names)
    return pd.DataFrame({"name": names, "launch_ts": np.arange(n, dtype=float), "launch_tid": tids,
                         "step": [0] * n, "dur": np.full(n, 10.0), "bound": ["memory"] * n,
                         "roofline_pct": np.full(n, 50.0), "family": ["gemm"] * n, "fallback_gemm": [False] * n},
                        index=np.arange(100, 100 + n))


def _ncu_rows(keys: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"ID": range(len(keys)), "key": keys})


def test_match_per_thread_range() -> None:
    """Default NVTX scope: ncu saw the main thread only; each row meets its own instance."""
    k = _synthetic_kernels()
    joined, what = nc.match(k, _ncu_rows(["gemm_a", "add", "norm", "gemm_a", "adam"]))
    assert what == "step 0, thread 1"
    assert joined["trace_index"].tolist() == [100, 101, 102, 103, 109]


def test_match_process_range() -> None:
    """--nvtx-push-pop-scope process: every thread's kernels of the step, in launch order."""
    k = _synthetic_kernels()
    joined, what = nc.match(k, _ncu_rows(k["name"].tolist()))
    assert what == "step 0, all threads"
    assert joined["trace_index"].tolist() == k.index.tolist()


def test_match_pairs_a_differently_spelled_launch_by_position() -> None:
    """A name one tool spells apart (Kineto left it mangled) between two aligned stretches."""
    k = _synthetic_kernels()
    k.loc[102, "name"] = "_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel"
    joined, _ = nc.match(k, _ncu_rows(["gemm_a", "add", "Kernel<cutlass_conv>", "gemm_a", "adam"]))
    assert joined["trace_index"].tolist() == [100, 101, 102, 103, 109]
    assert joined["by_position"].tolist() == [False, False, True, False, False]


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "ncu.csv"
    bad.write_text("==PROF== nothing profiled\n")
    trace = ROOT / "sample_traces" / "h200" / "gpt_bf16.json.gz"
    r = subprocess.run([sys.executable, str(SCRIPT), str(trace), str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "ncu.csv" in r.stderr
