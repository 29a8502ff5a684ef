"""Summarising a story's final state with the book's T5, trained from scratch, scored with ROUGE.

The story: 4-10 bAbI-style sentences (stories.tell_story). The summary: one sentence that lists every person,
in order of first appearance, with their final place and what they carry, e.g.
    "mary is in the kitchen with the apple , john is in the garden ."
Baselines: the story's first sentence (lead) and its last sentence.
Run: OMP_NUM_THREADS=1 python summ.py --seed 0
"""
import argparse
import random
import time

import stories
import torch
import torch.nn.functional as F
from rouge_score import rouge_scorer

from transformer_lib.bert import IGNORE_INDEX
from transformer_lib.t5 import T5, T5Config, shift_right, t5_generate
from transformer_lib.training import warmup_linear_scheduler

VOCAB = stories.VOCAB + ("in", "with", "and", ",") + tuple(f"#{k}" for k in range(1, 11))     # the story words and the summary's few new ones
ID = {w: i for i, w in enumerate(VOCAB)}
NUMBERED = False
PAD, EOS = ID["[PAD]"], ID["[SEP]"]                     # T5: pad is also the decoder's start token


def summarise(where, holder):
    """The reference summary of a final state, as a list of words."""
    parts = []
    for person, (place, _) in where.items():            # dicts keep insertion order: first appearance
        part = [person, "is", "in", "the", place]
        carried = [o for o in stories.OBJECTS if holder.get(o) == person]
        for k, o in enumerate(carried):
            part += ["with" if k == 0 else "and", "the", o]
        parts.append(part)
    return [w for k, part in enumerate(parts) for w in ([","] if k else []) + part] + ["."]


def make_example(rng, min_sentences=4, max_sentences=10):
    """-> (story words, summary words, sentences)."""
    sentences, where, holder, _ = stories.tell_story(rng, min_sentences, max_sentences)
    if NUMBERED:                                         # "#3" before the 3rd sentence (bAbI numbers its lines)
        return [w for k, s in enumerate(sentences) for w in [f"#{k + 1}", *s]], summarise(where, holder), sentences
    return [w for s in sentences for w in s], summarise(where, holder), sentences


def to_batch(examples):
    """Story ids + EOS, padded with PAD -> src (B, S); summary ids + EOS, padded with IGNORE_INDEX -> labels."""
    src = [[ID[w] for w in story] + [EOS] for story, _, _ in examples]
    tgt = [[ID[w] for w in summary] + [EOS] for _, summary, _ in examples]
    S, T = max(map(len, src)), max(map(len, tgt))
    src = torch.tensor([x + [PAD] * (S - len(x)) for x in src])
    labels = torch.tensor([y + [IGNORE_INDEX] * (T - len(y)) for y in tgt])
    return src, labels


def train(model, rng, steps, batch_size, lr, warmup, exclude, short_steps=0):
    """AdamW on fresh random stories every step (skipping the test stories); lr: linear warm-up, linear decay."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    scheduler = warmup_linear_scheduler(optimizer, steps, warmup)
    model.train()
    batches = []
    for step in range(steps):
        if not batches:             # 16 batches at a time, of stories of similar length: less padding
            examples = []
            while len(examples) < 16 * batch_size:
                ex = make_example(rng, 2, 4) if step < short_steps else make_example(rng)
                if tuple(ex[0]) not in exclude:
                    examples.append(ex)
            examples.sort(key=lambda ex: len(ex[0]))
            batches = [examples[k:k + batch_size] for k in range(0, len(examples), batch_size)]
            rng.shuffle(batches)
        src, labels = to_batch(batches.pop())
        logits = model(src, shift_right(labels, PAD, PAD))               # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if step % 300 == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {loss.item():.4f}", flush=True)


def decode(ids):
    words = []
    for i in ids.tolist():
        if i == EOS:
            break
        words.append(VOCAB[i])
    return words


@torch.no_grad()
def summaries(model, test, batch_size=500):
    out = []
    for k in range(0, len(test), batch_size):
        src, labels = to_batch(test[k:k + batch_size])
        out += [decode(row) for row in t5_generate(model, src, max_new_tokens=labels.size(1) + 5)]
    return out


def rouge(predictions, references):
    """Mean ROUGE-1/2/L F1 (in %) of word lists, with rouge-score's standard tokeniser (it drops , and .)."""
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    totals = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    for p, r in zip(predictions, references, strict=True):
        for name, score in scorer.score(" ".join(r), " ".join(p)).items():   # score(target, prediction)
            totals[name] += score.fmeasure
    return {name: 100 * t / len(references) for name, t in totals.items()}


