"""A small GPT used to record gpuprof's sample traces, with one switch per known defect.

Each sample trace in ``sample_traces/`` names the command line that made it (see
``record_all.sh``). The program records a torch.profiler (Kineto) trace of a few steps and,
separately, times steps without the profiler, so that each bad/good pair has a realised
step-time difference to check gpuprof's estimated saving against.

Defect switches (the default is the well-tuned program):
  --precision fp32        FP32 math with TF32 off (bad) instead of bf16 autocast
  --vocab 50257           a vocabulary that is not a multiple of 64 (bad shapes)
  --attn manual           matmul + mask + softmax + dropout attention instead of SDPA
  --elementwise naive     hand-written LayerNorm and tanh-GELU instead of fused modules
  --optim forloop         AdamW(foreach=False, fused=False) instead of AdamW(fused=True)
  --host-sync             a per-parameter ``.item()`` grad-norm log each step
  --grad-norm-on-gpu      the same grad-norm log kept on the GPU, read once every 10 steps (host_sync's fix)
  --size tiny             a model so small the host cannot launch kernels fast enough
  --cuda-graph            the whole training step captured once and replayed (the fix); with
                          --mode decode: a static KV cache and one graph replay per generated token
  --mode decode           KV-cache token-by-token generation instead of training
  --d-model/--heads/--ffn override the model's sizes (e.g. 1020/4/4084: every GEMM misaligned)
  --python-work inline    pure-Python tokenisation on the main thread between steps (vs workers)
  --checkpoint-every N    torch.save of the model every N steps (a long host stall)
  --empty-cache           torch.cuda.empty_cache() every step (allocator churn)
  --compile               torch.compile the model
  --gpu-only / --with-stack   profiler activities=[CUDA] only / Python frames in the trace
  --profile-capture       profile the CUDA-graph warm-up and capture instead of steady state
  --ddp / --manual-allreduce / --slow-rank-ms   multi-GPU runs under torchrun
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

SIZES = {
    # name: (layers, d_model, heads, seq, batch)
    "small": (6, 768, 12, 512, 8),
    "tiny": (4, 128, 4, 64, 2),
    "decode": (6, 4096, 32, 512, 1),
}


class NaiveLayerNorm(nn.Module):
    """LayerNorm written out of separate elementwise and reduction ops (the defect)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * self.weight + self.bias


