"""experiments/: the several-seed runs whose committed results (transformer_lib/results/*.json) Chapters 8, 12 and 15 print
and asserts on. Each script must still run (here on a few steps, one seed), and each committed file must be what
the script's current defaults produce: every seed, every model, the same budgets. A script whose defaults changed
without `make experiments` being run again fails here."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "transformer_lib" / "results"


def load_script(name):
    if str(ROOT / "experiments") not in sys.path:                  # the scripts import record.py beside them
        sys.path.insert(0, str(ROOT / "experiments"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def defaults(name):
    """The script's argparse defaults, without running it."""
    return vars(load_script(name).make_parser().parse_args([]))


def run_script(name, tmp_path, *args):
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "experiments" / f"{name}.py"), *args, "--json", str(out)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(out.read_text())


def check_t5(result, seeds, steps, batch=32):
    runs = result["runs"]
    assert result["seeds"] == seeds and result["steps"] == steps
    tasks = ("en-de", "de-en", "en-num")
    kinds = ("multi-task", "single-task", "single-task, equal updates", "single-task, equal steps")
    assert result["kinds"] == list(kinds)
    expected = {(kind, task, seed) for kind in kinds for task in tasks for seed in seeds}
    assert {(r["model"], r["task"], r["seed"]) for r in runs} == expected and len(runs) == len(expected)
    for r in runs:          # the same total compute; the same updates in the third; the same updates and batch last
        assert (r["steps"], r["batch"]) == {"multi-task": (steps, batch), "single-task": (steps // 3, batch),
                                            "single-task, equal updates": (steps, round(batch / 3)),
                                            "single-task, equal steps": (steps, batch)}[r["model"]]
        assert 0.0 <= r["exact"] <= 1.0


def check_vit(result, seeds, steps, shuffle_steps):
    runs = result["runs"]
    assert result["seeds"] == seeds and result["steps"] == steps and result["shuffle_steps"] == shuffle_steps
    main_run = [f"ViT, patch {p}" for p in (2, 4, 8)] + ["CNN", "MLP"]
    expected = {(model, steps, False, s) for model in main_run for s in seeds}
    expected |= {(m, shuffle_steps, shuffled, s) for m in ("ViT, patch 2", "CNN") for shuffled in (False, True)
                 for s in seeds}
    assert {(r["model"], r["steps"], r["shuffled"], r["seed"]) for r in runs} == expected
    assert len(runs) == len(expected)
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in runs)


def check_qa(result, seeds, steps, conditions):
    runs = result["runs"]
    assert result["seeds"] == seeds and result["steps"] == steps and result["conditions"] == conditions
    assert [(r["condition"], r["seed"]) for r in runs] == [(c, s) for c in conditions for s in seeds]
    assert all(0.0 <= r[f"{kind} {m}"] <= 1.0 for r in runs for kind in ("person", "object") for m in ("exact", "f1"))
    assert all(r[f"{kind} exact"] <= r[f"{kind} f1"] for r in runs for kind in ("person", "object"))


def check_ablation(result, seeds, steps):
    runs = result["runs"]
    assert result["seeds"] == seeds and result["steps"] == steps
    variants = ("warm-up, ε = 0.1", "no warm-up, ε = 0.1", "warm-up, ε = 0")
    assert [(r["variant"], r["seed"]) for r in runs] == [(v, s) for v in variants for s in seeds]
    for r in runs:
        assert len(r["loss"]) == steps and 0.0 <= r["exact_match"] <= 1.0 and r["cer"] >= 0.0