def errors(predictions, references):
    """Which part of a summary is wrong: per reference clause ("mary is in the kitchen with the apple"), is the
    person, the place or the list of objects wrong (or the clause missing); and how many summaries add a clause."""
    counts = {"clauses": 0, "person": 0, "place": 0, "objects": 0, "missing": 0, "extra clause": 0}
    for p, r in zip(predictions, references, strict=True):
        p, r = " ".join(p).rstrip(" .").split(" , "), " ".join(r).rstrip(" .").split(" , ")
        counts["extra clause"] += len(p) > len(r)
        for k, ref in enumerate(r):
            counts["clauses"] += 1
            if k >= len(p):
                counts["missing"] += 1
                continue
            pw, rw = p[k].split(), ref.split()
            counts["person"] += pw[:1] != rw[:1]
            counts["place"] += pw[4:5] != rw[4:5]
            counts["objects"] += pw[5:] != rw[5:]
    return counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--d_model", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2, help="encoder layers")
    ap.add_argument("--dec_layers", type=int, default=2, help="decoder layers")
    ap.add_argument("--d_ff", type=int, default=0, help="0: 4 * d_model")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--short_steps", type=int, default=0, help="curriculum: stories of 2-4 sentences first")
    ap.add_argument("--n_test", type=int, default=500)
    ap.add_argument("--show", type=int, default=5, help="how many wrong summaries to print")
    ap.add_argument("--numbered", action="store_true", help="a sentence-number token before each sentence")
    args = ap.parse_args()
    global NUMBERED
    NUMBERED = args.numbered

    torch.manual_seed(args.seed)
    test_rng = random.Random(1_000_000)              # the held-out stories: one seed, not a training seed
    test = [make_example(test_rng) for _ in range(args.n_test)]
    exclude = {tuple(story) for story, _, _ in test}
    references = [summary for _, summary, _ in test]

    config = T5Config(vocab_size=len(VOCAB), d_model=args.d_model, num_heads=args.heads,
                      d_ff=args.d_ff or 4 * args.d_model, num_layers=args.layers, num_decoder_layers=args.dec_layers,
                      dropout=0.0, pad_id=PAD, eos_id=EOS)
    model = T5(config)
    print(f"{sum(p.numel() for p in model.parameters()):,} parameters")

    t0 = time.perf_counter()
    train(model, random.Random(args.seed), args.steps, args.batch, args.lr, args.warmup, exclude, args.short_steps)
    train_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    predictions = summaries(model, test)
    scores = rouge(predictions, references)
    eval_s = time.perf_counter() - t0

    print(f"{'':14s} {'R-1':>6s} {'R-2':>6s} {'R-L':>6s} {'exact':>6s}")
    for name, pred in (("T5", predictions), ("lead sentence", [sentences[0] for _, _, sentences in test]),
                       ("last sentence", [sentences[-1] for _, _, sentences in test])):
        s = scores if name == "T5" else rouge(pred, references)
        exact = 100 * sum(p == r for p, r in zip(pred, references, strict=True)) / len(test)
        print(f"{name:14s} {s['rouge1']:6.2f} {s['rouge2']:6.2f} {s['rougeL']:6.2f} {exact:6.1f}")
    print(f"training {train_s:.1f} s, evaluation (decoding + ROUGE) {eval_s:.1f} s")
    print("T5's errors:", errors(predictions, references))
    failed = [(t, p) for t, p in zip(test, predictions, strict=True) if p != t[1]]
    for (story, summary, _), p in failed[:args.show]:
        print("story:    ", " ".join(story), "\nreference:", " ".join(summary), "\nT5:       ", " ".join(p))

if __name__ == "__main__":
    main()
