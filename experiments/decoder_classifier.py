"""Chapter 16.4's sweep: Chapter 11's pre-trained GPT as a classifier of which standard-library package a function
comes from, tuned four ways (head only, last block + head, full, LoRA + head), and the same network trained from
scratch, over three seeds.

    .venv/bin/python experiments/decoder_classifier.py [--seeds 0 1 2] [--steps 150]
        [--json transformer_lib/results/decoder_classifier.json]

Every run uses the same data (library's split_by_file of package_functions, split seed 0: 200 training and 50 test
functions per package, no file on both sides; each function's first 64 tokens of Chapter 11's tokenizer, padded on
the right, batches of 16), AdamW at a constant learning rate with no weight decay; the seed sets the head's (and
LoRA's, or the whole scratch network's) initial weights and the order of the batches. Chapter 16 prints the
committed JSON and asserts its claims on it. About 4 minutes of one CPU thread (on a machine shared with other work)."""

import os
import time

import torch
from record import log, seeds_parser, write_results  # experiments/record.py, beside this script

from transformer_lib.assistant import (
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


def gpt_tokenizer() -> ByteBPE:
    """Chapter 11's tokenizer (the gpt recipe's), as the sft recipe ships it and Chapter 16.2 rebuilds it."""
    tokenizer = read_checkpoint(recipe_checkpoint("sft", "final.pt"))["tokenizer"]
    vocab, merges = tokenizer["vocab"], tokenizer["merges"]
    return ByteBPE(vocab, [(vocab.index(a), vocab.index(b)) for a, b in merges], ["<|endoftext|>"])


def batches(args):
    """(train batches, test batches, the data's sha256) as Chapter 16.4 builds them."""
    data = split_by_file(package_functions(), args.n_train, args.n_test, seed=0)
    tok = gpt_tokenizer()
    train = [classify_collate(data["train"][i:i + args.batch], tok, args.max_tokens)
             for i in range(0, len(data["train"]), args.batch)]
    test = [classify_collate(data["test"][i:i + 100], tok, args.max_tokens) for i in range(0, len(data["test"]), 100)]
    return train, test, data_sha256([[t.tolist() for t in b] for b in train + test])


def make_parser():
    """The script's arguments; their defaults are what the committed results were run with."""
    parser = seeds_parser(__doc__)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--n-train", type=int, default=200, help="training functions per package")
    parser.add_argument("--n-test", type=int, default=50, help="test functions per package")
    parser.add_argument("--max-tokens", type=int, default=64)
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    torch.set_num_threads(1)
    train, test, sha = batches(args)
    runs = []
    for seed in args.seeds:
        for tuning in (*TUNING, "scratch"):
            seed_everything(seed)
            pretrained = load_recipe("gpt")[0]
            body = GPT(pretrained.config) if tuning == "scratch" else pretrained
            model = prepare_tuning(DecoderClassifier(body, 4), "full" if tuning == "scratch" else tuning)
            start = time.perf_counter()
            result = train_classifier(model, train, test, args.steps, args.lr, seed)
            log(runs, {"tuning": tuning, "seed": seed, "accuracy": result["accuracy"],
                       "trainable": result["trainable"], "optimizer_bytes": result["optimizer_bytes"],
                       "step_seconds": round(result["step_seconds"], 4), "loss_first": round(result["loss"][0], 4),
                       "loss_last20": round(sum(result["loss"][-20:]) / 20, 4),
                       "seconds": round(time.perf_counter() - start, 1), "load_average": os.getloadavg()[0]})
    settings = {"steps": args.steps, "lr": args.lr, "batch": args.batch, "n_train": args.n_train,
                "n_test": args.n_test, "max_tokens": args.max_tokens, "seeds": args.seeds, "data_sha256": sha}
    return write_results("experiments/decoder_classifier.py", settings, runs, args.json)


if __name__ == "__main__":
    main()
