"""A ``torch.compile``d model in a plain training loop: a small GPT-style stack (6 blocks, d=768,
SDPA attention) compiled with the default inductor backend, bf16 autocast, fused AdamW, data made
on the device, 400 optimizer steps (its 10 ms steps are timed in 20-step chunks: the window may take
200 of them). The first steps compile (tens of seconds): warm-up that the recorder's skipped and
timed-until-steady steps must leave out.

    python compiled.py [--timing-out own.json]
    python compiled.py --device cpu --tiny [--backend aot_eager]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from own_clock import OwnClock, add_args, resolve  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Net(torch.nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.emb, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(seq, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_args(p, steps=400)
    p.add_argument("--backend", default="inductor")
    args = resolve(p.parse_args())
    dev = torch.device(args.device)
    vocab, d, layers, heads, seq, batch = (256, 64, 2, 4, 32, 4) if args.tiny else (8192, 768, 6, 12, 512, 16)
    torch.manual_seed(0)
    net = Net(vocab, d, layers, heads, seq).to(dev)
    model = torch.compile(net, backend=args.backend)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-4, fused=args.device == "cuda")
    clock = OwnClock("compiled", args, model=f"GPT-style {layers}x d={d}", backend=args.backend, batch=batch, seq=seq)
    data = [torch.randint(0, vocab, (batch, seq + 1), device=dev) for _ in range(8)]
    for step in range(1, args.steps + 1):
        ids = data[step % len(data)]
        with torch.autocast(args.device, dtype=torch.bfloat16):
            logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.step_done(step)
    clock.report()


if __name__ == "__main__":
    main()
