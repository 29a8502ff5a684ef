"""Chapter 12's text-to-text demonstration over several seeds: one T5 trained on three tasks at once against three
single-task T5s that share the same total compute (each a third of the steps), exact match per task.

    .venv/bin/python experiments/t5_tasks.py [--seeds 0 1 2] [--steps 2400] [--batch 32] [--lr 5e-3]
        [--json experiments/results/t5_tasks.json]

The data, model and training are Chapter 12's: numbers 0-999 in three tasks marked by a prefix (en-de, de-en,
en-num), 200 numbers held out of every task, characters as tokens, d_model 64, two encoder and two decoder
layers, AdamW at a peak of 5e-3 with 10 % warm-up and linear decay, clipping at 1; greedy decoding. The seed sets the
initial weights and the order of the batches. Chapter 12 prints the committed JSON and asserts its claims on it.
Not part of `make test` (about 20 minutes of one CPU thread for three seeds; `make experiments` runs it)."""

import argparse
import time

import torch
from record import log, write_results  # experiments/record.py, beside this script

from transformer_lib.bert import IGNORE_INDEX, token_cross_entropy
from transformer_lib.classifier import fit, random_batches
from transformer_lib.data import CharTokenizer, number_pairs, split_numbers
from transformer_lib.t5 import T5, T5Config, shift_right, t5_generate
from transformer_lib.utils import seed_everything

TASKS = ("en-de", "de-en", "en-num")


def number_tasks(seed: int = 0):
    """Chapter 12's examples: (train, test) lists of (input, output, task) and the character tokenizer."""
    train_numbers, _, test_numbers = split_numbers(1000, 0, 200, seed=seed)
    words = dict(zip(range(1000), number_pairs(range(1000), "en", "de"), strict=True))

    def examples(numbers):
        out = []
        for n in numbers:
            en, de = words[n]
            out += [(f"en-de: {en}", de, "en-de"), (f"de-en: {de}", en, "de-en"), (f"en-num: {en}", str(n), "en-num")]
        return out

    train, test = examples(train_numbers), examples(test_numbers)
    tokenizer = CharTokenizer.from_texts([text for ex in train + test for text in ex[:2]])
    return train, test, tokenizer


def encode(tokenizer, rows, column, pad):
    """One column of rows as a padded (len(rows), longest + 1) id tensor, each row ending in eos."""
    ids = [tokenizer.encode(row[column], eos=True) for row in rows]
    width = max(map(len, ids))
    return torch.tensor([row + [pad] * (width - len(row)) for row in ids])


def t5_loss(model, batch):
    src, labels = batch
    return token_cross_entropy(model(src, shift_right(labels)), labels)


def train_t5(rows, tokenizer, steps, batch_size, lr, seed):
    """A Chapter 12 T5 trained on rows for steps batches of batch_size."""
    seed_everything(seed)
    config = T5Config(vocab_size=len(tokenizer), d_model=64, num_heads=4, d_ff=256, num_layers=2,
                      num_decoder_layers=2, num_buckets=16, max_distance=64, dropout=0.0,
                      pad_id=tokenizer.pad_id, eos_id=tokenizer.eos_id)
    model = T5(config)
    batches = random_batches(encode(tokenizer, rows, 0, tokenizer.pad_id), encode(tokenizer, rows, 1, IGNORE_INDEX),
                             batch_size=batch_size, seed=seed)
    fit(model, t5_loss, batches, steps, lr=lr, clip_norm=1.0, progress=False)
    return model


def exact_match(model, tokenizer, rows):
    """The fraction of rows whose greedy output equals the expected text."""
    out = t5_generate(model, encode(tokenizer, rows, 0, tokenizer.pad_id), max_new_tokens=40)
    return sum(tokenizer.decode(row) == ex[1] for row, ex in zip(out, rows, strict=True)) / len(rows)


def make_parser():
    """The script's arguments; their defaults are what the committed results were run with."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=2400, help="the multi-task model's steps")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-3, help="the peak learning rate")
    parser.add_argument("--json", default=None, help="write the results here")
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    train, test, tokenizer = number_tasks()
    runs = []
    for seed in args.seeds:
        plans = [("multi-task", TASKS, args.steps)] + [("single-task", (task,), args.steps // 3) for task in TASKS]
        for kind, tasks, steps in plans:
            start = time.perf_counter()
            model = train_t5([ex for ex in train if ex[2] in tasks], tokenizer, steps, args.batch, args.lr, seed)
            for task in tasks:
                accuracy = exact_match(model, tokenizer, [ex for ex in test if ex[2] == task])
                log(runs, {"model": kind, "task": task, "steps": steps, "seed": seed, "exact": accuracy,
                           "seconds": round(time.perf_counter() - start, 1)})
    settings = {"steps": args.steps, "batch": args.batch, "lr": args.lr, "seeds": args.seeds}
    return write_results("experiments/t5_tasks.py", settings, runs, args.json)


if __name__ == "__main__":
    main()
