"""Hugging Face transformers models (random weights, built from a config) for gpuprof's samples.

A second, structurally different program beside gpt.py: the model code is transformers' own
(Llama: RMSNorm, rotary embeddings, SwiGLU, grouped attention; BERT: post-norm encoder, GELU,
masked-LM head). Switches, the default being the tuned program:
  --model llama|bert           which architecture
  --hidden/--heads/--inter/--vocab   sizes (llama misaligned: 1020/10/2750/32001; aligned 1040/10/2752/32000)
  --python-work inline         pure-Python tokenisation on the main thread (vs workers / none)
  --host-sync                  log loss.item() and a grad-norm .item() every step (a host sync)
  --metrics-on-gpu             the same loss and grad norm kept as tensors, read once every 10 steps
  --optim forloop              AdamW(foreach=False, fused=False): one small kernel per op per parameter
  --compile                    torch.compile the model
  --mode generate              model.generate() of --new-tokens tokens per step at --batch (decode)
  --static-cache               generate with cache_implementation="static" (with --compile: CUDA graphs)
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from textdata import batches as text_batches  # noqa: E402


def build(a: argparse.Namespace) -> torch.nn.Module:
    import transformers as tf

    if a.model == "llama":
        cfg = tf.LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.inter,
                             num_hidden_layers=a.layers, num_attention_heads=a.heads,
                             num_key_value_heads=a.heads, max_position_embeddings=max(a.seq, 2048))
        return tf.LlamaForCausalLM(cfg)
    cfg = tf.BertConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.inter,
                        num_hidden_layers=a.layers, num_attention_heads=a.heads,
                        max_position_embeddings=max(a.seq, 512))
    return tf.BertForMaskedLM(cfg)


def log_metrics(loss: torch.Tensor, model: torch.nn.Module) -> float:
    """What a training script's logging does each step: two host syncs (.item())."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    return float(loss.item()) + float(norm.item())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_args(p)
    p.add_argument("--model", choices=["llama", "bert"], default="llama")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--inter", type=int, default=2816)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--python-work", choices=["none", "inline", "workers"], default="none")
    p.add_argument("--host-sync", action="store_true")
    p.add_argument("--metrics-on-gpu", action="store_true")
    p.add_argument("--optim", choices=["fused", "forloop"], default="fused")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--mode", choices=["train", "generate"], default="train")
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--static-cache", action="store_true")
    a = p.parse_args()
    dev = torch.device(a.device)
    torch.manual_seed(0)
    with dev:
        model = build(a)
    if a.mode == "generate":
        model = model.to(torch.bfloat16).eval()
        prompt = torch.randint(0, a.vocab, (a.batch, 32), device=dev)
        kw = {"cache_implementation": "static"} if a.static_cache else {}
        if a.compile:
            model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)

        def gen() -> None:
            with torch.no_grad():
                model.generate(prompt, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                               do_sample=False, pad_token_id=0, **kw)

        harness.record(a, gen, {"tokens_per_step": a.batch * a.new_tokens, "new_tokens": a.new_tokens})
        return

    fwd = torch.compile(model) if a.compile else model
    if a.optim == "fused":
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=dev.type == "cuda")
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False, fused=False)
    gpu_metrics: list[torch.Tensor] = []
    next_batch = text_batches(a.python_work, a.vocab, a.seq, a.batch, dev)

    mark = harness.REGIONS.mark

    def step() -> None:
        mark(None)
        x, y = next_batch()
        mark("input")
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            out = fwd(input_ids=x, labels=y if a.model == "bert" else x)
        mark("forward")
        out.loss.backward()
        mark("backward")
        if a.host_sync:
            log_metrics(out.loss, model)
            mark("host_sync")
        if a.metrics_on_gpu:  # host_sync's fix: the same values, one read every 10 steps
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            gpu_metrics.append(out.loss.detach() + norm)
            if len(gpu_metrics) == 10:
                _ = float(torch.stack(gpu_metrics).sum().item())
                gpu_metrics.clear()
            mark("gpu_metrics")
        opt.step()
        mark("optimizer")
        opt.zero_grad(set_to_none=True)
        mark("zero_grad")
        harness.REGIONS.step_done()

    harness.record(a, step, {"tokens_per_step": a.batch * a.seq})


if __name__ == "__main__":
    main()
