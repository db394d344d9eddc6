"""torchvision CNN training (ResNet-50, ConvNeXt-T; random weights and data) for gpuprof's samples.

Switches: --arch resnet50|convnext_tiny, --precision fp32|bf16 (autocast), --memory-format
nchw|cl (channels_last), --compile. PyTorch's default flags are kept (cuDNN may use TF32 for
convolutions, matmuls do not): what an unmodified script gets. The data is already on the GPU,
so the step is the model's work alone.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_args(p)
    p.add_argument("--arch", choices=["resnet50", "convnext_tiny"], default="resnet50")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--memory-format", choices=["nchw", "cl"], default="cl")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    import torchvision

    dev = torch.device(a.device)
    torch.manual_seed(0)
    fmt = torch.channels_last if a.memory_format == "cl" else torch.contiguous_format
    model = getattr(torchvision.models, a.arch)(weights=None).to(dev).to(memory_format=fmt)
    fwd = torch.compile(model) if a.compile else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    xs = [torch.randn(a.batch, 3, 224, 224, device=dev).to(memory_format=fmt) for _ in range(2)]
    ys = [torch.randint(0, 1000, (a.batch,), device=dev) for _ in range(2)]
    count = iter(range(10**12))

    mark = harness.REGIONS.mark

    def step() -> None:
        mark(None)
        k = next(count) % 2
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = F.cross_entropy(fwd(xs[k]), ys[k])
        mark("forward")
        loss.backward()
        mark("backward")
        opt.step()
        mark("optimizer")
        opt.zero_grad(set_to_none=True)
        mark("zero_grad")
        harness.REGIONS.step_done()

    harness.record(a, step, {"images_per_step": a.batch,
                             "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
                             "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32})


if __name__ == "__main__":
    main()
