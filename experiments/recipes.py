"""Train the book's committed models: each recipe trains one chapter's model with the library's own code, keeps the
checkpoints the chapter analyses in transformer_lib/checkpoints/<name>/ and writes its record <name>.json beside
them (arguments, the whole call with its defaults, the optimizer's settings, the data's sha256, seed, steps,
examples and tokens seen, wall time, threads, machine, versions and commit, the whole loss and learning-rate
history, each file's sha256).

The chapter re-runs the first steps live and asserts its losses equal the record's (check_loss_prefix), then loads
the files (recipe_checkpoint checks each sha256). Run on one CPU thread (`make recipes`), a recipe reproduces its
files bit for bit on the machine that wrote them (with one thread; more threads sum in another order); elsewhere
its loss prefix, to the chapter's tolerance.

    python experiments/recipes.py [NAME ...] [--device cuda] [--out DIR]     (default: every recipe)
"""

import argparse
import dataclasses
import functools
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time

import torch

from transformer_lib.training import file_sha256

RECIPES = {}


def recipe(fn):
    RECIPES[fn.__name__] = fn
    return fn


def machine(device: str) -> dict:
    cpu = platform.processor() or platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else None
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu, "system": platform.system()}


@functools.cache
def translator_setup() -> dict:
    """Chapter 8's data, tokenizer, configuration and the arguments of train_translator (the chapter's STEPS,
    BATCH, PEAK_LR, SLICE), built with the chapter's own functions (once per process: numbering 64,000 numbers in
    words takes seconds)."""
    from torch.utils.data import DataLoader

    from transformer_lib.data import (
        CharTokenizer,
        LengthGroupedSampler,
        TranslationDataset,
        collate,
        number_pairs,
        split_numbers,
        training_numbers,
    )
    from transformer_lib.model import TransformerConfig
    from transformer_lib.training import LabelSmoothingLoss, data_sha256, evaluate_loss

    steps, batch, lr, slice_ = 2000, 32, 2e-3, 200
    pool, valid_numbers, _ = split_numbers(1_000_000, 500, 2_000, seed=0)
    train_pairs, valid_pairs = number_pairs(training_numbers(pool, steps * batch, seed=1)), number_pairs(valid_numbers)
    tokenizer = CharTokenizer.from_texts([text for pair in train_pairs for text in pair])
    config = TransformerConfig(src_vocab_size=len(tokenizer), tgt_vocab_size=len(tokenizer), d_model=64, num_heads=4,
                               d_ff=256, num_encoder_layers=2, num_decoder_layers=2, dropout=0.0, max_len=128,
                               pad_id=tokenizer.pad_id)
    valid_set = TranslationDataset(valid_pairs, tokenizer)
    valid_loader = DataLoader(valid_set, batch_sampler=LengthGroupedSampler([(len(s), len(t)) for s, t in valid_set],
                                                                            250, shuffle=False),
                              collate_fn=lambda b: collate(b, pad_id=tokenizer.pad_id))
    loss_fn = LabelSmoothingLoss(0.1, tokenizer.pad_id)
    return {"config": config, "tokenizer": tokenizer, "train_pairs": train_pairs,
            "data": {"train_pairs_sha256": data_sha256(train_pairs), "valid_pairs_sha256": data_sha256(valid_pairs),
                     "chars": tokenizer.chars,
                     "batch_order_sha256": data_sha256(list(LengthGroupedSampler(      # train_translator's sampler
                         [(len(s), len(t)) for s, t in TranslationDataset(train_pairs, tokenizer)], batch, seed=0)))},
            "args": {"steps": steps, "batch_size": batch, "lr": lr, "seed": 0, "eval_every": slice_,
                     "save_every": slice_},
            "evaluate": lambda m: evaluate_loss(m, valid_loader, loss_fn)}


def translator_first_steps(k: int) -> list:
    """The losses of the translator recipe's first k steps (what the chapter and tests/ compare with the record)."""
    from transformer_lib.training import train_translator

    s = translator_setup()
    args = {key: v for key, v in s["args"].items() if key not in ("eval_every", "save_every")}
    return train_translator(s["config"], s["tokenizer"], s["train_pairs"], stop_after=k, **args)[1]["loss"]


@recipe
def translator(out: str, device: str) -> dict:
    """Chapter 8: the English -> German number translator (2,000 steps of 32 numbers, one epoch), its early
    checkpoint (step 800) and the last five of every 200 steps (averaged in the chapter)."""
    from transformer_lib.data import TranslationDataset
    from transformer_lib.training import train_translator

    s = translator_setup()
    config, tokenizer, train_pairs, args = s["config"], s["tokenizer"], s["train_pairs"], s["args"]
    keep = [800, 1200, 1400, 1600, 1800, 2000]
    with tempfile.TemporaryDirectory() as tmp:
        call = call_arguments(train_translator, config, tokenizer, train_pairs, device=device, evaluate=s["evaluate"],
                              save_dir=tmp, skip=("config", "tokenizer", "pairs", "evaluate", "save_dir", "device"),
                              **args)
        start = time.perf_counter()
        _, history = train_translator(config, tokenizer, train_pairs, device=device, evaluate=s["evaluate"],
                                      save_dir=tmp, **args)
        seconds = time.perf_counter() - start
        for step in keep:
            shutil.copy(os.path.join(tmp, f"step{step}.pt"), os.path.join(out, f"step{step}.pt"))
    train_set = TranslationDataset(train_pairs, tokenizer)
    steps = args["steps"]
    return {"chapter": "08_training", "function": "transformer_lib.training.train_translator",
            "args": {"config": dataclasses.asdict(config), **args},
            "data": s["data"], "seed": args["seed"], "steps": steps, "examples_seen": steps * args["batch_size"],
            "tokens_seen": sum(len(src) + len(tgt) - 1 for src, tgt in train_set),   # one epoch, no padding
            "seconds": seconds, "call": call, "optimizer": history["optimizer"],
            "history": {k: history[k] for k in ("loss", "lr", "eval_step", "eval")},
            "final": f"step{steps}.pt", "files": {f"step{step}.pt": {"step": step} for step in keep}}


def one_model(out: str, device: str, s: dict, train, chapter: str, function: str, tokens_seen) -> dict:
    """The body of a recipe that keeps one model: train(s, device, evaluate=s["evaluate"]) timed, the model saved
    as final.pt, and the record's entries. tokens_seen(history) -> the tokens the run read."""
    from transformer_lib.training import save_checkpoint

    start = time.perf_counter()
    model, history = train(s, device, evaluate=s["evaluate"])
    seconds = time.perf_counter() - start
    steps = s["args"]["steps"]
    save_checkpoint(os.path.join(out, "final.pt"), model.cpu(), step=steps)
    return {"chapter": chapter, "function": function, "args": {"config": dataclasses.asdict(s["config"]), **s["args"]},
            "data": s["data"], "seed": s["args"]["seed"], "steps": steps,
            "examples_seen": steps * s["args"]["batch_size"], "tokens_seen": tokens_seen(history),
            "seconds": seconds, "call": history["call"], "optimizer": history["optimizer"],
            "history": {k: history[k] for k in ("loss", "lr", "eval_step", "eval")},
            "final": "final.pt", "files": {"final.pt": {"step": steps}}}


@functools.cache
def gpt_setup() -> dict:
    """Chapter 11's data (the standard library's modules, split by file, as BPE ids), configuration and the
    arguments of fit (the chapter's VOCAB, CONTEXT, STEPS, BATCH, WIDTH, LAYERS, HEADS), built with the chapter's
    own functions."""
    from transformer_lib.gpt import (
        HELDOUT_MODULES,
        TRAIN_MODULES,
        GPTConfig,
        encode_modules,
        sequence_nll,
        stdlib_sources,
        train_bpe,
    )
    from transformer_lib.training import data_sha256

    vocab, context, steps, batch, width, layers, heads = 1024, 128, 2000, 8, 128, 4, 4
    train_sources, heldout_texts = stdlib_sources(TRAIN_MODULES), list(stdlib_sources(HELDOUT_MODULES).values())
    bpe = train_bpe(train_sources.values(), vocab)
    train_ids, heldout_ids = encode_modules(bpe, train_sources.values()), encode_modules(bpe, heldout_texts)
    heldout_bytes = sum(len(t.encode()) for t in heldout_texts)
    config = GPTConfig(vocab_size=vocab, max_len=context, d_model=width, num_layers=layers, num_heads=heads,
                       d_ff=4 * width, dropout=0.0)
    return {"config": config, "train_ids": train_ids, "heldout_ids": heldout_ids, "context": context, "bpe": bpe,
            "heldout_bytes": heldout_bytes,
            "data": {"train_ids_sha256": data_sha256(train_ids.tolist()),
                     "heldout_ids_sha256": data_sha256(heldout_ids.tolist())},
            "args": {"steps": steps, "batch_size": batch, "lr": 3e-3, "warmup_steps": steps // 20,
                     "weight_decay": 0.1, "betas": [0.9, 0.95], "clip_norm": 1.0, "eval_every": steps // 5,
                     "seed": 0},
            "evaluate": lambda m: sequence_nll(m, heldout_ids, context) / math.log(2) / heldout_bytes}


