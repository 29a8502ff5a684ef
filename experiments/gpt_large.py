"""Chapter 11's GPT with what a GPU buys: a larger model, more tokens, and more of the standard library to read.

    .venv/bin/python experiments/gpt_large.py --save-data FILE          # the data, on the book's Python (3.11)
    python experiments/gpt_large.py --data FILE --device cuda --arm NAME --seed S --out DIR
    .venv/bin/python experiments/gpt_large.py --assemble DIR --arm NAME  # the chosen run -> the committed files

The model is Chapter 11's `GPT` (GPT-2's block), d_model 192, 6 blocks, 6 heads, d_ff 768, a context of 256 tokens,
Chapter 11's byte-level BPE of 1,024 tokens; the training is Chapter 11's (`fit`: AdamW, beta_2 0.95, weight decay 0.1,
5 % warm-up and linear decay, clipping at 1) on random windows, batch 64, float32 (no TF32). The arms differ in what
they read and in dropout:

    chapter  Chapter 11's 59 training modules (0.90 million tokens), as the chapter's small GPT
    more     those and every other module of the standard library (`more_modules`: no tests, no held-out or
             validation module), about 3.8 times the bytes

Every arm is scored on the 12 validation modules (`more_modules`'s, in neither training set: the arm and its settings
are chosen on them) and on Chapter 11's 10 held-out modules (reported, never chosen on). At every evaluation the run
also measures, on the GPU: the held-out bits per byte; the copy test of Chapter 11 (128 held-out passages of 32 tokens
read twice: bits per token on each copy after its first token); the induction and previous-token scores of every head
on those sequences; and the parse rate of 200 functions sampled from "def " (temperature 0.8 and 0.5, top-p 0.95, 120
new tokens, cut with `function_text`, `ast.parse`). At the end: the copy test with each of the three heads of highest
induction score ablated, the three together, and the three of lowest score together (a control); and the held-out
bits per byte of the weights rounded to float16, as they are stored.

The data are the standard library of the Python that makes them: --save-data writes them on the book's Python so that
a machine with another Python trains on the same ids (--data). Not part of `make test`: minutes on a GPU, hours on two
CPU cores. The JSON is written after every evaluation, so a time limit keeps what was done."""

import argparse
import copy
import dataclasses
import json
import math
import os
import sys
import time

import torch
from recipes import copy_sequences, copy_test, head_scores, parse_rate  # the gpt_more recipe's probes
from record import machine, save_json  # experiments/record.py, beside this script

from transformer_lib.classifier import fit
from transformer_lib.gpt import (
    GPT,
    HELDOUT_MODULES,
    TRAIN_MODULES,
    GPTConfig,
    ablate_heads,
    encode_modules,
    lm_loss,
    more_modules,
    random_windows,
    sequence_nll,
    stdlib_sources,
    train_bpe,
)
from transformer_lib.training import data_sha256, save_checkpoint
from transformer_lib.utils import seed_everything

VOCAB, CONTEXT, WIDTH, LAYERS, HEADS, BATCH = 1024, 256, 192, 6, 6, 64
ARMS = {                                # name -> (training data, dropout, steps, peak learning rate)
    "chapter": ("chapter", 0.1, 3000, 2e-3),
    "more": ("more", 0.1, 3000, 2e-3),
    "more-p0": ("more", 0.0, 3000, 2e-3),
}
EVAL_EVERY = 500


def build_data() -> dict:
    """Chapter 11's tokenizer and ids (gpt_setup's), and the rest of the standard library encoded with it."""
    train_sources = stdlib_sources(TRAIN_MODULES)
    bpe = train_bpe(train_sources.values(), VOCAB)
    more, valid = more_modules()
    texts = {"chapter": list(train_sources.values()), "more": list(stdlib_sources(more).values()),
             "valid": list(stdlib_sources(valid).values()), "heldout": list(stdlib_sources(HELDOUT_MODULES).values())}
    ids = {k: encode_modules(bpe, v) for k, v in texts.items()}
    return {"ids": {k: v.to(torch.int16) for k, v in ids.items()},            # 1,024 ids: int16 is enough
            "bytes": {k: sum(len(t.encode()) for t in v) for k, v in texts.items()},
            "modules": {"more": more, "valid": valid}, "bpe": bpe._tokenizer.to_str(),
            "sha256": {k: data_sha256(v.tolist()) for k, v in ids.items()},
            "python": sys.version.split()[0]}


def training_ids(data: dict, which: str) -> torch.Tensor:
    return data["ids"]["chapter"] if which == "chapter" else torch.cat([data["ids"]["chapter"], data["ids"]["more"]])


def model_config(dropout: float) -> GPTConfig:
    return GPTConfig(vocab_size=VOCAB, max_len=CONTEXT, d_model=WIDTH, num_layers=LAYERS, num_heads=HEADS,
                     d_ff=4 * WIDTH, dropout=dropout)


