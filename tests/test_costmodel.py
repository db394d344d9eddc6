"""FLOP and byte models per op, checked against hand counts."""

from __future__ import annotations

import pytest

from gpuprof.costmodel import cost_of

BF16, F32 = "c10::BFloat16", "float"


def test_mm_addmm_bmm() -> None:
    c = cost_of("aten::mm", [[4096, 768], [768, 50304]], [BF16, BF16], ["", ""])
    assert c is not None and c.family == "gemm" and c.dtype == "bf16"
    assert c.flops == 2 * 4096 * 768 * 50304
    assert c.bytes == (4096 * 768 + 768 * 50304 + 4096 * 50304) * 2
    a = cost_of("aten::addmm", [[2304], [4096, 768], [768, 2304], [], []], [BF16, BF16, BF16, "Scalar", "Scalar"], [])
    assert a is not None and a.flops == 2 * 4096 * 768 * 2304 and a.bytes > (4096 * 768 + 768 * 2304 + 4096 * 2304) * 2
    b = cost_of("aten::bmm", [[96, 512, 512], [96, 512, 64]], [BF16, BF16], [])
    assert b is not None and b.flops == 2 * 96 * 512 * 64 * 512


def test_attention_causal_and_backward() -> None:
    dims = [[8, 12, 512, 64]] * 3 + [[]] * 10
    types = [BF16] * 3 + [""] * 10
    conc = ["", "", "", "", "", "", "512", "512", "True", "0.1", "True", "False", ""]
    fwd = cost_of("aten::_cudnn_attention_forward", dims, types, conc)
    full = 4 * 8 * 12 * 512 * 512 * 64
    assert fwd is not None and fwd.family == "attention" and fwd.flops == full / 2
    conc[10] = "False"
    assert cost_of("aten::_cudnn_attention_forward", dims, types, conc).flops == full  # type: ignore[union-attr]
    # _efficient_attention_* take [B, T, H, D] and a custom_mask_type (1 = causal)
    eff = cost_of("aten::_efficient_attention_forward", [[8, 512, 12, 64]] * 3 + [[]] * 11, [F32] * 3 + [""] * 11,
                  [""] * 8 + ["0.1", "1", "True", "", "", ""])
    assert eff is not None and eff.flops == full / 2 and eff.dtype == "fp32"
    bwd = cost_of("aten::_efficient_attention_backward", [[8, 512, 12, 64]] * 4 + [[]] * 16, [F32] * 4 + [""] * 16,
                  [""] * 14 + ["1"] + [""] * 5)
    assert bwd is not None and bwd.flops == pytest.approx(2.5 * full / 2)


def test_convolution_output_size_and_backward_mask() -> None:
    conv = cost_of("aten::cudnn_convolution", [[128, 3, 224, 224], [64, 3, 3, 3], [], [], [], [], [], [], []],
                   [BF16, BF16, "ScalarList", "ScalarList", "ScalarList", "Scalar", "Scalar", "Scalar", "Scalar"],
                   ["", "", "[1, 1]", "[2, 2]", "[1, 1]", "1", "False", "False", "True"])
    assert conv is not None and conv.flops == 2 * 128 * 64 * 112 * 112 * 3 * 9
    bwd = cost_of("aten::convolution_backward", [[128, 64, 112, 112], [128, 3, 224, 224], [64, 3, 3, 3]] + [[]] * 8,
                  [BF16] * 3 + ["ScalarList"] * 8,
                  ["", "", "", "[0]", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1", "[False, True, False]"])
    assert bwd is not None and bwd.flops == conv.flops  # weight gradient only


def test_elementwise_broadcast_inplace_and_copy() -> None:
    add = cost_of("aten::add", [[8, 512, 768], [512, 768], []], [F32, F32, "Scalar"], [])
    assert add is not None and add.bytes == (8 * 512 * 768 + 512 * 768 + 8 * 512 * 768) * 4
    mul_ = cost_of("aten::mul_", [[50304, 768], []], [F32, "double"], [])
    assert mul_ is not None and mul_.bytes == 2 * 50304 * 768 * 4
    cp = cost_of("aten::copy_", [[2304], [2304], []], [BF16, F32, "Scalar"], [])
    assert cp is not None and cp.bytes == 2304 * 2 + 2304 * 4 and cp.family == "copy"


def test_reductions_softmax_norms() -> None:
    s = cost_of("aten::sum", [[4096, 768], [], [], []], [BF16, "ScalarList", "Scalar", ""], ["", "[0]", "True", ""])
    assert s is not None and s.bytes == 4096 * 768 * 2 + 768 * 2
    sm = cost_of("aten::_log_softmax", [[4096, 50304], [], []], [BF16, "Scalar", "Scalar"], [])
    assert sm is not None and sm.bytes == 2 * 4096 * 50304 * 2
    ln = cost_of("aten::native_layer_norm", [[8, 512, 768], [], [768], [768], []], [F32, "ScalarList", F32, F32, "Scalar"], [])
    assert ln is not None and ln.family == "norm" and ln.bytes == 2 * 8 * 512 * 768 * 4 + 2 * 768 * 4


def test_foreach_tensorlists() -> None:
    c = cost_of("aten::_foreach_mul_", [[[64, 3, 3, 3], [64]], []], ["TensorList", "Scalar"], [])
    assert c is not None and c.family == "optimizer" and c.bytes == 2 * (64 * 27 + 64) * 4


def test_unknown_or_malformed_ops_have_no_model() -> None:
    assert cost_of("aten::some_custom_op", [[8, 8]], [F32], []) is None
    assert cost_of("aten::mm", [[8, 8, 8], [8]], [F32, F32], []) is None  # not 2-D: no guess
    assert cost_of("aten::mm", None, None, None) is None
    assert cost_of("aten::_fused_adamw_", [[], [], []], ["TensorList"] * 3, []) is None  # shapes not recorded


def test_expanded_inputs_count_stored_elements_once() -> None:
    """Real case from gpt_bf16: cross-entropy's gather reads an index expanded along dim 1."""
    dims = [[50304, 768], [], [4096, 768], [], [4096, 768]]
    types = [F32, "Scalar", "long int", "Scalar", F32]
    dense = cost_of("aten::gather", dims, types, [], [[768, 1], [], [768, 1], [], [768, 1]])
    expanded = cost_of("aten::gather", dims, types, [], [[768, 1], [], [1, 0], [], [768, 1]])
    assert dense is not None and expanded is not None
    assert dense.bytes - expanded.bytes == (4096 * 768 - 4096) * 8
    bias = cost_of("aten::add", [[8, 512, 768], [8, 512, 768], []], [F32, F32, "Scalar"], [],
                   [[393216, 768, 1], [0, 768, 1], []])
    assert bias is not None and bias.bytes == (8 * 512 * 768 + 512 * 768 + 8 * 512 * 768) * 4
