"""Chapter 12's image experiments over several seeds: the ViT with each patch size and the two baselines (the small
CNN, the MLP) at the main run's budget, and the fixed shuffle of the patches (ViT with learned positions vs the
small CNN, each as drawn and shuffled).

    .venv/bin/python experiments/vit_seeds.py [--seeds 0 1 2] [--steps 4000] [--shuffle-steps 1000]
        [--json experiments/results/vit_seeds.json]

Every run is Chapter 12's: the same split of scikit-learn's digits, the same random shift, AdamW at 3e-3 with
10 % warm-up and linear decay, weight decay 0.05, batches of 64; the seed sets the initial weights and the order
of the batches. Chapter 12 prints the committed JSON (mean and spread over the seeds) and asserts its claims on it.
Not part of `make test`: about 25 minutes of one CPU thread for three seeds (`make experiments` runs it)."""

import time

import torch
from record import log, seeds_parser, write_results  # experiments/record.py, beside this script

from transformer_lib.classifier import classification_loss, fit
from transformer_lib.utils import seed_everything
from transformer_lib.vit import (
    ViT,
    ViTConfig,
    cnn_baseline,
    digits_split,
    image_batches,
    mlp_baseline,
    shuffle_patches,
)

PATCHES = (2, 4, 8)


def train_and_test(model, data, steps, seed, order=None):
    """Train as Chapter 12 does, seeding again before training (order: shuffle every batch's 2x2 patches, and the
    test digits'); -> test accuracy. Seed 0 of a model built right after seed_everything(0) is the chapter's run."""
    train_x, train_y, test_x, test_y = data
    seed_everything(seed)
    batches = image_batches(train_x, train_y, 64, 1, seed)
    if order is not None:
        batches = ((shuffle_patches(x, order, 2), y) for x, y in batches)
        test_x = shuffle_patches(test_x, order, 2)
    fit(model, classification_loss, batches, steps, lr=3e-3, weight_decay=0.05, progress=False)
    model.eval()
    with torch.no_grad():
        return (model(test_x).argmax(-1) == test_y).float().mean().item()


def make_parser():
    """The script's arguments; their defaults are what the committed results were run with."""
    parser = seeds_parser(__doc__)
    parser.add_argument("--steps", type=int, default=4000, help="the main run's budget (patch table, baselines)")
    parser.add_argument("--shuffle-steps", type=int, default=1000, help="the shuffle test's budget")
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    data = digits_split()
    order = torch.randperm(16, generator=torch.Generator().manual_seed(0))     # Chapter 12's fixed shuffle
    runs = []
    for seed in args.seeds:
        for name, make, steps, shuffled in (
                *((f"ViT, patch {p}", lambda p=p: ViT(ViTConfig(patch_size=p)), args.steps, False) for p in PATCHES),
                ("CNN", cnn_baseline, args.steps, False),
                ("MLP", mlp_baseline, args.steps, False),
                ("ViT, patch 2", lambda: ViT(ViTConfig(patch_size=2)), args.shuffle_steps, False),
                ("ViT, patch 2", lambda: ViT(ViTConfig(patch_size=2)), args.shuffle_steps, True),
                ("CNN", cnn_baseline, args.shuffle_steps, False),
                ("CNN", cnn_baseline, args.shuffle_steps, True)):
            seed_everything(seed)
            start = time.perf_counter()
            accuracy = train_and_test(make(), data, steps, seed, order if shuffled else None)
            log(runs, {"model": name, "steps": steps, "shuffled": shuffled, "seed": seed, "accuracy": accuracy,
                       "seconds": round(time.perf_counter() - start, 1)})
    settings = {"steps": args.steps, "shuffle_steps": args.shuffle_steps, "seeds": args.seeds}
    return write_results("experiments/vit_seeds.py", settings, runs, args.json)


if __name__ == "__main__":
    main()
