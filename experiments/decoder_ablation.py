"""Chapter 14's changes one at a time: a Llama-style decoder and the same model with one change undone, 3 seeds each.

    .venv/bin/python experiments/decoder_ablation.py [--seeds 0 1 2] [--device cuda] [--steps 1500]
                     [--data FILE] [--json transformer_lib/results/decoder_ablation.json]
    .venv/bin/python experiments/decoder_ablation.py --save-data FILE     # Chapter 11's ids, for another machine

Every arm is the same decoder-only scaffold (`Decoder` below) built from the library's parts (Chapter 7's
`DecoderLayer` configured through its constructor, Chapter 14's `RotaryEmbedding`, Chapter 12's `RMSNorm`, Chapter
5's `LayerNorm`), d_model 128, 4 blocks, 4 heads, the output layer tied to the embedding. The base arm is
Llama's block (RoPE, RMSNorm, SwiGLU, no biases, one key/value head per query head) and is asserted equal to the
library's `Llama` with the same weights; every other arm changes one thing: learned, sinusoidal or no positions
instead of RoPE; LayerNorm instead of RMSNorm; a GELU FFN of the same parameter count instead of SwiGLU; biases;
2 or 1 key/value heads (grouped-query / multi-query attention); and all four of GPT-2's choices at once.
Data: Chapter 11's (the standard library's modules split by file, byte-level BPE of 1,024 tokens); training on
random windows of 256 tokens, batch 32, AdamW with warm-up and linear decay (the book's `fit`). Reported: held-out
bits per byte every 250 steps, at the trained length; for the position arms, loss by position in windows of 1,024
tokens (4x the trained length), and the same targets read after a window of the trained length.

LoRA (with --lora, on the base arm's seed-0 model): adapting to `turtle.py` (a module neither split has seen: its
first 70 % to tune on, the next 10 % to choose the learning rate, the last 20 % to score), LoRA rank 4 on W_q and
W_v, LoRA rank 8 on every matrix of the blocks, full fine-tuning, and the control (full fine-tuning on the
training modules): a learning-rate grid per arm judged on the validation part, then 3 seeds at the chosen rate;
trainable parameters, optimizer-state bytes and time per step.

Not part of `make test`. Ran on a GPU (see the JSON's "machine"); on two CPU cores it would take hours. The data
are the standard library of the Python that makes them: --save-data writes them on the book's Python (3.11) so that
a machine with another Python trains on the same ids (--data)."""

import json
import math
import platform
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from record import machine, save_json, seeds_parser  # experiments/record.py, beside this script

from transformer_lib.classifier import fit
from transformer_lib.decoder import DecoderLayer
from transformer_lib.gpt import (
    HELDOUT_MODULES,
    TRAIN_MODULES,
    encode_modules,
    lm_loss,
    random_windows,
    stdlib_sources,
    train_bpe,
)
from transformer_lib.llama import Llama, LlamaConfig, RotaryEmbedding, add_lora
from transformer_lib.positional import sinusoidal_encoding
from transformer_lib.residual import LayerNorm
from transformer_lib.t5 import RMSNorm
from transformer_lib.utils import seed_everything
from transformer_lib.validation import checked

VOCAB, WIDTH, LAYERS, HEADS, CONTEXT, LONG = 1024, 128, 4, 4, 256, 1024
D_FF_SWIGLU, D_FF_GELU = 344, 512          # 3 · 128 · 344 = 132,096 ≈ 2 · 128 · 512 = 131,072 weights per FFN
BASE = {"positions": "rope", "norm": "rms", "ffn": "swiglu", "bias": False, "kv_heads": HEADS}
ARMS = {                                   # name -> the options that differ from BASE
    "Llama style (RoPE, RMSNorm, SwiGLU, no biases)": {},
    "learned positions instead of RoPE": {"positions": "learned"},
    "sinusoidal positions instead of RoPE": {"positions": "sinusoidal"},
    "no positions instead of RoPE": {"positions": "none"},
    "LayerNorm instead of RMSNorm": {"norm": "layer"},
    "GELU FFN instead of SwiGLU": {"ffn": "gelu"},
    "biases in every linear layer": {"bias": True},
    "2 key/value heads (GQA)": {"kv_heads": 2},
    "1 key/value head (MQA)": {"kv_heads": 1},
    "GPT-2 style (learned, LayerNorm, GELU, biases)": {"positions": "learned", "norm": "layer", "ffn": "gelu",
                                                        "bias": True},
}
POSITION_ARMS = [name for name, o in ARMS.items() if set(o) == {"positions"}] + [next(iter(ARMS))]


