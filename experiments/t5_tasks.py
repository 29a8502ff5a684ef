"""Chapter 12's text-to-text demonstration over several seeds: one T5 trained on three tasks at once against three
single-task T5s that share the same total compute (each a third of the steps), against three single-task T5s with
the same compute and as many optimizer updates (all the steps, on batches a third as large), and against three
single-task T5s with as many updates on batches as large (all the steps: three times the examples of their task);
exact match per task.

    .venv/bin/python experiments/t5_tasks.py [--seeds 0 1 2] [--steps 2400] [--batch 32] [--lr 5e-3]
        [--kinds multi-task single-task "single-task, equal updates" "single-task, equal steps"]
        [--json transformer_lib/results/t5_tasks.json] [--add-to FILE] [--device cuda]

The data, model and training are Chapter 12's: numbers 0-999 in three tasks marked by a prefix (en-de, de-en,
en-num), 200 numbers held out of every task, characters as tokens, d_model 64, two encoder and two decoder
layers, AdamW at a peak of 5e-3 with 10 % warm-up and linear decay, clipping at 1; greedy decoding. The seed sets the
initial weights and the order of the batches. Chapter 12 prints the committed JSON and asserts its claims on it.
Not part of `make test` (about 20 minutes of one CPU thread for three seeds, and 27 minutes on a shared machine for
the equal-update specialists; `make experiments` runs it). --kinds runs some of the conditions only: the equal-update specialists
were added to the committed file that way, beside the earlier runs of the other two.

The equal-update specialists at the multi-task model's learning rate are not a tuned baseline (en-num's fail), so
their peak learning rate was tuned on a validation split (seed 0: 5e-3, 2.5e-3 and 1.5e-3; en-num first, then de-en
and en-de, about 16 minutes of one thread in all) and the specialists rerun at the rate with the best mean over the
three tasks (2.5e-3):

    .venv/bin/python experiments/t5_tasks.py --tune-lrs 5e-3 2.5e-3 1.5e-3 --tune-tasks en-num --seeds 0 \
        --add-to transformer_lib/results/t5_tasks.json
    .venv/bin/python experiments/t5_tasks.py --tune-lrs 5e-3 2.5e-3 1.5e-3 --tune-tasks de-en en-de --seeds 0 \
        --add-to transformer_lib/results/t5_tasks.json
    .venv/bin/python experiments/t5_tasks.py --equal-lr 2.5e-3 --add-to transformer_lib/results/t5_tasks.json

The equal-step specialists (each task alone for all --steps, on batches of --batch: the same updates and batch as the
multi-task model, three times its examples of their task) were added to the committed file afterwards, on one CPU
thread (about an hour for three seeds):

    .venv/bin/python experiments/t5_tasks.py --kinds "single-task, equal steps" \
        --add-to transformer_lib/results/t5_tasks.json

--tune-lrs trains each --tune-tasks specialist (--steps of round(--batch / 3)) on the training numbers less --valid
of them, held out by a seeded draw (disjoint from the test numbers), and scores it on those; --equal-lr trains the
three specialists on all the training numbers at that learning rate and scores them on the test numbers, like the
other conditions. Both add their runs under the key "equal_updates_lr" of the file --add-to names (appending to
what earlier invocations wrote there) and leave the rest of it as it was. A run with --json rewrites the whole file
without that key (so does `make experiments`): run these three commands after it."""

import json
import time

import torch
from record import log, seeds_parser, write_results  # experiments/record.py, beside this script

from transformer_lib.bert import IGNORE_INDEX
from transformer_lib.classifier import fit, random_batches
from transformer_lib.data import CharTokenizer, split_numbers
from transformer_lib.t5 import NUMBER_TASKS, T5, T5Config, encode_texts, number_tasks, t5_generate, t5_loss
from transformer_lib.utils import seed_everything

TASKS = NUMBER_TASKS
KINDS = ("multi-task", "single-task", "single-task, equal updates", "single-task, equal steps")


