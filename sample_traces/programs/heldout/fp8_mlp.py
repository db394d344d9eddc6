"""A GEMM-bound stack of transformer MLP blocks (x + W2 GELU(W1 LN(x)), d=4096, hidden 16384, 8192
tokens per step, no bias, fp32 master weights, fused AdamW) trained in BF16 autocast or with its
matrix products in FP8, for gpuprof's held-out precision pair on Hopper.

  --precision bf16   nn.Linear under bf16 autocast (the GEMM-bound BF16 program gpuprof should flag)
  --precision fp8    the same blocks with Fp8Linear (fp8.py): torch._scaled_mm, tensorwise dynamic
                     scaling, e4m3 forward, e5m2 output gradients (the fix)
  --compile          the model under torch.compile (inductor): the FP8 program's amax, scale and
                     cast kernels fused around the _scaled_mm calls, as the recipes gpuprof prices
                     (torchao float8 and Transformer Engine) run them; the BF16 program compiled
                     alike, so that a pair of the two differs in precision only

``--tiny --check`` (CPU) compares the FP8 program's loss and gradients with the BF16 one's on the same
weights: it checks the backward's operand orientation and layouts, not the CUDA kernels' speed.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from _common import harness, parser
from fp8 import Fp8Linear
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, hidden: int, fp8: bool) -> None:
        super().__init__()
        lin = Fp8Linear if fp8 else (lambda i, o: nn.Linear(i, o, bias=False))
        self.norm, self.up, self.down = nn.LayerNorm(d), lin(d, hidden), lin(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x)), approximate="tanh"))


def build(d: int, hidden: int, layers: int, fp8: bool, dev: torch.device) -> nn.Module:
    torch.manual_seed(0)
    with dev:  # initialised on the device: 268M parameters at the default size, slow to initialise on the host
        return nn.Sequential(*[Block(d, hidden, fp8) for _ in range(layers)])


def loss_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
        return model(x).float().pow(2).mean()


def check(d: int, hidden: int, layers: int, tokens: int, dev: torch.device) -> dict[str, float]:
    """FP8 vs BF16 on the same weights and input: loss ratio, each gradient's cosine similarity and norm."""
    ref, f8 = build(d, hidden, layers, False, dev), build(d, hidden, layers, True, dev)
    f8.load_state_dict(ref.state_dict())
    x = torch.randn(tokens, d, device=dev, dtype=torch.bfloat16)
    lr, lf = loss_of(ref, x), loss_of(f8, x)
    lr.backward()
    lf.backward()
    pairs = [(a.grad.flatten().float(), b.grad.flatten().float()) for a, b in zip(ref.parameters(), f8.parameters())]
    cos = [F.cosine_similarity(g, h, dim=0).item() for g, h in pairs]
    norm = [abs(float(h.norm() / g.norm()) - 1.0) for g, h in pairs]  # the cosine misses a wrong scale
    return {"loss_ratio": float((lf / lr).detach()), "min_grad_cosine": min(cos), "max_grad_norm_rel_err": max(norm)}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--precision", choices=["bf16", "fp8"], default="bf16")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--d", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=16384)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--check", action="store_true", help="compare FP8 with BF16 first (loss, gradients)")
    a = p.parse_args()
    dev = torch.device(a.device)
    tokens, d, hidden, layers = (256, 64, 256, 2) if a.tiny else (a.tokens, a.d, a.hidden, a.layers)
    extra: dict[str, object] = {}
    if a.check:
        extra["check"] = check(d, hidden, layers, tokens, dev)
        print("fp8 vs bf16:", extra["check"], flush=True)
    model = build(d, hidden, layers, a.precision == "fp8", dev)
    opt_params = list(model.parameters())
    if a.compile:
        model = torch.compile(model)
    opt = torch.optim.AdamW(opt_params, lr=1e-4, fused=dev.type == "cuda")
    xs = [torch.randn(tokens, d, device=dev, dtype=torch.bfloat16) for _ in range(2)]
    count = itertools.count()

    def step() -> None:
        loss = loss_of(model, xs[next(count) % 2])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    harness.record(a, step, {"tokens_per_step": tokens, "gemm_flop_per_step": 3 * 2 * 2 * tokens * d * hidden * layers,
                             "precision": a.precision, "compiled": a.compile, **extra})


if __name__ == "__main__":
    main()
