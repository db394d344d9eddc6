"""A hand-written diffusion UNet (DDPM-style noise prediction: a stride-2 stem, three resolutions of
ResBlocks with GroupNorm+SiLU and a timestep embedding, self-attention at the lowest one, skip
concatenations, a transposed-conv head back to full size) trained on synthetic images, bf16
autocast, channels_last, fused AdamW, for gpuprof's held-out pairs.

Each step copies a batch of images and its noise (2 x 28 MB of float32 at the default size) from host
memory, as a training loop fed from a host-side pipeline does, and logs each block's activation RMS.

  --copies pageable    the host batches in pageable memory, copied with .to(dev) (the defect; default
                       pinned memory and non_blocking=True)
  --host-sync          each block's RMS read with .item() inside the forward, one host sync per block,
                       plus loss.item() (the defect; default: the same values kept on the GPU, read
                       once every 10 steps)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from _common import HostBatches, Stats, harness, parser
from torch import nn


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, temb: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(32, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.temb = nn.Linear(temb, cout)
        self.norm2, self.conv2 = nn.GroupNorm(32, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb(emb)[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


class Attention(nn.Module):
    def __init__(self, ch: int, heads: int) -> None:
        super().__init__()
        self.norm, self.heads = nn.GroupNorm(32, ch), heads
        self.qkv, self.proj = nn.Conv2d(ch, 3 * ch, 1), nn.Conv2d(ch, ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, hh, ww = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, self.heads, c // self.heads, hh * ww).unbind(1)
        o = F.scaled_dot_product_attention(q.transpose(-1, -2), k.transpose(-1, -2), v.transpose(-1, -2))
        return x + self.proj(o.transpose(-1, -2).reshape(b, c, hh, ww))


class UNet(nn.Module):
    def __init__(self, chans: tuple[int, ...], heads: int, stats: Stats) -> None:
        super().__init__()
        self.stats, temb = stats, 4 * chans[0]
        self.temb_dim = chans[0]
        self.temb = nn.Sequential(nn.Linear(chans[0], temb), nn.SiLU(), nn.Linear(temb, temb))
        self.stem = nn.Conv2d(3, chans[0], 4, stride=2, padding=1)
        self.down = nn.ModuleList()
        self.pools = nn.ModuleList()
        cin = chans[0]
        for i, c in enumerate(chans):
            self.down.append(ResBlock(cin, c, temb))
            self.pools.append(nn.Conv2d(c, c, 3, stride=2, padding=1) if i < len(chans) - 1 else nn.Identity())
            cin = c
        self.mid1, self.mid_attn, self.mid2 = ResBlock(cin, cin, temb), Attention(cin, heads), ResBlock(cin, cin, temb)
        self.up = nn.ModuleList()
        self.ups = nn.ModuleList()
        for i, c in reversed(list(enumerate(chans))):
            self.up.append(ResBlock(cin + c, c, temb))
            self.ups.append(nn.Upsample(scale_factor=2, mode="nearest") if i > 0 else nn.Identity())
            cin = c
        self.out_norm = nn.GroupNorm(32, cin)
        self.head = nn.ConvTranspose2d(cin, 3, 4, stride=2, padding=1)

    def log(self, name: str, h: torch.Tensor) -> None:
        self.stats.add(name, h.detach().float().pow(2).mean().sqrt())

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        emb = self.temb(timestep_embedding(t, self.temb_dim))
        h = self.stem(x)
        skips = []
        for i, (block, pool) in enumerate(zip(self.down, self.pools)):
            h = block(h, emb)
            self.log(f"down{i}", h)
            skips.append(h)
            h = pool(h)
        h = self.mid2(self.mid_attn(self.mid1(h, emb)), emb)
        self.log("mid", h)
        for i, (block, up) in enumerate(zip(self.up, self.ups)):
            h = block(torch.cat([h, skips.pop()], dim=1), emb)
            self.log(f"up{i}", h)
            h = up(h)
        return self.head(F.silu(self.out_norm(h)))


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--img", type=int, default=192)
    p.add_argument("--copies", choices=["pageable", "pinned"], default="pinned")
    p.add_argument("--host-sync", action="store_true")
    a = p.parse_args()
    dev = torch.device(a.device)
    torch.manual_seed(0)
    batch, img, chans = (2, 32, (32, 64)) if a.tiny else (a.batch, a.img, (64, 128, 256))
    stats = Stats(sync=a.host_sync, read="item")
    model = UNet(chans, heads=4, stats=stats).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4, fused=dev.type == "cuda")
    alpha_bar = torch.cos(torch.linspace(0, 1, 1000, device=dev) * math.pi / 2).clamp(min=1e-4) ** 2
    gen = torch.Generator().manual_seed(0)
    host = [[torch.randn(batch, 3, img, img, generator=gen), torch.randn(batch, 3, img, img, generator=gen)]
            for _ in range(2)]
    data = HostBatches(host, pinned=a.copies == "pinned", dev=dev)

    def step() -> None:
        x0, noise = data.next()
        x0 = x0.contiguous(memory_format=torch.channels_last)
        noise = noise.contiguous(memory_format=torch.channels_last)
        t = torch.randint(0, 1000, (x0.shape[0],), device=dev)
        ab = alpha_bar[t][:, None, None, None]
        xt = ab.sqrt() * x0 + (1 - ab).sqrt() * noise
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            loss = F.mse_loss(model(xt, t).float(), noise)
        loss.backward()
        if a.host_sync:
            stats.last["loss"] = float(loss.item())
        else:
            stats.add("loss", loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats.step_done()

    harness.record(a, step, {"images_per_step": batch, "host_bytes_per_step": 2 * batch * 3 * img * img * 4,
                             "syncs_per_step": (2 * len(chans) + 2) if a.host_sync else 0,
                             "params": sum(q.numel() for q in model.parameters())})


if __name__ == "__main__":
    main()
