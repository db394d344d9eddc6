"""Greedy decoding of ``--new-tokens`` tokens per step from a ``--prompt``-token prompt at ``--batch``
sequences, bf16 weights, inference mode, for gpuprof's held-out KV-cache pairs.

  --model qwen2        transformers' Qwen2 (``Qwen2ForCausalLM`` from a ``Qwen2Config``: RMSNorm,
                       rotary embeddings, grouped-query attention with 2 KV heads, SwiGLU)
  --model gpt2         transformers' GPT-2 (round 3; ``GPT2LMHeadModel`` from a ``GPT2Config``: LayerNorm,
                       learned positions, fused QKV projection (Conv1D), GELU MLP)
  --model opt          transformers' OPT (for round 11; ``OPTForCausalLM`` from an ``OPTConfig``: pre-LayerNorm,
                       learned positions, separate Q/K/V projections with biases, ReLU MLP 4x)
  --model phi          transformers' Phi (for round 11; ``PhiForCausalLM`` from a ``PhiConfig``: attention and
                       MLP in parallel off one LayerNorm, partial rotary embeddings, GELU MLP 4x, biases)
  --model llama        transformers' Llama (for round 12; ``LlamaForCausalLM`` from a ``LlamaConfig``: RMSNorm, rotary
                       embeddings, grouped-query attention with 4 KV heads, SwiGLU, no biases)
  --model neox         transformers' GPT-NeoX (for round 12; ``GPTNeoXForCausalLM`` from a ``GPTNeoXConfig``: parallel
                       attention and MLP residual, fused QKV projection, partial rotary (25 %), GELU MLP 4x)
  --model handwritten  a decoder written here (RMSNorm, rotary embeddings, SDPA, SwiGLU, untied head)
                       with its own preallocated KV cache
  --no-cache           every new token runs the model over the whole sequence so far, the prefix
                       recomputed each pass (``model(ids, use_cache=False)``; the defect). Default: one
                       prefill pass over the prompt, then one pass per token over that token alone
                       with the cached keys and values (``past_key_values`` / the decoder's cache).

Both make the same tokens (greedy argmax; the next token stays on the GPU, no host sync, no early stop).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _common import harness, parser
from torch import nn


def rope_tables(max_len: int, hd: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd))
    f = torch.outer(torch.arange(max_len, device=dev, dtype=torch.float32), inv)
    return f.cos().to(torch.bfloat16), f.sin().to(torch.bfloat16)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class Layer(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.up, self.down = nn.Linear(d, 2 * ffn, bias=False), nn.Linear(ffn, d, bias=False)

    def forward(self, x: torch.Tensor, pos: int, cos: torch.Tensor, sin: torch.Tensor,
                cache: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, self.hd).transpose(1, 3).unbind(2)
        c, s = cos[pos:pos + t], sin[pos:pos + t]
        q, k = rotate(q, c, s), rotate(k, c, s)
        if cache is not None:  # write this pass's keys/values, attend over everything cached so far
            cache[0][:, :, pos:pos + t] = k
            cache[1][:, :, pos:pos + t] = v
            k, v = cache[0][:, :, :pos + t], cache[1][:, :, :pos + t]
        o = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        x = x + self.o(o.transpose(1, 2).reshape(b, t, d))
        g, u = self.up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class Decoder(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, ffn: int, max_len: int, dev: torch.device) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Layer(d, heads, ffn) for _ in range(layers)])
        self.norm, self.head = nn.RMSNorm(d), nn.Linear(d, vocab, bias=False)
        self.cos, self.sin = rope_tables(max_len, d // heads, dev)
        self.max_len, self.heads, self.hd = max_len, heads, d // heads

    def new_cache(self, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        shape = (batch, self.heads, self.max_len, self.hd)
        dev, dt = self.head.weight.device, self.head.weight.dtype
        return [(torch.empty(shape, device=dev, dtype=dt), torch.empty(shape, device=dev, dtype=dt)) for _ in self.layers]

    def forward(self, ids: torch.Tensor, pos: int = 0,
                cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
        x = self.embed(ids)
        for i, layer in enumerate(self.layers):
            x = layer(x, pos, self.cos, self.sin, cache[i] if cache is not None else None)
        return self.head(self.norm(x))


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--model", choices=["qwen2", "gpt2", "opt", "phi", "llama", "neox", "handwritten"], default="qwen2")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=1024)
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--no-cache", action="store_true")
    a = p.parse_args()
    dev = torch.device(a.device)
    torch.manual_seed(0)
    batch, prompt_len, vocab = (2, 16, 512) if a.tiny else (a.batch, a.prompt, 32000)
    max_len = prompt_len + a.new_tokens
    extra: dict[str, object] = {}
    if a.model in ("qwen2", "gpt2", "opt", "phi", "llama", "neox"):
        import transformers as tf

        if a.model in ("qwen2", "llama"):  # the same configuration fields (GQA, SwiGLU), their own sizes
            qwen = a.model == "qwen2"
            layers, d, heads, kv, inter = ((2, 64, 4, 2, 128) if a.tiny else
                                           (4, 1536, 12, 2, 4096) if qwen else (8, 1024, 16, 4, 2816))
            config, causal_lm = (tf.Qwen2Config, tf.Qwen2ForCausalLM) if qwen else (tf.LlamaConfig, tf.LlamaForCausalLM)
            cfg = config(vocab_size=vocab, hidden_size=d, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv,
                         max_position_embeddings=max(4096, max_len), tie_word_embeddings=False)
            with dev:
                model = causal_lm(cfg)
        elif a.model == "opt":
            layers, d, heads = (2, 64, 4) if a.tiny else (8, 1024, 16)
            cfg = tf.OPTConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers, ffn_dim=4 * d,
                               num_attention_heads=heads, max_position_embeddings=max(2048, max_len),
                               word_embed_proj_dim=d, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
            with dev:
                model = tf.OPTForCausalLM(cfg)
        elif a.model == "phi":
            layers, d, heads = (2, 64, 4) if a.tiny else (6, 1280, 20)
            cfg = tf.PhiConfig(vocab_size=vocab, hidden_size=d, intermediate_size=4 * d, num_hidden_layers=layers,
                               num_attention_heads=heads, max_position_embeddings=max(2048, max_len),
                               resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)
            with dev:
                model = tf.PhiForCausalLM(cfg)
        elif a.model == "neox":
            layers, d, heads = (2, 64, 4) if a.tiny else (8, 1024, 16)
            cfg = tf.GPTNeoXConfig(vocab_size=vocab, hidden_size=d, intermediate_size=4 * d, num_hidden_layers=layers,
                                   num_attention_heads=heads, max_position_embeddings=max(2048, max_len),
                                   rotary_pct=0.25, use_parallel_residual=True, hidden_dropout=0.0,
                                   attention_dropout=0.0, tie_word_embeddings=False)
            with dev:
                model = tf.GPTNeoXForCausalLM(cfg)
        else:
            layers, d, heads = (2, 64, 4) if a.tiny else (8, 1024, 16)
            cfg = tf.GPT2Config(vocab_size=vocab, n_embd=d, n_layer=layers, n_head=heads,
                                n_positions=max(2048, max_len), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
            with dev:
                model = tf.GPT2LMHeadModel(cfg)
        extra["transformers"] = tf.__version__

        def logits_full(ids: torch.Tensor) -> torch.Tensor:
            return model(input_ids=ids, use_cache=False).logits

        def generate_cached(prompt: torch.Tensor) -> torch.Tensor:
            out = model(input_ids=prompt, use_cache=True)
            past, toks = out.past_key_values, [out.logits[:, -1].argmax(-1)]
            for _ in range(a.new_tokens - 1):
                out = model(input_ids=toks[-1][:, None], past_key_values=past, use_cache=True)
                past = out.past_key_values
                toks.append(out.logits[:, -1].argmax(-1))
            return torch.stack(toks, 1)
    else:
        layers, d, heads, ffn = (2, 64, 4, 128) if a.tiny else (8, 1024, 16, 2816)
        with dev:
            model = Decoder(vocab, d, layers, heads, ffn, max_len, dev)
        cache = None

        def logits_full(ids: torch.Tensor) -> torch.Tensor:
            return model(ids)

        def generate_cached(prompt: torch.Tensor) -> torch.Tensor:
            nonlocal cache
            if cache is None:
                cache = model.new_cache(prompt.shape[0])
            toks = [model(prompt, 0, cache)[:, -1].argmax(-1)]
            for i in range(a.new_tokens - 1):
                toks.append(model(toks[-1][:, None], prompt.shape[1] + i, cache)[:, -1].argmax(-1))
            return torch.stack(toks, 1)

    model = model.to(torch.bfloat16).eval()
    prompt = torch.randint(0, vocab, (batch, prompt_len), device=dev)

    def generate_recompute(prompt: torch.Tensor) -> torch.Tensor:
        ids = prompt
        for _ in range(a.new_tokens):
            nxt = logits_full(ids)[:, -1].argmax(-1)
            ids = torch.cat([ids, nxt[:, None]], dim=1)
        return ids[:, prompt.shape[1]:]

    gen = generate_recompute if a.no_cache else generate_cached

    def step() -> None:
        with torch.inference_mode():
            gen(prompt)

    if a.tiny:  # the cached and recomputed loops must make the same tokens
        with torch.inference_mode():
            same = torch.equal(generate_recompute(prompt), generate_cached(prompt))
        print("cached == recomputed:", same, flush=True)
        extra["tiny_tokens_match"] = same
    harness.record(a, step, {"new_tokens": a.new_tokens, "tokens_per_step": batch * a.new_tokens,
                             "prompt": prompt_len, "batch": batch, "model": a.model, **extra,
                             "params": sum(q.numel() for q in model.parameters())})


if __name__ == "__main__":
    main()