def fit_arguments(steps: int, lr: float) -> dict:
    return dict(steps=steps, lr=lr, warmup_steps=max(1, steps // 20), weight_decay=0.1, betas=(0.9, 0.95), clip_norm=1.0,
                eval_every=EVAL_EVERY)


def first_steps(data: dict, arm: str, seed: int, k: int, device: str = "cpu") -> list:
    """The losses of an arm's first k steps (what Chapter 11 re-runs on the CPU against the record)."""
    which, dropout, steps, lr = ARMS[arm]
    seed_everything(seed)
    model = GPT(model_config(dropout)).to(device)
    history = fit(model, lm_loss, random_windows(training_ids(data, which), CONTEXT, BATCH, seed=seed),
                  **fit_arguments(steps, lr), progress=False, stop_after=k)
    return history["loss"]


def bits_per_byte(model, data: dict, which: str) -> float:
    return sequence_nll(model, data["ids"][which], CONTEXT) / math.log(2) / data["bytes"][which]


def run(data: dict, arm: str, seed: int, device: str, out: str) -> dict:
    from tokenizers import Tokenizer

    bpe = Tokenizer.from_str(data["bpe"])
    which, dropout, steps, lr = ARMS[arm]
    train_ids = training_ids(data, which)
    seqs = copy_sequences(data["ids"]["heldout"]).to(device)
    result = {"arm": arm, "seed": seed, "data": which, "dropout": dropout, "steps": steps, "lr": lr,
              "batch_size": BATCH, "context": CONTEXT, "training_tokens": len(train_ids),
              "training_bytes": data["bytes"]["chapter"] + (data["bytes"]["more"] if which == "more" else 0),
              "config": dataclasses.asdict(model_config(dropout)), "fit": fit_arguments(steps, lr), "machine": machine(device),
              "python_of_data": data["python"], "data_sha256": data["sha256"], "evals": []}
    json_path = os.path.join(out, f"{arm}_s{seed}.json")
    start = time.perf_counter()

    def evaluate(model):
        model.eval()
        t0 = time.perf_counter()
        row = {"step": len(result["evals"] + [0]) * EVAL_EVERY, "seconds": round(t0 - start, 1),
               "heldout": bits_per_byte(model, data, "heldout"), "valid": bits_per_byte(model, data, "valid"),
               "copy": copy_test(model, seqs)}
        induction, previous = head_scores(model, seqs)
        row["induction"], row["previous"] = induction.double().numpy().round(4).tolist(), previous.double().numpy().round(4).tolist()
        row["parse"] = {str(t): parse_rate(model, bpe, t) for t in (0.8, 0.5)}
        row["eval_seconds"] = round(time.perf_counter() - t0, 1)
        result["evals"].append(row)
        save_checkpoint(os.path.join(out, f"{arm}_s{seed}.pt"), copy.deepcopy(model).half().cpu(), step=row["step"])
        print(json.dumps({k: row[k] for k in ("step", "seconds", "heldout", "valid", "copy", "parse")}), flush=True)
        save_json(result, json_path)
        model.train()
        return row["heldout"]

    seed_everything(seed)
    model = GPT(model_config(dropout)).to(device)
    result["parameters"] = sum(p.numel() for p in model.parameters())
    history = fit(model, lm_loss, random_windows(train_ids, CONTEXT, BATCH, seed=seed), **fit_arguments(steps, lr),
                  evaluate=evaluate, progress=False)
    result["seconds"] = time.perf_counter() - start
    result["loss"] = [round(x, 5) for x in history["loss"]]
    result["history_lr"] = history["lr"]
    result["optimizer"] = history["optimizer"]
    model.eval()
    induction, _ = head_scores(model, seqs)
    order = induction.flatten().argsort(descending=True).tolist()
    top = [divmod(i, HEADS) for i in order[:3]]
    low = [divmod(i, HEADS) for i in order[-3:]]
    ablations = {}
    for name, heads in [(f"layer {a}, head {b}", [(a, b)]) for a, b in top] + [("top three", top),
                                                                            ("lowest three", low)]:
        spec = {}
        for a, b in heads:
            spec.setdefault(a, []).append(b)
        with ablate_heads(model, spec):
            ablations[name] = {"heads": heads, **copy_test(model, seqs)}
    result["ablations"] = ablations
    half = copy.deepcopy(model).half().cpu()
    save_checkpoint(os.path.join(out, f"{arm}_s{seed}.pt"), half, step=steps)
    rounded = GPT(model_config(dropout)).to(device)
    rounded.load_state_dict(half.state_dict())
    result["heldout_float16_weights"] = bits_per_byte(rounded.eval(), data, "heldout")
    save_json(result, json_path)
    print("done", arm, seed, round(result["seconds"]), "s", flush=True)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--save-data", default=None)
    parser.add_argument("--data", default=None)
    parser.add_argument("--arm", choices=ARMS, default="more")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=".")
    parser.add_argument("--steps", type=int, default=None, help="override the arm's steps (a smoke test)")
    parser.add_argument("--eval-every", type=int, default=None, help="override EVAL_EVERY (a smoke test)")
    args = parser.parse_args()
    if args.eval_every:
        global EVAL_EVERY
        EVAL_EVERY = args.eval_every
    if args.save_data:
        torch.save(build_data(), args.save_data)
        return
    data = torch.load(args.data, weights_only=True) if args.data else build_data()
    data["ids"] = {k: v.long() for k, v in data["ids"].items()}
    if args.steps:
        which, dropout, _, lr = ARMS[args.arm]
        ARMS[args.arm] = (which, dropout, args.steps, lr)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    run(data, args.arm, args.seed, args.device, args.out)


if __name__ == "__main__":
    main()
