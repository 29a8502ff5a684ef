"""Chapter 15's question-answering reader: which of its recipe's choices matter, over several seeds. Each
condition changes one thing of the chapter's recipe (section 15.5) and trains with each seed; every run is scored
with SQuAD's exact match and F1 on the chapter's held-out one-fact ("where is mary ?") and two-fact ("where is
the apple ?") stories.

    .venv/bin/python experiments/qa_ablation.py [--seeds 0 1 2] [--steps 3000] [--short-steps 800] [--batch 32]
        [--lr 1e-3] [--conditions ...] [--json transformer_lib/results/qa_ablation.json]

Conditions: "recipe" (init_std 0.2, the curriculum, sentence numbers as segment ids, one-fact questions only;
seed 0 is the chapter's reader), "init 0.02" (BERT's initialisation), "no curriculum" (short_steps 0),
"two segments" (BERT's segments 0 and 1), "two-fact mix" (half the training questions two-fact) and "two-fact mix,
4 layers". Everything else is Chapter 15's: the 1,000 test stories of each kind from random.Random(1234), never
trained on, the BertForQuestionAnswering of d_model 64, 4 heads, train_qa's schedule. The seed sets the initial
weights (seed_everything) and the training stories (train_qa's seed). Chapter 15 prints the committed JSON and
asserts its claims on it. Not part of `make test` (the committed grid: 18 runs, 58 minutes of wall time on one
thread of a shared two-core machine, about 45 alone; `make experiments` runs it)."""

import random
import time

from record import log, seeds_parser, write_results  # experiments/record.py, beside this script

from transformer_lib.applications import QA_VOCAB, make_story, predict_answers, squad_scores, train_qa
from transformer_lib.bert import BertConfig, BertForQuestionAnswering
from transformer_lib.utils import seed_everything

KINDS = ("person", "object")
CONDITIONS = {            # what each condition changes: (BertConfig's, train_qa's)
    "recipe": ({}, {}),
    "init 0.02": ({"init_std": 0.02}, {}),
    "no curriculum": ({}, {"short_steps": 0}),
    "two segments": ({}, {"sentence_segments": False}),
    "two-fact mix": ({}, {"two_fact": 0.5}),
    "two-fact mix, 4 layers": ({"num_layers": 4}, {"two_fact": 0.5}),
}


def chapter_tests(n: int = 1000):
    """Chapter 15's held-out stories: n of each kind, from random.Random(1234), and the set train_qa excludes."""
    rng = random.Random(1234)
    tests = {kind: [make_story(rng, question=kind) for _ in range(n)] for kind in KINDS}
    held_out = {(tuple(map(tuple, s)), tuple(q)) for data in tests.values() for s, q, _ in data}
    return tests, held_out


def reader_config(**changes) -> BertConfig:
    """Chapter 15's reader configuration, with changes."""
    return BertConfig(**{**dict(vocab_size=len(QA_VOCAB), d_model=64, num_layers=2, num_heads=4, d_ff=256,
                                max_len=112, dropout=0.0, type_vocab_size=12, init_std=0.2), **changes})


def make_parser():
    """The script's arguments; their defaults are what the committed results were run with."""
    parser = seeds_parser(__doc__)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--short-steps", type=int, default=800, help="the curriculum's steps on 2-4 sentences")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--test-size", type=int, default=1000, help="held-out stories of each kind")
    parser.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    tests, held_out = chapter_tests(args.test_size)
    runs = []
    settings = {"steps": args.steps, "short_steps": args.short_steps, "batch": args.batch, "lr": args.lr,
                "test_size": args.test_size, "seeds": args.seeds, "conditions": args.conditions}
    for name in args.conditions:
        config_changes, train_changes = CONDITIONS[name]
        for seed in args.seeds:
            seed_everything(seed)
            model = BertForQuestionAnswering(reader_config(**config_changes))
            kwargs = dict(steps=args.steps, short_steps=args.short_steps, batch_size=args.batch, lr=args.lr,
                          seed=seed, exclude=held_out) | train_changes
            start = time.perf_counter()
            train_qa(model, **kwargs)
            seconds = round(time.perf_counter() - start, 1)
            segments = kwargs.get("sentence_segments", True)
            scores = {kind: squad_scores(predict_answers(model, tests[kind], segments), tests[kind]) for kind in KINDS}
            log(runs, {"condition": name, "seed": seed, **{f"{kind} {metric}": scores[kind][metric]
                                                            for kind in KINDS for metric in ("exact", "f1")},
                       "steps": kwargs["steps"], "short_steps": kwargs["short_steps"],
                       "changes": {**config_changes, **train_changes}, "seconds": seconds})
            write_results("experiments/qa_ablation.py", settings, runs, args.json)   # after every run
    return write_results("experiments/qa_ablation.py", settings, runs, args.json)


if __name__ == "__main__":
    main()
