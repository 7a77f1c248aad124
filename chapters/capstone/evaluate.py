"""Did the GPT learn? Its loss on held-out text against n-gram baselines, and the words it writes.

    train_data, held_out = split_corpus(data)                 # the last 10 % of the text is never trained on
    baselines = ngram_losses(train_data, held_out, vocab_size)  # {"uniform": ln V, "unigram": ..., ...}
    held_out_loss(gpt, held_out)                              # the GPT's mean cross-entropy on the held-out text
    real_word_fraction(text, corpus_words(train_text))        # how many of the words it wrote the corpus has

All losses are mean cross-entropies in nats per character, the unit of the training loss. An n-gram model predicts
a character from the n - 1 before it by counting in the training text: (count(context, c) + alpha) /
(count(context) + alpha V), with add-alpha smoothing so that a pair never seen costs a finite loss.
"""
import math
import re

import torch
import torch.nn.functional as F

ALPHAS = (0.01, 0.1, 1.0)   # smoothing tried for each n-gram model; the best on the held-out text is kept
WORD = re.compile(r"[a-z]+")


def split_corpus(data, held_out=0.1):
    """(train, held_out): the first 1 - held_out of the character ids, and the rest (a contiguous tail)."""
    if not 0 < held_out < 1:
        raise ValueError(f"held_out={held_out}: keep a fraction of the text between 0 and 1 apart, e.g. 0.1")
    cut = int(len(data) * (1 - held_out))
    return data[:cut], data[cut:]


def ngram_loss(train, held_out, vocab_size, n, alpha):
    """Mean cross-entropy on held_out[n-1:] of the add-alpha n-gram model counted on train (n = 1, 2, 3)."""
    index = lambda d, k: sum(d[i:len(d) - k + 1 + i] * vocab_size ** (k - 1 - i) for i in range(k))  # noqa: E731
    full = torch.bincount(index(train, n), minlength=vocab_size ** n).double()            # count(context, c)
    context = full.view(-1, vocab_size).sum(1)                                            # count(context)
    held = index(held_out, n)
    p = (full[held] + alpha) / (context[held // vocab_size] + alpha * vocab_size)
    return -p.log().mean().item()


def ngram_losses(train, held_out, vocab_size):
    """{"uniform": ln V, "unigram", "bigram", "trigram"}: each n-gram model with its best smoothing in ALPHAS."""
    losses = {"uniform": math.log(vocab_size)}
    for n, name in ((1, "unigram"), (2, "bigram"), (3, "trigram")):
        losses[name] = min(ngram_loss(train, held_out[3 - n:], vocab_size, n, a) for a in ALPHAS)
    return losses


@torch.no_grad()
def held_out_loss(model, held_out):
    """The GPT's mean cross-entropy on held_out, read in windows of block_size characters, as in training."""
    T = model.config.block_size
    windows = (len(held_out) - 1) // T
    if windows == 0:
        raise ValueError(f"{len(held_out)} held-out characters, fewer than one window of {T + 1}: hold out more")
    x = held_out[:windows * T].view(windows, T)                   # (windows, T)
    y = held_out[1:windows * T + 1].view(windows, T)              # the next characters
    logits, _ = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)).item()


def corpus_words(text):
    """The set of words of text: runs of letters, lower-cased."""
    return set(WORD.findall(text.lower()))


def real_word_fraction(text, words, min_letters=2):
    """(fraction, count): of the words of text with at least min_letters letters, the fraction found in `words`."""
    written = [w for w in WORD.findall(text.lower()) if len(w) >= min_letters]
    return sum(w in words for w in written) / max(1, len(written)), len(written)
