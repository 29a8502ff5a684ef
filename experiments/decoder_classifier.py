"""Chapter 16.4's sweep: Chapter 11's pre-trained GPT as a classifier of which standard-library package a function
comes from, tuned four ways (head only, last block + head, full, LoRA + head), the same network trained from
scratch, and a bag-of-tokens logistic regression, each with its learning rate (or C) chosen on a validation split,
on three splits of files, three seeds each.

    .venv/bin/python experiments/decoder_classifier.py [--seeds 0 1 2] [--splits 3] [--steps 150]
        [--json transformer_lib/results/decoder_classifier.json]

The data: the library's split_by_file of package_functions, files to the test side, then to the validation side,
then to training, so that no file gives functions to two sides; 200 training, 50 validation and 50 test functions
per package. A split seed whose files cannot give that many (xml/dom's minidom.py alone holds 204 of the package's
374 functions, and it must be on the training side) is skipped and recorded; the first --splits split seeds that
can are used. Each function is read as its first 64 tokens of Chapter 11's tokenizer, padded on the right, in
batches of 16. Every run: AdamW at a constant learning rate, no weight decay, --steps steps; the seed sets the
head's (and LoRA's, or the whole scratch network's) initial weights and the order of the batches.

The choice, on each split separately: every setting trains with seed --seeds[0] at each learning rate of its grid
(LR_GRID: four values around the 3e-3 of the first version, lower for full and scratch training, which move every
weight; the head's grid first ran from 3e-3 to 1e-1 and was moved down when its lowest rate won on the first
split's validation functions); the rate with the highest validation accuracy wins (ties: the lower validation
loss). While the winner is the smallest or the largest rate tried, the next rate beyond it (a factor of about 3)
is tried too, at most --extend times. The other seeds then train at the chosen rate, and the test accuracy of all
three is reported. The test functions play no part in the choice. The logistic regression on which tokens occur
gets its C the same way (C_GRID), on the same validation functions. Chapter 16 prints the committed JSON and
asserts its claims on it. The JSON records the time it took (wall clock and CPU time of its one thread, on a
machine shared with other work)."""

import math
import os
import time

import torch
from record import log, seeds_parser, write_results  # experiments/record.py, beside this script

from transformer_lib.assistant import (
    PACKAGES,
    TUNING,
    ByteBPE,
    DecoderClassifier,
    classify_collate,
    package_functions,
    prepare_tuning,
    split_by_file,
    train_classifier,
)
from transformer_lib.gpt import GPT
from transformer_lib.training import data_sha256, load_recipe, read_checkpoint, recipe_checkpoint
from transformer_lib.utils import seed_everything

SETTINGS = (*TUNING, "scratch")
LR_GRID = {"head only": (1e-3, 3e-3, 1e-2, 3e-2), "last block + head": (3e-4, 1e-3, 3e-3, 1e-2),
           "full": (1e-4, 3e-4, 1e-3, 3e-3), "LoRA + head": (1e-3, 3e-3, 1e-2, 3e-2),
           "scratch": (1e-4, 3e-4, 1e-3, 3e-3)}
C_GRID = (0.1, 0.3, 1.0, 3.0, 10.0)          # scikit-learn's default is C = 1


def gpt_tokenizer() -> ByteBPE:
    """Chapter 11's tokenizer (the gpt recipe's), as the sft recipe ships it and Chapter 16.2 rebuilds it."""
    tokenizer = read_checkpoint(recipe_checkpoint("sft", "final.pt"))["tokenizer"]
    vocab, merges = tokenizer["vocab"], tokenizer["merges"]
    return ByteBPE(vocab, [(vocab.index(a), vocab.index(b)) for a, b in merges], ["<|endoftext|>"])


def choose_splits(functions, count, n_train, n_val, n_test):
    """([(split seed, data)] for the first count split seeds that split_by_file can serve, [the skipped seeds])."""
    chosen, skipped, seed = [], [], 0
    while len(chosen) < count:
        try:
            chosen.append((seed, split_by_file(functions, n_train, n_test, seed=seed, n_val=n_val)))
        except ValueError:
            skipped.append(seed)
        seed += 1
    return chosen, skipped


def batches(data, tok, batch, max_tokens):
    """(train batches of `batch` rows, validation and test batches of 100, the data's sha256) as Chapter 16.4
    builds them."""
    def cut(examples, size):
        return [classify_collate(examples[i:i + size], tok, max_tokens) for i in range(0, len(examples), size)]
    train, val, test = cut(data["train"], batch), cut(data["val"], 100), cut(data["test"], 100)
    return train, val, test, data_sha256([[t.tolist() for t in b] for b in train + val + test])


def side_files(functions, examples):
    """{package: sorted names of the files that examples' functions come from}."""
    found = {package: set() for package in functions}
    for text, label in examples:
        package = list(functions)[label]
        found[package] |= {name for name, texts in functions[package].items() if text in texts}
    return {package: sorted(names) for package, names in found.items()}


