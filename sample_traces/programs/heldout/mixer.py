"""A hand-written MLP-Mixer (Tolstikhin et al. 2021: patch embedding, then blocks of token-mixing and
channel-mixing MLPs, each after a LayerNorm, GELU inside) trained on synthetic images already on the
GPU, bf16 autocast, momentum SGD, for gpuprof's held-out pairs.

  --elementwise naive  LayerNorm and tanh-GELU written out of elementwise ops (the defect; default
                       nn.LayerNorm and F.gelu(approximate="tanh"))
  --optim sgd_loop     a hand-written momentum-SGD loop over the parameters (the defect; default
                       torch.optim.SGD(foreach=True), the same update)
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from _common import NaiveLayerNorm, harness, make_optimizer, maybe_compile, naive_gelu_tanh, parser
from torch import nn


class MlpBlock(nn.Module):
    def __init__(self, dim: int, hidden: int, naive: bool) -> None:
        super().__init__()
        self.fc1, self.fc2, self.naive = nn.Linear(dim, hidden), nn.Linear(hidden, dim), naive

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        h = naive_gelu_tanh(h) if self.naive else F.gelu(h, approximate="tanh")
        return self.fc2(h)


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int, token_hidden: int, channel_hidden: int, naive: bool) -> None:
        super().__init__()
        norm = NaiveLayerNorm if naive else nn.LayerNorm
        self.norm1, self.norm2 = norm(dim), norm(dim)
        self.token_mlp = MlpBlock(tokens, token_hidden, naive)
        self.channel_mlp = MlpBlock(dim, channel_hidden, naive)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, tokens, dim)
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class Mixer(nn.Module):
    def __init__(self, img: int, patch: int, dim: int, depth: int, token_hidden: int, channel_hidden: int,
                 classes: int, naive: bool) -> None:
        super().__init__()
        tokens = (img // patch) ** 2
        self.stem = nn.Conv2d(3, dim, patch, stride=patch)
        self.blocks = nn.Sequential(*[MixerBlock(tokens, dim, token_hidden, channel_hidden, naive) for _ in range(depth)])
        self.norm = NaiveLayerNorm(dim) if naive else nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(x)).mean(1))


def main() -> None:
    p = parser(__doc__, compile=True)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--img", type=int, default=256)  # 256 tokens of 16x16: GEMM dims multiples of 8
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--elementwise", choices=["fused", "naive"], default="fused")
    p.add_argument("--optim", choices=["sgd_foreach", "sgd_loop"], default="sgd_foreach")
    a = p.parse_args()
    dev = torch.device(a.device)
    torch.manual_seed(0)
    batch, img, depth, dim = (4, 64, 2, 64) if a.tiny else (a.batch, a.img, a.depth, a.dim)
    model = Mixer(img, 16, dim, depth, token_hidden=dim // 2, channel_hidden=4 * dim, classes=1000,
                  naive=a.elementwise == "naive").to(dev)
    opt = make_optimizer(a.optim, model.parameters(), dev)
    model = maybe_compile(model, a)
    xs = [torch.randn(batch, 3, img, img, device=dev) for _ in range(2)]
    ys = [torch.randint(0, 1000, (batch,), device=dev) for _ in range(2)]
    count = itertools.count()

    def step() -> None:
        k = next(count) % 2
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(xs[k]), ys[k])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    harness.record(a, step, {"images_per_step": batch, "params": sum(q.numel() for q in model.parameters()),
                             "param_tensors": len(list(model.parameters())), "compiled": a.compile})


if __name__ == "__main__":
    main()
