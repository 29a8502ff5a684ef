"""Chapter 12's image experiments over several seeds: the ViT with each patch size and the two baselines (the small
CNN, the MLP) at the main run's budget, and the fixed shuffle of the patches (ViT with learned positions vs the
small CNN, each as drawn and shuffled).

    .venv/bin/python experiments/vit_seeds.py [--seeds 0 1 2] [--steps 4000] [--shuffle-steps 1000]
        [--json experiments/results/vit_seeds.json]

Every run is Chapter 12's: the same split of scikit-learn's digits, the same random shift, AdamW at 3e-3 with
10 % warm-up and linear decay, weight decay 0.05, batches of 64; the seed sets the initial weights and the order
of the batches. Chapter 12 prints the committed JSON (mean and spread over the seeds) and asserts its claims on it.
Not part of `make test`: about 25 minutes of one CPU thread for three seeds (`make experiments` runs it)."""

import argparse
import time

import torch
import torch.nn as nn
from record import log, write_results  # experiments/record.py, beside this script
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from transformer_lib.classifier import classification_loss, fit
from transformer_lib.utils import seed_everything
from transformer_lib.vit import ViT, ViTConfig, image_batches, patchify, unpatchify

PATCHES = (2, 4, 8)


def digits_split():
    """Chapter 12's split: 1,437 training and 360 test digits (80/20, stratified, random_state=0)."""
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16      # (1797, 1, 8, 8) in [0, 1]
    targets = torch.tensor(digits.target)
    train, test = train_test_split(range(len(targets)), test_size=0.2, stratify=targets.numpy(), random_state=0)
    return images[train], targets[train], images[test], targets[test]


def small_cnn():
    """Chapter 12's baseline: two 3x3 convolutions, a max-pool and a linear layer."""
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 4 * 4, 10))


def mlp():
    """Chapter 12's other baseline: an MLP on the 64 pixels."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))


def shuffle_patches(images, order, patch_size):
    """Patch i of the result is patch order[i] of the input (Chapter 12's fixed shuffle)."""
    return unpatchify(patchify(images, patch_size)[:, order], patch_size, images.size(-2), images.size(-1))


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=4000, help="the main run's budget (patch table, baselines)")
    parser.add_argument("--shuffle-steps", type=int, default=1000, help="the shuffle test's budget")
    parser.add_argument("--json", default=None, help="write the results here")
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    data = digits_split()
    order = torch.randperm(16, generator=torch.Generator().manual_seed(0))     # Chapter 12's fixed shuffle
    runs = []
    for seed in args.seeds:
        for name, make, steps, shuffled in (
                *((f"ViT, patch {p}", lambda p=p: ViT(ViTConfig(patch_size=p)), args.steps, False) for p in PATCHES),
                ("CNN", small_cnn, args.steps, False),
                ("MLP", mlp, args.steps, False),
                ("ViT, patch 2", lambda: ViT(ViTConfig(patch_size=2)), args.shuffle_steps, False),
                ("ViT, patch 2", lambda: ViT(ViTConfig(patch_size=2)), args.shuffle_steps, True),
                ("CNN", small_cnn, args.shuffle_steps, False),
                ("CNN", small_cnn, args.shuffle_steps, True)):
            seed_everything(seed)
            start = time.perf_counter()
            accuracy = train_and_test(make(), data, steps, seed, order if shuffled else None)
            log(runs, {"model": name, "steps": steps, "shuffled": shuffled, "seed": seed, "accuracy": accuracy,
                       "seconds": round(time.perf_counter() - start, 1)})
    settings = {"steps": args.steps, "shuffle_steps": args.shuffle_steps, "seeds": args.seeds}
    return write_results("experiments/vit_seeds.py", settings, runs, args.json)


if __name__ == "__main__":
    main()
