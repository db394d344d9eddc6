"""PyTorch Lightning, automatic optimisation, as a user writes it: timm ResNet-18,
``precision="bf16-mixed"``, SGD, a DataLoader with 4 worker processes over a synthetic dataset
that does some CPU work per item (decode-like: make, crop, flip and normalise a uint8 image), and
``Trainer(max_steps=...)``. Lightning runs forward and backward inside ``optimizer.step(closure)``.

    python lightning_resnet.py [--timing-out own.json]            # on the GPU
    python lightning_resnet.py --channels-last                    # the fix gpuprof names first (#24 pair)
    python lightning_resnet.py --device cpu --tiny                # dry run

Without timm (or its torchvision) a small stand-in CNN is used and the clock line says so.
Nothing is downloaded: the model is built from its config, the data is made here.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from own_clock import OwnClock, add_args, resolve  # noqa: E402


class Images(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Synthetic images with per-item CPU work: a random uint8 image a little larger than the crop,
    a random crop, a random flip, float conversion and normalisation."""

    def __init__(self, n: int, size: int) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        rng = np.random.default_rng(i)
        pad = self.size // 8
        img = rng.integers(0, 256, (3, self.size + pad, self.size + pad), dtype=np.uint8)
        y, x = rng.integers(0, pad + 1, 2)
        img = img[:, y:y + self.size, x:x + self.size]
        if rng.random() < 0.5:
            img = img[:, :, ::-1]
        out = (img.astype(np.float32) / 255.0 - 0.45) / 0.225
        return torch.from_numpy(np.ascontiguousarray(out)), int(rng.integers(0, 1000))


def model() -> tuple[torch.nn.Module, str]:
    try:
        import timm

        return timm.create_model("resnet18", pretrained=False, num_classes=1000), "timm resnet18"
    except Exception as e:  # timm needs a torchvision built for this torch
        print(f"lightning_resnet: timm unavailable ({e.__class__.__name__}); a stand-in CNN", file=sys.stderr)
        layers: list[torch.nn.Module] = []
        c = 3
        for w in (32, 64, 128):
            layers += [torch.nn.Conv2d(c, w, 3, stride=2, padding=1, bias=False), torch.nn.BatchNorm2d(w),
                       torch.nn.ReLU(inplace=True)]
            c = w
        layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(c, 1000)]
        return torch.nn.Sequential(*layers), "stand-in CNN (no timm)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_args(p)
    p.add_argument("--batch", type=int, default=None, help="default 64 (--tiny 8)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--channels-last", action="store_true",
                   help="the model's weights and each batch in channels_last (the memory_format fix)")
    args = resolve(p.parse_args())
    import lightning as L

    batch = args.batch or (8 if args.tiny else 64)
    size = 32 if args.tiny else 224
    net, what = model()
    if args.channels_last:
        net = net.to(memory_format=torch.channels_last)
    clock = OwnClock("lightning_resnet", args, model=what, batch=batch, image=size, workers=args.workers,
                     channels_last=args.channels_last)

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> torch.Tensor:
            x, y = batch
            if args.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)

    class Clock(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, *a: object) -> None:
            clock.step_done(trainer.global_step)  # automatic optimisation: one optimizer step per batch

    loader = torch.utils.data.DataLoader(Images(batch * (args.steps + 10), size), batch_size=batch, shuffle=True,
                                         num_workers=args.workers, pin_memory=args.device == "cuda",
                                         persistent_workers=args.workers > 0, drop_last=True)
    trainer = L.Trainer(max_steps=args.steps, accelerator="gpu" if args.device == "cuda" else "cpu", devices=1,
                        precision="bf16-mixed", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, callbacks=[Clock()])
    trainer.fit(Module(), loader)
    clock.report()


if __name__ == "__main__":
    main()
