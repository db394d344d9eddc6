"""GPT-NeoX causal-LM training (transformers' own model code from a ``GPTNeoXConfig``: parallel
attention/MLP residual, partial rotary embeddings, untied output embedding; random weights, random
token ids on the GPU), bf16 autocast, for gpuprof's held-out pairs.

  --empty-cache        torch.cuda.empty_cache() after every step (the defect)
  --optim forloop      AdamW(foreach=False, fused=False): one small kernel per op per parameter
                       (the defect; default AdamW(fused=True))
"""

from __future__ import annotations

import torch
from _common import harness, lm_train_step, parser


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--inter", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=50432)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--empty-cache", action="store_true")
    p.add_argument("--optim", choices=["fused", "forloop"], default="fused")
    a = p.parse_args()
    import transformers as tf

    if a.tiny:
        a.layers, a.hidden, a.heads, a.inter, a.vocab, a.seq, a.batch = 2, 64, 4, 256, 512, 32, 2
    dev = torch.device(a.device)
    torch.manual_seed(0)
    cfg = tf.GPTNeoXConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                           num_attention_heads=a.heads, intermediate_size=a.inter,
                           max_position_embeddings=max(2048, a.seq),
                           use_parallel_residual=True, hidden_dropout=0.0, attention_dropout=0.0)
    with dev:
        model = tf.GPTNeoXForCausalLM(cfg)
    model.train()
    step = lm_train_step(model, a.optim, a.vocab, a.batch, a.seq, dev, a.empty_cache)

    harness.record(a, step, {"tokens_per_step": a.batch * a.seq, "transformers": tf.__version__,
                             "params": sum(q.numel() for q in model.parameters())})


if __name__ == "__main__":
    main()
