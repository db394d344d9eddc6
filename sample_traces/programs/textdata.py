"""Token batches made by pure-Python tokenisation, for the "Python work in the loop" samples.

``inline`` tokenises each batch in the training process between steps (the defect: user Python
on the main thread, outside any op and outside any DataLoader); ``workers`` does the same work in
DataLoader worker processes with pinned memory (the fix); ``none`` reuses ready token tensors.
The tokeniser is a greedy longest-match over a word-piece vocabulary, written in Python as
simple tokenisers and text cleaners in training scripts are.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import torch

_ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def _vocab(size: int, seed: int = 0) -> dict[str, int]:
    rng = random.Random(seed)
    pieces = set(_ALPHABET)
    while len(pieces) < size - 1:
        pieces.add("".join(rng.choice(_ALPHABET) for _ in range(rng.randint(2, 6))))
    return {p: i + 1 for i, p in enumerate(sorted(pieces))}


class Tokenizer:
    def __init__(self, vocab_size: int) -> None:
        self.vocab = _vocab(vocab_size)
        self.longest = max(len(p) for p in self.vocab)

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for word in text.lower().split():
            i = 0
            while i < len(word):
                for j in range(min(len(word), i + self.longest), i, -1):
                    tok = self.vocab.get(word[i:j])
                    if tok is not None:
                        out.append(tok)
                        i = j
                        break
                else:
                    i += 1
        return out


def _text(rng: random.Random, words: int) -> str:
    return " ".join("".join(rng.choice(_ALPHABET) for _ in range(rng.randint(3, 10))) for _ in range(words))


class TextSet(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, vocab_size: int, seq: int, n: int) -> None:
        self.tok = Tokenizer(vocab_size)
        self.seq, self.n = seq, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        rng = random.Random(i)
        ids: list[int] = []
        while len(ids) < self.seq + 1:
            ids += self.tok.encode(_text(rng, self.seq // 2))
        return torch.tensor(ids[: self.seq + 1])


def batches(mode: str, vocab_size: int, seq: int, batch: int, device: torch.device,
            workers: int = 8) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """A function returning the next (inputs, targets) pair on ``device``."""
    data = TextSet(vocab_size, seq, 10**9)
    if mode == "none":
        ready = [torch.stack([data[i * batch + j] for j in range(batch)]).to(device) for i in range(4)]
        count = iter(range(10**12))
        return lambda: (lambda t: (t[:, :-1].contiguous(), t[:, 1:].contiguous()))(ready[next(count) % 4])
    if mode == "inline":
        count = iter(range(10**12))

        def inline() -> tuple[torch.Tensor, torch.Tensor]:
            k = next(count)
            t = torch.stack([data[k * batch + j] for j in range(batch)]).to(device)
            return t[:, :-1].contiguous(), t[:, 1:].contiguous()

        return inline
    loader = torch.utils.data.DataLoader(data, batch_size=batch, num_workers=workers, pin_memory=True,
                                         prefetch_factor=4, persistent_workers=True)
    it: Iterator[torch.Tensor] = iter(loader)

    def from_workers() -> tuple[torch.Tensor, torch.Tensor]:
        t = next(it).to(device, non_blocking=True)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

    return from_workers