def evaluate(model, batches) -> tuple:
    """(accuracy, mean cross-entropy) of model's logits over batches of (tokens, lengths, labels)."""
    right = total = 0
    loss = 0.0
    with torch.no_grad():
        for tokens, lengths, labels in batches:
            logits = model(tokens, lengths)
            right += int((logits.argmax(-1) == labels).sum())
            loss += float(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
            total += len(labels)
    return right / total, loss / total


def half_decade(lr: float, step: int) -> float:
    """The rate step half-decades from lr on the grid's scale 1, 3, 10, 30, ... (1e-3, -1 -> 3e-4; 3e-4, -1 -> 1e-4)."""
    return float(f"{10 ** ((round(2 * math.log10(lr)) + step) / 2):.0e}")


def one_run(tuning, seed, lr, split_seed, train, val, test, steps):
    """Train one setting at one rate and seed; its record (test accuracy as "accuracy")."""
    seed_everything(seed)
    pretrained = load_recipe("gpt")[0]
    body = GPT(pretrained.config) if tuning == "scratch" else pretrained
    model = prepare_tuning(DecoderClassifier(body, len(PACKAGES)), "full" if tuning == "scratch" else tuning)
    start = time.perf_counter()
    result = train_classifier(model, train, test, steps, lr, seed)
    val_accuracy, val_loss = evaluate(model, val)
    return {"split_seed": split_seed, "tuning": tuning, "seed": seed, "lr": lr, "val_accuracy": val_accuracy,
            "val_loss": round(val_loss, 4), "accuracy": result["accuracy"], "trainable": result["trainable"],
            "optimizer_bytes": result["optimizer_bytes"], "step_seconds": round(result["step_seconds"], 4),
            "loss_first": round(result["loss"][0], 4), "loss_last20": round(sum(result["loss"][-20:]) / 20, 4),
            "seconds": round(time.perf_counter() - start, 1), "load_average": os.getloadavg()[0]}


def token_presence(examples, tok, max_tokens):
    """(X: one row per example, 1 where a token of the vocabulary occurs in its first max_tokens tokens, labels)."""
    X = torch.zeros(len(examples), len(tok))
    for row, (text, _) in enumerate(examples):
        X[row, tok.encode(text)[:max_tokens]] = 1.0
    return X.numpy(), [label for _, label in examples]


def bag_of_tokens(data, tok, max_tokens):
    """The logistic regression on which tokens occur, its C chosen on the validation side: its record."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss
    start = time.perf_counter()
    (X_train, y_train), (X_val, y_val), (X_test, y_test) = (token_presence(data[side], tok, max_tokens)
                                                            for side in ("train", "val", "test"))
    grid = []
    for C in C_GRID:
        fit = LogisticRegression(C=C, max_iter=5000).fit(X_train, y_train)
        grid.append({"C": C, "val_accuracy": fit.score(X_val, y_val),
                     "val_loss": round(log_loss(y_val, fit.predict_proba(X_val)), 4)})
    best = max(grid, key=lambda g: (g["val_accuracy"], -g["val_loss"]))
    fit = LogisticRegression(C=best["C"], max_iter=5000).fit(X_train, y_train)
    return {"grid": grid, "C": best["C"], "accuracy": fit.score(X_test, y_test),
            "seconds": round(time.perf_counter() - start, 1)}


def make_parser():
    """The script's arguments; their defaults are what the committed results were run with."""
    parser = seeds_parser(__doc__)
    parser.add_argument("--splits", type=int, default=3, help="how many splits of files")
    parser.add_argument("--extend", type=int, default=2,
                        help="at most this many rates tried beyond an end of a setting's grid, while the best is there")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--n-train", type=int, default=200, help="training functions per package")
    parser.add_argument("--n-val", type=int, default=50, help="validation functions per package")
    parser.add_argument("--n-test", type=int, default=50, help="test functions per package")
    parser.add_argument("--max-tokens", type=int, default=64)
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    torch.set_num_threads(1)
    start, cpu = time.perf_counter(), time.process_time()
    functions, tok = package_functions(), gpt_tokenizer()
    chosen_splits, skipped = choose_splits(functions, args.splits, args.n_train, args.n_val, args.n_test)
    splits, grid, runs = [], [], []
    for split_seed, data in chosen_splits:
        train, val, test, sha = batches(data, tok, args.batch, args.max_tokens)
        bag = bag_of_tokens(data, tok, args.max_tokens)
        print(f"split {split_seed}: bag of tokens {bag}", flush=True)
        chosen_lr = {}
        for tuning in SETTINGS:
            tried = []
            for lr in LR_GRID[tuning]:
                log(grid, one_run(tuning, args.seeds[0], lr, split_seed, train, val, test, args.steps))
                tried.append(grid[-1])
            best = max(tried, key=lambda r: (r["val_accuracy"], -r["val_loss"]))
            for _ in range(args.extend):       # the best at an end of the rates tried: try the next one beyond it
                rates = sorted(r["lr"] for r in tried)
                if best["lr"] not in (rates[0], rates[-1]):
                    break
                lr = half_decade(best["lr"], -1 if best["lr"] == rates[0] else 1)
                run = one_run(tuning, args.seeds[0], lr, split_seed, train, val, test, args.steps)
                log(grid, run | {"extended": True})
                tried.append(grid[-1])
                best = max(tried, key=lambda r: (r["val_accuracy"], -r["val_loss"]))
            chosen_lr[tuning] = best["lr"]
            runs.append(best)
            for seed in args.seeds[1:]:
                log(runs, one_run(tuning, seed, best["lr"], split_seed, train, val, test, args.steps))
        splits.append({"split_seed": split_seed, "data_sha256": sha, "val_files": side_files(functions, data["val"]),
                       "test_files": side_files(functions, data["test"]), "chosen_lr": chosen_lr,
                       "bag_of_tokens": bag})
    settings = {"steps": args.steps, "batch": args.batch, "n_train": args.n_train, "n_val": args.n_val,
                "n_test": args.n_test, "max_tokens": args.max_tokens, "seeds": args.seeds,
                "lr_grid": LR_GRID, "extend": args.extend, "C_grid": C_GRID, "skipped_split_seeds": skipped, "splits": splits,
                "grid": grid, "seconds": round(time.perf_counter() - start),
                "cpu_seconds": round(time.process_time() - cpu)}
    return write_results("experiments/decoder_classifier.py", settings, runs, args.json)


if __name__ == "__main__":
    main()
