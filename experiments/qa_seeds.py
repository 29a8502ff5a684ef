"""Chapter 15's question-answering reader over several seeds: the chapter's recipe (section 15.5) trained with each
seed, exact match on the chapter's held-out one-fact ("where is mary ?") and two-fact ("where is the apple ?")
questions.

    .venv/bin/python experiments/qa_seeds.py [--seeds 0 1 2] [--steps 3000] [--short-steps 800] [--batch 32]
        [--lr 1e-3] [--json transformer_lib/results/qa_seeds.json]

Everything is Chapter 15's: the 1,000 test stories of each kind drawn from random.Random(1234), the
BertForQuestionAnswering of d_model 64, 2 layers, 4 heads, init_std 0.2 and sentence numbers as segment ids,
train_qa's curriculum and schedule, the test stories never trained on. The seed sets the initial weights
(seed_everything) and the training stories (train_qa's seed); seed 0 is the chapter's run. Chapter 15 prints the
committed JSON and asserts its claims on it. Not part of `make test` (about ten minutes of one CPU thread for three
seeds; `make experiments` runs it)."""

import random
import time

from record import log, seeds_parser, write_results  # experiments/record.py, beside this script

from transformer_lib.applications import VOCAB, exact_match, make_story, train_qa
from transformer_lib.bert import BertConfig, BertForQuestionAnswering
from transformer_lib.utils import seed_everything

KINDS = ("person", "object")


def chapter_tests(n: int = 1000):
    """Chapter 15's held-out stories: n of each kind, from random.Random(1234), and the set train_qa excludes."""
    rng = random.Random(1234)
    tests = {kind: [make_story(rng, question=kind) for _ in range(n)] for kind in KINDS}
    held_out = {(tuple(map(tuple, s)), tuple(q)) for data in tests.values() for s, q, _ in data}
    return tests, held_out


def reader(seed: int) -> BertForQuestionAnswering:
    """Chapter 15's untrained reader, its weights drawn after seed_everything(seed)."""
    seed_everything(seed)
    return BertForQuestionAnswering(BertConfig(vocab_size=len(VOCAB), d_model=64, num_layers=2, num_heads=4,
                                               d_ff=256, max_len=80, dropout=0.0, type_vocab_size=12, init_std=0.2))


def make_parser():
    """The script's arguments; their defaults are what the committed results were run with."""
    parser = seeds_parser(__doc__)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--short-steps", type=int, default=800, help="the curriculum's steps on 2-4 sentences")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--test-size", type=int, default=1000, help="held-out stories of each kind")
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    tests, held_out = chapter_tests(args.test_size)
    runs = []
    for seed in args.seeds:
        model = reader(seed)
        start = time.perf_counter()
        train_qa(model, steps=args.steps, short_steps=args.short_steps, batch_size=args.batch, lr=args.lr,
                 seed=seed, exclude=held_out)
        seconds = round(time.perf_counter() - start, 1)
        log(runs, {"seed": seed, **{kind: exact_match(model, tests[kind]) for kind in KINDS}, "seconds": seconds})
    settings = {"steps": args.steps, "short_steps": args.short_steps, "batch": args.batch, "lr": args.lr,
                "test_size": args.test_size, "seeds": args.seeds}
    return write_results("experiments/qa_seeds.py", settings, runs, args.json)


if __name__ == "__main__":
    main()
