"""Small helpers shared by the tests (importable because pytest puts tests/ on sys.path)."""

import functools
import importlib
import os

import pytest
import torch
from torch import nn

from transformer_lib.applications import OBJECTS, PEOPLE, QA_VOCAB

DT = torch.float64      # the equality proofs run in float64 ...
ATOL = 1e-12            # ... and agree to this (round-off is about 1e-15)


def import_hf(name: str = "transformers"):
    """Import `transformers` or `tokenizers` for a Hugging Face comparison. Locally a missing package skips the
    test; with REQUIRE_HF=1 (set by .ci/run) it fails instead, so CI can never go green by skipping Part III's
    equality proofs because an import broke."""
    if os.environ.get("REQUIRE_HF") == "1":
        try:
            return importlib.import_module(name)
        except Exception as e:  # an ImportError, or any error raised while the package imports
            pytest.fail(f"REQUIRE_HF=1 but `import {name}` failed: {type(e).__name__}: {e}")
    return pytest.importorskip(name)


def hf(build):
    """A Hugging Face model in float64 and eval, built from a config with no network (skipped locally when
    transformers is missing)."""
    transformers = import_hf("transformers")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        return build(transformers).double().eval()


def randomize(module, seed, std=0.3):
    """Random values for every parameter, LayerNorm gains and biases included, so that all of them matter
    when a module is compared with PyTorch's."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(std * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def noisy(hf_model, seed):
    """A Hugging Face model in float64, eval, and 0.1 * N(0, 1) added to every parameter (LayerNorm gains and biases included)."""
    hf_model = hf_model.double().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in hf_model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return hf_model


def wordpiece_tokenizer(words):
    """A small BERT tokenizer (transformers.PreTrainedTokenizerFast over a tokenizers WordPiece model): the five
    specials [PAD] [UNK] [CLS] [SEP] [MASK] (ids 0-4), then words; lower-cased, BERT's pre-tokenizer, and
    "[CLS] A [SEP] B [SEP]" with segment 1 for B. What save_pretrained writes of it loads with AutoTokenizer."""
    transformers, tokenizers = import_hf("transformers"), import_hf("tokenizers")
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    wordpiece = tokenizers.Tokenizer(tokenizers.models.WordPiece({w: i for i, w in enumerate(specials + list(words))},
                                                                 unk_token="[UNK]"))
    wordpiece.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    wordpiece.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=wordpiece, unk_token="[UNK]", pad_token="[PAD]",
                                                cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def max_diff(a, b) -> float:
    """The largest absolute difference between two tensors of one shape."""
    return (a - b).abs().max().item()


def assert_download_fails(class_name, checkpoint, cache_dir):
    """transformers.<class_name>.from_pretrained(checkpoint) must fail: with the no_network fixture of conftest.py
    any connection raises, so nothing is ever downloaded (and a test that tries would fail, not fetch)."""
    transformers = import_hf("transformers")
    with pytest.raises(Exception):  # noqa: B017 - the offline error or the guard's RuntimeError, whichever comes first
        getattr(transformers, class_name).from_pretrained(checkpoint, cache_dir=cache_dir)


# ------------------------------------------------------------------------- bad-input tables (test_bad_inputs*.py)
OK = "ok"


def err(names: str, phrase: str):
    """A ValueError naming one of `names` (word-bounded) and matching `phrase`, anywhere in the message."""
    return ("raises", rf"(?s)(?=.*\b(?:{names})\b)(?=.*(?:{phrase}))")


def run_case(call, expected):
    """Run one row of a table: OK (the call asserts its documented result itself) or err(...)."""
    if expected == OK:
        call()
        return
    kind, pattern = expected
    assert kind == "raises"
    with pytest.raises(ValueError, match=pattern):
        call()


def table_tests(tensor_cases, plain_cases, before=None):
    """The three tests of a bad-input table module: its ids are unique, each tensor case runs on float32 and
    float64, each plain case runs. `before(monkeypatch)`, if given, runs before every case. Use as
    `test_case_ids_unique, test_tensor_case, test_plain_case = table_tests(TENSOR_CASES, PLAIN_CASES)`."""
    def test_case_ids_unique():
        ids = [c[0] for c in tensor_cases + plain_cases]
        assert len(set(ids)) == len(ids), [i for i in ids if ids.count(i) > 1]

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
    @pytest.mark.parametrize("case_id, call, expected", tensor_cases, ids=[c[0] for c in tensor_cases])
    def test_tensor_case(case_id, call, expected, dtype, monkeypatch):
        if before:
            before(monkeypatch)
        run_case(lambda: call(dtype), expected)

    @pytest.mark.parametrize("case_id, call, expected", plain_cases, ids=[c[0] for c in plain_cases])
    def test_plain_case(case_id, call, expected, monkeypatch):
        if before:
            before(monkeypatch)
        run_case(call, expected)

    return test_case_ids_unique, test_tensor_case, test_plain_case


# --- Chapter 15: stories read by an independent replay, and a rule played as a QA model

def replay(sentences):
    """Where each person is and who holds each object, read off the words alone (independent of tell_story): a
    sentence whose last word before the '.' is an object is a pick-up or a drop, any other a move whose place is
    every word after 'went to' (or another two-word verb) and 'the'."""
    where, holder, lying = {}, {}, {}
    for s in sentences:
        person, last = s[0], s[-2]
        if last not in OBJECTS:
            assert s[3] == "the", s
            where[person] = " ".join(s[4:-1])
        elif s[1] in ("dropped", "put", "left"):
            del holder[last]
            lying[last] = where[person]
        else:
            holder[last] = person
            lying.pop(last, None)
    return where, holder, lying


def answer_of(sentences, question):
    """The true answer of a question, as the story says it: "the " + the place."""
    where, holder, lying = replay(sentences)
    word = question[-2]
    if word in PEOPLE:
        return "the " + where[word]
    return "the " + (where[holder[word]] if word in holder else lying[word])


class RuleAsModel(nn.Module):
    """A 'model' whose span scores pick the span a rule answers (start 1 at its first word, end 1 at its last, in
    the last move sentence that names it, 0 elsewhere): its exact match must equal the rule's."""

    def __init__(self, rule):
        super().__init__()
        self.rule, self.dummy = rule, nn.Parameter(torch.zeros(()))

    def forward(self, tokens, segments):
        scores = torch.zeros(*tokens.shape, 2)
        for b in range(tokens.size(0)):
            words = [QA_VOCAB[i] for i in tokens[b].tolist()]
            sep = words.index("[SEP]")
            question, story = words[1:sep], words[sep + 1:]
            sentences, current, offsets = [], [], []
            for k, w in enumerate(story):
                if w in ("[SEP]", "[PAD]"):
                    break
                if not current:
                    offsets.append(k)
                current.append(w)
                if w == ".":
                    sentences.append(current)
                    current = []
            answer = self.rule(sentences, question)
            k = max(k for k, s in enumerate(sentences) if " ".join(s[3:-1]) == answer and s[-2] not in OBJECTS)
            start = sep + 1 + offsets[k] + 3
            scores[b, start, 0] = scores[b, start + len(answer.split()) - 1, 1] = 1.0
        return scores + self.dummy


