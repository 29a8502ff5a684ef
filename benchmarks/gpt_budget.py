"""What buys the most in three minutes of CPU? Chapter 11's GPT on the standard library, one row per variant.

    .venv/bin/python benchmarks/gpt_budget.py [--budget 170] [--only base "lr 6e-3" ...] [--json out.json]
    .venv/bin/python benchmarks/gpt_budget.py --tokens 2048000 --only "batch 16" "batch 8" "batch 4"

Each variant trains for a fixed wall-clock budget (default 170 s; the learning rate warms up over the first 5 %
of the budget and decays linearly to zero at its end, so every run finishes its schedule), then reports the
held-out bits per byte (Chapter 11's `sequence_nll` on the ten HELDOUT_MODULES) and the steps it managed. The
trigram baseline is printed for each vocabulary. Time budgets make the rows comparable on one machine only and
depend on its load: run it alone, and read the rows against each other, not against another machine's.
Not part of `make test` (about 3 minutes per row).

With --tokens N every variant instead reads the same N training tokens (N // (batch * context) steps) through
Chapter 11's own training call, `fit` with the chapter's settings and seed: the rows then compare batch sizes at
equal data, and a row's bits per byte is what the chapter's training cell prints for those steps and that batch
(on this CPU; the seconds are this machine's, under whatever else it ran). The runs Chapter 11 quotes are in
benchmarks/results/ (the JSON of --json, with the date and the conditions added)."""

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

from transformer_lib.gpt import (
    GPT,
    HELDOUT_MODULES,
    TRAIN_MODULES,
    GPTConfig,
    TrigramLM,
    random_windows,
    sequence_nll,
    stdlib_sources,
)

VARIANTS = {   # name: (vocabulary, d_model, layers, heads, context, batch, peak lr)
    "base": (1024, 128, 4, 4, 128, 32, 3e-3),
    "vocab 2048": (2048, 128, 4, 4, 128, 32, 3e-3),
    "context 256, batch 16": (1024, 128, 4, 4, 256, 16, 3e-3),
    "narrow, deep (d 96, 6 layers)": (1024, 96, 6, 4, 128, 32, 3e-3),
    "lr 6e-3": (1024, 128, 4, 4, 128, 32, 6e-3),
    "batch 16": (1024, 128, 4, 4, 128, 16, 3e-3),
    "batch 8": (1024, 128, 4, 4, 128, 8, 3e-3),
    "batch 4": (1024, 128, 4, 4, 128, 4, 3e-3),
}


def tokenize(vocab_size, train, heldout):
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(list(train), vocab_size=vocab_size, min_frequency=2, special_tokens=["<|endoftext|>"],
                            show_progress=False)
    eot = bpe.token_to_id("<|endoftext|>")

    def encode(texts):
        return torch.tensor([i for t in texts for i in bpe.encode(t).ids + [eot]])
    return bpe.get_vocab_size(), encode(train), encode(heldout)


def run_tokens(name, tokens, train, heldout, heldout_bytes):
    """One variant for a fixed number of training tokens, trained exactly as Chapter 11's training cell trains."""
    from transformer_lib.classifier import fit
    from transformer_lib.gpt import lm_loss

    V, train_ids, heldout_ids, model, (context, batch, lr) = build(name, train, heldout)
    steps = tokens // (batch * context)
    history = fit(model, lm_loss, random_windows(train_ids, context, batch_size=batch), steps=steps, lr=lr,
                  warmup_steps=max(1, steps // 20), weight_decay=0.1, betas=(0.9, 0.95), clip_norm=1.0,
                  progress=False)
    return score_row(name, model, steps, V, train_ids, heldout_ids, heldout_bytes) | {"seconds": round(history["seconds"])}


def score_row(name, model, steps, V, train_ids, heldout_ids, heldout_bytes) -> dict:
    """A trained variant's row: its held-out bits per byte and the trigram's on the same tokens."""
    context = model.config.max_len
    bpb = sequence_nll(model, heldout_ids, context) / math.log(2) / heldout_bytes
    trigram = TrigramLM(train_ids, V).nll(heldout_ids) / math.log(2) / heldout_bytes
    return {"variant": name, "params": sum(p.numel() for p in model.parameters()), "steps": steps,
            "bits_per_byte": round(bpb, 3), "trigram_bits_per_byte": round(trigram, 3)}


def build(name, train, heldout):
    """A variant's tokens and its freshly initialised model (seed 0, as Chapter 11's training cell seeds it)."""
    vocab, d, layers, heads, context, batch, lr = VARIANTS[name]
    V, train_ids, heldout_ids = tokenize(vocab, train, heldout)
    torch.manual_seed(0)
    model = GPT(GPTConfig(V, context, d, layers, heads, 4 * d, dropout=0.0))
    return V, train_ids, heldout_ids, model, (context, batch, lr)


def run(name, budget, train, heldout, heldout_bytes):
    V, train_ids, heldout_ids, model, (context, batch, lr) = build(name, train, heldout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    batches, steps, start = random_windows(train_ids, context, batch), 0, time.perf_counter()
    model.train()
    while (elapsed := time.perf_counter() - start) < budget:
        frac = elapsed / budget                                  # schedule by time: warm-up 5 %, then to zero
        for group in optimizer.param_groups:
            group["lr"] = lr * (frac / 0.05 if frac < 0.05 else (1 - frac) / 0.95)
        (x,) = next(batches)
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        steps += 1
    return score_row(name, model, steps, V, train_ids, heldout_ids, heldout_bytes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=170.0, help="seconds of training per variant")
    parser.add_argument("--tokens", type=int, help="train every variant on this many tokens instead (by steps, with "
                        "Chapter 11's fit) and report its seconds")
    parser.add_argument("--only", nargs="*", choices=list(VARIANTS), help="run only these variants")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    train = list(stdlib_sources(TRAIN_MODULES).values())
    heldout = list(stdlib_sources(HELDOUT_MODULES).values())
    heldout_bytes = sum(len(t.encode()) for t in heldout)
    if args.tokens is not None and args.tokens < 2 * 128 * 32:
        parser.error(f"--tokens must be at least {2 * 128 * 32:,} (two steps of the largest batch), got {args.tokens}")
    rows = []
    print(f"{'variant':34}{'params':>10}{'steps':>7}{'seconds':>9}{'bits/byte':>11}{'trigram':>9}", flush=True)
    for name in args.only or VARIANTS:
        if args.tokens is None:
            row = run(name, args.budget, train, heldout, heldout_bytes)
        else:
            row = run_tokens(name, args.tokens, train, heldout, heldout_bytes)
        rows.append(row)
        print(f"{name:34}{row['params']:>10,}{row['steps']:>7}{row.get('seconds', args.budget):>9.0f}"
              f"{row['bits_per_byte']:>11.3f}{row['trigram_bits_per_byte']:>9.3f}", flush=True)
    if args.json:
        budget = {"budget_s": args.budget} if args.tokens is None else {"tokens": args.tokens}
        with open(args.json, "w") as f:
            json.dump(budget | {"threads": torch.get_num_threads(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