class Decoder(nn.Module):
    """A decoder-only language model from the library's parts, one option per change Chapter 14 discusses.
    positions: "rope" (rotates Q and K in every block), "learned" (a table of LONG rows added to the embeddings),
    "sinusoidal" (Chapter 3's table, frozen, scaled to RMS 0.02 like the learned one at initialisation), "none".
    forward(tokens (B, T)) -> logits (B, T, VOCAB)."""

    def __init__(self, positions="rope", norm="rms", ffn="swiglu", bias=False, kv_heads=HEADS):
        super().__init__()
        self.options = dict(positions=positions, norm=norm, ffn=ffn, bias=bias, kv_heads=kv_heads)
        self.token = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Embedding(LONG, WIDTH) if positions in ("learned", "sinusoidal") else None
        rotary = RotaryEmbedding(WIDTH // HEADS) if positions == "rope" else None
        norm_class = RMSNorm if norm == "rms" else LayerNorm
        gated = ffn == "swiglu"
        self.blocks = nn.ModuleList(
            DecoderLayer(WIDTH, HEADS, D_FF_SWIGLU if gated else D_FF_GELU, 0.0, norm_first=True,
                         activation="silu" if gated else "gelu_tanh", norm=norm_class, bias=bias,
                         cross_attention=False, num_kv_heads=kv_heads, rotary=rotary, gated=gated)
            for _ in range(LAYERS))
        self.norm = norm_class(WIDTH, eps=1e-5)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
        if positions == "sinusoidal":
            table = sinusoidal_encoding(LONG, WIDTH)
            self.position.weight = nn.Parameter(table * 0.02 / table.pow(2).mean().sqrt(), requires_grad=False)

    def forward(self, tokens):
        x = self.token(tokens)                                           # (B, T, d_model)
        if self.position is not None:
            x = x + self.position.weight[:tokens.size(1)]
        with checked():                                                  # the blocks check nothing
            for block in self.blocks:
                x = block(x)
            x = self.norm(x)
        return x @ self.token.weight.T                                   # (B, T, VOCAB)


def assert_base_is_llama(device):
    """The base arm computes what the library's Llama computes with the same weights (float64)."""
    ours = Decoder(**BASE).double().to(device)
    llama = Llama(LlamaConfig(vocab_size=VOCAB, max_len=LONG, d_model=WIDTH, num_layers=LAYERS, num_heads=HEADS,
                              num_kv_heads=HEADS, d_ff=D_FF_SWIGLU, tie_embeddings=True)).double().to(device)
    missing = llama.load_state_dict(ours.state_dict(), strict=False)
    assert not missing.missing_keys, missing
    tokens = torch.randint(0, VOCAB, (2, 64), device=device)
    difference = (ours(tokens) - llama(tokens)).abs().max().item()
    assert difference < 1e-10, difference
    return difference


def load_data(path=None) -> dict:
    """Chapter 11's ids (its BPE of 1,024 tokens on this Python's standard library), or the saved ones."""
    if path:
        return {k: v.long() if isinstance(v, torch.Tensor) else v for k, v in torch.load(path).items()}
    train_texts = list(stdlib_sources(TRAIN_MODULES).values())
    heldout_texts = list(stdlib_sources(HELDOUT_MODULES).values())
    tune_text = next(iter(stdlib_sources(("turtle.py",)).values()))
    bpe = train_bpe(train_texts, VOCAB)
    a, b = int(len(tune_text) * 0.7), int(len(tune_text) * 0.8)
    return {"train": encode_modules(bpe, train_texts), "heldout": encode_modules(bpe, heldout_texts),
            "heldout_bytes": sum(len(t.encode()) for t in heldout_texts),
            "tune": encode_modules(bpe, [tune_text[:a]]), "tune_valid": encode_modules(bpe, [tune_text[a:b]]),
            "tune_test": encode_modules(bpe, [tune_text[b:]]),
            "tune_bytes": {"valid": len(tune_text[a:b].encode()), "test": len(tune_text[b:].encode())},
            "python": platform.python_version()}


@torch.no_grad()
def loss_by_position(model, ids, n):
    """Mean next-token loss (nats) at each position 0 .. n-1 of the non-overlapping windows of n + 1 tokens."""
    device = next(model.parameters()).device
    windows = ids[:len(ids) // (n + 1) * (n + 1)].view(-1, n + 1).to(device)    # (W, n + 1)
    losses = [F.cross_entropy(model(w[:, :-1]).transpose(1, 2), w[:, 1:], reduction="none") for w in windows.split(32)]
    return torch.cat(losses).mean(0).cpu()                                      # (n,)


@torch.no_grad()
def loss_after_short_window(model, ids, n=LONG, block=64):
    """The targets at positions n/2 .. n-1 of each n-token window, read after a window of CONTEXT tokens ending with
    them (trained positions only): the same tokens as loss_by_position(model, ids, n)[n // 2:], a shorter context."""
    device = next(model.parameters()).device
    windows = ids[:len(ids) // (n + 1) * (n + 1)].view(-1, n + 1).to(device)
    losses = []
    for lo in range(n // 2, n, block):
        x = windows[:, lo + block - CONTEXT:lo + block + 1]                       # (W, CONTEXT + 1)
        losses.append(F.cross_entropy(model(x[:, :-1]).transpose(1, 2), x[:, 1:], reduction="none")[:, -block:])
    return torch.cat(losses, 1).mean().item()


def train_arm(data, name, seed, steps, device, batch_size=32, lr=3e-3):
    bits = len(data["heldout"]) / data["heldout_bytes"] / math.log(2)            # nats per token -> bits per byte
    seed_everything(seed)
    model = Decoder(**{**BASE, **ARMS[name]}).to(device)
    start = time.perf_counter()
    history = fit(model, lm_loss, random_windows(data["train"], CONTEXT, batch_size, seed=seed), steps=steps, lr=lr,
                  warmup_steps=max(1, steps // 20), weight_decay=0.1, betas=(0.9, 0.95), clip_norm=1.0,
                  evaluate=lambda m: loss_by_position(m, data["heldout"], CONTEXT).mean().item() * bits,
                  eval_every=max(1, steps // 6), progress=False)
    seconds = time.perf_counter() - start
    run = {"arm": name, "seed": seed, "options": model.options, "steps": steps, "batch_size": batch_size,
           "context": CONTEXT, "lr": lr, "seconds": round(seconds, 1),
           "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
           "block_parameters": sum(p.numel() for p in model.blocks.parameters()),
           "bits_per_byte": round(history["eval"][-1], 5),
           "eval_step": history["eval_step"], "eval": [round(v, 5) for v in history["eval"]],
           "loss": [round(v, 4) for v in history["loss"][::10]]}
    if name in POSITION_ARMS:
        curve = loss_by_position(model.eval(), data["heldout"], LONG) * bits                # (LONG,) bits per byte
        run["by_position_bits_per_byte"] = [round(v, 4) for v in curve.view(-1, 16).mean(1).tolist()]  # 16 each
        run["ranges"] = {f"{lo}-{hi - 1}": round(curve[lo:hi].mean().item(), 5)
                         for lo, hi in ((0, CONTEXT), (CONTEXT, 2 * CONTEXT), (2 * CONTEXT, LONG))}
        run["same_targets"] = {"in_long_window": round(curve[LONG // 2:].mean().item(), 5),
                               "after_trained_window": round(loss_after_short_window(model, data["heldout"]) * bits,
                                                             5)}
    return model.eval(), run


def tune(base, data, arm, lr, seed, steps, device, batch_size=16):
    """One fine-tuning run from a copy of base: (bits per byte on the validation and test parts, facts)."""
    import copy
    model = copy.deepcopy(base).train()
    if arm.startswith("LoRA, rank 4"):
        add_lora(model, targets=("W_q", "W_v"), rank=4, alpha=8.0)
    elif arm.startswith("LoRA, rank 8"):
        add_lora(model, targets=("W_q", "W_k", "W_v", "W_o", "linear1", "linear_up", "linear2"), rank=8, alpha=16.0)
    ids = data["train"] if arm.startswith("control") else data["tune"]
    seed_everything(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    history = fit(model, lm_loss, random_windows(ids, CONTEXT, batch_size, seed=seed), steps=steps, lr=lr,
                  warmup_steps=max(1, steps // 20), weight_decay=0.0, clip_norm=1.0, progress=False)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    model.eval()

    def bpb(part):
        return loss_by_position(model, data[f"tune_{part}"], CONTEXT).mean().item() * \
            len(data[f"tune_{part}"]) / data["tune_bytes"][part] / math.log(2)
    return {"arm": arm, "lr": lr, "seed": seed, "steps": steps, "valid": round(bpb("valid"), 5),
            "test": round(bpb("test"), 5), "trainable": sum(p.numel() for p in params),
            "adam_state_bytes": sum(p.numel() * p.element_size() * 2 for p in params),
            "ms_per_step": round(1000 * seconds / steps, 2), "final_loss": round(history["loss"][-1], 4)}


LORA_GRID = {"LoRA, rank 4 on W_q and W_v": (1e-3, 3e-3, 1e-2, 3e-2),
             "LoRA, rank 8 on every matrix of the blocks": (1e-3, 3e-3, 1e-2),
             "full fine-tuning": (1e-4, 3e-4, 1e-3, 3e-3)}


def lora_study(base, data, device, seeds, steps=100) -> dict:
    runs, chosen = [], {}
    for arm, grid in LORA_GRID.items():
        trial = [tune(base, data, arm, lr, 0, steps, device) for lr in grid]
        runs += trial
        chosen[arm] = min(trial, key=lambda r: r["valid"])["lr"]
        print(json.dumps({"arm": arm, "grid": [(r["lr"], r["valid"]) for r in trial]}), flush=True)
    chosen["control: full fine-tuning on the training modules"] = chosen["full fine-tuning"]
    final = [tune(base, data, arm, lr, seed, steps, device) for arm, lr in chosen.items() for seed in seeds]
    before = {part: round(loss_by_position(base, data[f"tune_{part}"], CONTEXT).mean().item()
                          * len(data[f"tune_{part}"]) / data["tune_bytes"][part] / math.log(2), 5)
              for part in ("valid", "test")}
    return {"steps": steps, "batch_size": 16, "grid": runs, "chosen_lr": chosen, "runs": final, "before": before,
            "tokens": {"tune": len(data["tune"]), "valid": len(data["tune_valid"]), "test": len(data["tune_test"])}}


def make_parser():
    """The script's arguments; their defaults are what the committed results were run with."""
    parser = seeds_parser(__doc__)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data", default=None, help="ids saved by --save-data (else built from this Python)")
    parser.add_argument("--save-data", default=None)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), help="a subset of the arms (default: all)")
    parser.add_argument("--lora", action="store_true", help="also the LoRA study, on the base arm's first seed")
    parser.add_argument("--lora-steps", type=int, default=100)
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    if args.save_data:                                                   # int16: every id is < 1,024
        torch.save({k: v.short() if isinstance(v, torch.Tensor) else v for k, v in load_data().items()},
                   args.save_data)
        return
    torch.backends.cuda.matmul.allow_tf32 = False                       # float32 products, as on the CPU
    torch.backends.cudnn.allow_tf32 = False
    data = load_data(args.data)
    start = time.perf_counter()
    result = {"script": "experiments/decoder_ablation.py", "python_of_data": data["python"],
              "machine": machine(args.device), "base_equals_llama": assert_base_is_llama(args.device),
              "settings": {"width": WIDTH, "layers": LAYERS, "heads": HEADS, "context": CONTEXT, "long": LONG,
                           "steps": args.steps, "batch_size": 32, "lr": 3e-3, "d_ff": {"swiglu": D_FF_SWIGLU,
                                                                                       "gelu": D_FF_GELU}},
              "runs": []}
    base = None
    for seed in args.seeds:
        for name in args.arms:
            model, run = train_arm(data, name, seed, args.steps, args.device)
            result["runs"].append(run)
            print(json.dumps({k: v for k, v in run.items() if k not in ("loss", "by_position_bits_per_byte")}),
                  flush=True)
            if args.lora and base is None and name == next(iter(ARMS)):     # the LoRA study's base: done first
                base = model
                result["lora"] = lora_study(base, data, args.device, (0, 1, 2), args.lora_steps)
            save_json(result, args.json)                                   # what is done so far
    result["seconds"] = round(time.perf_counter() - start, 1)
    save_json(result, args.json)


if __name__ == "__main__":
    main()
