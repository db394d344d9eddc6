"""What the held-out programs share: the harness's arguments plus ``--tiny``, the defects written
once (hand-written LayerNorm/GELU, a hand-written momentum-SGD loop, pageable host batches, per-layer
statistics read on the host) and their fixes.

Every program here builds its model from code or a config (nothing is downloaded), makes synthetic
data, and hands one ``step()`` to ``harness.record`` (programs/harness.py), which times unprofiled
windows and then records ``--active`` steps after ``wait=1, warmup=2`` with ``record_shapes=True``.
``--device cpu --tiny`` shrinks the model and data so that a program runs end to end on a laptop CPU
(the dry run); the sizes without ``--tiny`` are the ones recorded on the H200.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
from collections.abc import Callable, Iterable

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness

__all__ = ["HostBatches", "LoopSGD", "NaiveGELU", "NaiveLayerNorm", "Stats", "harness", "lm_train_step",
           "make_optimizer", "maybe_compile", "naive_gelu_tanh", "parser"]


def parser(doc: str | None, compile: bool = False) -> argparse.ArgumentParser:
    """The harness's arguments and ``--tiny``; with ``compile``, also ``--compile`` (only for the
    programs that pass their model through :func:`maybe_compile`, so no program accepts it and
    ignores it)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_args(p)
    p.add_argument("--tiny", action="store_true", help="a small model and batch for a CPU dry run")
    if compile:
        p.add_argument("--compile", action="store_true",
                       help="torch.compile the model (the compile class's fix; Inductor, default mode)")
    return p


def maybe_compile(model: nn.Module, a: argparse.Namespace) -> nn.Module:
    """``model`` compiled with ``torch.compile`` (default mode, the user's one-line fix) when
    ``--compile`` is given, else ``model``. Compiling happens on the first steps, which the harness
    runs as warm-up before it times or profiles anything."""
    return torch.compile(model) if a.compile else model


class NaiveLayerNorm(nn.Module):
    """LayerNorm written out of separate reduction and elementwise ops (the defect): about nine
    kernels forward and more backward where ``nn.LayerNorm`` launches one each way. Accepts the
    keyword arguments timm passes to a norm layer (eps, device, dtype)."""

    def __init__(self, dim: int, eps: float = 1e-6, device: object = None, dtype: object = None, **_: object) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))  # type: ignore[arg-type]
        self.bias = nn.Parameter(torch.zeros(dim, device=device, dtype=dtype))  # type: ignore[arg-type]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class NaiveGELU(nn.Module):
    """The exact (erf) GELU written out of elementwise ops (the defect; ``nn.GELU`` is one kernel)."""

    def __init__(self, *_: object, **__: object) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def naive_gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """The tanh GELU written out (the defect; ``F.gelu(x, approximate="tanh")`` is one kernel)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


class LoopSGD:
    """Momentum SGD written as a Python loop over the parameters, no ``torch.optim`` (the defect):
    for each parameter ``d = g + wd*p; buf = m*buf + d; p -= lr*buf``, three or four small kernels
    per parameter launched one after another. The same update as ``torch.optim.SGD(momentum=m,
    weight_decay=wd)``, which with ``foreach=True`` does it in a few multi-tensor kernels (the fix)."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float, momentum: float, weight_decay: float) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.bufs: list[torch.Tensor | None] = [None] * len(self.params)

    @torch.no_grad()
    def step(self) -> None:
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad.add(p, alpha=self.weight_decay) if self.weight_decay else p.grad
            buf = self.bufs[i]
            if buf is None:
                buf = self.bufs[i] = torch.clone(g).detach()
            else:
                buf.mul_(self.momentum).add_(g)
            p.add_(buf, alpha=-self.lr)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None


OPTIMS = ["sgd_foreach", "sgd_loop", "adamw_fused", "adamw_forloop"]


