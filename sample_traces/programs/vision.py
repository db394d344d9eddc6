"""A small image-classification training loop used to record gpuprof's input-pipeline samples.

How each batch reaches the GPU is the switch (``--loader``):
  inline    CPU decoding/augmentation in the training process, then a pageable copy (bad input pipeline)
  workers   the same CPU work in DataLoader worker processes, pinned memory, non_blocking copies (the fix)
  pageable  ready batches in pageable host memory copied with ``.cuda()`` (bad copies)
  pinned    ready batches in pinned host memory copied with ``non_blocking=True`` (the fix)

Like gpt.py it writes a Kineto trace of a few steps and an unprofiled step timing.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    """A ResNet-ish convolutional network, sized so one bf16 step takes a few milliseconds."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        chans = [3, 64, 128, 256, 512]
        layers: list[nn.Module] = []
        for cin, cout in zip(chans[:-1], chans[1:]):
            layers += [nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
            layers += [nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(chans[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def augment(raw: torch.Tensor, light: bool = False) -> torch.Tensor:
    """CPU preprocessing of one uint8 HWC image: flip, resize (``light``: a 224² crop instead, the
    cheaper per-sample work), normalise (the host-side work)."""
    img = raw.permute(2, 0, 1).float().div_(255.0)
    if torch.rand(()) < 0.5:
        img = img.flip(-1)
    if light:
        img = img[:, 16:240, 16:240]
    else:
        img = F.interpolate(img[None], size=(224, 224), mode="bilinear", align_corners=False)[0]
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    return (img - mean) / std


class Images(torch.utils.data.Dataset):
    def __init__(self, n: int, light: bool = False) -> None:
        g = torch.Generator().manual_seed(0)
        self.raw = torch.randint(0, 256, (16, 256, 256, 3), dtype=torch.uint8, generator=g)
        self.n = n
        self.light = light

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return augment(self.raw[i % 16], self.light), i % 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--timing-out")
    p.add_argument("--loader", choices=["inline", "workers", "pageable", "pinned"], default="pinned")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--timed-steps", type=int, default=20)
    p.add_argument("--augment", choices=["full", "light"], default="full",
                   help="per-sample CPU work: bilinear resize (full) or a crop (light, the cheaper twin)")
    p.add_argument("--warmup-steps", type=int, default=5,
                   help="untimed steps first (a DataLoader's prefetched queue drains in them)")
    p.add_argument("--active", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--no-profile", action="store_true")
    a = p.parse_args()
    dev = torch.device(a.device)
    torch.manual_seed(0)

    model = Net().to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    total = (a.timed_steps + a.active + a.warmup_steps + 5) * a.batch

    if a.loader in ("inline", "workers"):
        ds = Images(total, light=a.augment == "light")
        workers = 0 if a.loader == "inline" else a.workers
        dl = torch.utils.data.DataLoader(
            ds, batch_size=a.batch, num_workers=workers, pin_memory=a.loader == "workers" and a.device == "cuda",
            prefetch_factor=4 if workers else None, persistent_workers=bool(workers),
        )
        it = iter(dl)

        def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
            x, y = next(it)
            nb = a.loader == "workers"
            return x.to(dev, non_blocking=nb), y.to(dev, non_blocking=nb)
    else:
        pin = a.loader == "pinned" and a.device == "cuda"
        host = [torch.randn(a.batch, 3, 224, 224, pin_memory=pin) for _ in range(2)]
        labels = [torch.randint(0, 1000, (a.batch,), pin_memory=pin) for _ in range(2)]
        state = {"i": 0}

        def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
            i = state["i"] = state["i"] + 1
            nb = a.loader == "pinned"
            return host[i % 2].to(dev, non_blocking=nb), labels[i % 2].to(dev, non_blocking=nb)

    def step() -> None:
        x, y = next_batch()
        x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(a.warmup_steps):
        step()
    if a.device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.timed_steps):
        step()
    if a.device == "cuda":
        torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t0) * 1000.0 / a.timed_steps
    if a.timing_out:
        with open(a.timing_out, "w") as f:
            json.dump({"argv": vars(a), "step_ms": step_ms, "samples_per_step": a.batch, "torch": torch.__version__,
                       "gpu": torch.cuda.get_device_name() if a.device == "cuda" else "cpu"}, f, indent=1)
    print(f"step {step_ms:.3f} ms", flush=True)
    if a.no_profile:
        return

    acts = [torch.profiler.ProfilerActivity.CPU]
    if a.device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(
        activities=acts, record_shapes=True,
        schedule=torch.profiler.schedule(wait=1, warmup=2, active=a.active),
        on_trace_ready=lambda prof: prof.export_chrome_trace(a.out),
    ) as prof:
        for _ in range(3 + a.active):
            step()
            prof.step()


if __name__ == "__main__":
    main()