def gpt_fit(s: dict, device: str = "cpu", stop_after: int | None = None, evaluate=None):
    """Chapter 11's training run: seed 0, a fresh GPT, fit() on random windows of the training ids."""
    from transformer_lib.classifier import fit
    from transformer_lib.gpt import GPT, lm_loss, random_windows
    from transformer_lib.utils import seed_everything

    a = s["args"]
    seed_everything(a["seed"])
    model = GPT(s["config"]).to(device)
    kwargs = dict(steps=a["steps"], lr=a["lr"], warmup_steps=a["warmup_steps"], weight_decay=a["weight_decay"],
                  betas=tuple(a["betas"]), clip_norm=a["clip_norm"], evaluate=evaluate, eval_every=a["eval_every"],
                  progress=False, stop_after=stop_after)
    batches = random_windows(s["train_ids"], s["context"], batch_size=a["batch_size"])
    history = fit(model, lm_loss, batches, **kwargs)
    history["call"] = call_arguments(fit, model, lm_loss, batches, skip=("model", "loss_fn", "batches", "evaluate"),
                                     **kwargs)
    return model, history


def gpt_first_steps(k: int) -> list:
    """The losses of the gpt recipe's first k steps (what the chapter and tests/ compare with the record)."""
    return gpt_fit(gpt_setup(), stop_after=k)[1]["loss"]


@recipe
def gpt(out: str, device: str) -> dict:
    """Chapter 11: the GPT trained on Python source (0.94M parameters, 2,000 steps of 8 windows of 128 BPE tokens)."""
    s = gpt_setup()
    return one_model(out, device, s, gpt_fit, "11_decoder_only", "transformer_lib.classifier.fit",
                     lambda h: s["args"]["steps"] * s["args"]["batch_size"] * s["context"])


