"""A word-level LSTM language model, shaped like pytorch/examples' word_language_model/main.py,
adapted to the worker SDK: it survives being killed mid-epoch and resumes bit for bit.

Self-contained: the corpus is generated here (a small seeded Markov chain over a few dozen
words), so nothing is downloaded. Run it through the reconciler, or by hand with a run folder:

    RECONCILER_RUN_URI=/tmp/lm-run python examples/word_language_model.py --epochs 3

Kill it (kill -9) and start it again: it restores the weights, the learning rate, the best
validation loss, the LSTM's hidden state and the batch position, and goes on from the last
checkpoint (every RECONCILER_CHECKPOINT_EVERY steps, or at the interval the SDK chooses). The lines marked
"# SDK" are the whole adaptation (see "Fitting a training loop" in README.md).
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections.abc import Sequence

import torch
from torch import nn

from reconciler.worker import open_run  # SDK

WORDS = ("the a one my your this that cat dog bird fish tree river hill house road child farmer "
         "sees likes finds follows wants keeps near under over beside quickly slowly often never "
         "and but then so because while . ,").split()


def generate_text(n_words: int, seed: int) -> list[str]:
    """A seeded stream of words in which each word favours a few followers (something to learn;
    the followers are the same in every split, the streams differ)."""
    language = random.Random(0)
    followers = {w: language.sample(WORDS, 5) for w in WORDS}
    rng = random.Random(seed)
    word, out = "the", []
    for _ in range(n_words):
        word = rng.choice(followers[word]) if rng.random() < 0.85 else rng.choice(WORDS)
        out.append(word)
    return out


class Corpus:
    """Word ids for a training and a validation split of the generated text."""

    def __init__(self, n_words: int, seed: int) -> None:
        self.index = {w: i for i, w in enumerate(WORDS)}
        self.train = self.tokenize(generate_text(n_words, seed))
        self.valid = self.tokenize(generate_text(n_words // 5, seed + 1))

    def tokenize(self, words: list[str]) -> torch.Tensor:
        return torch.tensor([self.index[w] for w in words], dtype=torch.long)


def batchify(data: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Cut the token stream into `batch_size` columns (the remainder is dropped)."""
    rows = data.size(0) // batch_size
    return data[: rows * batch_size].view(batch_size, -1).t().contiguous()


def get_batch(source: torch.Tensor, i: int, bptt: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].reshape(-1)


class RNNModel(nn.Module):
    """Embedding, LSTM and a linear decoder, with dropout between them."""

    def __init__(self, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid, self.nlayers = nhid, nlayers

    def forward(self, x: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, tuple]:
        output, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.decoder.out_features)
        return torch.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        zeros = torch.zeros(self.nlayers, batch_size, self.nhid)
        return zeros, zeros.clone()


def repackage_hidden(h: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Cut the graph between batches: the hidden state goes on, its history does not."""
    return tuple(v.detach() for v in h)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="word-level LSTM language model on a generated corpus")
    p.add_argument("--words", type=int, default=6000, help="training corpus size in words")
    p.add_argument("--emsize", type=int, default=32)
    p.add_argument("--nhid", type=int, default=32)
    p.add_argument("--nlayers", type=int, default=2)
    p.add_argument("--lr", type=float, default=20.0)
    p.add_argument("--clip", type=float, default=0.25)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch_size", type=int, default=20)
    p.add_argument("--bptt", type=int, default=35)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=1111)
    p.add_argument("--log-interval", type=int, default=4)
    p.add_argument("--save", default="model.pt", help="where the best model's state_dict is written")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    torch.manual_seed(args.seed)
    corpus = Corpus(args.words, args.seed)
    train_data = batchify(corpus.train, args.batch_size)
    val_data = batchify(corpus.valid, 10)
    model = RNNModel(len(WORDS), args.emsize, args.nhid, args.nlayers, args.dropout)
    criterion = nn.NLLLoss()

    def train_batch(i: int, hidden: tuple, lr: float) -> tuple[float, tuple]:
        model.train()
        data, targets = get_batch(train_data, i, args.bptt)
        hidden = repackage_hidden(hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for p in model.parameters():
            if p.grad is not None:
                p.data.add_(p.grad, alpha=-lr)
        return loss.item(), hidden

    def evaluate(source: torch.Tensor) -> float:
        model.eval()
        total, hidden = 0.0, model.init_hidden(source.size(1))
        with torch.no_grad():
            for i in range(0, source.size(0) - 1, args.bptt):
                data, targets = get_batch(source, i, args.bptt)
                output, hidden = model(data, hidden)
                total += len(data) * criterion(output, targets).item()
        return total / (len(source) - 1)

    lr, best_val_loss = args.lr, None
    positions = range(0, train_data.size(0) - 1, args.bptt)
    run = open_run()  # SDK
    epoch_start_time = time.time()
    for epoch in run.epochs(args.epochs, model=model):  # SDK
        lr, best_val_loss = run.carry(lr=lr, best_val_loss=best_val_loss)  # SDK
        hidden = model.init_hidden(args.batch_size)
        for batch, i in run.enumerate(positions, carry=lambda: hidden):  # SDK
            loss, hidden = train_batch(i, hidden, lr)
            if batch % args.log_interval == 0 and batch > 0:
                print(f"| epoch {epoch + 1:3d} | {batch:3d}/{len(positions):3d} batches | lr {lr:5.2f} "
                      f"| loss {loss:5.2f} | ppl {math.exp(loss):8.2f}", flush=True)
        val_loss = evaluate(val_data)
        print(f"| end of epoch {epoch + 1:3d} | time: {time.time() - epoch_start_time:5.2f}s "
              f"| valid loss {val_loss:5.2f} | valid ppl {math.exp(val_loss):8.2f}", flush=True)
        epoch_start_time = time.time()
        if best_val_loss is None or val_loss < best_val_loss:
            torch.save(model.state_dict(), args.save)
            best_val_loss = val_loss
        else:
            lr /= 4.0  # anneal when validation stops improving
    run.complete(loss=best_val_loss)  # SDK


if __name__ == "__main__":
    main()
