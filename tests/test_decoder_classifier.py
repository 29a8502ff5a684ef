"""Chapter 16.4: a GPT as a classifier (transformer_lib.assistant): the head reads each row's last real token, so
padding on the right changes no row's logits; the four ways of tuning train what they say; the data split keeps
every file on one side."""

import pytest
import torch

from transformer_lib.assistant import (
    PACKAGES,
    TUNING,
    DecoderClassifier,
    classify_collate,
    last_token_hidden,
    optimizer_state_bytes,
    package_functions,
    prepare_tuning,
    split_by_file,
    train_classifier,
)
from transformer_lib.gpt import GPT, GPTConfig
from transformer_lib.llama import LoRALinear


def tiny_gpt(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=50, max_len=16, d_model=16, num_layers=2, num_heads=2, d_ff=32, dropout=0.0))


class Chars:
    """A tokenizer of one id per character (ids 1..49), enough for classify_collate."""

    def encode(self, text):
        return [1 + ord(c) % 49 for c in text]


def test_padding_on_the_right_changes_no_rows_logits():
    model = DecoderClassifier(tiny_gpt(), 3).eval()
    examples = [("abcdefgh", 0), ("xy", 1), ("hello", 2), ("q", 0)]
    tokens, lengths, _ = classify_collate(examples, Chars(), max_tokens=16, pad_id=7)
    assert tokens.shape == (4, 8) and lengths.tolist() == [8, 2, 5, 1]
    with torch.no_grad():
        batch = model(tokens, lengths)
        for b, (text, _) in enumerate(examples):
            alone, n, _ = classify_collate([(text, 0)], Chars(), max_tokens=16)
            torch.testing.assert_close(batch[b], model(alone, n)[0], rtol=1e-5, atol=1e-6)
        other_pad = model(torch.where(torch.arange(8) < lengths[:, None], tokens, 3), lengths)
    torch.testing.assert_close(batch, other_pad)        # whatever the pad id
    hidden = torch.randn(4, 8, 5)
    picked = last_token_hidden(hidden, lengths)
    assert torch.equal(picked, hidden[torch.arange(4), lengths - 1])
    assert not torch.equal(picked[1:], hidden[1:, -1])   # position -1 is padding in the shorter rows


def test_last_token_hidden_rejects_lengths_outside_the_rows():
    with pytest.raises(ValueError, match="lengths"):
        last_token_hidden(torch.zeros(2, 4, 3), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="lengths"):
        last_token_hidden(torch.zeros(2, 4, 3), torch.tensor([5, 2]))


def test_collate_truncates_to_max_tokens():
    tokens, lengths, labels = classify_collate([("abcdefghij", 2), ("ab", 1)], Chars(), max_tokens=4)
    assert tokens.shape == (2, 4) and lengths.tolist() == [4, 2] and labels.tolist() == [2, 1]


@pytest.mark.parametrize("tuning", TUNING)
def test_each_tuning_trains_what_it_says(tuning):
    model = prepare_tuning(DecoderClassifier(tiny_gpt(), 3), tuning)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {"head.weight", "head.bias"} <= trainable
    if tuning == "head only":
        assert trainable == {"head.weight", "head.bias"}
    elif tuning == "last block + head":
        assert trainable - {"head.weight", "head.bias"} == {n for n, _ in model.named_parameters()
                                                            if n.startswith(("body.blocks.1.", "body.norm."))}
    elif tuning == "full":
        assert all(p.requires_grad for p in model.parameters())
    else:
        assert sum(isinstance(m, LoRALinear) for m in model.modules()) == 2 * 4
        assert all("lora_" in n for n in trainable - {"head.weight", "head.bias"})
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    batch = classify_collate([("abcdefgh", 0), ("xy", 1), ("hello", 2)], Chars(), max_tokens=16)
    result = train_classifier(model, [batch], [batch], steps=2, lr=1e-2)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed <= trainable and "head.weight" in changed
    count = sum(p.numel() for n, p in model.named_parameters() if n in trainable)
    assert result["trainable"] == count
    assert result["optimizer_bytes"] == optimizer_state_bytes(result["optimizer"]) == 2 * 4 * count  # Adam, float32


def test_unknown_tuning_is_refused():
    with pytest.raises(ValueError, match="tuning"):
        prepare_tuning(DecoderClassifier(tiny_gpt(), 3), "lora")


def test_split_keeps_each_file_on_one_side():
    functions = package_functions()
    assert list(functions) == list(PACKAGES)
    data = split_by_file(functions, 200, 50, seed=0)
    assert len(data["train"]) == 800 and len(data["test"]) == 200
    for label, files in enumerate(functions.values()):
        where = {text: name for name, texts in files.items() for text in texts}
        train_files = {where[t] for t, y in data["train"] if y == label}
        test_files = {where[t] for t, y in data["test"] if y == label}
        assert train_files and test_files and not train_files & test_files
    assert data == split_by_file(functions, 200, 50, seed=0)
    with pytest.raises(ValueError, match="too few"):
        split_by_file(functions, 10_000, 50)


def test_validation_side_takes_whole_files_of_its_own():
    functions = package_functions()
    data = split_by_file(functions, 200, 50, seed=1, n_val=50)       # split seed 0 cannot serve 200/50/50
    assert [len(data[side]) for side in ("train", "val", "test")] == [800, 200, 200]
    for label, files in enumerate(functions.values()):
        where = {text: name for name, texts in files.items() for text in texts}
        sides = [{where[t] for t, y in data[side] if y == label} for side in ("train", "val", "test")]
        assert all(sides) and not (sides[0] & sides[1] or sides[0] & sides[2] or sides[1] & sides[2])
    without = split_by_file(functions, 200, 50, seed=0)
    assert without["val"] == [] and without == split_by_file(functions, 200, 50, seed=0, n_val=0)
    with pytest.raises(ValueError, match="too few"):
        split_by_file(functions, 200, 50, seed=0, n_val=50)             # xml/dom's minidom.py lands off training


def test_committed_results_match_the_scripts_defaults():
    """transformer_lib/results/decoder_classifier.json, which Chapter 16.4 prints, is what the script's defaults
    produce: its grids, budgets and seeds, every setting chosen on every split, three seeds at each chosen rate."""
    import importlib.util
    import json
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "experiments"))
    try:
        spec = importlib.util.spec_from_file_location("decoder_classifier", root / "experiments" / "decoder_classifier.py")
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
    finally:
        sys.path.remove(str(root / "experiments"))
    args = vars(script.make_parser().parse_args([]))
    result = json.loads((root / "transformer_lib" / "results" / "decoder_classifier.json").read_text())
    assert result["script"] == "experiments/decoder_classifier.py"
    for key in ("steps", "batch", "n_train", "n_val", "n_test", "max_tokens", "seeds", "extend"):
        assert result[key] == args[key], key
    assert result["lr_grid"] == {t: list(v) for t, v in script.LR_GRID.items()}
    assert result["C_grid"] == list(script.C_GRID) and len(result["splits"]) == args["splits"] >= 3
    for split in result["splits"]:
        assert set(split["chosen_lr"]) == set(script.SETTINGS)
        for tuning, lr in split["chosen_lr"].items():
            runs = [r for r in result["runs"] if r["split_seed"] == split["split_seed"] and r["tuning"] == tuning]
            assert sorted(r["seed"] for r in runs) == args["seeds"] and {r["lr"] for r in runs} == {lr}
