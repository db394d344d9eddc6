"""Whisper audio classification training (transformers' ``WhisperForAudioClassification`` from a
``WhisperConfig``: a two-conv stem over log-mel features, then a pre-norm transformer encoder, mean
pooling and a linear head; random weights), bf16 autocast, fused AdamW, for gpuprof's held-out pairs.

Each step copies a batch of log-mel features (B x 80 x 3000 float32: 30.7 MB at B=32) and labels from
host memory, as an audio pipeline that decodes on the host does, and a forward hook on each encoder
layer logs its output's mean absolute value.

  --copies pageable    features in pageable memory, copied with .to(dev) (the defect; default pinned
                       memory and non_blocking=True)
  --host-sync          each layer's statistic read with .cpu() inside the forward, one host sync per
                       layer, plus loss.cpu() (the defect; default: kept on the GPU, read every 10 steps)
"""

from __future__ import annotations

import torch
from _common import HostBatches, Stats, harness, parser


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--copies", choices=["pageable", "pinned"], default="pinned")
    p.add_argument("--host-sync", action="store_true")
    a = p.parse_args()
    import transformers as tf

    dev = torch.device(a.device)
    torch.manual_seed(0)
    batch, layers, d, heads, positions = (2, 1, 64, 2, 100) if a.tiny else (a.batch, a.layers, a.d_model, a.heads, 1500)
    cfg = tf.WhisperConfig(num_mel_bins=80, d_model=d, encoder_layers=layers, encoder_attention_heads=heads,
                           encoder_ffn_dim=4 * d, decoder_layers=1, decoder_attention_heads=heads,
                           max_source_positions=positions, num_labels=50, classifier_proj_size=256,
                           dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    with dev:
        model = tf.WhisperForAudioClassification(cfg)
    model.train()
    stats = Stats(sync=a.host_sync, read="cpu")

    def hook(name: str):  # type: ignore[no-untyped-def]
        def fn(_m: torch.nn.Module, _i: object, out: object) -> None:
            h = out[0] if isinstance(out, tuple) else out
            stats.add(name, h.detach().float().abs().mean())
        return fn

    for i, layer in enumerate(model.encoder.layers):
        layer.register_forward_hook(hook(f"layer{i}"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    frames = 2 * positions  # the encoder's two convs halve the frames to max_source_positions
    gen = torch.Generator().manual_seed(0)
    host = [[torch.randn(batch, 80, frames, generator=gen), torch.randint(0, 50, (batch,), generator=gen)]
            for _ in range(2)]
    data = HostBatches(host, pinned=a.copies == "pinned", dev=dev)

    def step() -> None:
        feats, labels = data.next()
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            out = model(input_features=feats, labels=labels)
        out.loss.backward()
        if a.host_sync:
            stats.last["loss"] = float(out.loss.detach().cpu())
        else:
            stats.add("loss", out.loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats.step_done()

    harness.record(a, step, {"clips_per_step": batch, "host_bytes_per_step": batch * 80 * frames * 4,
                             "syncs_per_step": (layers + 1) if a.host_sync else 0, "transformers": tf.__version__,
                             "params": sum(q.numel() for q in model.parameters())})


if __name__ == "__main__":
    main()