def make_optimizer(kind: str, params: Iterable[nn.Parameter], dev: torch.device) -> LoopSGD | torch.optim.Optimizer:
    """``sgd_foreach``/``adamw_fused``: the tuned optimizers (fused AdamW on CUDA; on the CPU its
    default). ``sgd_loop``: :class:`LoopSGD`. ``adamw_forloop``: ``AdamW(foreach=False, fused=False)``."""
    params = list(params)
    if kind == "sgd_foreach":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=5e-5, foreach=True)
    if kind == "sgd_loop":
        return LoopSGD(params, lr=0.05, momentum=0.9, weight_decay=5e-5)
    if kind == "adamw_fused":
        return torch.optim.AdamW(params, lr=3e-4, weight_decay=0.05, fused=dev.type == "cuda")
    if kind == "adamw_forloop":
        return torch.optim.AdamW(params, lr=3e-4, weight_decay=0.05, foreach=False, fused=False)
    raise ValueError(kind)


def lm_train_step(model: nn.Module, optim: str, vocab: int, batch: int, seq: int, dev: torch.device,
                  empty_cache: bool = False, precision: str = "bf16") -> Callable[[], None]:
    """One causal-LM training step of ``model`` on two alternating random token batches on the
    device (labels = inputs): the forward under bf16 autocast (``precision="fp32"``: no autocast,
    every GEMM in FP32 at torch's default matmul precision, the defect), backward, the optimizer
    (``optim="fused"``: ``adamw_fused``; ``"forloop"``: ``adamw_forloop``, the defect), and with
    ``empty_cache`` a ``torch.cuda.empty_cache()`` after every step (the defect)."""
    opt = make_optimizer("adamw_fused" if optim == "fused" else "adamw_forloop", model.parameters(), dev)
    ids = [torch.randint(0, vocab, (batch, seq), device=dev) for _ in range(2)]
    count = itertools.count()

    def step() -> None:
        x = ids[next(count) % 2]
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = model(input_ids=x, labels=x)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if empty_cache and dev.type == "cuda":
            torch.cuda.empty_cache()

    return step


class HostBatches:
    """Ready batches kept in host memory and copied to the device each step, two alternating.
    ``pinned=False`` (the defect): pageable memory and ``.to(dev)``, which stages every byte through
    a driver buffer and blocks the host until the copy is done. ``pinned=True`` (the fix): page-locked
    memory and ``non_blocking=True``. The host tensors are never written after they are made, so
    an asynchronous copy cannot race a writer."""

    def __init__(self, batches: list[list[torch.Tensor]], pinned: bool, dev: torch.device) -> None:
        self.pinned = pinned and dev.type == "cuda"
        self.host = [[t.pin_memory() if self.pinned else t for t in b] for b in batches]
        self.dev, self.i = dev, 0

    def next(self) -> list[torch.Tensor]:
        self.i = (self.i + 1) % len(self.host)
        return [t.to(self.dev, non_blocking=self.pinned) for t in self.host[self.i]]


class Stats:
    """Per-layer statistics that a training script logs (activation RMS per block, say).
    ``sync=True`` (the defect): each value is read on the host as it is made (``read="item"``:
    ``.item()``, ``"cpu"``: ``.cpu()``), one host sync per value, inside the step. Otherwise (the fix)
    the values stay on the GPU as tensors and are read in one copy every ``every`` steps."""

    def __init__(self, sync: bool, read: str = "item", every: int = 10) -> None:
        self.sync, self.read, self.every = sync, read, every
        self.last: dict[str, float] = {}
        self.pending: list[torch.Tensor] = []
        self.steps = 0

    def add(self, name: str, value: torch.Tensor) -> None:
        if self.sync:
            self.last[name] = float(value.item()) if self.read == "item" else float(value.cpu())
        else:
            self.pending.append(value.detach().float().reshape(()))

    def step_done(self) -> None:
        self.steps += 1
        if not self.sync and self.steps % self.every == 0 and self.pending:
            vals = torch.stack(self.pending).cpu()  # the one read every `every` steps
            self.last = {"mean": float(vals.mean())}
            self.pending.clear()