def task_data(seed: int = 0):
    """Chapter 12's examples: (train, test) lists of (input, output, task) and the character tokenizer."""
    train_numbers, _, test_numbers = split_numbers(1000, 0, 200, seed=seed)
    train, test = number_tasks(train_numbers), number_tasks(test_numbers)
    tokenizer = CharTokenizer.from_texts([text for ex in train + test for text in ex[:2]])
    return train, test, tokenizer


VALID_SEED = 1    # the draw of the validation numbers out of the training numbers


def valid_split(valid: int, seed: int = VALID_SEED):
    """(fit, valid) rows of the three tasks: valid of the training numbers, drawn with a seeded generator, are held
    out of training for choosing a learning rate (the test numbers are not touched)."""
    train_numbers, _, _ = split_numbers(1000, 0, 200, seed=0)       # task_data's training numbers
    order = torch.randperm(len(train_numbers), generator=torch.Generator().manual_seed(seed)).tolist()
    held = {train_numbers[i] for i in order[:valid]}
    return (number_tasks([n for n in train_numbers if n not in held]),
            number_tasks([n for n in train_numbers if n in held]))


def train_t5(rows, tokenizer, steps, batch_size, lr, seed, device="cpu"):
    """A Chapter 12 T5 trained on rows for steps batches of batch_size (on device)."""
    seed_everything(seed)
    config = T5Config(vocab_size=len(tokenizer), d_model=64, num_heads=4, d_ff=256, num_layers=2,
                      num_decoder_layers=2, num_buckets=16, max_distance=64, dropout=0.0,
                      pad_id=tokenizer.pad_id, eos_id=tokenizer.eos_id)
    model = T5(config).to(device)
    batches = random_batches(encode_texts(tokenizer, [ex[0] for ex in rows], tokenizer.pad_id),
                             encode_texts(tokenizer, [ex[1] for ex in rows], IGNORE_INDEX), batch_size=batch_size, seed=seed)
    fit(model, t5_loss, batches, steps, lr=lr, clip_norm=1.0, progress=False)
    return model


def exact_match(model, tokenizer, rows):
    """The fraction of rows whose greedy output equals the expected text."""
    src = encode_texts(tokenizer, [ex[0] for ex in rows], tokenizer.pad_id).to(next(model.parameters()).device)
    out = t5_generate(model, src, max_new_tokens=40).cpu()
    return sum(tokenizer.decode(row) == ex[1] for row, ex in zip(out, rows, strict=True)) / len(rows)


def make_parser():
    """The script's arguments; their defaults are what the committed results were run with."""
    parser = seeds_parser(__doc__)
    parser.add_argument("--steps", type=int, default=2400, help="the multi-task model's steps")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-3, help="the peak learning rate")
    parser.add_argument("--tune-lrs", type=float, nargs="+", default=None,
                        help="instead of --kinds: the equal-update specialists of --tune-tasks at these learning rates, "
                             "scored on --valid held-out training numbers")
    parser.add_argument("--tune-tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--valid", type=int, default=100, help="training numbers held out for --tune-lrs")
    parser.add_argument("--equal-lr", type=float, default=None,
                        help="instead of --kinds: the three equal-update specialists at this learning rate, on the test "
                             "numbers")
    parser.add_argument("--add-to", default=None,
                        help="with --tune-lrs or --equal-lr: the results file whose key equal_updates_lr gets the runs; "
                             "with --kinds: the results file whose runs the new conditions' runs join")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                        help="multi-task: the three tasks, --steps of --batch; single-task: one task, --steps // 3 of "
                             "--batch (the same examples and compute); single-task, equal updates: one task, --steps "
                             "of round(--batch / 3) (about the same examples and compute, and the same updates); "
                             "single-task, equal steps: one task, --steps of --batch (the same updates and batch: "
                             "three times the examples and compute)")
    parser.add_argument("--device", default="cpu", help="where to train (the committed runs: see each run's device)")
    return parser


