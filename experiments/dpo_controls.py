"""Chapter 16.3's controls for DPO: its learning rate and beta chosen on validation prompts, and an "extra SFT" arm
(the same steps of plain supervised tuning on the chosen answers of the same pairs), three seeds each.

    .venv/bin/python experiments/dpo_controls.py [--seeds 0 1 2] [--json transformer_lib/results/dpo_controls.json]

The pairs are the dpo recipe's (experiments/recipes.py dpo_setup: the sft recipe's tuned GPT samples 4 answers at
temperature 1 to the first 400 training prompts of each task; a prompt with a right and a wrong answer gives a
pair). The choice: a fifth of the training pairs (drawn with random.Random(0), whole prompts) are held out as
validation pairs; each arm trains on the other four fifths with seed --seeds[0] at each point of its grid (DPO:
the recipe's lr 1e-5 and beta 0.1, lr 1e-4, beta 0.5; extra SFT: lr 1e-5 and 1e-4), and the point whose greedy
answers to the validation prompts are right most often (mean over the three tasks; ties: the smaller change, the
grid's first) wins. The held-out test prompts and phrasings play no part in it. Then each arm trains on all the
training pairs at its chosen point, seeds --seeds, and answers the two held-out test sets as section 16.2 measures
them (exact_match). Every run: the recipe's 100 steps of 16 pairs (extra SFT: 16 chosen answers), AdamW with the
recipe's warm-up, decay, betas, no weight decay and clipping; the seed sets the order of the batches. Chapter 16
prints the committed JSON and asserts its claims on it."""

import copy
import random
import time

import torch
from recipes import SFT_SPLITS, dpo_setup, sft_accuracy
from record import log, seeds_parser, write_results  # experiments/record.py, beside this script

from transformer_lib.assistant import exact_match, finetune_chat, finetune_dpo, render_examples, render_pairs
from transformer_lib.training import data_sha256

GRID = {"DPO": ({"lr": 1e-5, "beta": 0.1}, {"lr": 1e-4, "beta": 0.1}, {"lr": 1e-5, "beta": 0.5}),
        "extra SFT": ({"lr": 1e-5}, {"lr": 1e-4})}


def train_arm(s, arm, point, pairs, seed):
    """A copy of the tuned GPT tuned by one arm at one grid point on pairs [(task, request, chosen, rejected)]."""
    a = s["args"]
    model = copy.deepcopy(s["sft"]).train()
    common = dict(batch_size=a["batch_size"], lr=point["lr"], warmup_steps=a["warmup_steps"],
                  weight_decay=a["weight_decay"], betas=tuple(a["betas"]), clip_norm=a["clip_norm"], seed=seed)
    end = s["template"].end_id
    if arm == "DPO":
        history = finetune_dpo(model, s["reference"], render_pairs(s["template"], pairs), end, a["steps"],
                               beta=point["beta"], **common)
    else:
        chosen = render_examples(s["template"], [(task, q, c) for task, q, c, _ in pairs])
        history = finetune_chat(model, chosen, end, a["steps"], **common)
    return model.eval(), history


def mean_exact(result) -> float:
    return sum(v for k, v in result.items() if k != "answers") / (len(result) - 1)


def main(argv=None):
    args = seeds_parser(__doc__).parse_args(argv)
    torch.set_num_threads(1)
    start, cpu = time.perf_counter(), time.process_time()
    s = dpo_setup()
    pairs = s["pairs"]["train"]
    prompts = sorted({q for _, q, _, _ in pairs})
    held = set(random.Random(0).sample(prompts, len(prompts) // 5))
    fit_pairs = [p for p in pairs if p[1] not in held]
    val_pairs = [p for p in pairs if p[1] in held]
    val_examples = [(task, q, c) for task, q, c, _ in val_pairs]    # the chosen answer is the right one
    before_val = exact_match(s["sft"], s["template"], val_examples)     # the tuned model, before either arm
    grid, chosen, runs = [], {}, []
    for arm, points in GRID.items():
        tried = []
        for point in points:
            t0 = time.perf_counter()
            model, history = train_arm(s, arm, point, fit_pairs, args.seeds[0])
            result = exact_match(model, s["template"], val_examples)
            run = {"arm": arm, **point, "seed": args.seeds[0], "val_exact": {k: v for k, v in result.items()
                                                                             if k != "answers"},
                   "val_mean": round(mean_exact(result), 4), "loss_first": round(history["loss"][0], 4),
                   "loss_last10": round(sum(history["loss"][-10:]) / 10, 4),
                   "seconds": round(time.perf_counter() - t0, 1)}
            log(grid, run)
            tried.append(run)
        best = max(tried, key=lambda r: r["val_mean"])      # max keeps the first of equals: the grid's order
        chosen[arm] = {k: best[k] for k in GRID[arm][0]}
        for seed in args.seeds:
            t0 = time.perf_counter()
            model, history = train_arm(s, arm, chosen[arm], pairs, seed)
            accuracy, _ = sft_accuracy(s, model)
            log(runs, {"arm": arm, **chosen[arm], "seed": seed, "accuracy": accuracy,
                       "loss_first": round(history["loss"][0], 4),
                       "loss_last10": round(sum(history["loss"][-10:]) / 10, 4),
                       "seconds": round(time.perf_counter() - t0, 1)})
    before, _ = sft_accuracy(s, s["sft"])
    a = s["args"]
    settings = {"steps": a["steps"], "batch_size": a["batch_size"], "warmup_steps": a["warmup_steps"],
                "seeds": args.seeds, "grid_points": GRID, "pairs": len(pairs), "fit_pairs": len(fit_pairs),
                "val_pairs": len(val_pairs), "val_prompts": len(held),
                "val_before": {k: v for k, v in before_val.items() if k != "answers"},
                "val_before_mean": round(mean_exact(before_val), 4), "val_sha256": data_sha256(sorted(held)),
                "pairs_sha256": s["data"]["pairs_sha256"], "splits": list(SFT_SPLITS), "before": before,
                "grid": grid, "chosen": chosen, "seconds": round(time.perf_counter() - start),
                "cpu_seconds": round(time.process_time() - cpu)}
    return write_results("experiments/dpo_controls.py", settings, runs, args.json)


if __name__ == "__main__":
    main()
