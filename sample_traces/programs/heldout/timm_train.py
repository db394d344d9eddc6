"""timm image-classifier training (random weights, ``pretrained=False``; synthetic images already on
the GPU), bf16 autocast, for gpuprof's held-out pairs.

  --arch NAME                  a timm model: regnety_016, efficientnet_b0, vit_small_patch16_224, ...
  --memory-format nchw         the model and batches in NCHW (the defect; default channels_last)
  --empty-cache                torch.cuda.empty_cache() after every step (the defect)
  --elementwise naive          ViT only: hand-written LayerNorm and erf-GELU passed to timm as
                               norm_layer/act_layer (the defect; default timm's LayerNorm and nn.GELU)
  --optim sgd_loop             a hand-written momentum-SGD loop over the parameters (the defect;
                               default sgd_foreach: torch.optim.SGD(foreach=True), same update)
  --optim adamw_fused          AdamW(fused=True) (what the ViT programs use)
  --precision fp32             no autocast: FP32 convolutions and GEMMs at torch's default precision
                               (round 3; the defect; default bf16 autocast)
  --input pageable             round 3: the two batches kept in pageable host memory and copied with
                               ``.to(dev)`` each step (the defect); ``--input pinned``: page-locked and
                               ``non_blocking=True`` (the fix); default ``device``: already on the GPU
  --input loader               round 10: each batch made by a ``torch.utils.data.DataLoader`` from
                               uint8 images augmented on the CPU per sample (flip, bilinear resize
                               256 -> --img, normalise); ``--workers 0`` runs that in the training
                               process (the defect), ``--workers N`` in N worker processes with
                               pinned memory and ``non_blocking`` copies (the fix)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from _common import OPTIMS, HostBatches, NaiveGELU, NaiveLayerNorm, harness, make_optimizer, maybe_compile, parser


def main() -> None:
    p = parser(__doc__, compile=True)
    p.add_argument("--arch", default="regnety_016")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--img", type=int, default=224)
    p.add_argument("--memory-format", choices=["nchw", "cl"], default="cl")
    p.add_argument("--empty-cache", action="store_true")
    p.add_argument("--elementwise", choices=["fused", "naive"], default="fused")
    p.add_argument("--optim", choices=OPTIMS, default="sgd_foreach")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--input", choices=["device", "pinned", "pageable", "loader"], default="device")
    p.add_argument("--workers", type=int, default=0, help="--input loader: DataLoader worker processes")
    a = p.parse_args()
    import timm

    dev = torch.device(a.device)
    torch.manual_seed(0)
    kw: dict[str, object] = {}
    if a.elementwise == "naive":
        if not a.arch.startswith("vit"):
            p.error("--elementwise naive is for the ViT (timm's norm_layer/act_layer)")
        kw.update(norm_layer=NaiveLayerNorm, act_layer=NaiveGELU)
    batch, img = a.batch, a.img
    if a.tiny:
        batch, img = 4, 64
        if a.arch.startswith("vit"):
            kw.update(depth=2, img_size=img)
    model = timm.create_model(a.arch, pretrained=False, num_classes=1000, **kw)
    fmt = torch.channels_last if a.memory_format == "cl" else torch.contiguous_format
    model = model.to(dev).to(memory_format=fmt).train()
    opt = make_optimizer(a.optim, model.parameters(), dev)
    model = maybe_compile(model, a)
    loader = _loader(batch, img, a.workers, dev) if a.input == "loader" else None
    where = dev if a.input == "device" else torch.device("cpu")
    xs = [torch.randn(batch, 3, img, img, device=where).contiguous(memory_format=fmt) for _ in range(2)]
    ys = [torch.randint(0, 1000, (batch,), device=where) for _ in range(2)]
    host = HostBatches([[x, y] for x, y in zip(xs, ys)], a.input == "pinned", dev) if a.input != "device" else None
    count = itertools.count()

    def step() -> None:
        k = next(count) % 2
        if loader is not None:
            x, y = next(loader)
            x, y = x.to(dev, non_blocking=a.workers > 0), y.to(dev, non_blocking=a.workers > 0)
        else:
            x, y = host.next() if host is not None else (xs[k], ys[k])
        x = x.contiguous(memory_format=fmt)  # a no-op unless pinning dropped the layout
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if a.empty_cache and dev.type == "cuda":
            torch.cuda.empty_cache()

    harness.record(a, step, {"images_per_step": batch, "arch": a.arch, "precision": a.precision, "input": a.input,
                             "workers": a.workers if a.input == "loader" else None,
                             "timm": timm.__version__, "compiled": a.compile,
                             "params": sum(q.numel() for q in model.parameters())})


class _Augmented(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Per-sample CPU preprocessing of 16 fixed uint8 HWC images, cycled: flip half of them, resize
    bilinearly to ``img`` and normalise, as a torchvision pipeline does on decoded JPEGs."""

    def __init__(self, img: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.raw = torch.randint(0, 256, (16, 256, 256, 3), dtype=torch.uint8, generator=g)
        self.img = img
        self.mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
        self.std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

    def __len__(self) -> int:
        return 1 << 30  # endless: the harness decides how many steps run

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = self.raw[i % 16].permute(2, 0, 1).float().div_(255.0)
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        x = F.interpolate(x[None], size=(self.img, self.img), mode="bilinear", align_corners=False)[0]
        return (x - self.mean) / self.std, i % 1000


def _loader(batch: int, img: int, workers: int, dev: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """An endless iterator over DataLoader batches of :class:`_Augmented` (``workers`` 0: made in this
    process)."""
    dl = torch.utils.data.DataLoader(_Augmented(img), batch_size=batch, num_workers=workers,
                                     pin_memory=workers > 0 and dev.type == "cuda",
                                     prefetch_factor=4 if workers else None, persistent_workers=workers > 0)
    return iter(dl)


if __name__ == "__main__":
    main()