def add_runs(path, **entries):
    """Under the key equal_updates_lr of the results file at path: extend its lists by the list entries (runs, sweep),
    set the others."""
    with open(path) as f:
        result = json.load(f)
    tuning = result.setdefault("equal_updates_lr", {"valid": None, "valid_seed": VALID_SEED, "sweep": [], "runs": []})
    for key, value in entries.items():
        if isinstance(tuning.get(key), list):
            tuning[key] += value
        elif value is not None:
            tuning[key] = value
    tuning["torch"], tuning["threads"] = torch.__version__, torch.get_num_threads()
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    return result


def tune(args, train, test, tokenizer):
    """The learning-rate sweep (on validation numbers) or the specialists at the chosen rate (on the test numbers)."""
    batch, runs = round(args.batch / 3), []
    if args.tune_lrs:
        fit_rows, valid_rows = valid_split(args.valid)
        plans = [(lr, task, seed) for seed in args.seeds for lr in args.tune_lrs for task in args.tune_tasks]
        rows, scored, split = fit_rows, valid_rows, "valid"
    else:
        plans = [(args.equal_lr, task, seed) for seed in args.seeds for task in TASKS]
        rows, scored, split = train, test, "test"
    for lr, task, seed in plans:
        start = time.perf_counter()
        model = train_t5([ex for ex in rows if ex[2] == task], tokenizer, args.steps, batch, lr, seed)
        accuracy = exact_match(model, tokenizer, [ex for ex in scored if ex[2] == task])
        log(runs, {"model": "single-task, equal updates", "task": task, "steps": args.steps, "batch": batch,
                   "lr": lr, "seed": seed, "split": split, "exact": accuracy,
                   "seconds": round(time.perf_counter() - start, 1)})
    if args.add_to:
        if args.tune_lrs:
            return add_runs(args.add_to, valid=args.valid, sweep=runs)
        return add_runs(args.add_to, runs=runs, lr=args.equal_lr)
    return {"script": "experiments/t5_tasks.py", "runs": runs}


def main(argv=None):
    args = make_parser().parse_args(argv)
    train, test, tokenizer = task_data()
    if args.tune_lrs or args.equal_lr:
        return tune(args, train, test, tokenizer)
    runs = []
    for seed in args.seeds:
        plans = [("multi-task", TASKS, args.steps, args.batch)]
        plans += [("single-task", (task,), args.steps // 3, args.batch) for task in TASKS]
        plans += [("single-task, equal updates", (task,), args.steps, round(args.batch / 3)) for task in TASKS]
        plans += [("single-task, equal steps", (task,), args.steps, args.batch) for task in TASKS]
        for kind, tasks, steps, batch in [plan for plan in plans if plan[0] in args.kinds]:
            start = time.perf_counter()
            model = train_t5([ex for ex in train if ex[2] in tasks], tokenizer, steps, batch, args.lr, seed,
                             args.device)
            for task in tasks:
                accuracy = exact_match(model, tokenizer, [ex for ex in test if ex[2] == task])
                log(runs, {"model": kind, "task": task, "steps": steps, "batch": batch, "seed": seed,
                           "exact": accuracy, "seconds": round(time.perf_counter() - start, 1),
                           "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"})
    if args.add_to:                  # more conditions beside the committed ones: their runs appended
        return add_kind_runs(args.add_to, runs, args.kinds)
    settings = {"steps": args.steps, "batch": args.batch, "lr": args.lr, "seeds": args.seeds, "kinds": args.kinds}
    return write_results("experiments/t5_tasks.py", settings, runs, args.json)


def add_kind_runs(path, runs, kinds):
    """Append runs (of --kinds not yet in the results file at path) to its runs and kinds; the rest stays."""
    with open(path) as f:
        result = json.load(f)
    if set(kinds) & set(result["kinds"]):
        raise SystemExit(f"{path} already holds runs of {sorted(set(kinds) & set(result['kinds']))}")
    result["runs"] += runs
    result["kinds"] += list(kinds)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
