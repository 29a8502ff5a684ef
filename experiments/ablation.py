"""Chapter 8's short ablations over several seeds: the warm-up and the label smoothing, each removed in turn.

    .venv/bin/python experiments/ablation.py [--seeds 0 1 2] [--steps 200] [--test-size 500]
                                             [--tokenizer-numbers 64000]
                                             [--json transformer_lib/results/ablation.json]

Every run is Chapter 8's `ablation`: the chapter's character tokenizer and model configuration (d_model 64, two
layers per side), the numbers 0 to 9,999 (8,500 for training, 500 held out for the test, split by
`split_numbers(10_000, 500, 1_000, seed=0)`, every other test number), length-grouped batches of 32, Adam at the
chapter's peak learning rate with a 5 % warm-up (or none) and a linear decay to zero, label smoothing 0.1 (or 0).
The seed sets the initial weights and the order of the batches. Chapter 8 prints the committed JSON (the mean and
each seed's value) and plots each run's training loss from it. Not part of `make test`: about two minutes of one
CPU thread for three seeds (`make experiments` runs it)."""

import time

import torch
from record import log, seeds_parser, write_results  # experiments/record.py, beside this script

from transformer_lib.data import CharTokenizer, number_pairs, split_numbers, training_numbers
from transformer_lib.decoding import evaluate_translations, translate
from transformer_lib.model import TransformerConfig
from transformer_lib.training import train_translator

VARIANTS = {"warm-up, ε = 0.1": {}, "no warm-up, ε = 0.1": {"warmup": False},
            "warm-up, ε = 0": {"label_smoothing": 0.0}}
PEAK_LR, STEPS, BATCH = 2e-3, 2000, 32      # Chapter 8's main run, whose training numbers build the tokenizer


def chapter_tokenizer(numbers=STEPS * BATCH):
    """Chapter 8's CharTokenizer: built from the English and German text of the main run's training numbers (the
    first `numbers` of them; all 64,000 by default, as the chapter does)."""
    pool, _, _ = split_numbers(1_000_000, 500, 2_000, seed=0)
    drawn = training_numbers(pool, STEPS * BATCH, seed=1)[:numbers]
    return CharTokenizer.from_texts([text for pair in number_pairs(drawn) for text in pair])


def ablation(tokenizer, steps, seed, test_size=500, device="cpu", loss_every=1, **options) -> dict:
    """Chapter 8's ablation(): a fresh model trained on 0..9,999, its held-out exact match and CER (greedy) on the
    first test_size of the 500 test numbers (all of them unless a smoke test asks for fewer)."""
    small_train, _, small_test = split_numbers(10_000, 500, 1_000, seed=0)
    test_pairs = number_pairs(small_test[::2][:test_size])
    config = TransformerConfig(src_vocab_size=len(tokenizer), tgt_vocab_size=len(tokenizer), d_model=64, num_heads=4,
                               d_ff=256, num_encoder_layers=2, num_decoder_layers=2, dropout=0.0, max_len=128,
                               pad_id=tokenizer.pad_id)
    model, history = train_translator(config, tokenizer, number_pairs(small_train), steps, seed=seed, lr=PEAK_LR,
                                      device=device, **options)
    scores = evaluate_translations(translate(model, tokenizer, [en for en, _ in test_pairs]),
                                   [de for _, de in test_pairs])
    return {"exact_match": scores["exact_match"], "cer": scores["cer"],
            "loss": [round(x, 5) for x in history["loss"][loss_every - 1::loss_every]]}


def make_parser():
    """The script's arguments; their defaults are what the committed results were run with."""
    parser = seeds_parser(__doc__)
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps of 32 numbers per run")
    parser.add_argument("--test-size", type=int, default=500, help="held-out numbers scored per run, 1 to 500 "
                        "(default: all 500)")
    parser.add_argument("--tokenizer-numbers", type=int, default=STEPS * BATCH, help="build the chapter's tokenizer "
                        "from the first N of its 64,000 training numbers (default: all, as Chapter 8 does; writing "
                        "them out in words is most of a short run's time, and the first 500 already hold the same "
                        "31 characters, 2026-11-27)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), help="a subset of the variants (default: all)")
    parser.add_argument("--loss-every", type=int, default=1, help="keep every Nth step's training loss (default: all)")
    parser.add_argument("--device", default="cpu", help="where to train (cuda: say so where the results are quoted)")
    return parser


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    if not 1 <= args.test_size <= 500:
        parser.error(f"--test-size must lie in 1..500 (the held-out numbers), got {args.test_size}")
    if not 1 <= args.tokenizer_numbers <= STEPS * BATCH:
        parser.error(f"--tokenizer-numbers must lie in 1..{STEPS * BATCH:,} (the chapter's training numbers), got "
                     f"{args.tokenizer_numbers}")
    tokenizer = chapter_tokenizer(args.tokenizer_numbers)
    settings = {"steps": args.steps, "seeds": args.seeds, "test_size": args.test_size,
                "characters": "".join(tokenizer.chars),
                **({"device": torch.cuda.get_device_name()} if args.device == "cuda" else {}),
                **({"loss_every": args.loss_every} if args.loss_every != 1 else {})}
    runs = []
    for name in args.variants:
        options = VARIANTS[name]
        for seed in args.seeds:
            start = time.perf_counter()
            run = ablation(tokenizer, args.steps, seed, args.test_size, args.device, args.loss_every, **options)
            log(runs, {"variant": name, "seed": seed, **run, "seconds": round(time.perf_counter() - start, 1)})
            result = write_results("experiments/ablation.py", settings, runs, args.json)   # what is done so far
    return result


if __name__ == "__main__":
    main()