@functools.cache
def gpt_more_setup() -> dict:
    """Chapter 11's GPT (the gpt recipe's configuration, tokenizer and held-out modules) trained on the whole standard
    library instead of its 59 training modules (`more_modules`: 529 more files, 3.8 times the bytes; no tests, no
    held-out or validation module) for 15 times the tokens: 15,000 steps of 16 windows of 128 tokens."""
    from transformer_lib.gpt import encode_modules, more_modules, stdlib_sources
    from transformer_lib.training import data_sha256

    g = gpt_setup()
    more, valid = more_modules()
    more_ids = encode_modules(g["bpe"], stdlib_sources(more).values())
    valid_texts = list(stdlib_sources(valid).values())
    valid_ids, valid_bytes = encode_modules(g["bpe"], valid_texts), sum(len(t.encode()) for t in valid_texts)
    train_ids = torch.cat([g["train_ids"], more_ids])
    steps, batch = 15000, 16
    s = {**g, "train_ids": train_ids, "valid_ids": valid_ids, "valid_bytes": valid_bytes, "probes": [],
         "data": {**g["data"], "more_ids_sha256": data_sha256(more_ids.tolist()),
                  "valid_ids_sha256": data_sha256(valid_ids.tolist()), "more_modules": len(more),
                  "valid_modules": valid},
         "args": {**g["args"], "steps": steps, "batch_size": batch, "warmup_steps": steps // 20,
                  "eval_every": steps // 10}}
    return s                                      # evaluate: the gpt recipe's, the held-out bits per byte


def copy_sequences(heldout_ids, n: int = 128):
    """Chapter 11's classic induction test: n held-out passages of 32 tokens after 32 tokens of code, repeated
    verbatim -> (n, 96) ids (drawn with random.Random(0))."""
    import random

    rng = random.Random(0)
    passages = torch.stack([heldout_ids[s:s + 64] for s in rng.sample(range(len(heldout_ids) - 64), n)])
    return torch.cat([passages, passages[:, 32:]], 1)


@torch.no_grad()
def copy_test(model, seqs) -> dict:
    """Bits per token on the passage's first copy (positions 33-63) and second (65-95), after each copy's first."""
    import torch.nn.functional as F

    logits = model(seqs)
    bits = F.cross_entropy(logits[:, :-1].transpose(1, 2).float(), seqs[:, 1:], reduction="none") / math.log(2)
    pos = torch.arange(1, seqs.size(1), device=seqs.device)                 # the position each loss predicts
    return {"first": bits[:, (pos > 32) & (pos < 64)].mean().item(), "second": bits[:, pos > 64].mean().item()}


@torch.no_grad()
def head_scores(model, seqs) -> tuple:
    """(induction, previous) (L, h): the mean weight a token of the second copy puts on the token after its
    counterpart in the first copy, and the mean weight on the token just before (every position)."""
    from transformer_lib.multi_head import attention_maps

    with attention_maps(model) as maps:
        model(seqs)
    q = torch.arange(64, 95, device=seqs.device)                            # the second copy but its last token
    induction = torch.stack([w[:, :, q, q - 32 + 1].mean((0, 2)).cpu() for w in maps.values()])
    previous = torch.stack([w.diagonal(-1, 2, 3).mean((0, 2)).cpu() for w in maps.values()])
    return induction, previous


def parse_rate(model, bpe, temperature: float, n: int = 200, new_tokens: int = 120) -> float:
    """Chapter 11's test: n functions sampled from "def " (top-p 0.95, new_tokens tokens, seed 0), cut with
    function_text; the fraction ast.parse accepts."""
    import warnings

    from transformer_lib.gpt import function_text, parses
    from transformer_lib.sampling import generate

    device = next(model.parameters()).device
    prompt = torch.tensor([bpe.encode("def ").ids] * n, device=device)
    g = torch.Generator(device=device).manual_seed(0)
    out = generate(model, prompt, new_tokens, temperature=temperature, top_p=0.95, generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)                      # "invalid decimal literal" and such
        return sum(parses(function_text("def " + bpe.decode(row.tolist()))) for row in out) / n


def gpt_probe(s: dict, model) -> float:
    """The recipe's evaluation: the held-out bits per byte (returned: the record's history), and, kept in
    s["probes"], the validation modules' bits per byte, the copy test, every head's induction and previous-token
    scores and the parse rate of 200 sampled functions at temperature 0.8."""
    from transformer_lib.gpt import sequence_nll

    was_training = model.training
    model.eval()
    seqs = copy_sequences(s["heldout_ids"]).to(next(model.parameters()).device)
    heldout = sequence_nll(model, s["heldout_ids"], s["context"]) / math.log(2) / s["heldout_bytes"]
    induction, previous = head_scores(model, seqs)
    s["probes"].append({"heldout": heldout,
                        "valid": sequence_nll(model, s["valid_ids"], s["context"]) / math.log(2) / s["valid_bytes"],
                        "copy": copy_test(model, seqs), "induction": induction.double().numpy().round(4).tolist(),
                        "previous": previous.double().numpy().round(4).tolist(),
                        "parse_0.8": parse_rate(model, s["bpe"], 0.8)})
    print(f"probe {len(s['probes'])}: {json.dumps(s['probes'][-1])[:300]}", flush=True)
    model.train(was_training)
    return heldout


def gpt_more_first_steps(k: int) -> list:
    """The losses of the gpt_more recipe's first k steps."""
    return gpt_fit(gpt_more_setup(), stop_after=k)[1]["loss"]


@recipe
def gpt_more(out: str, device: str) -> dict:
    """Chapter 11: its GPT on the whole standard library, 15,000 steps of 16 windows of 128 tokens (30.7 million
    tokens: 15 times the gpt recipe's), with the probes of gpt_probe at every tenth of the run."""
    s = gpt_more_setup()
    s["probes"].clear()
    r = one_model(out, device, {**s, "evaluate": lambda m: gpt_probe(s, m)}, gpt_fit, "11_decoder_only", "transformer_lib.classifier.fit",
                  lambda h: s["args"]["steps"] * s["args"]["batch_size"] * s["context"])
    return {**r, "probes": list(s["probes"])}


@functools.cache
def t5_setup() -> dict:
    """Chapter 12's three number tasks (en-de, de-en, en-num on 1,000 numbers, 200 held out), the T5 configuration
    and the arguments of fit (the chapter's T5_STEPS, T5_BATCH, T5_LR), built with the chapter's own functions."""
    from transformer_lib.bert import IGNORE_INDEX
    from transformer_lib.data import CharTokenizer, split_numbers
    from transformer_lib.t5 import T5Config, encode_texts, number_tasks, t5_loss
    from transformer_lib.training import data_sha256

    train_numbers, _, test_numbers = split_numbers(1000, 0, 200, seed=0)
    train_examples, test_examples = number_tasks(train_numbers), number_tasks(test_numbers)
    tokenizer = CharTokenizer.from_texts([text for ex in train_examples + test_examples for text in ex[:2]])
    encode = lambda examples, i, pad: encode_texts(tokenizer, [ex[i] for ex in examples], pad)  # noqa: E731
    train_src, train_labels = encode(train_examples, 0, tokenizer.pad_id), encode(train_examples, 1, IGNORE_INDEX)
    test_src, test_labels = encode(test_examples, 0, tokenizer.pad_id), encode(test_examples, 1, IGNORE_INDEX)
    config = T5Config(vocab_size=len(tokenizer), d_model=64, num_heads=4, d_ff=256, num_layers=2,
                      num_decoder_layers=2, num_buckets=16, max_distance=64, dropout=0.0,
                      pad_id=tokenizer.pad_id, eos_id=tokenizer.eos_id)
    return {"config": config, "train": (train_src, train_labels),
            "data": {"train_src_sha256": data_sha256(train_src.tolist()),
                     "train_labels_sha256": data_sha256(train_labels.tolist()), "chars": tokenizer.chars},
            "args": {"steps": 2400, "batch_size": 32, "lr": 5e-3, "clip_norm": 1.0, "seed": 0},
            "evaluate": lambda m: float(t5_loss(m, (test_src.to(next(m.parameters()).device),
                                                    test_labels.to(next(m.parameters()).device))))}


def t5_fit(s: dict, device: str = "cpu", stop_after: int | None = None, evaluate=None):
    """Chapter 12's training run: seed 0, a fresh T5, fit() on random batches of the three tasks."""
    from transformer_lib.classifier import fit, random_batches
    from transformer_lib.t5 import T5, t5_loss
    from transformer_lib.utils import seed_everything

    a = s["args"]
    seed_everything(a["seed"])
    model = T5(s["config"]).to(device)
    kwargs = dict(lr=a["lr"], clip_norm=a["clip_norm"], evaluate=evaluate, eval_every=a["steps"] // 4,
                  progress=False, stop_after=stop_after)
    batches = random_batches(*s["train"], batch_size=a["batch_size"])
    history = fit(model, t5_loss, batches, a["steps"], **kwargs)
    history["call"] = call_arguments(fit, model, t5_loss, batches, a["steps"],
                                     skip=("model", "loss_fn", "batches", "evaluate"), **kwargs)
    return model, history


def t5_first_steps(k: int) -> list:
    """The losses of the t5 recipe's first k steps."""
    return t5_fit(t5_setup(), stop_after=k)[1]["loss"]


@recipe
def t5(out: str, device: str) -> dict:
    """Chapter 12: one T5 (0.23M parameters) on three number tasks, 2,400 steps of 32 examples; its test
    cross-entropy (the 600 held-out examples) every 600 steps."""
    s = t5_setup()
    src, labels = s["train"]                              # padded lengths: an upper bound
    return one_model(out, device, s, t5_fit, "12_t5_and_vit", "transformer_lib.classifier.fit",
                     lambda h: s["args"]["steps"] * s["args"]["batch_size"] * (src.size(1) + labels.size(1)))


@functools.cache
def vit_setup() -> dict:
    """Chapter 12.2's digits (scikit-learn's 1,797, split 80 / 20), the ViT configuration, the two baselines and
    the arguments of fit (the chapter's VIT_STEPS and train_image_model)."""
    from transformer_lib.training import data_sha256
    from transformer_lib.vit import ViTConfig, digits_split

    train_images, train_targets, test_images, test_targets = digits_split()

    def evaluate(model):                    # test accuracy, the chapter's accuracy()
        device = next(model.parameters()).device
        return (model(test_images.to(device)).argmax(-1).cpu() == test_targets).float().mean().item()

    return {"config": ViTConfig(patch_size=4), "train": (train_images, train_targets),
            "data": {"train_images_sha256": data_sha256(train_images.flatten().tolist()),
                     "train_targets_sha256": data_sha256(train_targets.tolist()),
                     "test_targets_sha256": data_sha256(test_targets.tolist())},
            "args": {"steps": 4000, "batch_size": 64, "max_shift": 1, "lr": 3e-3, "weight_decay": 0.05, "seed": 0},
            "evaluate": evaluate}


def vit_fit(s: dict, name: str = "ViT, patch 4", device: str = "cpu", stop_after=None, evaluate=None):
    """The chapter's training of one image model: seed 0, the model, seed 0 again (train_image_model), fit()."""
    from transformer_lib.classifier import classification_loss, fit
    from transformer_lib.utils import seed_everything
    from transformer_lib.vit import ViT, cnn_baseline, image_batches, mlp_baseline

    a = s["args"]
    seed_everything(a["seed"])
    model = {"ViT, patch 4": lambda: ViT(s["config"]), "CNN": cnn_baseline, "MLP": mlp_baseline}[name]()
    seed_everything(a["seed"])
    kwargs = dict(lr=a["lr"], weight_decay=a["weight_decay"], evaluate=evaluate, eval_every=a["steps"] // 4,
                  progress=False, stop_after=stop_after)
    batches = image_batches(*s["train"], a["batch_size"], a["max_shift"], a["seed"])
    history = fit(model.to(device), classification_loss, batches, a["steps"], **kwargs)
    history["call"] = call_arguments(fit, model, classification_loss, batches, a["steps"],
                                     skip=("model", "loss_fn", "batches", "evaluate"), **kwargs)
    return model, history


def vit_first_steps(k: int) -> list:
    """The losses of the vit recipe's first k steps (the ViT's)."""
    return vit_fit(vit_setup(), stop_after=k)[1]["loss"]


@recipe
def vit(out: str, device: str) -> dict:
    """Chapter 12.2: the ViT (patches of 4 pixels, 0.14M parameters) and the two baselines it is measured against
    (a small CNN, an MLP), 4,000 steps of 64 digits each; one file: the ViT, with the baselines' weights in it."""
    from transformer_lib.training import save_checkpoint

    s = vit_setup()
    start = time.perf_counter()
    models, histories = {}, {}
    for name in ("ViT, patch 4", "CNN", "MLP"):
        models[name], histories[name] = vit_fit(s, name, device, evaluate=s["evaluate"])
    seconds = time.perf_counter() - start
    steps, batch = s["args"]["steps"], s["args"]["batch_size"]
    save_checkpoint(os.path.join(out, "final.pt"), models["ViT, patch 4"].cpu(), step=steps,
                    cnn=models["CNN"].cpu().state_dict(), mlp=models["MLP"].cpu().state_dict())
    h = histories["ViT, patch 4"]
    return {"chapter": "12_t5_and_vit", "function": "transformer_lib.classifier.fit",
            "args": {"config": dataclasses.asdict(s["config"]), **s["args"]}, "data": s["data"],
            "seed": s["args"]["seed"], "steps": steps, "examples_seen": steps * batch, "tokens_seen": steps * batch * 5,
            "seconds": seconds, "call": h["call"], "optimizer": h["optimizer"],
            "history": {k: h[k] for k in ("loss", "lr", "eval_step", "eval")},
            "baselines": {name: {k: histories[name][k] for k in ("loss", "lr", "eval_step", "eval", "optimizer")}
                          for name in ("CNN", "MLP")},
            "seconds_each": {name: histories[name]["seconds"] for name in histories},
            "final": "final.pt", "files": {"final.pt": {"step": steps}}}


VARIANT_NAMES = ("GPT-2 (learned positions)", "GPT-2 (sinusoidal positions)", "Llama (RoPE)")


@functools.cache
def variants_setup() -> dict:
    """Chapter 14's comparison: Chapter 11's data (gpt_setup's ids), the three small decoders it builds
    (gpt2_style("learned"), gpt2_style("sinusoidal"), llama_style()) and the arguments of fit, two seeds each."""
    import torch.nn.functional as F

    from transformer_lib.gpt import GPT, GPTConfig
    from transformer_lib.llama import Llama, LlamaConfig
    from transformer_lib.positional import sinusoidal_encoding

    g = gpt_setup()
    context, steps, width, layers, heads = 128, 250, 64, 2, 4

    def gpt2_style(positions):
        model = GPT(GPTConfig(vocab_size=1024, max_len=512, d_model=width, num_layers=layers, num_heads=heads,
                              d_ff=4 * width, dropout=0.0))
        if positions == "sinusoidal":
            table = sinusoidal_encoding(512, width)
            table *= 0.02 / table.pow(2).mean().sqrt()
            model.position.weight = torch.nn.Parameter(table, requires_grad=False)
        return model

    def llama_style():
        return Llama(LlamaConfig(vocab_size=1024, max_len=512, d_model=width, num_layers=layers, num_heads=heads,
                                 num_kv_heads=heads, d_ff=172, tie_embeddings=True))

    heldout = g["heldout_ids"]
    windows = heldout[:len(heldout) // (context + 1) * (context + 1)].view(-1, context + 1)

    def evaluate(model):                    # mean next-token loss (nats) over held-out windows of `context` tokens
        device = next(model.parameters()).device
        return torch.cat([F.cross_entropy(model(w[:, :-1].to(device)).transpose(1, 2), w[:, 1:].to(device),
                                          reduction="none").flatten().cpu() for w in windows.split(64)]).mean().item()

    builds = dict(zip(VARIANT_NAMES, (lambda: gpt2_style("learned"), lambda: gpt2_style("sinusoidal"), llama_style),
                      strict=True))
    return {"builds": builds, "train_ids": g["train_ids"], "data": g["data"],
            "args": {"context": context, "steps": steps, "width": width, "layers": layers, "heads": heads,
                     "batch_size": 16, "lr": 3e-3, "warmup_steps": steps // 20, "weight_decay": 0.1,
                     "betas": [0.9, 0.95], "clip_norm": 1.0, "seeds": [0, 1]},
            "evaluate": evaluate}


def variants_fit(s: dict, name: str, seed: int, device: str = "cpu", stop_after=None, evaluate=None):
    """One of Chapter 14's runs: seed, the variant, fit() on random windows of Chapter 11's training ids."""
    from transformer_lib.classifier import fit
    from transformer_lib.gpt import lm_loss, random_windows
    from transformer_lib.utils import seed_everything

    a = s["args"]
    seed_everything(seed)
    model = s["builds"][name]().to(device)
    kwargs = dict(steps=a["steps"], lr=a["lr"], warmup_steps=a["warmup_steps"], weight_decay=a["weight_decay"],
                  betas=tuple(a["betas"]), clip_norm=a["clip_norm"], evaluate=evaluate, eval_every=a["steps"],
                  progress=False, stop_after=stop_after)
    batches = random_windows(s["train_ids"], a["context"], batch_size=a["batch_size"], seed=seed)
    history = fit(model, lm_loss, batches, **kwargs)
    history["call"] = call_arguments(fit, model, lm_loss, batches, skip=("model", "loss_fn", "batches", "evaluate"),
                                     **kwargs)
    return model, history


def variants_first_steps(k: int) -> list:
    """The losses of the variants recipe's first k steps (the Llama, seed 0: the run its record keeps as history)."""
    return variants_fit(variants_setup(), "Llama (RoPE)", 0, stop_after=k)[1]["loss"]


@recipe
def variants(out: str, device: str) -> dict:
    """Chapter 14: GPT-2 with learned and with sinusoidal positions and a Llama (RoPE, RMSNorm, SwiGLU), 0.1M
    parameters in the blocks each, 250 steps of 16 windows of 128 tokens, seeds 0 and 1; one file: the Llama of
    seed 0 (the base of the chapter's LoRA) with the other five runs' weights as extra entries."""
    from transformer_lib.training import save_checkpoint

    s = variants_setup()
    start = time.perf_counter()
    models, runs = {}, {}
    for name in VARIANT_NAMES:
        for seed in s["args"]["seeds"]:
            models[name, seed], h = variants_fit(s, name, seed, device, evaluate=s["evaluate"])
            runs[f"{name}, seed {seed}"] = {k: h[k] for k in ("loss", "lr", "eval_step", "eval", "seconds")} | {
                "config": dataclasses.asdict(models[name, seed].config), "optimizer": h["optimizer"]}
            call = h["call"]
    seconds = time.perf_counter() - start
    base = models["Llama (RoPE)", 0]
    extra = {f"{name}, seed {seed}": m.cpu().state_dict() for (name, seed), m in models.items() if m is not base}
    a = s["args"]
    save_checkpoint(os.path.join(out, "final.pt"), base.cpu(), step=a["steps"], **extra)
    first = runs["Llama (RoPE), seed 0"]
    return {"chapter": "14_modern_decoder", "function": "transformer_lib.classifier.fit", "args": a,
            "data": s["data"], "seed": 0, "steps": a["steps"], "examples_seen": 6 * a["steps"] * a["batch_size"],
            "tokens_seen": 6 * a["steps"] * a["batch_size"] * a["context"], "seconds": seconds, "call": call,
            "optimizer": first["optimizer"], "history": {k: first[k] for k in ("loss", "lr", "eval_step", "eval")},
            "runs": runs, "final": "final.pt", "files": {"final.pt": {"step": a["steps"]}}}


CLASSIFIER_RUNS = (("cls", True), ("cls", False), ("mean", True), ("max", True))


@functools.cache
def encoders_setup() -> dict:
    """Chapter 10's data (the six classes of number sequences; unlabelled sequences for MLM; 60 labelled ones) and
    the arguments of its three kinds of runs: supervised classifiers, MLM pre-training, fine-tuning on 60 labels."""
    from transformer_lib.classifier import make_sequences
    from transformer_lib.training import data_sha256

    (X_train, y_train), (X_test, y_test) = make_sequences(6000, seed=1), make_sequences(300, seed=3)
    X_unlabelled, _ = make_sequences(4000, seed=11)
    X_few, y_few = make_sequences(10, seed=12)

    def evaluate(model):                          # test accuracy of a classifier (its inputs as it reads them)
        from transformer_lib.classifier import predict
        x = X_test if type(model).__name__ == "SequenceClassifier" else with_cls(X_test)
        return (predict(model, x) == y_test).float().mean().item()

    return {"train": (X_train, y_train), "unlabelled": X_unlabelled, "few": (X_few, y_few), "evaluate": evaluate,
            "data": {name: data_sha256(t.tolist()) for name, t in (("X_train", X_train), ("y_train", y_train),
                     ("X_unlabelled", X_unlabelled), ("X_few", X_few), ("y_few", y_few), ("y_test", y_test))},
            "args": {"classifier": {"steps": 600, "batch_size": 64, "lr": 5e-3},
                     "mlm": {"steps": 500, "batch_size": 64, "lr": 3e-3, "d_model": 32, "num_layers": 2,
                             "num_heads": 4, "d_ff": 64, "max_len": 33},
                     "fine_tune": {"steps": 150, "batch_size": 32, "lr": 1e-3, "seeds": [0, 1, 2]}}}


def with_cls(tokens):
    """Chapter 10's with_cls: [CLS] in front of every sequence."""
    from transformer_lib.classifier import CLS_ID
    return torch.cat([torch.full_like(tokens[:, :1], CLS_ID), tokens], dim=1)


def encoders_run(s: dict, kind: str, key=None, device: str = "cpu", stop_after=None, evaluate=None, mlm=None):
    """One of Chapter 10's runs: kind "classifier" (key = (pooling, positional)), "mlm", or "fine_tune"
    (key = (seed, pre-trained?); mlm: the pre-trained BertForMaskedLM). -> (model, history)"""
    from transformer_lib.bert import (
        BertClassifier,
        BertConfig,
        BertForMaskedLM,
        mask_tokens,
        token_cross_entropy,
    )
    from transformer_lib.classifier import (
        CLASSES,
        CLS_ID,
        MASK_ID,
        PAD_ID,
        VOCAB_SIZE,
        ClassifierConfig,
        SequenceClassifier,
        classification_loss,
        fit,
        random_batches,
    )
    from transformer_lib.utils import seed_everything

    a = s["args"][kind]
    common = dict(progress=False, stop_after=stop_after, evaluate=evaluate, eval_every=a["steps"])
    if kind == "classifier":
        pooling, positional = key
        seed_everything(0)
        model = SequenceClassifier(ClassifierConfig(VOCAB_SIZE, len(CLASSES), pooling=pooling, positional=positional,
                                                    dropout=0.0)).to(device)
        history = fit(model, classification_loss, random_batches(*s["train"], batch_size=a["batch_size"], seed=0),
                      steps=a["steps"], lr=a["lr"], **common)
    elif kind == "mlm":
        tiny = BertConfig(VOCAB_SIZE, d_model=a["d_model"], num_layers=a["num_layers"], num_heads=a["num_heads"],
                          d_ff=a["d_ff"], max_len=a["max_len"])
        seed_everything(0)
        model = BertForMaskedLM(tiny).to(device)
        masking = torch.Generator().manual_seed(0)

        def mlm_step(m, batch):
            inputs, labels = mask_tokens(batch[0], MASK_ID, VOCAB_SIZE, special_ids=(PAD_ID, CLS_ID),
                                         generator=masking)
            return token_cross_entropy(m(inputs), labels)

        history = fit(model, mlm_step, random_batches(with_cls(s["unlabelled"]), batch_size=a["batch_size"]),
                      steps=a["steps"], lr=a["lr"], **common)
    else:
        seed, pretrained = key
        seed_everything(seed)
        model = BertClassifier(mlm.config, len(CLASSES)).to(device)
        if pretrained:
            model.bert.load_state_dict(mlm.bert.state_dict(), strict=False)      # all but the pooler
        X_few, y_few = s["few"]
        history = fit(model, classification_loss, random_batches(with_cls(X_few), y_few, batch_size=a["batch_size"],
                                                                 seed=seed), steps=a["steps"], lr=a["lr"], **common)
    return model, history


def encoders_first_steps(k: int) -> list:
    """The losses of the encoders recipe's first k steps (the [CLS] classifier with positions)."""
    return encoders_run(encoders_setup(), "classifier", ("cls", True), stop_after=k)[1]["loss"]


@recipe
def encoders(out: str, device: str) -> dict:
    """Chapter 10: four supervised classifiers ([CLS], mean and max pooling with positions, [CLS] without), a tiny
    BERT pre-trained with MLM, and six fine-tunings on 60 labels (three seeds, from scratch and pre-trained); one
    file: the [CLS] classifier with every other run's weights as extra entries."""
    from transformer_lib.training import save_checkpoint

    s = encoders_setup()
    start = time.perf_counter()
    models, runs = {}, {}

    def keep(name, model, h):
        models[name] = model
        runs[name] = {k: h[k] for k in ("loss", "lr", "eval_step", "eval", "seconds")} | {
            "config": dataclasses.asdict(model.config), "optimizer": h["optimizer"]}

    for key in CLASSIFIER_RUNS:
        keep(f"classifier {key[0]}, {'with' if key[1] else 'without'} PE", *encoders_run(s, "classifier", key, device,
                                                                                        evaluate=s["evaluate"]))
    mlm, h = encoders_run(s, "mlm", device=device)
    keep("mlm", mlm, h)
    for seed in s["args"]["fine_tune"]["seeds"]:
        for pretrained in (False, True):
            name = f"fine-tune {'pre-trained' if pretrained else 'from scratch'}, seed {seed}"
            keep(name, *encoders_run(s, "fine_tune", (seed, pretrained), device, evaluate=s["evaluate"], mlm=mlm))
    seconds = time.perf_counter() - start
    first_name = "classifier cls, with PE"
    extra = {name: m.cpu().state_dict() for name, m in models.items() if name != first_name}
    save_checkpoint(os.path.join(out, "final.pt"), models[first_name].cpu(), step=s["args"]["classifier"]["steps"],
                    **extra)
    first = runs[first_name]
    a = s["args"]
    return {"chapter": "10_encoder_only", "function": "transformer_lib.classifier.fit", "args": a, "data": s["data"],
            "seed": 0, "steps": a["classifier"]["steps"],
            "examples_seen": 4 * 600 * 64 + 500 * 64 + 6 * 150 * 32,
            "tokens_seen": 4 * 600 * 64 * 32 + 500 * 64 * 33 + 6 * 150 * 32 * 33,   # padded lengths: an upper bound
            "seconds": seconds,
            "call": {"note": "three kinds of fit calls: see args"}, "optimizer": first["optimizer"],
            "history": {k: first[k] for k in ("loss", "lr", "eval_step", "eval")}, "runs": runs,
            "final": "final.pt", "files": {"final.pt": {"step": a["classifier"]["steps"]}}}


def count_tokens(model, count) -> list:
    """A forward pre-hook on model that adds count(inputs) to the list it returns on every call in training mode
    (the tokens a recipe trains on, where they are made inside the training function); the arithmetic is not
    touched."""
    seen = []
    model.register_forward_pre_hook(lambda m, inputs: seen.append(int(count(*inputs))) if m.training else None)
    return seen


@functools.cache
def reader_setup() -> dict:
    """Chapter 15's question-answering reader (section 15.5): the chapter's 1,000 one-fact and 1,000 two-fact
    test stories (random.Random(1234)), which train_qa never trains on, the BertForQuestionAnswering
    configuration and train_qa's arguments; evaluate: span_loss of the answers' first and last positions on the
    one-fact test stories."""
    import random

    from transformer_lib.applications import QA_VOCAB, make_story, qa_batch, qa_loss
    from transformer_lib.bert import BertConfig
    from transformer_lib.training import data_sha256, inference, model_device, to_device

    test_rng = random.Random(1234)
    tests = {kind: [make_story(test_rng, question=kind) for _ in range(1000)] for kind in ("person", "object")}
    held_out = {(tuple(map(tuple, s)), tuple(q)) for data in tests.values() for s, q, _ in data}
    config = BertConfig(vocab_size=len(QA_VOCAB), d_model=64, num_layers=2, num_heads=4, d_ff=256, max_len=112,
                        dropout=0.0, type_vocab_size=12, init_std=0.2)
    batch = qa_batch(tests["person"])
    return {"config": config, "tests": tests, "held_out": held_out,
            "data": {"test_stories_sha256": data_sha256(tests), "vocab": list(QA_VOCAB)},
            "args": {"steps": 3000, "short_steps": 800, "batch_size": 32, "lr": 1e-3, "two_fact": 0.0, "seed": 0,
                     "sentence_segments": True, "eval_every": 500},
            "evaluate": inference(lambda m: qa_loss(m, to_device(batch, model_device(m))).item())}


def reader_train(s: dict, device: str = "cpu", stop_after: int | None = None, evaluate=None):
    """Chapter 15's training cell: seed_everything(seed), a fresh BertForQuestionAnswering, train_qa."""
    from transformer_lib.applications import QA_ID, train_qa
    from transformer_lib.bert import BertForQuestionAnswering
    from transformer_lib.utils import seed_everything

    a = s["args"]
    seed_everything(a["seed"])
    model = BertForQuestionAnswering(s["config"]).to(device)
    tokens = count_tokens(model, lambda ids, segments: (ids != QA_ID["[PAD]"]).sum())
    kwargs = dict(a, exclude=s["held_out"], evaluate=evaluate, stop_after=stop_after)
    history = train_qa(model, **kwargs)
    history["call"] = call_arguments(train_qa, model, skip=("model", "exclude", "evaluate"), **kwargs)
    history["tokens_seen"] = sum(tokens)
    return model, history


def reader_first_steps(k: int) -> list:
    """The losses of the reader recipe's first k steps (what the chapter and tests/ compare with the record)."""
    return reader_train(reader_setup(), stop_after=k)[1]["loss"]


@recipe
def reader(out: str, device: str) -> dict:
    """Chapter 15: the question-answering reader (BertForQuestionAnswering, d_model 64, 2 layers; 3,000 steps of
    32 fresh one-fact stories with multi-word answer spans, the first 800 on 2-4 sentences)."""
    return one_model(out, device, reader_setup(), reader_train, "15_applications",
                     "transformer_lib.applications.train_qa", lambda h: h["tokens_seen"])


@functools.cache
def docstring_data() -> dict:
    """Chapter 15's summarization data (section 15.6): the shipped docstring pairs split by module and encoded by
    the shipped tokenizer."""
    from transformer_lib.applications import (
        encode_pairs,
        is_test_module,
        load_docstring_bpe,
        shipped,
        shipped_pairs,
    )
    from transformer_lib.training import data_sha256

    pairs = shipped_pairs()
    train = [p for p in pairs if not is_test_module(p["module"])]
    test = [p for p in pairs if is_test_module(p["module"])]
    assert not {p["module"] for p in train} & {p["module"] for p in test}
    bpe = load_docstring_bpe()
    return {"pairs": pairs, "train": train, "test": test, "bpe": bpe,
            "train_tensors": encode_pairs(bpe, train), "test_tensors": encode_pairs(bpe, test),
            "data": {"pairs_sha256": data_sha256(pairs), "test_modules": sorted({p["module"] for p in test}),
                     "tokenizer_sha256": file_sha256(shipped("docstring_bpe.json"))}}


def pretraining_stream(bpe) -> tuple:
    """The pre-training stream (the sources of the modules that are not test modules) and the 64 corrupted windows
    of the test modules' source that measure it (random.Random(1)). Read from the running Python's standard
    library, which must be the book's, DOCSTRING_PYTHON."""
    import platform
    import random

    from transformer_lib.applications import (
        DOCSTRING_PYTHON,
        corrupted_windows,
        encode_stream,
        pretraining_texts,
    )

    if platform.python_version() != DOCSTRING_PYTHON:
        raise RuntimeError(f"the docstring_t5 recipe reads the standard library of Python {DOCSTRING_PYTHON}, "
                           f"this is {platform.python_version()}")
    stream = encode_stream(bpe, pretraining_texts())                  # no test module's file (pretraining_texts)
    heldout = encode_stream(bpe, pretraining_texts(held_out=True))   # the test modules' source
    return stream, corrupted_windows(heldout, 64, 128, random.Random(1))


DOCSTRING_CONFIG = dict(vocab_size=2048, d_model=128, num_heads=4, d_ff=512, num_layers=2, num_decoder_layers=2,
                        pad_id=0, eos_id=1)


@functools.cache
def docstring_t5_setup() -> dict:
    """Chapter 15's pre-trained T5 (section 15.6): span corruption on the standard library's source minus the test
    modules; evaluate: the loss on 64 corrupted windows of the test modules' source (random.Random(1))."""
    from transformer_lib.t5 import T5Config, t5_loss
    from transformer_lib.training import data_sha256, inference, model_device, to_device

    d = docstring_data()
    stream, batch = pretraining_stream(d["bpe"])
    return {"config": T5Config(**DOCSTRING_CONFIG, dropout=0.0), "stream": stream,
            "data": {**d["data"], "stream_sha256": data_sha256(stream), "stream_tokens": len(stream),
                     "heldout_sha256": data_sha256([t.tolist() for t in batch])},
            "args": {"steps": 2000, "batch_size": 32, "length": 128, "lr": 2e-3, "warmup_steps": 200, "seed": 0,
                     "eval_every": 400},
            "evaluate": inference(lambda m: t5_loss(m, to_device(batch, model_device(m))).item())}


def docstring_t5_train(s: dict, device: str = "cpu", stop_after: int | None = None, evaluate=None):
    """Chapter 15's pre-training cell: seed_everything(seed), a fresh T5, pretrain_t5 on the stream."""
    from transformer_lib.applications import PAD, pretrain_t5
    from transformer_lib.t5 import T5
    from transformer_lib.utils import seed_everything

    a = s["args"]
    seed_everything(a["seed"])
    model = T5(s["config"]).to(device)
    tokens = count_tokens(model, lambda src, tgt_in: (src != PAD).sum() + (tgt_in != PAD).sum() + len(tgt_in))
    kwargs = dict(a, evaluate=evaluate, stop_after=stop_after)
    history = pretrain_t5(model, s["stream"], **kwargs)
    history["call"] = call_arguments(pretrain_t5, model, [], skip=("model", "stream", "evaluate"), **kwargs)
    history["tokens_seen"] = sum(tokens)
    return model, history


def docstring_t5_first_steps(k: int) -> list:
    """The losses of the docstring_t5 recipe's first k steps."""
    return docstring_t5_train(docstring_t5_setup(), stop_after=k)[1]["loss"]


@recipe
def docstring_t5(out: str, device: str) -> dict:
    """Chapter 15: a T5 (d_model 128, 2 + 2 layers, 2,048 BPE tokens) pre-trained by span corruption on the
    standard library's source, the test modules left out (2,000 steps of 32 windows of 128 tokens)."""
    return one_model(out, device, docstring_t5_setup(), docstring_t5_train, "15_applications",
                     "transformer_lib.applications.pretrain_t5", lambda h: h["tokens_seen"])


def writer_args(pretrained: bool, seed: int = 0) -> dict:
    """finetune_t5's arguments of Chapter 15's summarizers: the same for the pre-trained and the from-scratch T5."""
    return {"steps": 400, "batch_size": 32, "lr": 3e-3, "warmup_steps": 40, "seed": seed, "eval_every": 100,
            "pretrained": "docstring_t5" if pretrained else None}


@functools.cache
def writer_setup() -> dict:
    """Chapter 15's summarizer (section 15.6): the pre-trained T5 of docstring_t5 fine-tuned on the training pairs
    (body -> summary line); evaluate: the teacher-forced loss of the test pairs' summaries."""
    from transformer_lib.t5 import T5Config, t5_loss
    from transformer_lib.training import data_sha256, inference, model_device, recipe_record, to_device

    d = docstring_data()
    batch = d["test_tensors"]
    return {"config": T5Config(**DOCSTRING_CONFIG, dropout=0.1), "train_tensors": d["train_tensors"],
            "data": {**d["data"], "train_sha256": data_sha256([t.tolist() for t in d["train_tensors"]]),
                     "pretrained_sha256": recipe_record("docstring_t5")["files"]["final.pt"]["sha256"]},
            "args": writer_args(pretrained=True),
            "evaluate": inference(lambda m: t5_loss(m, to_device(batch, model_device(m))).item())}


def summarizer(config, pretrained, seed: int, device: str = "cpu"):
    """seed_everything(seed), a fresh T5(config), and the weights of recipe `pretrained` in it unless None (read
    first: loading builds a model, which must not draw from the seeded generator that dropout then uses)."""
    from transformer_lib.t5 import T5
    from transformer_lib.training import load_recipe
    from transformer_lib.utils import seed_everything

    weights = load_recipe(pretrained)[0].state_dict() if pretrained else None
    seed_everything(seed)
    model = T5(config)
    if weights is not None:
        model.load_state_dict(weights)
    return model.to(device)


def writer_train(s: dict, device: str = "cpu", stop_after: int | None = None, evaluate=None):
    """Chapter 15's fine-tuning cell: summarizer(config, "docstring_t5", seed), then finetune_t5 on the pairs."""
    from transformer_lib.applications import PAD, finetune_t5

    a = dict(s["args"])
    model = summarizer(s["config"], a.pop("pretrained"), a["seed"], device)
    tokens = count_tokens(model, lambda src, tgt_in: (src != PAD).sum() + (tgt_in != PAD).sum() + len(tgt_in))
    kwargs = dict(a, evaluate=evaluate, stop_after=stop_after)
    history = finetune_t5(model, *s["train_tensors"], **kwargs)
    history["call"] = call_arguments(finetune_t5, model, None, None, skip=("model", "src", "labels", "evaluate"),
                                     **kwargs)
    history["tokens_seen"] = sum(tokens)
    return model, history


def writer_first_steps(k: int) -> list:
    """The losses of the writer recipe's first k steps (what the chapter and tests/ compare with the record)."""
    return writer_train(writer_setup(), stop_after=k)[1]["loss"]


@recipe
def writer(out: str, device: str) -> dict:
    """Chapter 15: the summarizer, docstring_t5 fine-tuned on the training docstrings' body -> summary line
    (400 steps of 32 pairs)."""
    return one_model(out, device, writer_setup(), writer_train, "15_applications",
                     "transformer_lib.applications.finetune_t5", lambda h: h["tokens_seen"])


SFT_SPLITS = ("test_prompts", "test_phrasings")


@functools.cache
def sft_setup() -> dict:
    """Chapter 16.2's supervised instruction tuning: Chapter 11's tokenizer (checked to give the gpt recipe's
    training ids), the chat template over it, the generated instructions (three tasks, 2,000 training examples
    each, 60 held-out prompts and 60 prompts in held-out phrasings each), the GPT configuration with the three chat
    tokens, finetune_chat's arguments; evaluate: the masked loss of the held-out prompts' answers."""
    from transformer_lib.assistant import (
        ByteBPE,
        ChatTemplate,
        instruction_data,
        render_examples,
        sft_collate,
        sft_loss,
        tokenizers_vocab_and_merges,
    )
    from transformer_lib.gpt import TRAIN_MODULES, encode_modules, stdlib_sources, train_bpe
    from transformer_lib.training import data_sha256, inference, model_device, recipe_record, to_device

    gpt_record = recipe_record("gpt")
    sources = stdlib_sources(TRAIN_MODULES)
    hf = train_bpe(sources.values(), gpt_record["args"]["config"]["vocab_size"])
    if data_sha256(encode_modules(hf, sources.values()).tolist()) != gpt_record["data"]["train_ids_sha256"]:
        raise RuntimeError("this Python's standard library does not give the gpt recipe's tokenizer: the sft recipe "
                           f"runs on Python {gpt_record['python']}")
    vocab, merges = tokenizers_vocab_and_merges(hf)
    ids = {t: i for i, t in enumerate(vocab)}
    template = ChatTemplate(ByteBPE(vocab, [(ids[a], ids[b]) for a, b in merges], ["<|endoftext|>"]))
    args = {"n_train": 2000, "n_test": 60, "data_seed": 0, "steps": 400, "batch_size": 32, "lr": 1e-3,
            "warmup_steps": 20, "weight_decay": 0.1, "betas": [0.9, 0.95], "clip_norm": 1.0, "eval_every": 100,
            "seeds": [0, 1, 2]}
    data = instruction_data(args["n_train"], args["n_test"], args["data_seed"])
    for _, request, answer in data["train"][:500]:          # ours encodes as tokenizers does (16.1's proof)
        assert template.tok.encode(request) == hf.encode(request).ids and template.tok.encode(answer) == hf.encode(answer).ids
    train = render_examples(template, data["train"])
    test = sft_collate(render_examples(template, data["test_prompts"]), template.end_id)
    config = dataclasses.replace(load_gpt_config(), vocab_size=template.vocab_size)
    return {"config": config, "template": template, "tokenizer": {"vocab": vocab, "merges": [list(m) for m in merges]},
            "instructions": data, "train": train,
            "data": {"tokenizer_sha256": data_sha256([vocab, [list(m) for m in merges]]),
                     "instructions_sha256": {k: data_sha256(v) for k, v in data.items()},
                     "pretrained_sha256": gpt_record["files"]["final.pt"]["sha256"]},
            "args": args,
            "evaluate": inference(lambda m: sft_loss(m, to_device(test, model_device(m))).item())}


def load_gpt_config():
    """The configuration of the gpt recipe's model (Chapter 11's GPT), from its record."""
    from transformer_lib.gpt import GPTConfig
    from transformer_lib.training import recipe_record

    return GPTConfig(**recipe_record("gpt")["args"]["config"])


def sft_model(s: dict, init: str, seed: int):
    """seed_everything(seed), then the model to tune: "pretrained", the gpt recipe's GPT with three rows added for
    the chat tokens (add_chat_rows: the mean of the old rows, no random draw), or "scratch", a fresh GPT of the same
    configuration (GPT-2's random initialisation)."""
    from transformer_lib.assistant import add_chat_rows
    from transformer_lib.gpt import GPT
    from transformer_lib.training import load_recipe
    from transformer_lib.utils import seed_everything

    pretrained = load_recipe("gpt")[0] if init == "pretrained" else None   # read before the seeded draws
    seed_everything(seed)
    if init == "pretrained":
        return add_chat_rows(pretrained, s["config"].vocab_size)
    if init == "scratch":
        return GPT(s["config"])
    raise ValueError(f"init must be 'pretrained' or 'scratch', got {init!r}")


def sft_fit(s: dict, init: str = "pretrained", seed: int = 0, device: str = "cpu", stop_after=None, evaluate=None):
    """One of Chapter 16.2's runs: sft_model(s, init, seed), then finetune_chat on the rendered training examples
    in an order fixed by seed."""
    from transformer_lib.assistant import finetune_chat

    a = s["args"]
    model = sft_model(s, init, seed).to(device)
    kwargs = dict(steps=a["steps"], batch_size=a["batch_size"], lr=a["lr"], warmup_steps=a["warmup_steps"],
                  weight_decay=a["weight_decay"], betas=tuple(a["betas"]), clip_norm=a["clip_norm"], seed=seed,
                  evaluate=evaluate, eval_every=a["eval_every"], stop_after=stop_after)
    history = finetune_chat(model, s["train"], s["template"].end_id, **kwargs)
    history["call"] = call_arguments(finetune_chat, model, [], 0, skip=("model", "examples", "pad_id", "evaluate"),
                                     **kwargs)
    return model, history


def sft_first_steps(k: int) -> list:
    """The losses of the sft recipe's first k steps (the pre-trained GPT, seed 0)."""
    return sft_fit(sft_setup(), stop_after=k)[1]["loss"]


def sft_accuracy(s: dict, model) -> dict:
    """{split: {task: exact match}} of the model's greedy answers on the two held-out sets, and the answers."""
    from transformer_lib.assistant import exact_match

    out = {split: exact_match(model, s["template"], s["instructions"][split]) for split in SFT_SPLITS}
    return {split: {k: v for k, v in r.items() if k != "answers"} for split, r in out.items()}, \
        {split: r["answers"] for split, r in out.items()}


def half_rounded(model):
    """The model with every weight rounded to float16 and back (what a float16 checkpoint holds)."""
    import copy

    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.half().float())
    return rounded


@recipe
def sft(out: str, device: str) -> dict:
    """Chapter 16.2: the gpt recipe's GPT tuned on chat-formatted instructions (reverse or sort a list of words,
    write a number in words; 400 steps of 32 examples), and the same GPT trained from scratch on the same examples
    with the same settings, seeds 0, 1 and 2 each; one file: the tuned GPT of seed 0, with the control of seed 0 and
    the tokenizer as extra entries, each model in float16 where that changes none of its answers on the held-out
    sets (else float32). Every run's accuracy on the held-out sets is in the record."""
    from transformer_lib.training import save_checkpoint

    s = sft_setup()
    a = s["args"]
    start = time.perf_counter()
    before, _ = sft_accuracy(s, sft_model(s, "pretrained", 0))
    runs, kept = {}, {}
    for init in ("pretrained", "scratch"):
        for seed in a["seeds"]:
            name = f"{init}, seed {seed}"
            model, h = sft_fit(s, init, seed, device, evaluate=s["evaluate"])
            model = model.cpu().eval()
            accuracy, answers = sft_accuracy(s, model)
            rounded = half_rounded(model)
            accuracy16, answers16 = sft_accuracy(s, rounded)
            changed = sum(x != y for split in SFT_SPLITS for x, y in zip(answers[split], answers16[split], strict=True))
            runs[name] = {k: h[k] for k in ("loss", "lr", "eval_step", "eval", "seconds")} | {
                "optimizer": h["optimizer"], "accuracy": accuracy, "accuracy_float16": accuracy16,
                "float16_changed_answers": changed, "eval_float16": s["evaluate"](rounded)}
            if seed == 0:         # kept in float16 only where that changes none of its answers
                kept[init], call = (rounded.half() if changed == 0 else model), h["call"]
    seconds = time.perf_counter() - start
    first = runs["pretrained, seed 0"]
    save_checkpoint(os.path.join(out, "final.pt"), kept["pretrained"], step=a["steps"],
                    scratch=kept["scratch"].state_dict(), tokenizer=s["tokenizer"])
    history = {k: first[k] for k in ("loss", "lr", "eval_step", "eval")}
    if kept["pretrained"].token.weight.dtype == torch.float16:          # the last: of the saved weights
        history["eval"] = history["eval"][:-1] + [first["eval_float16"]]
    examples = 6 * a["steps"] * a["batch_size"]
    return {"chapter": "16_assistant", "function": "transformer_lib.assistant.finetune_chat",
            "args": {"config": dataclasses.asdict(s["config"]), **a}, "data": s["data"], "seed": 0,
            "steps": a["steps"], "examples_seen": examples,
            "tokens_seen": round(examples * sum(len(ids) for ids, _ in s["train"]) / len(s["train"])),  # mean length
            "seconds": seconds, "call": call, "optimizer": first["optimizer"], "history": history,
            "history_note": "eval: the masked loss of the held-out prompts' answers, its last entry that of the saved "
                            "weights (float16 where that changes no answer; runs[...]['eval'] holds the float32 "
                            "one); runs[...]['accuracy']: exact match of the float32 weights",
            "before": before, "runs": runs, "final": "final.pt", "files": {"final.pt": {"step": a["steps"]}}}


@functools.cache
def dpo_setup() -> dict:
    """Chapter 16.3's preference tuning: the sft recipe's tuned GPT (seed 0, its file) answers the first 400
    training prompts of each task 4 times at temperature 1 (sampling seed 0); a prompt with a right and a wrong
    answer gives a pair (chosen, rejected). The same on the held-out prompts gives held-out pairs. finetune_dpo's
    arguments; evaluate: the DPO loss of the held-out pairs against the tuned GPT."""
    from transformer_lib.assistant import (
        TASKS,
        dpo_batch_loss,
        dpo_collate,
        frozen_copy,
        preference_pairs,
        render_pairs,
        sample_answers,
    )
    from transformer_lib.training import (
        data_sha256,
        inference,
        load_recipe,
        model_device,
        recipe_record,
        to_device,
    )

    s = sft_setup()
    args = {"prompts_per_task": 400, "n_samples": 4, "temperature": 1.0, "max_new_tokens": 24, "sample_seed": 0,
            "beta": 0.1, "steps": 100, "batch_size": 16, "lr": 1e-5, "warmup_steps": 10, "weight_decay": 0.0,
            "betas": [0.9, 0.95], "clip_norm": 1.0, "eval_every": 50, "seeds": [0, 1, 2]}
    sft = load_recipe("sft")[0].float().eval()
    reference = frozen_copy(sft)
    train = [e for task in TASKS for e in [x for x in s["instructions"]["train"] if x[0] == task][:args["prompts_per_task"]]]
    pairs = {}
    for split, examples in (("train", train), ("test_prompts", s["instructions"]["test_prompts"])):
        samples = sample_answers(sft, s["template"], [q for _, q, _ in examples], args["n_samples"],
                                 args["max_new_tokens"], args["temperature"], args["sample_seed"])
        pairs[split] = preference_pairs(examples, samples)
    held = dpo_collate(render_pairs(s["template"], pairs["test_prompts"]), s["template"].end_id)
    return {"config": s["config"], "template": s["template"], "instructions": s["instructions"], "sft": sft,
            "reference": reference, "pairs": pairs, "train": render_pairs(s["template"], pairs["train"]),
            "held_out": held, "args": args,
            "data": {"sft_sha256": recipe_record("sft")["files"]["final.pt"]["sha256"],
                     "pairs_sha256": {k: data_sha256(v) for k, v in pairs.items()}},
            "evaluate": inference(lambda m: dpo_batch_loss(m, reference, to_device(held, model_device(m)),
                                                           args["beta"])[0].item())}


def dpo_fit(s: dict, seed: int = 0, device: str = "cpu", stop_after=None, evaluate=None):
    """One of Chapter 16.3's runs: a copy of the tuned GPT (the policy) tuned by finetune_dpo against the frozen
    reference on the training pairs, in an order fixed by seed."""
    import copy

    from transformer_lib.assistant import finetune_dpo

    a = s["args"]
    policy = copy.deepcopy(s["sft"]).to(device).train()
    reference = s["reference"].to(device)
    before = {k: v.clone() for k, v in reference.state_dict().items()}
    kwargs = dict(beta=a["beta"], batch_size=a["batch_size"], lr=a["lr"], warmup_steps=a["warmup_steps"],
                  weight_decay=a["weight_decay"], betas=tuple(a["betas"]), clip_norm=a["clip_norm"], seed=seed,
                  evaluate=evaluate, eval_every=a["eval_every"], stop_after=stop_after)
    history = finetune_dpo(policy, reference, s["train"], s["template"].end_id, a["steps"], **kwargs)
    assert all(torch.equal(v, before[k]) for k, v in reference.state_dict().items()), "the reference changed"
    history["call"] = call_arguments(finetune_dpo, policy, reference, [], 0, a["steps"],
                                     skip=("policy", "reference", "pairs", "pad_id", "evaluate"), **kwargs)
    return policy, history


def dpo_first_steps(k: int) -> list:
    """The losses of the dpo recipe's first k steps (seed 0)."""
    return dpo_fit(dpo_setup(), stop_after=k)[1]["loss"]


def dpo_margins(s: dict, model) -> list:
    """The reward margins of the held-out pairs under model (against the reference)."""
    from transformer_lib.assistant import dpo_batch_loss

    with torch.no_grad():
        return dpo_batch_loss(model.eval(), s["reference"], s["held_out"], s["args"]["beta"])[1].tolist()


@recipe
def dpo(out: str, device: str) -> dict:
    """Chapter 16.3: the sft recipe's tuned GPT tuned further by DPO on pairs of its own answers (100 steps of 16
    pairs, seeds 0, 1 and 2); one file: the model of seed 0 (float16 where that changes none of its answers on the
    held-out sets, else float32) and the pairs. Every run's accuracy and held-out margins are in the record."""
    from transformer_lib.training import save_checkpoint

    start = time.perf_counter()
    s = dpo_setup()
    a = s["args"]
    sampled = time.perf_counter() - start
    before, _ = sft_accuracy(s, s["sft"])
    runs = {}
    for seed in a["seeds"]:
        model, h = dpo_fit(s, seed, device, evaluate=s["evaluate"])
        model = model.cpu().eval()
        accuracy, answers = sft_accuracy(s, model)
        rounded = half_rounded(model)
        accuracy16, answers16 = sft_accuracy(s, rounded)
        changed = sum(x != y for split in SFT_SPLITS for x, y in zip(answers[split], answers16[split], strict=True))
        runs[f"seed {seed}"] = {k: h[k] for k in ("loss", "lr", "eval_step", "eval", "seconds", "margins")} | {
            "optimizer": h["optimizer"], "accuracy": accuracy, "accuracy_float16": accuracy16,
            "float16_changed_answers": changed, "eval_float16": s["evaluate"](rounded),
            "held_out_margins": dpo_margins(s, model)}
        if seed == 0:
            kept, call = (rounded.half() if changed == 0 else model), h["call"]
    seconds = time.perf_counter() - start
    first = runs["seed 0"]
    save_checkpoint(os.path.join(out, "final.pt"), kept, step=a["steps"], pairs=s["pairs"])
    history = {k: first[k] for k in ("loss", "lr", "eval_step", "eval")}
    if kept.token.weight.dtype == torch.float16:
        history["eval"] = history["eval"][:-1] + [first["eval_float16"]]
    examples = a["steps"] * a["batch_size"] * 2
    return {"chapter": "16_assistant", "function": "transformer_lib.assistant.finetune_dpo",
            "args": {"config": dataclasses.asdict(s["config"]), **a}, "data": s["data"], "seed": 0,
            "steps": a["steps"], "examples_seen": 3 * examples,
            "tokens_seen": round(3 * a["steps"] * a["batch_size"] * sum(len(c[0]) + len(r[0]) for c, r in s["train"])
                                 / len(s["train"])),
            "seconds": seconds, "sampling_seconds": sampled, "call": call, "optimizer": first["optimizer"],
            "history": history,
            "history_note": "eval: the DPO loss of the held-out pairs, its last entry that of the saved weights "
                            "(float16 where that changes no answer); runs[...]['accuracy']: exact match of the "
                            "float32 weights; held_out_margins: beta x the log-ratio difference of each held-out "
                            "pair, float32 weights",
            "pairs": {k: len(v) for k, v in s["pairs"].items()}, "before": before,
            "before_margins": dpo_margins(s, s["sft"]), "runs": runs, "final": "final.pt",
            "files": {"final.pt": {"step": a["steps"]}}}


SETUPS = {"translator": translator_setup, "gpt": gpt_setup, "gpt_more": gpt_more_setup, "t5": t5_setup, "vit": vit_setup,   # tests/test_recipes.py
          "variants": variants_setup, "encoders": encoders_setup, "reader": reader_setup, "writer": writer_setup,
          "docstring_t5": docstring_t5_setup, "sft": sft_setup, "dpo": dpo_setup}
FIRST_STEPS = {"translator": translator_first_steps, "gpt": gpt_first_steps, "gpt_more": gpt_more_first_steps, "t5": t5_first_steps,
               "vit": vit_first_steps, "variants": variants_first_steps, "encoders": encoders_first_steps,
               "reader": reader_first_steps, "writer": writer_first_steps,
               "docstring_t5": docstring_t5_first_steps, "sft": sft_first_steps,
               "dpo": dpo_first_steps}


def environment() -> dict:
    """What else decides the bits of a run: the code's commit, the versions of what the data and the arithmetic
    come from, PyTorch's CPU kernels and the thread settings."""
    import importlib.metadata as md
    import subprocess

    def version(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    root = os.path.dirname(os.path.abspath(__file__))
    git = lambda *a: subprocess.run(["git", *a], cwd=root, capture_output=True, text=True).stdout.strip()  # noqa: E731
    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "versions": {n: version(n) for n in ("transformer-textbook", "numpy", "num2words", "tokenizers")},
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")}}


def run(name: str, root: str, device: str) -> dict:
    """Train recipe `name` into a temporary folder beside root/<name>/, then replace root/<name>/ and
    root/<name>.json with the new files: an interrupted run leaves the committed ones as they were."""
    out, final = os.path.join(root, f".{name}.partial"), os.path.join(root, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    record = {"recipe": name, "made_by": f"python experiments/recipes.py {name}" +
              (f" --device {device}" if device != "cpu" else ""), **RECIPES[name](out, device)}
    for file, entry in record["files"].items():
        path = os.path.join(out, file)
        entry.update(bytes=os.path.getsize(path), sha256=file_sha256(path))
    record.update(device=device, threads=torch.get_num_threads(), machine=machine(device),
                  torch=torch.__version__, python=platform.python_version(), environment=environment())
    with open(os.path.join(out, "record.json"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(os.path.join(out, "record.json"), os.path.join(root, f"{name}.json.partial"))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(out, final)
    os.replace(os.path.join(root, f"{name}.json.partial"), os.path.join(root, f"{name}.json"))
    return record


def call_arguments(fn, *args, skip=(), **kwargs) -> dict:
    """Every argument of the call fn(*args, **kwargs), defaults filled in (JSON values; tuples as lists), except
    those named in skip (the model, the data, functions): what a record keeps of how the recipe called fn."""
    import inspect

    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    out = {}
    for k, v in bound.arguments.items():
        if k in skip:
            continue
        if not (v is None or isinstance(v, (bool, int, float, str, tuple, list))):
            raise ValueError(f"argument {k} = {v!r} of {fn.__name__} has no JSON form: add it to skip")
        out[k] = list(v) if isinstance(v, tuple) else v
    return out


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", default=sorted(RECIPES), help=f"recipes to train (default: all of "
                        f"{sorted(RECIPES)})")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "transformer_lib",
                                                      "checkpoints"))
    return parser


if __name__ == "__main__":
    args = make_parser().parse_args()
    for name in args.names:
        if name not in RECIPES:
            sys.exit(f"unknown recipe {name!r}: choose from {sorted(RECIPES)}")
    for name in args.names:
        r = run(name, args.out, args.device)
        print(f"{name}: {r['steps']} steps, {r['tokens_seen']:,} tokens, {r['seconds']:.0f} s on {r['machine']['cpu']}"
              f" ({r['threads']} thread(s)); {', '.join(r['files'])}", flush=True)
