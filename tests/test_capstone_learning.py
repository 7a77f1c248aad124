"""chapters/capstone: what chapter 10's section 10 measures learning with (evaluate.py) and its LR schedule."""
import dataclasses
import math
import pathlib
import sys

import pytest
import torch

CHAPTERS = pathlib.Path(__file__).resolve().parents[1] / "chapters"
if str(CHAPTERS) not in sys.path:   # train_gpt imports its siblings as `capstone.*`, as the chapter and torchrun do
    sys.path.insert(0, str(CHAPTERS))

from capstone.evaluate import (  # noqa: E402
    ALPHAS,
    corpus_words,
    held_out_loss,
    ngram_loss,
    ngram_losses,
    real_word_fraction,
    split_corpus,
)
from capstone.model import GPT, GPTConfig  # noqa: E402
from capstone.train_gpt import TrainConfig, learning_rate  # noqa: E402

V = 3
TRAIN = torch.tensor([0, 1, 0, 1, 0, 2, 0, 1])
HELD = torch.tensor([0, 1, 2, 0])


def test_split_keeps_the_tail_apart():
    data = torch.arange(20)
    train, held = split_corpus(data, held_out=0.25)
    assert torch.equal(train, data[:15]) and torch.equal(held, data[15:])


def test_ngram_losses_are_the_counted_frequencies_by_hand():
    # unigram: counts 0:4, 1:3, 2:1 of 8. Bigram, over the 7 pairs: after 0, 1 three times and 2 once; after 1,
    # 0 twice (the last 1 has no successor); after 2, 0 once.
    alpha = 0.5
    unigram = [(c + alpha) / (8 + alpha * V) for c in (4, 3, 1)]
    assert ngram_loss(TRAIN, HELD, V, 1, alpha) == pytest.approx(-sum(math.log(unigram[c]) for c in HELD) / 4)
    p01, p12, p20 = (3 + alpha) / (4 + alpha * V), (0 + alpha) / (2 + alpha * V), (1 + alpha) / (1 + alpha * V)
    assert ngram_loss(TRAIN, HELD, V, 2, alpha) == pytest.approx(-(math.log(p01) + math.log(p12) + math.log(p20)) / 3)


def test_every_baseline_predicts_the_same_characters_with_its_best_smoothing():
    losses = ngram_losses(TRAIN, HELD, V)
    assert list(losses) == ["uniform", "unigram", "bigram", "trigram"]
    assert losses["uniform"] == pytest.approx(math.log(V))
    # each predicts HELD[2:], the characters that have two before them: the unigram reads HELD[2:], the bigram HELD[1:]
    for n, name, held in ((1, "unigram", HELD[2:]), (2, "bigram", HELD[1:]), (3, "trigram", HELD)):
        assert losses[name] == min(ngram_loss(TRAIN, held, V, n, alpha) for alpha in ALPHAS), name


def test_held_out_loss_is_the_mean_cross_entropy_of_whole_windows():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=V, block_size=4, n_layer=1, n_head=1, n_embd=8))
    held = torch.randint(V, (10,))                       # two windows of 4, plus the last targets; one left over
    _, expected = gpt(held[:8].view(2, 4), held[1:9].view(2, 4))
    assert held_out_loss(gpt, held) == pytest.approx(expected.item())
    with pytest.raises(ValueError, match="fewer than one window of 5: hold out more"):
        held_out_loss(gpt, held[:4])


def test_real_words_are_runs_of_letters_found_in_the_corpus():
    words = corpus_words("Every rank's gradient, all-reduced.")
    assert words == {"every", "rank", "s", "gradient", "all", "reduced"}
    assert real_word_fraction("Gradient xq rank a zzz", words) == (0.5, 4)   # "a": under two letters, not counted


def test_bad_split_says_what_to_pass():
    with pytest.raises(ValueError, match="held_out=1.5: keep a fraction"):
        split_corpus(torch.arange(10), held_out=1.5)


def test_schedule_warms_up_then_decays_to_a_tenth_and_defaults_to_constant():
    cfg = TrainConfig(steps=100, lr=1e-2, warmup=10, decay_to=0.1)
    rates = [learning_rate(cfg, step) for step in range(cfg.steps)]
    assert rates[:10] == pytest.approx([1e-3 * (s + 1) for s in range(10)])
    assert rates[10] == pytest.approx(1e-2) and rates[-1] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(rates[10:], rates[11:])), "decays monotonically after the warmup"
    constant = dataclasses.replace(cfg, warmup=0, decay_to=1.0)
    assert {learning_rate(constant, step) for step in range(cfg.steps)} == {1e-2}   # exactly the LR, every step
