"""DRAFT (not part of the book yet): extractive question answering on bAbI-style stories with the book's BERT
(BertForQuestionAnswering, Chapter 10), trained from scratch. See README.md for the recipe and the numbers.

    OMP_NUM_THREADS=1 .venv/bin/python drafts/applications/qa.py --seed 1                       # the recipe
    OMP_NUM_THREADS=1 .venv/bin/python drafts/applications/qa.py --seed 1 --init-std 0.02        # BERT's init
    OMP_NUM_THREADS=1 .venv/bin/python drafts/applications/qa.py --seed 1 --story-segments       # segments 0/1
"""
import argparse
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
import stories as S  # noqa: E402

from transformer_lib.bert import BertConfig, BertForQuestionAnswering  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--steps", type=int, default=3000)
ap.add_argument("--short-steps", type=int, default=800, help="curriculum: stories of 2-4 sentences first")
ap.add_argument("--short-frac", type=float, default=1.0, help="share of short stories while step < short-steps")
ap.add_argument("--lr", type=float, default=1e-3)
ap.add_argument("--layers", type=int, default=2)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--init-std", type=float, default=0.2)
ap.add_argument("--story-segments", action="store_true", help="segment 1 for the whole story (BERT's default)")
ap.add_argument("--two-fact", type=float, default=0.0, help="fraction of 'where is the apple ?' questions")
a = ap.parse_args()
sentence_segments = not a.story_segments

torch.manual_seed(a.seed)
rng = random.Random(a.seed)
test_rng = random.Random(1234)                          # one test set for every run
tests = {q: [S.make_story(test_rng, question=q) for _ in range(1000)] for q in ("person", "object")}
held_out = {(tuple(map(tuple, s)), tuple(q)) for d in tests.values() for s, q, _ in d}

config = BertConfig(vocab_size=len(S.VOCAB), d_model=64, num_layers=a.layers, num_heads=4, d_ff=256, max_len=80,
                    dropout=0.0, type_vocab_size=12, init_std=a.init_std)
model = BertForQuestionAnswering(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr)
hold = int(0.8 * a.steps)                               # constant lr, then linear decay to 0 over the last 20 %
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (a.steps - i) / (a.steps - hold)))


def story(step):
    q = "object" if rng.random() < a.two_fact else "person"
    while True:
        short = step < a.short_steps and rng.random() < a.short_frac
        s = S.make_story(rng, 2, 4, question=q) if short else S.make_story(rng, question=q)
        if (tuple(map(tuple, s[0])), tuple(s[1])) not in held_out:
            return s


@torch.no_grad()
def exact_match(data):
    """The share of questions whose predicted start token is the answer's word (answers are one word)."""
    model.eval()
    tokens, segments, answers = S.batch(data, sentence_segments)
    start = model(tokens, segments)[..., 0].masked_fill(segments == 0, float("-inf"))
    start = start.masked_fill((tokens == S.ID["[SEP]"]) | (tokens == 0), float("-inf")).argmax(-1)
    model.train()
    return (tokens.gather(1, start[:, None]) == tokens.gather(1, answers[:, None])).float().mean().item()


t0 = time.time()
for step in range(a.steps):
    tokens, segments, answers = S.batch([story(step) for _ in range(a.batch)], sentence_segments)
    start = model(tokens, segments)[..., 0].masked_fill(segments == 0, float("-inf"))    # only story tokens
    loss = F.cross_entropy(start, answers)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    if (step + 1) % 500 == 0:
        print(f"step {step + 1}: loss {loss.item():.3f}, one-fact {exact_match(tests['person']):.3f}, "
              f"two-fact {exact_match(tests['object']):.3f} ({time.time() - t0:.0f} s)", flush=True)
print(f"final: one-fact {exact_match(tests['person']):.3f}, two-fact {exact_match(tests['object']):.3f}, "
      f"training {time.time() - t0:.0f} s")
