"""Accelerate as a user writes it: ``Accelerator(gradient_accumulation_steps=2,
mixed_precision="bf16")``, ``prepare`` of a small Transformer encoder, AdamW and a DataLoader with
2 workers, ``with accelerator.accumulate(model)``, ``accelerator.backward``, and
``optimizer.step()`` / ``zero_grad()`` called after every micro-batch (Accelerate's
``AcceleratedOptimizer`` steps the real optimizer every second one). One step is one optimizer
step (two micro-batches), here and in gpuprof.

    python accelerate_loop.py [--timing-out own.json]
    python accelerate_loop.py --pin-memory      # pinned batches copied with non_blocking (#24 pair)
    python accelerate_loop.py --device cpu --tiny
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from own_clock import OwnClock, add_args, resolve  # noqa: E402

ACCUMULATE = 2


class Sequences(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, seq: int, d: int) -> None:
        self.n, self.seq, self.d = n, seq, d

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.seq, self.d, generator=g), torch.randint(0, 10, (), generator=g)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_args(p)
    p.add_argument("--pin-memory", action="store_true",
                   help="the DataLoader pins its batches and Accelerate copies them with non_blocking=True "
                        "(the pageable_memcpy fix; on the GPU only)")
    args = resolve(p.parse_args())
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    d, seq, batch, layers = (32, 16, 4, 2) if args.tiny else (512, 256, 32, 6)
    pin = args.pin_memory and args.device == "cuda"
    acc = Accelerator(gradient_accumulation_steps=ACCUMULATE, mixed_precision="bf16" if args.device == "cuda" else "no",
                      cpu=args.device == "cpu", dataloader_config=DataLoaderConfiguration(non_blocking=pin))
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(d, 8 if d >= 64 else 4, 4 * d,
                                                                       batch_first=True), layers)
    model = torch.nn.Sequential(enc, torch.nn.Flatten(1), torch.nn.Linear(seq * d, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(Sequences(batch * ACCUMULATE * (args.steps + 10), seq, d), batch_size=batch,
                                         num_workers=2, shuffle=True, drop_last=True, pin_memory=pin)
    model, opt, loader = acc.prepare(model, opt, loader)
    clock = OwnClock("accelerate_loop", args, model=f"TransformerEncoder {layers}x d={d}", batch=batch, seq=seq,
                     accumulate=ACCUMULATE, optimizer_class=type(opt).__name__, pin_memory=pin)
    steps = 0
    model.train()
    for x, y in loader:
        with acc.accumulate(model):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
        if acc.sync_gradients:
            steps += 1
            clock.step_done(steps)
            if steps == args.steps:
                break
    clock.report(micro_batches_per_step=ACCUMULATE)


if __name__ == "__main__":
    main()