def naive_gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, seq: int, attn: str, elementwise: str, dropout: float,
                 ffn: int = 0) -> None:
        super().__init__()
        self.dropout = dropout
        norm = NaiveLayerNorm if elementwise == "naive" else nn.LayerNorm
        self.ln1, self.ln2 = norm(d), norm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc = nn.Linear(d, ffn or 4 * d)
        self.fc_out = nn.Linear(ffn or 4 * d, d)
        self.heads, self.attn, self.elementwise = heads, attn, elementwise
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq, dtype=torch.bool)), persistent=False)
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None

    def attention(self, x: torch.Tensor, pos: int | torch.Tensor | None) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        causal = True
        if isinstance(pos, torch.Tensor):  # static decode (CUDA graphs): fixed shapes, position on the GPU
            assert self.k_cache is not None and self.v_cache is not None and t == 1
            self.k_cache.index_copy_(2, pos.view(1), k)
            self.v_cache.index_copy_(2, pos.view(1), v)
            seen = torch.arange(self.k_cache.size(2), device=x.device) <= pos
            y = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=seen.view(1, 1, 1, -1))
            return self.proj(y.transpose(1, 2).reshape(b, t, d))
        if pos is not None:  # decode: append to the KV cache, attend over everything so far
            assert self.k_cache is not None and self.v_cache is not None
            self.k_cache[:, :, pos : pos + t] = k
            self.v_cache[:, :, pos : pos + t] = v
            k, v = self.k_cache[:, :, : pos + t], self.v_cache[:, :, : pos + t]
            causal = t > 1
        if self.attn == "manual":
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            if causal:
                att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
            att = F.dropout(F.softmax(att, dim=-1), p=self.dropout, training=self.training)
            y = att @ v
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=causal, dropout_p=self.dropout if self.training else 0.0
            )
        return self.proj(y.transpose(1, 2).reshape(b, t, d))

    def forward(self, x: torch.Tensor, pos: int | torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attention(self.ln1(x), pos)
        h = self.fc(self.ln2(x))
        h = naive_gelu(h) if self.elementwise == "naive" else F.gelu(h, approximate="tanh")
        return x + self.fc_out(h)


class GPT(nn.Module):
    def __init__(self, vocab: int, layers: int, d: int, heads: int, seq: int, attn: str, elementwise: str,
                 dropout: float = 0.1, ffn: int = 0):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, seq, attn, elementwise, dropout, ffn) for _ in range(layers))
        self.ln_f = NaiveLayerNorm(d) if elementwise == "naive" else nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # weight tying, as in GPT-2

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, pos: int | torch.Tensor | None = None):
        t = idx.size(1)
        if isinstance(pos, torch.Tensor):
            x = self.tok(idx) + self.pos(pos.view(1, 1))
        else:
            start = 0 if pos is None else pos
            x = self.tok(idx) + self.pos(torch.arange(start, start + t, device=idx.device))
        for blk in self.blocks:
            x = blk(x, pos)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def make_profiler(out: str, wait: int, warmup: int, active: int, device: str, gpu_only: bool = False,
                  with_stack: bool = False):
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    if gpu_only:
        acts = [torch.profiler.ProfilerActivity.CUDA]

    def on_ready(prof: torch.profiler.profile) -> None:
        prof.export_chrome_trace(out)

    return torch.profiler.profile(
        activities=acts,
        schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=on_ready,
        record_shapes=True,
        with_stack=with_stack,
    )


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="trace path (.json.gz)")
    p.add_argument("--timing-out", help="JSON file for the unprofiled step timing")
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--batch", type=int)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--attn", choices=["sdpa", "manual"], default="sdpa")
    p.add_argument("--elementwise", choices=["fused", "naive"], default="fused")
    p.add_argument("--optim", choices=["fused", "forloop"], default="fused")
    p.add_argument("--host-sync", action="store_true")
    p.add_argument("--grad-norm-on-gpu", action="store_true",
                   help="--host-sync's grad-norm log kept on the GPU, read every 10 steps")
    p.add_argument("--cuda-graph", action="store_true")
    p.add_argument("--mode", choices=["train", "decode"], default="train")
    p.add_argument("--ddp", action="store_true")
    p.add_argument("--manual-allreduce", action="store_true", help="per-parameter all_reduce after backward")
    p.add_argument("--slow-rank-ms", type=float, default=0.0, help="extra host time per step on the last rank")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--timed-steps", type=int, default=20)
    p.add_argument("--active", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--nvtx-step", type=int, default=-1, help="wrap this step in an NVTX range 'ncu_step' (for ncu)")
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--d-model", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--ffn", type=int, default=0)
    p.add_argument("--python-work", choices=["none", "inline", "workers"], default="none")
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--empty-cache", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--gpu-only", action="store_true")
    p.add_argument("--with-stack", action="store_true")
    p.add_argument("--profile-capture", action="store_true")
    p.add_argument("--timing-windows", type=int, default=1, help="timed windows (each --timed-steps steps)")
    p.add_argument("--region-times", help="JSON file: host wall time per step of each region of the train step "
                                          "(forward, backward, the first .item(), the rest of the norms, optimizer, "
                                          "zero_grad), in the timed windows and in the profiled steps")
    a = p.parse_args()

    layers, d, heads, seq, batch = SIZES[a.size]
    batch = a.batch or batch
    d, heads = a.d_model or d, a.heads or heads
    device = a.device
    rank, world = 0, 1
    if a.ddp:
        import torch.distributed as dist

        backend = "nccl" if device == "cuda" else "gloo"
        dist.init_process_group(backend)
        rank, world = dist.get_rank(), dist.get_world_size()
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device(device, torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    torch.manual_seed(1234 + rank)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    vocab = a.vocab if a.size != "tiny" else 1024
    with dev:  # build on the device: a CPU init of the decode model takes many seconds
        model = GPT(vocab, layers, d, heads, seq, a.attn, a.elementwise, a.dropout, a.ffn)
    use_bf16 = a.precision == "bf16"
    autocast_dtype = torch.bfloat16

    def batch_of(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randint(0, vocab, (n, seq), device=dev)
        return x, torch.roll(x, -1, dims=1)

    if a.mode == "decode":
        run_decode(a, model, dev, vocab, seq, batch, use_bf16)
        return

    ddp_model: nn.Module = model
    if a.compile:
        ddp_model = torch.compile(model)
    if a.ddp and not a.manual_allreduce:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp_model = DDP(model, device_ids=[dev.index] if device == "cuda" else None)
    if a.optim == "fused":
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device == "cuda", capturable=a.cuda_graph)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False, fused=False)

    gpu_norms: list[torch.Tensor] = []
    # --region-times: harness.Regions marks between the regions of a step (none without the flag)
    regions = harness.REGIONS
    mark = regions.mark

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        mark(None)
        with torch.autocast(device_type=dev.type, dtype=autocast_dtype, enabled=use_bf16, cache_enabled=not a.cuda_graph):
            loss = ddp_model(x, y)
        mark("forward")
        loss.backward()
        mark("backward")
        if a.manual_allreduce:
            import torch.distributed as dist

            for prm in model.parameters():
                if prm.grad is not None:
                    dist.all_reduce(prm.grad)
                    prm.grad.div_(world)
        if a.host_sync:
            grads = [prm.grad for prm in model.parameters() if prm.grad is not None]
            norms = [grads[0].norm().item()]  # waits for backward's GPU work
            mark("first_item")
            norms += [g.norm().item() for g in grads[1:]]
            _ = max(norms)
            mark("other_items")
        if a.grad_norm_on_gpu:  # the same per-parameter norms, kept as tensors; one read every 10 steps
            gpu_norms.append(torch.stack([prm.grad.norm() for prm in model.parameters() if prm.grad is not None]).max())
            if len(gpu_norms) == 10:
                _ = torch.stack(gpu_norms).max().item()
                gpu_norms.clear()
            mark("gpu_norms")
        opt.step()
        mark("optimizer")
        opt.zero_grad(set_to_none=not a.cuda_graph)
        mark("zero_grad")
        regions.step_done()
        if a.empty_cache:
            torch.cuda.empty_cache()
        return loss

    step_fn = train_step
    capture_prof = None
    if a.cuda_graph and a.profile_capture and not a.no_profile:
        capture_prof = make_profiler(a.out, wait=0, warmup=0, active=1, device=device, with_stack=a.with_stack)
        capture_prof.start()
    if a.cuda_graph:
        static_x, static_y = batch_of(batch)
        captured: list[torch.Tensor] = []  # the loss of the last call, the captured one's

        def capturable_step() -> None:
            captured[:] = [train_step(static_x, static_y)]

        graph = harness.capture_graph(capturable_step)
        static_loss = captured[0]

        def graph_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            static_x.copy_(x)
            static_y.copy_(y)
            graph.replay()
            return static_loss

        step_fn = graph_step
    if capture_prof is not None:  # the capture trace (warm-up, capture, one replay) is the sample
        graph_step(*batch_of(batch))
        capture_prof.step()
        capture_prof.stop()
        a.no_profile = True

    batches = [batch_of(batch) for _ in range(4)]
    if a.python_work != "none":
        from textdata import batches as text_batches

        next_batch = text_batches(a.python_work, vocab, seq, batch, dev)
        inner_step = step_fn

        def text_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return inner_step(*next_batch())

        step_fn = text_step
    if a.checkpoint_every:
        ckpt_path = f"/tmp/gpt_ckpt_{os.getpid()}.pt"
        counter = iter(range(10**12))
        inner_ckpt = step_fn

        def ckpt_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = inner_ckpt(x, y)
            if next(counter) % a.checkpoint_every == 0:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, ckpt_path)
            return loss

        step_fn = ckpt_step

    def host_delay() -> None:
        if a.slow_rank_ms and rank == world - 1:
            end = time.perf_counter() + a.slow_rank_ms / 1000.0
            while time.perf_counter() < end:  # busy host work, like a slow data loader on one rank
                pass

    # Warm up, then time steps without the profiler: the realised step time.
    for i in range(5):
        host_delay()
        step_fn(*batches[i % 4])
    runs = []
    regions.bucket = "timed" if a.region_times else None
    for _window in range(a.timing_windows):  # one sync at each end of a window, none per step
        sync(device)
        t0 = time.perf_counter()
        for i in range(a.timed_steps):
            if i == a.nvtx_step and device == "cuda":
                torch.cuda.nvtx.range_push("ncu_step")
            host_delay()
            step_fn(*batches[i % 4])
            if i == a.nvtx_step and device == "cuda":
                torch.cuda.nvtx.range_pop()
        sync(device)
        runs.append((time.perf_counter() - t0) * 1000.0 / a.timed_steps)
    step_ms = sum(runs) / len(runs)
    regions.bucket = None
    write_timing(a, rank, world, step_ms, batch, seq, runs)

    def write_regions() -> None:
        if a.region_times:
            regions.write(a.region_times.replace("RANK", str(rank)))

    if a.no_profile:
        write_regions()
        return
    out = a.out.replace("RANK", str(rank))
    prof = make_profiler(out, wait=1, warmup=2, active=a.active, device=device, gpu_only=a.gpu_only,
                         with_stack=a.with_stack)
    with prof:
        for i in range(3 + a.active):
            regions.bucket = "profiled" if a.region_times and i >= 3 else None  # the recorded (active) steps
            host_delay()
            step_fn(*batches[i % 4])
            prof.step()
    regions.bucket = None
    write_regions()
    if a.ddp:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