def chapter_8_characters() -> str:
    """The characters of Chapter 8's tokenizer, as its stored output prints them (which nbval proves current)."""
    nb = json.loads((ROOT / "chapters" / "08_training.ipynb").read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            for line in "".join(output.get("text", "")).splitlines():
                if line.startswith("characters: "):
                    return line.removeprefix("characters: ")
    raise AssertionError("Chapter 8 no longer prints its tokenizer's characters")


def test_ablation_runs(tmp_path):      # 20 of the 500 test numbers: an untrained model decodes slowly
    # the tokenizer from 2,000 of the chapter's 64,000 training numbers: writing them all out in words would be
    # two thirds of this test's time (30 of 50 s), and these already hold every character the chapter's has
    result = run_script("ablation", tmp_path, "--seeds", "3", "--steps", "4", "--test-size", "20",
                        "--tokenizer-numbers", "2000")
    check_ablation(result, [3], 4)
    assert result["test_size"] == 20
    assert result["characters"] == chapter_8_characters()


@pytest.mark.parametrize("bad", ["0", "96001"])
def test_ablation_refuses_a_tokenizer_draw_out_of_range(bad, capsys):
    with pytest.raises(SystemExit) as stop:
        load_script("ablation").main(["--tokenizer-numbers", bad])
    assert stop.value.code == 2 and "--tokenizer-numbers must lie in 1..64,000" in capsys.readouterr().err


def test_t5_tasks_runs(tmp_path):
    check_t5(run_script("t5_tasks", tmp_path, "--seeds", "3", "--steps", "6", "--batch", "4"), [3], 6, batch=4)


def test_vit_seeds_runs(tmp_path):
    result = run_script("vit_seeds", tmp_path, "--seeds", "3", "--steps", "2", "--shuffle-steps", "3")
    check_vit(result, [3], 2, 3)


def test_qa_ablation_runs(tmp_path):
    conditions = ["recipe", "two segments", "two-fact mix, 4 layers"]
    result = run_script("qa_ablation", tmp_path, "--seeds", "3", "--steps", "4", "--short-steps", "2",
                        "--test-size", "20", "--conditions", *conditions)
    check_qa(result, [3], 4, conditions)
    assert result["test_size"] == 20 and result["short_steps"] == 2
    assert [r["changes"] for r in result["runs"]] == [{}, {"sentence_segments": False},
                                                      {"num_layers": 4, "two_fact": 0.5}]


def test_qa_ablation_uses_the_chapters_test_stories():
    """The script's held-out stories are Chapter 15's (random.Random(1234), 1,000 of each kind, drawn in the
    order the chapter draws them): the chapter asserts that its seed 0 is the run it trains live."""
    import random

    from transformer_lib.applications import make_story
    tests, held_out = load_script("qa_ablation").chapter_tests(5)
    rng = random.Random(1234)
    assert tests == {kind: [make_story(rng, question=kind) for _ in range(5)] for kind in ("person", "object")}
    assert len(held_out) == 10 and all(isinstance(s, tuple) and isinstance(q, tuple) for s, q in held_out)


@pytest.mark.parametrize("name", ["ablation", "t5_tasks", "vit_seeds", "qa_ablation"])
def test_committed_results_match_the_scripts_defaults(name):
    result = json.loads((RESULTS / f"{name}.json").read_text())
    args = defaults(name)
    assert result["script"] == f"experiments/{name}.py"
    assert len(args["seeds"]) >= 3, "a comparison over seeds needs at least three"
    if name == "t5_tasks":
        assert (result["batch"], result["lr"]) == (args["batch"], args["lr"])
        check_t5(result, args["seeds"], args["steps"], args["batch"])
    elif name == "ablation":
        assert result["test_size"] == args["test_size"] == 500       # every held-out number scored
        assert args["tokenizer_numbers"] == 64_000                    # the chapter's tokenizer, from all its numbers
        check_ablation(result, args["seeds"], args["steps"])
    elif name == "qa_ablation":
        assert (result["short_steps"], result["batch"], result["lr"], result["test_size"]) == \
            (args["short_steps"], args["batch"], args["lr"], args["test_size"]) == (800, 32, 1e-3, 1000)
        check_qa(result, args["seeds"], args["steps"], args["conditions"])
    else:
        check_vit(result, args["seeds"], args["steps"], args["shuffle_steps"])


def synthetic_ids(n, vocab, seed):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def test_decoder_ablation_trains_every_kind_of_arm_and_the_lora_study(monkeypatch):
    """experiments/decoder_ablation.py (its committed results ran on a GPU): each option of its scaffold builds and
    trains, the base arm is the library's Llama, and the LoRA study runs, here on random ids for two steps."""
    m = load_script("decoder_ablation")
    assert m.assert_base_is_llama("cpu") < 1e-10
    data = {"train": synthetic_ids(4000, m.VOCAB, 0), "heldout": synthetic_ids(2 * (m.LONG + 1), m.VOCAB, 1),
            "heldout_bytes": 6000, "tune": synthetic_ids(2000, m.VOCAB, 2), "tune_valid": synthetic_ids(600, m.VOCAB, 3),
            "tune_test": synthetic_ids(600, m.VOCAB, 4), "tune_bytes": {"valid": 1500, "test": 1500}}
    for name in ("no positions instead of RoPE", "GPT-2 style (learned, LayerNorm, GELU, biases)",
                 "1 key/value head (MQA)"):
        model, run = m.train_arm(data, name, 0, 2, "cpu", batch_size=2)
        assert run["options"] == {**m.BASE, **m.ARMS[name]} and math.isfinite(run["bits_per_byte"])
        assert ("ranges" in run) == (name in m.POSITION_ARMS)
    monkeypatch.setattr(m, "LORA_GRID", {arm: grid[:1] for arm, grid in m.LORA_GRID.items()})
    base = m.Decoder(**m.BASE).eval()
    study = m.lora_study(base, data, "cpu", (0,), steps=2)
    trainable = {r["arm"]: r["trainable"] for r in study["runs"]}
    assert trainable["LoRA, rank 4 on W_q and W_v"] == m.LAYERS * 2 * 4 * (m.WIDTH + m.WIDTH)
    assert trainable["full fine-tuning"] == sum(p.numel() for p in base.parameters() if p.requires_grad)


def test_tokenizer_compute_runs_on_any_vocabulary():
    m = load_script("tokenizer_compute")
    data = {"heldout_bytes": 3000, "train_bytes": 9000, 300: {"train": synthetic_ids(3000, 300, 0),
                                                             "heldout": synthetic_ids(1000, 300, 1)}}
    run = m.run(data, 300, 0, "cpu", steps=2)
    assert run["vocab"] == 300 and math.isfinite(run["bits_per_byte"]) and run["bytes_per_token"]["train"] == 3.0


def test_the_gpu_results_are_complete():
    """The three results files written on a GPU (2026-11-28): every arm, vocabulary and variant at three seeds."""
    abl = json.loads((RESULTS / "decoder_ablation.json").read_text())
    m = load_script("decoder_ablation")
    assert abl["base_equals_llama"] < 1e-10 and abl["settings"]["steps"] == defaults("decoder_ablation")["steps"]
    assert sorted((r["arm"], r["seed"]) for r in abl["runs"]) == sorted((a, s) for a in m.ARMS for s in (0, 1, 2))
    assert all(len(r["eval"]) == len(r["eval_step"]) and r["eval_step"][-1] == r["steps"] for r in abl["runs"])
    lora = abl["lora"]
    assert set(lora["chosen_lr"]) == set(m.LORA_GRID) | {"control: full fine-tuning on the training modules"}
    for arm, lr in lora["chosen_lr"].items():              # the chosen rate is the grid's best on validation
        grid = [r for r in lora["grid"] if r["arm"] == arm.replace("control: full fine-tuning on the training modules",
                                                                  "full fine-tuning")]
        assert lr == min(grid, key=lambda r: r["valid"])["lr"]
    tok = json.loads((RESULTS / "tokenizer_compute.json").read_text())
    t = load_script("tokenizer_compute")
    assert sorted((r["vocab"], r["seed"]) for r in tok["runs"]) == sorted((v, s) for v in t.VOCABS for s in (0, 1, 2))
    assert all(r["steps"] == t.STEPS and r["eval_step"][-1] == t.STEPS for r in tok["runs"])
    long = json.loads((RESULTS / "ablation_long.json").read_text())
    assert long["steps"] == 2000 and long["loss_every"] == 10
    variants = load_script("ablation").VARIANTS
    assert sorted((r["variant"], r["seed"]) for r in long["runs"]) == sorted((v, s) for v in variants for s in (0, 1, 2))
    assert all(len(r["loss"]) == 200 for r in long["runs"])


def test_gpt_large_runs_an_arm_with_every_probe(monkeypatch, tmp_path):
    """experiments/gpt_large.py (prepared for a GPU): an arm trains, probes at every evaluation and writes its JSON
    and float16 checkpoint, here a tiny model for two steps on random ids with Chapter 11's tokenizer."""
    from transformer_lib.gpt import TRAIN_MODULES, stdlib_sources, train_bpe
    from transformer_lib.training import load_checkpoint

    m = load_script("gpt_large")
    for name, value in {"WIDTH": 32, "LAYERS": 2, "HEADS": 2, "BATCH": 2, "EVAL_EVERY": 1}.items():
        monkeypatch.setattr(m, name, value)
    monkeypatch.setitem(m.ARMS, "more", ("more", 0.1, 2, 2e-3))
    ids = {k: synthetic_ids(n, m.VOCAB, i) for i, (k, n) in
           enumerate({"chapter": 3000, "more": 3000, "valid": 600, "heldout": 600}.items())}
    bpe = train_bpe(list(stdlib_sources(TRAIN_MODULES).values())[:3], m.VOCAB)
    data = {"ids": ids, "bytes": {k: 3 * len(v) for k, v in ids.items()}, "bpe": bpe._tokenizer.to_str(),
            "sha256": {}, "python": "3.11"}
    result = m.run(data, "more", 0, "cpu", str(tmp_path))
    assert [row["step"] for row in result["evals"]] == [1, 2] and result["training_tokens"] == 6000
    last = result["evals"][-1]
    assert math.isfinite(last["heldout"]) and 0 <= last["parse"]["0.8"] <= 1
    assert len(last["induction"]) == 2 and len(last["induction"][0]) == 2
    assert set(result["ablations"]) >= {"top three", "lowest three"}
    model, checkpoint = load_checkpoint(tmp_path / "more_s0.pt")
    assert checkpoint["step"] == 2 and checkpoint["state_dict"]["token.weight"].dtype == torch.float16
    assert abs(result["heldout_float16_weights"] - last["heldout"]) < 0.05


def test_count_models_counted_the_gpt_more_recipes_data():
    """transformer_lib/results/count_models.json (Chapter 11.10 prints it): counted on the data the gpt_more recipe
    trained on, the discount the best of the script's grid on the validation modules. Recounting takes a minute and
    2 GB (`make experiments` does it); here its inputs and choice are checked."""
    from transformer_lib.training import recipe_record

    counts = json.loads((RESULTS / "count_models.json").read_text())
    assert counts["script"] == "experiments/count_models.py"
    assert counts["data"] == recipe_record("gpt_more")["data"]
    grid, m = counts["valid_kneser_ney"], load_script("count_models")
    assert set(grid) == {f"{n},{d}" for n in m.ORDERS for d in m.DISCOUNTS}
    assert f"{counts['order']},{counts['discount']}" == min(grid, key=grid.get)
    assert counts["heldout"]["kneser_ney"] < counts["heldout"]["trigram"]
