"""Chapter 15's summarizers over several seeds: the T5 pre-trained by span corruption (recipe docstring_t5) and
fine-tuned on the docstring pairs, against the same T5 trained on the pairs alone (from scratch); ROUGE-1/2/L and
exact match of their greedy summaries of the test modules' docstrings.

    .venv/bin/python experiments/summarize_seeds.py [--seeds 0 1 2] [--steps 400] [--json transformer_lib/results/summarize_seeds.json]

Everything is Chapter 15's (experiments/recipes.py's writer recipe): the shipped pairs split by module, the shipped
tokenizer, the T5 of d_model 128 with 2 + 2 layers, finetune_t5's arguments; only the starting weights differ
(docstring_t5's checkpoint, or a fresh initialisation). The seed sets the initial weights where they are not
pre-trained, dropout and the order of the batches; the pre-trained run of seed 0 is the writer recipe's. Chapter 15
prints the committed JSON and asserts its claims on it. Not part of `make test` (about twenty minutes of one CPU
thread; `make experiments` runs it)."""

import importlib.util
import os
import time

from record import log, seeds_parser, write_results  # experiments/record.py, beside this script

from transformer_lib.applications import finetune_t5, summarize, summary_scores
from transformer_lib.t5 import T5Config, t5_loss
from transformer_lib.training import inference


def recipes():
    """experiments/recipes.py, imported from beside this script (its data and arguments are the chapter's)."""
    spec = importlib.util.spec_from_file_location("recipes", os.path.join(os.path.dirname(__file__), "recipes.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_parser():
    """The script's arguments; their defaults are what the committed results were run with."""
    parser = seeds_parser(__doc__)
    parser.add_argument("--steps", type=int, default=recipes().writer_args(True)["steps"],
                        help="fine-tuning steps (default: the writer recipe's)")
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    r = recipes()
    d = r.docstring_data()
    (src, labels), references = d["test_tensors"], [p["summary"] for p in d["test"]]
    config = T5Config(**r.DOCSTRING_CONFIG, dropout=0.1)
    runs = []
    for seed in args.seeds:
        for pretrained in (True, False):
            a = {**r.writer_args(pretrained, seed), "steps": args.steps}
            a["warmup_steps"] = min(a["warmup_steps"], max(1, args.steps // 10))   # the recipe's 40 of 400 steps
            model = r.summarizer(config, a.pop("pretrained"), seed)
            start = time.perf_counter()
            finetune_t5(model, *d["train_tensors"], **a)
            seconds = round(time.perf_counter() - start, 1)
            predictions = summarize(model, d["bpe"], src)
            loss = inference(lambda m: t5_loss(m, (src, labels)).item())(model)
            log(runs, {"seed": seed, "pretrained": pretrained, "test_loss": loss,
                       **summary_scores(predictions, references), "seconds": seconds})
    settings = {"finetune": {k: v for k, v in a.items() if k != "seed"},
                "config": {**r.DOCSTRING_CONFIG, "dropout": 0.1}, "test_pairs": len(references),
                "train_pairs": len(d["train"]), "pairs_sha256": d["data"]["pairs_sha256"], "seeds": args.seeds}
    return write_results("experiments/summarize_seeds.py", settings, runs, args.json)


if __name__ == "__main__":
    main()