def run_decode(a, model: GPT, dev: torch.device, vocab: int, seq: int, batch: int, use_bf16: bool) -> None:
    """Greedy generation with a KV cache: one profiler step per generated token.

    cuDNN's SDPA builds a new execution plan for every new KV length (seen here: ~40 ms per
    token), so decode uses the flash/efficient SDPA kernels, as serving stacks do.
    """
    if a.device == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)
    model = model.to(torch.bfloat16 if use_bf16 else torch.float32).eval()
    dtype = next(model.parameters()).dtype
    d = model.tok.weight.shape[1]
    for blk in model.blocks:
        shape = (batch, blk.heads, seq, d // blk.heads)
        blk.k_cache = torch.zeros(shape, device=dev, dtype=dtype)
        blk.v_cache = torch.zeros(shape, device=dev, dtype=dtype)
    prompt_len = 32
    prompt = torch.randint(0, vocab, (batch, prompt_len), device=dev)

    if a.cuda_graph:
        generate = graph_decoder(model, prompt, prompt_len, seq, dev)
    else:
        generate = None

    def eager_generate(n: int, prof: torch.profiler.profile | None = None) -> float:
        with torch.no_grad():
            logits = model(prompt, pos=0)
            tok = logits[:, -1:].argmax(-1)
            sync(a.device)
            t0 = time.perf_counter()
            for i in range(n):
                logits = model(tok, pos=prompt_len + i)
                tok = logits[:, -1:].argmax(-1)
                if prof is not None:
                    prof.step()
            sync(a.device)
            return (time.perf_counter() - t0) * 1000.0 / n

    generate = generate or eager_generate
    generate(8)
    runs = [generate(a.timed_steps * 5) for _ in range(a.timing_windows)]
    step_ms = sum(runs) / len(runs)
    write_timing(a, 0, 1, step_ms, batch, 1, runs)
    if a.no_profile:
        return
    prof = make_profiler(a.out, wait=1, warmup=2, active=a.active, device=a.device)
    with prof:
        generate(3 + a.active, prof)


def graph_decoder(model: GPT, prompt: torch.Tensor, prompt_len: int, seq: int, dev: torch.device):
    """The decode loop with the host taken out: the prompt fills the static KV cache eagerly, then
    one token's forward, argmax and position update are captured in a CUDA graph, and each
    generated token is one ``graph.replay()``."""
    tok = torch.zeros((prompt.size(0), 1), dtype=torch.long, device=dev)
    pos = torch.zeros((), dtype=torch.long, device=dev)

    def one_token() -> None:
        logits = model(tok, pos=pos)
        tok.copy_(logits[:, -1:].argmax(-1))
        pos.add_(1)

    def prefill() -> None:
        with torch.no_grad():
            logits = model(prompt, pos=0)
            tok.copy_(logits[:, -1:].argmax(-1))
            pos.fill_(prompt_len)

    with torch.no_grad():
        prefill()
        graph = harness.capture_graph(one_token)

    def generate(n: int, prof: torch.profiler.profile | None = None) -> float:
        assert prompt_len + n <= seq, "the static KV cache holds seq positions"
        prefill()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            graph.replay()
            if prof is not None:
                prof.step()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1000.0 / n

    return generate


def write_timing(a, rank: int, world: int, step_ms: float, batch: int, seq: int,
                 runs: list[float] | None = None) -> None:
    if not a.timing_out:
        return
    rec = {
        "argv": vars(a),
        "rank": rank,
        "world_size": world,
        "step_ms": step_ms,
        **({"step_ms_runs": runs} if runs and len(runs) > 1 else {}),
        "tokens_per_step": batch * seq,
        "timed_steps": a.timed_steps,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
    }
    path = a.timing_out.replace("RANK", str(rank))
    with open(path, "w") as f:
        json.dump(rec, f, indent=1)
    print(f"[rank {rank}] step {step_ms:.3f} ms  ({path})", flush=True)


if __name__ == "__main__":
    main()
