"""Chapter 12's text-to-text demonstration over several seeds: one T5 trained on three tasks at once against three
single-task T5s that share the same total compute (each a third of the steps), and against three single-task T5s
with the same compute and as many optimizer updates (all the steps, on batches a third as large); exact match per
task.

    .venv/bin/python experiments/t5_tasks.py [--seeds 0 1 2] [--steps 2400] [--batch 32] [--lr 5e-3]
        [--kinds multi-task single-task "single-task, equal updates"] [--json experiments/results/t5_tasks.json]

The data, model and training are Chapter 12's: numbers 0-999 in three tasks marked by a prefix (en-de, de-en,
en-num), 200 numbers held out of every task, characters as tokens, d_model 64, two encoder and two decoder
layers, AdamW at a peak of 5e-3 with 10 % warm-up and linear decay, clipping at 1; greedy decoding. The seed sets the
initial weights and the order of the batches. Chapter 12 prints the committed JSON and asserts its claims on it.
Not part of `make test` (about 20 minutes of one CPU thread for three seeds, and 27 minutes on a shared machine for
the equal-update specialists; `make experiments` runs it). --kinds runs some of the conditions only: the equal-update specialists
were added to the committed file that way, beside the earlier runs of the other two."""

import time

from record import log, seeds_parser, write_results  # experiments/record.py, beside this script

from transformer_lib.bert import IGNORE_INDEX
from transformer_lib.classifier import fit, random_batches
from transformer_lib.data import CharTokenizer, split_numbers
from transformer_lib.t5 import NUMBER_TASKS, T5, T5Config, encode_texts, number_tasks, t5_generate, t5_loss
from transformer_lib.utils import seed_everything

TASKS = NUMBER_TASKS
KINDS = ("multi-task", "single-task", "single-task, equal updates")


def task_data(seed: int = 0):
    """Chapter 12's examples: (train, test) lists of (input, output, task) and the character tokenizer."""
    train_numbers, _, test_numbers = split_numbers(1000, 0, 200, seed=seed)
    train, test = number_tasks(train_numbers), number_tasks(test_numbers)
    tokenizer = CharTokenizer.from_texts([text for ex in train + test for text in ex[:2]])
    return train, test, tokenizer


def train_t5(rows, tokenizer, steps, batch_size, lr, seed):
    """A Chapter 12 T5 trained on rows for steps batches of batch_size."""
    seed_everything(seed)
    config = T5Config(vocab_size=len(tokenizer), d_model=64, num_heads=4, d_ff=256, num_layers=2,
                      num_decoder_layers=2, num_buckets=16, max_distance=64, dropout=0.0,
                      pad_id=tokenizer.pad_id, eos_id=tokenizer.eos_id)
    model = T5(config)
    batches = random_batches(encode_texts(tokenizer, [ex[0] for ex in rows], tokenizer.pad_id),
                             encode_texts(tokenizer, [ex[1] for ex in rows], IGNORE_INDEX), batch_size=batch_size, seed=seed)
    fit(model, t5_loss, batches, steps, lr=lr, clip_norm=1.0, progress=False)
    return model


def exact_match(model, tokenizer, rows):
    """The fraction of rows whose greedy output equals the expected text."""
    out = t5_generate(model, encode_texts(tokenizer, [ex[0] for ex in rows], tokenizer.pad_id), max_new_tokens=40)
    return sum(tokenizer.decode(row) == ex[1] for row, ex in zip(out, rows, strict=True)) / len(rows)


def make_parser():
    """The script's arguments; their defaults are what the committed results were run with."""
    parser = seeds_parser(__doc__)
    parser.add_argument("--steps", type=int, default=2400, help="the multi-task model's steps")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-3, help="the peak learning rate")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                        help="multi-task: the three tasks, --steps of --batch; single-task: one task, --steps // 3 of "
                             "--batch (the same examples and compute); single-task, equal updates: one task, --steps "
                             "of round(--batch / 3) (about the same examples and compute, and the same updates)")
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    train, test, tokenizer = task_data()
    runs = []
    for seed in args.seeds:
        plans = [("multi-task", TASKS, args.steps, args.batch)]
        plans += [("single-task", (task,), args.steps // 3, args.batch) for task in TASKS]
        plans += [("single-task, equal updates", (task,), args.steps, round(args.batch / 3)) for task in TASKS]
        for kind, tasks, steps, batch in [plan for plan in plans if plan[0] in args.kinds]:
            start = time.perf_counter()
            model = train_t5([ex for ex in train if ex[2] in tasks], tokenizer, steps, batch, args.lr, seed)
            for task in tasks:
                accuracy = exact_match(model, tokenizer, [ex for ex in test if ex[2] == task])
                log(runs, {"model": kind, "task": task, "steps": steps, "batch": batch, "seed": seed,
                           "exact": accuracy, "seconds": round(time.perf_counter() - start, 1)})
    settings = {"steps": args.steps, "batch": args.batch, "lr": args.lr, "seeds": args.seeds, "kinds": args.kinds}
    return write_results("experiments/t5_tasks.py", settings, runs, args.json)


if __name__ == "__main__":
    main()
