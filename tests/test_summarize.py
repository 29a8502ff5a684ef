"""Chapter 15, section 15.6 (transformer_lib.applications): the docstring pairs (extraction rules, the shipped file,
the split by module), the baselines and the metrics, span corruption, and the pre-training and fine-tuning loops."""

import platform
import random

import pytest
import torch

from transformer_lib.applications import (
    DOCSTRING_PYTHON,
    EOS,
    NUM_SENTINELS,
    PAD,
    SENTINEL_0,
    SPECIAL_TOKENS,
    corrupted_windows,
    docstring_pairs,
    encode_pairs,
    extract_pairs,
    finetune_t5,
    generate_no_repeat,
    is_test_module,
    keep_pair,
    lead_sentence,
    load_docstring_bpe,
    name_words,
    nearest_summaries,
    pretrain_t5,
    pretraining_texts,
    random_segmentation,
    shipped_pairs,
    span_corruption,
    stdlib_files,
    summarize,
    summary_scores,
    top_module,
)
from transformer_lib.bert import IGNORE_INDEX
from transformer_lib.t5 import T5, T5Config, t5_generate

SOURCE = '''"""A module.

Its body is here."""


def f():
    """Return the answer to everything that matters.

    The body has
    two lines."""


class C:
    """One line only."""

    def g(self):
        """Summary of g,
        on two lines.

        First paragraph.

        Second paragraph."""
'''


def test_docstring_pairs_split_each_docstring_at_its_first_blank_line():
    pairs = docstring_pairs(SOURCE, "pkg/mod.py")
    assert [(p["name"], p["summary"], p["body"]) for p in pairs] == [
        ("mod", "A module.", "Its body is here."),
        ("f", "Return the answer to everything that matters.", "The body has two lines."),
        ("g", "Summary of g, on two lines.", "First paragraph. Second paragraph.")]      # C: no body
    assert {p["module"] for p in pairs} == {"pkg"} and top_module("os.py") == "os"
    words = lambda n: " ".join(["w"] * n)  # noqa: E731
    assert keep_pair({"summary": words(4), "body": words(15)})
    assert not keep_pair({"summary": words(3), "body": words(50)}) and not keep_pair({"summary": words(9), "body": words(14)})


