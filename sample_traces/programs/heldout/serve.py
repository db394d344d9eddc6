"""Inference serving of ``--requests`` requests per step (already on the GPU, as a server's queue holds
them), bf16 weights, inference mode, for gpuprof's held-out batching pairs.

  --model deberta      transformers' DeBERTa-v2 sequence classifier (``DebertaV2ForSequenceClassification``
                       from a config: disentangled relative-position attention, v3-style sizes, 6
                       layers), one request = one sequence of --seq tokens
  --model mobilenetv3  timm's mobilenetv3_large_100 (``pretrained=False``, channels_last), one request =
                       one 224x224 image
  --per-request        each request run alone at batch 1 in a Python loop, the same kernels repeated
                       once per request (the defect). Default: the requests stacked into one batch
                       and run in one forward.

The predictions (argmax) stay on the GPU: no host sync in either.
"""

from __future__ import annotations

import torch
from _common import harness, parser


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--model", choices=["deberta", "mobilenetv3"], default="deberta")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--per-request", action="store_true")
    a = p.parse_args()
    dev = torch.device(a.device)
    torch.manual_seed(0)
    n = 3 if a.tiny else a.requests
    extra: dict[str, object] = {}
    if a.model == "deberta":
        import transformers as tf

        layers, d, heads, seq, vocab = (1, 64, 2, 16, 512) if a.tiny else (6, 768, 12, a.seq, 128100)
        cfg = tf.DebertaV2Config(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                                 intermediate_size=4 * d, max_position_embeddings=512, relative_attention=True,
                                 position_buckets=256, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm",
                                 share_att_key=True, position_biased_input=False, num_labels=3)
        with dev:
            model = tf.DebertaV2ForSequenceClassification(cfg)
        reqs = [torch.randint(0, vocab, (1, seq), device=dev) for _ in range(n)]
        extra["transformers"] = tf.__version__

        def run(x: torch.Tensor) -> torch.Tensor:
            return model(input_ids=x).logits
    else:
        import timm

        img = 64 if a.tiny else 224
        model = timm.create_model("mobilenetv3_large_100", pretrained=False, num_classes=1000)
        model = model.to(dev).to(memory_format=torch.channels_last)
        reqs = [torch.randn(1, 3, img, img, device=dev).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
                for _ in range(n)]
        extra["timm"] = timm.__version__

        def run(x: torch.Tensor) -> torch.Tensor:
            return model(x)

    model = model.to(torch.bfloat16).eval()
    batched = torch.cat(reqs)

    def step() -> None:
        with torch.inference_mode():
            if a.per_request:
                preds = [run(x).argmax(-1) for x in reqs]
            else:
                preds = list(run(batched).argmax(-1).unbind(0))
        assert len(preds) == n

    harness.record(a, step, {"requests_per_step": n, "model": a.model, **extra,
                             "params": sum(q.numel() for q in model.parameters())})


if __name__ == "__main__":
    main()
