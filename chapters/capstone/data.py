"""The shipped corpus as character ids, and each rank's rows of a step's global batch."""
import pathlib

import torch

CORPUS = pathlib.Path(__file__).resolve().with_name("corpus.txt")


class CharTokenizer:
    """Character-level: the vocabulary is the sorted set of characters of the text."""

    def __init__(self, text):
        self.chars = sorted(set(text))
        self.index = {ch: i for i, ch in enumerate(self.chars)}

    @property
    def vocab_size(self):
        return len(self.chars)

    def encode(self, text):
        return torch.tensor([self.index[ch] for ch in text], dtype=torch.long)

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)


def load_corpus(path=CORPUS):
    """(tokenizer, data): data is the whole text as a 1-D int64 tensor of character ids."""
    text = pathlib.Path(path).read_text(encoding="utf-8")
    tokenizer = CharTokenizer(text)
    return tokenizer, tokenizer.encode(text)


def get_batch(data, rank, world_size, step, batch_size, block_size, seed):
    """This rank's rows of step `step`'s global batch: x, y of shape (batch_size, block_size), int64.

    Every rank draws the same world_size * batch_size window offsets from a generator seeded with
    (seed, step), without talking to the others, and keeps rows rank * batch_size ... (rank + 1) * batch_size - 1.
    So the ranks read different windows, and together exactly the global batch one process would read.
    y is x shifted by one character: the target at every position is the next character.
    """
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    offsets = torch.randint(len(data) - block_size, (world_size * batch_size,), generator=generator)
    mine = offsets[rank * batch_size:(rank + 1) * batch_size]                  # (batch_size,)
    x = torch.stack([data[o:o + block_size] for o in mine.tolist()])          # (batch_size, block_size)
    y = torch.stack([data[o + 1:o + 1 + block_size] for o in mine.tolist()])  # the next characters
    return x, y
