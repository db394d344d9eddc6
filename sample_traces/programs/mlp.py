"""A small MLP at a small batch: a launch-bound training step, eager or as one CUDA graph.

``--cuda-graph`` captures the whole step (forward, backward, fused capturable AdamW) once and
replays it (the fix); the default launches every kernel from Python (the defect).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_args(p)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--cuda-graph", action="store_true")
    a = p.parse_args()
    dev = torch.device(a.device)
    torch.manual_seed(0)
    dims = [a.width] * (a.layers + 1)
    mods: list[nn.Module] = []
    for din, dout in zip(dims[:-1], dims[1:]):
        mods += [nn.Linear(din, dout), nn.LayerNorm(dout), nn.GELU()]
    model = nn.Sequential(*mods, nn.Linear(a.width, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=dev.type == "cuda", capturable=a.cuda_graph)
    x = torch.randn(a.batch, a.width, device=dev)
    y = torch.randint(0, 10, (a.batch,), device=dev)

    def train_step() -> torch.Tensor:
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, cache_enabled=not a.cuda_graph):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss

    step = train_step
    if a.cuda_graph:
        step = harness.capture_graph(train_step).replay  # type: ignore[assignment]
    harness.record(a, step, {"rows_per_step": a.batch})


if __name__ == "__main__":
    main()
