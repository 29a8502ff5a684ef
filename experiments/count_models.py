"""Chapter 11.10's count models on the gpt_more recipe's training data: the trigram (absolute discounting) and the
interpolated Kneser-Ney model of section 11.4, counted on the whole standard library the recipe's GPT read (the
chapter's 59 training modules and `more_modules`'s others), its order (4 to 9) and discount chosen together on the 12
validation modules; held-out bits per byte on the chapter's 10 held-out modules.

    .venv/bin/python experiments/count_models.py [--json transformer_lib/results/count_models.json]

Counting 3.6 million tokens nine ways takes about two minutes and 7 GB of memory, more than Chapter 11 may spend on
it, so the chapter prints this file (and checks that its data are the chapter's); tests/test_experiments.py recounts
it. Deterministic: no seed, no threads."""

import argparse
import math
import time

from recipes import gpt_more_setup  # experiments/recipes.py, beside this script: the chapter's data
from record import save_json  # experiments/record.py, beside this script

from transformer_lib.gpt import NGramLM, TrigramLM

DISCOUNTS, ORDERS = (0.7, 0.8, 0.9, 1.0), (4, 5, 6, 7, 8, 9)


def count_models() -> dict:
    s = gpt_more_setup()
    vocab, start = s["config"].vocab_size, time.perf_counter()
    top = NGramLM(s["train_ids"], vocab, order=max(ORDERS))
    models = {n: top.lower_order(n) for n in ORDERS}
    valid = {f"{n},{d}": models[n].with_discount(d).nll(s["valid_ids"]) / math.log(2) / s["valid_bytes"]
             for n in ORDERS for d in DISCOUNTS}
    order, discount = min(valid, key=valid.get).split(",")
    order, discount = int(order), float(discount)
    heldout = {"kneser_ney": models[order].with_discount(discount).nll(s["heldout_ids"]) / math.log(2)
               / s["heldout_bytes"],
               "trigram": TrigramLM(s["train_ids"], vocab).nll(s["heldout_ids"]) / math.log(2) / s["heldout_bytes"]}
    return {"script": "experiments/count_models.py", "data": s["data"], "training_tokens": len(s["train_ids"]),
            "valid_kneser_ney": valid, "order": order, "discount": discount, "heldout": heldout,
            "seconds": round(time.perf_counter() - start, 1)}


def make_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=None, help="write the results here")
    return parser


if __name__ == "__main__":
    args = make_parser().parse_args()
    result = count_models()
    save_json(result, args.json)
    print({k: v for k, v in result.items() if k != "data"})
