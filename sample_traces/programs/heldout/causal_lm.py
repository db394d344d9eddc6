"""Causal-LM training with transformers' own model code built from a config (random weights, random
token ids on the GPU), bf16 autocast, for gpuprof's second round of held-out pairs (issue #24):
families this project had not used before that round.

  --family opt         OPT: pre-LayerNorm decoder, learned positions, ReLU MLP (ffn_dim 4x)
  --family bloom       BLOOM: ALiBi attention biases (no position embeddings), fused QKV, GELU MLP
  --family gemma       Gemma (round 3): RMSNorm (1 + weight), rotary embeddings, grouped-query
                       attention (4 KV heads), GeGLU MLP (intermediate 8/3 x hidden rounded to 256),
                       embeddings scaled by sqrt(hidden) and tied to the output
  --precision fp32     no autocast: every GEMM in FP32 at torch's default matmul precision, off the
                       tensor cores (the defect; default bf16 autocast)
  --empty-cache        torch.cuda.empty_cache() after every step (the defect)
  --optim forloop      AdamW(foreach=False, fused=False): one small kernel per op per parameter
                       (the defect; default AdamW(fused=True))
"""

from __future__ import annotations

import torch
from _common import harness, lm_train_step, parser


def build(tf: object, family: str, a: object) -> torch.nn.Module:
    if family == "opt":
        cfg = tf.OPTConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,  # type: ignore[attr-defined]
                           ffn_dim=4 * a.hidden, num_attention_heads=a.heads, max_position_embeddings=max(2048, a.seq),
                           word_embed_proj_dim=a.hidden, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
        return tf.OPTForCausalLM(cfg)  # type: ignore[attr-defined,no-any-return]
    if family == "gemma":
        inter = max(256, 256 * round(8 * a.hidden / 3 / 256))
        kv = max(d for d in range(1, max(1, a.heads // 4) + 1) if a.heads % d == 0)  # grouped-query: divides heads
        cfg = tf.GemmaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=inter,  # type: ignore[attr-defined]
                             num_hidden_layers=a.layers, num_attention_heads=a.heads,
                             num_key_value_heads=kv, head_dim=a.hidden // a.heads,
                             max_position_embeddings=max(2048, a.seq), attention_dropout=0.0)
        return tf.GemmaForCausalLM(cfg)  # type: ignore[attr-defined,no-any-return]
    cfg = tf.BloomConfig(vocab_size=a.vocab, hidden_size=a.hidden, n_layer=a.layers, n_head=a.heads,  # type: ignore[attr-defined]
                         hidden_dropout=0.0, attention_dropout=0.0)
    return tf.BloomForCausalLM(cfg)  # type: ignore[attr-defined,no-any-return]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--family", choices=["opt", "bloom", "gemma"], default="opt")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=50272)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--empty-cache", action="store_true")
    p.add_argument("--optim", choices=["fused", "forloop"], default="fused")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    a = p.parse_args()
    import transformers as tf

    if a.tiny:
        a.layers, a.hidden, a.heads, a.vocab, a.seq, a.batch = 2, 64, 4, 512, 32, 2
    dev = torch.device(a.device)
    torch.manual_seed(0)
    with dev:
        model = build(tf, a.family, a)
    model.train()
    step = lm_train_step(model, a.optim, a.vocab, a.batch, a.seq, dev, a.empty_cache, a.precision)

    harness.record(a, step, {"tokens_per_step": a.batch * a.seq, "family": a.family, "precision": a.precision,
                             "transformers": tf.__version__,
                             "params": sum(q.numel() for q in model.parameters())})


if __name__ == "__main__":
    main()
