"""Hugging Face ``Trainer`` as a user writes it: a small GPT-2 built from its config (4 layers,
d=512, no download), a synthetic token dataset, bf16, AdamW, 2 DataLoader workers, logging every
25 steps (the Trainer's own ``.item()`` calls included), no evaluation, no checkpoints.

    python hf_trainer_gpt2.py [--timing-out own.json]
    python hf_trainer_gpt2.py --device cpu --tiny
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from own_clock import OwnClock, add_args, resolve  # noqa: E402


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, seq: int, vocab: int) -> None:
        self.n, self.seq, self.vocab = n, seq, vocab

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, self.vocab, (self.seq,), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_args(p)
    p.add_argument("--batch", type=int, default=None, help="default 16 (--tiny 4)")
    args = resolve(p.parse_args())
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    tiny = args.tiny
    cfg = GPT2Config(n_layer=2 if tiny else 4, n_embd=64 if tiny else 512, n_head=4 if tiny else 8,
                     n_positions=64 if tiny else 512, vocab_size=512 if tiny else 16384, bos_token_id=0,
                     eos_token_id=0)
    seq, batch = (32, 4) if tiny else (512, args.batch or 16)
    clock = OwnClock("hf_trainer_gpt2", args, model=f"GPT-2 {cfg.n_layer} layers d={cfg.n_embd}", batch=batch,
                     seq=seq)

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, a: object, state: object, control: object, **kw: object) -> None:
            clock.step_done(getattr(state, "global_step"))  # after the optimizer step

    out = tempfile.mkdtemp(prefix="hf_trainer_gpt2-")
    targs = TrainingArguments(output_dir=out, max_steps=args.steps, per_device_train_batch_size=batch,
                              bf16=args.device == "cuda", use_cpu=args.device == "cpu", learning_rate=3e-4,
                              optim="adamw_torch", logging_steps=25, save_strategy="no", eval_strategy="no",
                              report_to="none", dataloader_num_workers=2, disable_tqdm=True, seed=0)
    trainer = Trainer(model=GPT2LMHeadModel(cfg), args=targs,
                      train_dataset=Tokens(batch * (args.steps + 10), seq, cfg.vocab_size), callbacks=[Clock()])
    trainer.train()
    clock.report()


if __name__ == "__main__":
    main()
