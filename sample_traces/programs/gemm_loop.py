"""A sustained bf16 GEMM loop, long enough for the GPU to reach its power limit.

Seen on an H200 here (REFERENCE.md): the SM clock falls from 1980 to about 1500 MHz with clock
event reason 0x4 (SW power cap). Each gpuprof.step() marks 20 products of 8192x8192 matrices.
Run under gpuprof record:

    gpuprof record --out RUN --skip-steps 200 --timed-steps 10 -- python gemm_loop.py 300
"""

from __future__ import annotations

import sys

import torch

import gpuprof

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
a = [torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
b = [torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
c = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)
for s in range(steps):
    for i in range(20):
        torch.mm(a[i % 3], b[(i + 1) % 3], out=c)
    gpuprof.step()
torch.cuda.synchronize()