class Call:
    """A grader call with more than the answer: Call(answer, 5, peak_step=4000) runs grader(answer, 5,
    peak_step=4000); Call(build=factory) runs grader(factory()), the answer built only when the case runs."""

    def __init__(self, *args, build=None, **kwargs):
        self.args, self.kwargs, self.build = args, kwargs, build

    def run(self, grader):
        return grader(*((self.build(),) if self.build else self.args), **self.kwargs)


def grader_row(check, correct, mistakes, prints=""):
    """One grader's row of the grader table that tests/test_graders.py runs: every answer in correct (float64 and
    float32 work) passes and prints check's line (containing the words prints, a string or a list), and every (wrong answer, words)
    in mistakes raises AssertionError whose message matches the regex words. An answer is what the reader passes
    to check, or a Call."""
    return check, list(correct), list(mistakes), prints


@functools.cache
def chat_template():
    """A small ChatTemplate (Chapter 16) for the SFT and DPO tests: a byte-level BPE of 60 merges on three requests."""
    from transformer_lib.assistant import ChatTemplate, train_byte_bpe
    texts = ["Reverse the words: self list dict name file line path data", "Write 42 in words. forty-two",
             "sort: key value args text mode node time type"] * 3
    return ChatTemplate(train_byte_bpe(texts, 257 + 60))
