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
"""

from __future__ import annotations

import itertools

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
    p.add_argument("--input", choices=["device", "pinned", "pageable"], default="device")
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
    where = dev if a.input == "device" else torch.device("cpu")
    xs = [torch.randn(batch, 3, img, img, device=where).contiguous(memory_format=fmt) for _ in range(2)]
    ys = [torch.randint(0, 1000, (batch,), device=where) for _ in range(2)]
    host = HostBatches([[x, y] for x, y in zip(xs, ys)], a.input == "pinned", dev) if a.input != "device" else None
    count = itertools.count()

    def step() -> None:
        k = next(count) % 2
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
                             "timm": timm.__version__, "compiled": a.compile,
                             "params": sum(q.numel() for q in model.parameters())})


if __name__ == "__main__":
    main()
