"""FSDP2 as a user writes it, run with ``torchrun --nproc_per_node 1``: the GPT-style stack of
compiled.py (eager here), each block and then the root ``fully_shard``ed
(``torch.distributed.fsdp``) with a bf16 ``MixedPrecisionPolicy``, AdamW, data made on the device.
With one process the collectives are trivial, but FSDP2's machinery (DTensor parameters,
all-gather/reduce-scatter streams, the pre/post hooks around every block) runs as on many GPUs.

    torchrun --standalone --nproc_per_node 1 fsdp2.py [--timing-out own.json]
    torchrun --standalone --nproc_per_node 1 fsdp2.py --device cpu --tiny      # gloo
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compiled import Net  # noqa: E402
from own_clock import OwnClock, add_args, resolve  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_args(p)
    args = resolve(p.parse_args())
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    cuda = args.device == "cuda"
    rank = int(os.environ.get("RANK", "0"))
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    vocab, d, layers, heads, seq, batch = (256, 64, 2, 4, 32, 4) if args.tiny else (8192, 768, 6, 12, 512, 16)
    torch.manual_seed(0)
    net = Net(vocab, d, layers, heads, seq).to(dev)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if cuda else MixedPrecisionPolicy()
    for blk in net.blocks:
        fully_shard(blk, mp_policy=mp)
    fully_shard(net, mp_policy=mp)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-4)
    clock = OwnClock("fsdp2", args, model=f"GPT-style {layers}x d={d}, fully_shard per block",
                     world_size=dist.get_world_size(), batch=batch, seq=seq)
    data = [torch.randint(0, vocab, (batch, seq + 1), device=dev) for _ in range(8)]
    for step in range(1, args.steps + 1):
        ids = data[step % len(data)]
        loss = F.cross_entropy(net(ids[:, :-1]).float().view(-1, vocab), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.step_done(step)
    if rank == 0:
        clock.report()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
