"""What the tokenizer does to Chapter 11's GPT at equal compute: bytes, and byte-level BPE of 512 to 4,096 tokens.

    .venv/bin/python experiments/tokenizer_compute.py [--seeds 0 1 2] [--device cuda] [--vocabs 257 512 1024 ...]
                     [--data FILE] [--json transformer_lib/results/tokenizer_compute.json]
    .venv/bin/python experiments/tokenizer_compute.py --save-data FILE      # the ids, for another machine

Every run is Chapter 11's recipe (`experiments/recipes.py gpt`: a GPT of d_model 128, 4 blocks, 4 heads, 2,000
AdamW steps of 8 windows of 128 tokens, peak learning rate 3e-3) with one thing changed: the tokenizer, a
byte-level BPE trained by the chapter's `train_bpe` on the same training modules (vocabulary 257: the 256 bytes and
<|endoftext|>, no merges). The blocks, steps, batch and context in tokens are the same, so every run costs the
same in its blocks; the embedding and the tied output layer grow with the vocabulary (their share of the
FLOPs per token is recorded). Each run is scored in bits per byte on the held-out modules (the unit that does
not depend on the tokenizer), with the chapter's `sequence_nll`. A longer token covers more bytes, so the runs
see different amounts of text: bytes seen and held-out bytes per token are recorded too.
Not part of `make test`; ran on a GPU (the JSON's "machine"). The data are the standard library of the Python
that makes them: --save-data writes them on the book's Python so that another machine trains on the same ids."""

import json
import math
import platform
import time

import torch
from record import machine, save_json, seeds_parser  # experiments/record.py, beside this script

from transformer_lib.classifier import fit
from transformer_lib.gpt import (
    GPT,
    HELDOUT_MODULES,
    TRAIN_MODULES,
    GPTConfig,
    encode_modules,
    lm_loss,
    random_windows,
    sequence_nll,
    stdlib_sources,
    train_bpe,
)
from transformer_lib.utils import seed_everything

VOCABS = (257, 512, 1024, 2048, 4096)
CONTEXT, STEPS, BATCH, WIDTH, LAYERS, HEADS = 128, 2000, 8, 128, 4, 4


def load_data(vocabs, path=None) -> dict:
    """{vocab: {"train": ids, "heldout": ids}} and the held-out bytes, built here or loaded."""
    if path:
        return torch.load(path)
    train_texts = list(stdlib_sources(TRAIN_MODULES).values())
    heldout_texts = list(stdlib_sources(HELDOUT_MODULES).values())
    data = {"heldout_bytes": sum(len(t.encode()) for t in heldout_texts),
            "train_bytes": sum(len(t.encode()) for t in train_texts), "python": platform.python_version()}
    for v in vocabs:
        bpe = train_bpe(train_texts, v)
        assert bpe.get_vocab_size() == v, (v, bpe.get_vocab_size())
        data[v] = {"train": encode_modules(bpe, train_texts).short(), "heldout": encode_modules(bpe, heldout_texts).short()}
    return data


def run(data, vocab, seed, device, steps=STEPS):
    ids = data[vocab]
    train_ids, heldout_ids = ids["train"].long(), ids["heldout"].long()
    config = GPTConfig(vocab_size=vocab, max_len=CONTEXT, d_model=WIDTH, num_layers=LAYERS, num_heads=HEADS,
                       d_ff=4 * WIDTH, dropout=0.0)
    seed_everything(seed)
    model = GPT(config).to(device)
    start = time.perf_counter()
    history = fit(model, lm_loss, random_windows(train_ids, CONTEXT, batch_size=BATCH, seed=seed), steps=steps,
                  lr=3e-3, warmup_steps=max(1, steps // 20), weight_decay=0.1, betas=(0.9, 0.95), clip_norm=1.0,
                  evaluate=lambda m: sequence_nll(m, heldout_ids, CONTEXT) / math.log(2) / data["heldout_bytes"],
                  eval_every=max(1, steps // 5), progress=False)
    seconds = time.perf_counter() - start
    blocks = sum(p.numel() for p in model.blocks.parameters())
    bytes_per_token = {"train": data["train_bytes"] / len(train_ids), "heldout": data["heldout_bytes"] / len(heldout_ids)}
    return {"vocab": vocab, "seed": seed, "steps": steps, "batch_size": BATCH, "context": CONTEXT,
            "bits_per_byte": round(history["eval"][-1], 5), "eval_step": history["eval_step"],
            "eval": [round(v, 5) for v in history["eval"]], "seconds": round(seconds, 1),
            "parameters": sum(p.numel() for p in model.parameters()), "block_parameters": blocks,
            "head_share_of_matmul_flops": round(WIDTH * vocab / (WIDTH * vocab + blocks), 4),
            "bytes_per_token": {k: round(v, 4) for k, v in bytes_per_token.items()},
            "train_tokens": len(train_ids), "heldout_tokens": len(heldout_ids),
            "bytes_seen": round(steps * BATCH * CONTEXT * bytes_per_token["train"]),
            "loss": [round(v, 4) for v in history["loss"][::10]]}


def make_parser():
    """The script's arguments; their defaults are what the committed results were run with."""
    parser = seeds_parser(__doc__)
    parser.add_argument("--vocabs", type=int, nargs="+", default=list(VOCABS))
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data", default=None)
    parser.add_argument("--save-data", default=None)
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    if args.save_data:
        torch.save(load_data(args.vocabs), args.save_data)
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    data = load_data(args.vocabs, args.data)
    result = {"script": "experiments/tokenizer_compute.py", "python_of_data": data["python"],
              "machine": machine(args.device),
              "settings": {"context": CONTEXT, "steps": args.steps, "batch_size": BATCH, "width": WIDTH,
                           "layers": LAYERS, "heads": HEADS, "lr": 3e-3}, "runs": []}
    start = time.perf_counter()
    for seed in args.seeds:
        for vocab in args.vocabs:
            r = run(data, vocab, seed, args.device, args.steps)
            result["runs"].append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "loss"}), flush=True)
            save_json(result, args.json)                                   # what is done so far
    result["seconds"] = round(time.perf_counter() - start, 1)
    save_json(result, args.json)


if __name__ == "__main__":
    main()