def test_extraction_skips_tests_idle_and_installed_packages(tmp_path):
    body = " ".join(["word"] * 20)
    text = f'"""Summary line of four words.\n\n{body}"""\n'
    for path in ("a.py", "pkg/b.py", "test/c.py", "pkg/tests/d.py", "idlelib/e.py", "site-packages/x/f.py",
                 "pkg/test_g.py", "lib2to3/h.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    assert stdlib_files(tmp_path) == ["a.py", "pkg/b.py"]
    assert [p["path"] for p in extract_pairs(tmp_path)] == ["a.py", "pkg/b.py"]
    kept = [p for p in ("a.py", "pkg/b.py") if not is_test_module(top_module(p))]
    assert len(pretraining_texts(tmp_path)) == len(kept)
    assert len(pretraining_texts(tmp_path, held_out=True)) == 2 - len(kept)
    with pytest.raises(ValueError, match="root must be a folder"):
        stdlib_files(tmp_path / "nowhere")


def test_the_shipped_pairs_and_their_split_by_module():
    pairs = shipped_pairs()
    assert len(pairs) == 2161 and all(keep_pair(p) for p in pairs)
    train = {p["module"] for p in pairs if not is_test_module(p["module"])}
    test = {p["module"] for p in pairs if is_test_module(p["module"])}
    assert not train & test and len(test) == 24
    share = sum(is_test_module(p["module"]) for p in pairs) / len(pairs)
    assert 0.08 < share < 0.2
    assert is_test_module("os") == is_test_module("os")       # a hash, not a draw


@pytest.mark.skipif(platform.python_version() != DOCSTRING_PYTHON, reason="another Python's standard library")
def test_the_shipped_pairs_are_what_this_python_extracts():
    assert extract_pairs() == shipped_pairs()


def test_span_corruption_keeps_every_token_and_can_be_undone():
    rng = random.Random(0)
    lengths = []
    for n in (2, 3, 10, 40, 128, 200):
        for _ in range(20):
            ids = [rng.randrange(100, 2000) for _ in range(n)]
            inputs, targets = span_corruption(ids, rng)
            assert inputs[-1] == EOS and targets[-1] == EOS
            sentinels = [t for t in inputs if SENTINEL_0 <= t < SENTINEL_0 + NUM_SENTINELS]
            spans = len(sentinels)
            assert sentinels == list(range(SENTINEL_0, SENTINEL_0 + spans))
            assert [t for t in targets if SENTINEL_0 <= t < SENTINEL_0 + NUM_SENTINELS] == \
                list(range(SENTINEL_0, SENTINEL_0 + spans + 1))          # one more sentinel ends the target
            dropped = len(targets) - spans - 2
            assert dropped == min(max(round(0.15 * n), 1), n - 1) and len(inputs) == n - dropped + spans + 1
            assert inputs[0] not in sentinels                             # T5 starts with kept tokens
            # undo: put each span back in place of its sentinel
            fill, k = {}, None
            for t in targets[:-1]:
                if SENTINEL_0 <= t < SENTINEL_0 + NUM_SENTINELS:
                    k = t
                    fill[k] = []
                else:
                    fill[k].append(t)
            assert all(fill[s] for s in sentinels)                        # no empty span
            assert [x for t in inputs[:-1] for x in (fill[t] if t in fill else [t])] == ids
            if n == 200:
                lengths += [len(fill[s]) for s in sentinels]
    assert 2.5 < sum(lengths) / len(lengths) < 3.5                       # mean span length about 3


def test_random_segmentation_and_span_corruption_errors():
    rng = random.Random(1)
    for _ in range(100):
        parts = random_segmentation(10, 4, rng)
        assert len(parts) == 4 and sum(parts) == 10 and min(parts) >= 1
    with pytest.raises(ValueError, match="ids must hold at least 2 tokens"):
        span_corruption([5], rng)
    with pytest.raises(ValueError, match="noise_density"):
        span_corruption([5, 6, 7], rng, noise_density=1.5)
    with pytest.raises(ValueError, match="more than the 31 there are"):
        span_corruption(list(range(100, 1100)), rng)


def test_the_shipped_tokenizer_has_t5s_special_tokens_first():
    bpe = load_docstring_bpe()
    assert [bpe.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    assert (PAD, EOS, SENTINEL_0) == (0, 1, 2) and bpe.get_vocab_size() == 2048
    text = "Return the sum of a and b."
    assert bpe.decode(bpe.encode(text).ids) == text


def test_baselines_and_scores():
    pytest.importorskip("rouge_score")                  # summary_scores: in the book's requirements
    assert lead_sentence("First one. Second one? Third.") == "First one."
    assert lead_sentence("No stop at all") == "No stop at all"
    assert lead_sentence("Uses e.g. an abbreviation here.") == "Uses e.g."          # the rule's known limit
    assert [name_words(n) for n in ("read_config_file", "HTTPServer", "__init__", "getLogger")] == \
        ["read config file", "HTTP Server", "init", "get Logger"]
    train = [{"body": "open a file and read its lines", "summary": "Read lines."},
             {"body": "send a message over the socket", "summary": "Send bytes."}]
    assert nearest_summaries(train, ["read the lines of a file", "a socket message"]) == ["Read lines.", "Send bytes."]
    perfect = summary_scores(["Read the lines."], ["Read  the lines."])
    assert perfect == {"rouge1": 100.0, "rouge2": 100.0, "rougeL": 100.0, "exact": 100.0}
    half = summary_scores(["read lines", "x"], ["read lines", "y"])
    assert half["exact"] == 50.0 and half["rouge1"] == 50.0
    with pytest.raises(ValueError, match="equal length"):
        summary_scores(["a"], [])


def tiny_t5():
    torch.manual_seed(0)
    return T5(T5Config(vocab_size=2048, d_model=16, num_heads=2, d_ff=32, num_layers=1, num_decoder_layers=1,
                       dropout=0.0, pad_id=PAD, eos_id=EOS))


def test_pretraining_and_fine_tuning_learn_and_stop_after_their_first_steps():
    bpe = load_docstring_bpe()
    stream = [t for s in ["Return the sum of two numbers.", "Open the file and read it."] * 30
              for t in bpe.encode(s).ids + [EOS]]
    src, labels = corrupted_windows(stream, 4, 20, random.Random(0))
    assert src.shape[0] == labels.shape[0] == 4 and (labels[:, 0] == SENTINEL_0).all()
    full = pretrain_t5(tiny_t5(), stream, steps=40, batch_size=8, length=20, lr=1e-2, warmup_steps=4)
    assert sum(full["loss"][-5:]) < 0.8 * sum(full["loss"][:5])
    assert pretrain_t5(tiny_t5(), stream, steps=40, batch_size=8, length=20, lr=1e-2, warmup_steps=4,
                       stop_after=3)["loss"] == full["loss"][:3]
    with pytest.raises(ValueError, match="stream must hold more than length=5000 tokens"):
        pretrain_t5(tiny_t5(), stream, steps=4, length=5000)
    pairs = [{"body": "Open the file named by path and return its lines as a list.", "summary": "Read a file."},
             {"body": "Add two numbers and return the sum of them.", "summary": "Add numbers."}] * 4
    src, labels = encode_pairs(bpe, pairs, max_body=8, max_summary=4)
    assert src.shape == (8, 8) and (src[:, -1] == EOS).all() and labels.shape[1] <= 4
    assert labels[0].tolist() == bpe.encode("Read a file.").ids[:3] + [EOS]
    assert (labels == IGNORE_INDEX).any() or labels.shape[1] == 4
    model = tiny_t5()
    history = finetune_t5(model, src, labels, steps=60, batch_size=4, lr=1e-2, warmup_steps=5)
    assert sum(history["loss"][-5:]) < 0.5 * sum(history["loss"][:5])
    out = summarize(model, bpe, src, max_new_tokens=6)
    assert len(out) == 8 and all(isinstance(s, str) for s in out)
    cut = [bpe.decode(bpe.encode(p["summary"]).ids[:3]) for p in pairs[:2]]     # max_summary=4: 3 tokens and EOS
    assert out[:2] == cut == ["Read a", "Add number"]                             # it learned the two summaries


def corrupted_lengths(n, noise_density=0.15, mean_span_length=3.0):
    """span_corruption's input and target lengths for n tokens, from its rules (the exercise's closed form)."""
    dropped = min(max(round(noise_density * n), 1), n - 1)
    spans = min(max(round(dropped / mean_span_length), 1), dropped, n - dropped)
    return n - dropped + spans + 1, dropped + spans + 2


def test_the_closed_form_lengths_are_span_corruptions():
    for settings in ((0.15, 3.0), (0.3, 5.0), (0.1, 2.0)):
        for n in range(2, 300):
            inputs, targets = span_corruption(list(range(100, 100 + n)), random.Random(n), *settings)
            assert (len(inputs), len(targets)) == corrupted_lengths(n, *settings)


def raw_length(inputs_length, noise_density=0.15, mean_span_length=3.0, *, eos=1, sentinels=1, target=2, extra=0):
    def fits(n):
        dropped = min(max(round(noise_density * n), 1), n - 1)
        spans = min(max(round(dropped / mean_span_length), 1), dropped, n - dropped)
        return n - dropped + sentinels * spans + eos <= inputs_length
    n = 2
    while fits(n + 1):
        n += 1
    n += extra
    return n, corrupted_lengths(n, noise_density, mean_span_length)[1] + target - 2


def test_check_raw_length_passes_a_right_answer_and_names_mistakes():
    from transformer_lib.exercises.applications import check_raw_length

    check_raw_length(raw_length)
    assert raw_length(512) == (568, 115)           # T5's pipeline cuts 568 raw tokens for 512 (its target: 114, no last sentinel)
    mistakes = {
        "EOS is not counted": dict(eos=0),
        "sentinels are not counted": dict(sentinels=0),
        "neither the sentinels nor the EOS": dict(sentinels=0, eos=0),
        "one past the largest": dict(extra=1),
        "one short": dict(extra=-1),
        "closing sentinel or its EOS": dict(target=1),
        r"cases wrong\)$": dict(target=3),                          # not a named slip: the numbers only
    }
    for message, slip in mistakes.items():
        with pytest.raises(AssertionError, match=message):
            check_raw_length(lambda length, d, m, slip=slip: raw_length(length, d, m, **slip))
    with pytest.raises(AssertionError, match="must return a pair"):
        check_raw_length(lambda length, d, m: raw_length(length, d, m)[0])


def test_summarize_seeds_runs_and_its_committed_results_match_its_defaults(tmp_path):
    pytest.importorskip("rouge_score")                  # summary_scores: in the book's requirements
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "summarize_seeds.json"
    run = subprocess.run([sys.executable, str(root / "experiments" / "summarize_seeds.py"), "--seeds", "3", "--steps", "2",
                          "--json", str(out)], capture_output=True, text=True, cwd=root, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [(r["seed"], r["pretrained"]) for r in result["runs"]] == [(3, True), (3, False)]
    assert result["finetune"]["steps"] == 2 and result["test_pairs"] == 248
    committed = json.loads((root / "transformer_lib" / "results" / "summarize_seeds.json").read_text())
    sys.path.insert(0, str(root / "experiments"))
    try:
        from summarize_seeds import make_parser
    finally:
        sys.path.remove(str(root / "experiments"))
    defaults = vars(make_parser().parse_args([]))
    assert committed["script"] == "experiments/summarize_seeds.py" and len(defaults["seeds"]) >= 3
    assert committed["seeds"] == defaults["seeds"] and committed["finetune"]["steps"] == defaults["steps"]
    assert [(r["seed"], r["pretrained"]) for r in committed["runs"]] == \
        [(s, p) for s in defaults["seeds"] for p in (True, False)]
    for r in committed["runs"]:
        assert all(0 <= r[k] <= 100 for k in ("rouge1", "rouge2", "rougeL", "exact"))


def test_the_shipped_data_is_package_data():
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped_files = {p.name for p in (root / "transformer_lib" / "datasets").iterdir()}
    assert shipped_files == {"docstring_pairs.json.gz", "docstring_bpe.json"}
    assert {"datasets/*.json", "datasets/*.json.gz"} <= set(patterns["transformer_lib"])


def test_generate_no_repeat_never_writes_an_ngram_twice_and_is_greedy_otherwise():
    model = tiny_t5()
    src = torch.randint(40, 2048, (6, 9))
    plain = t5_generate(model, src, 12)
    assert torch.equal(generate_no_repeat(model, src, 12, n=13), plain)        # no 13-gram fits in 12 tokens
    for n in (1, 2, 3):
        for row in generate_no_repeat(model, src, 12, n=n).tolist():
            row = row[:row.index(EOS)] if EOS in row else row
            grams = [tuple(row[i:i + n]) for i in range(len(row) - n + 1)]
            assert len(grams) == len(set(grams))
    assert model.training                                                      # the caller's mode, restored


@pytest.mark.skipif(platform.python_version() != DOCSTRING_PYTHON, reason="another Python's standard library")
def test_the_shipped_tokenizer_is_what_train_docstring_bpe_makes_of_this_pythons_library():
    from transformer_lib.applications import shipped, train_docstring_bpe

    expected = shipped("docstring_bpe.json").read_text(encoding="utf-8")
    assert train_docstring_bpe(pretraining_texts(), 2048).to_str() == expected
