"""Chapter 11, section 11.11: OpenAI's GPT-2 weights in the book's GPT (issue 22, item 2).

The chapter's cell downloads GPT-2 small where there is a network (Colab) and skips offline. These tests run the
same two functions, `gpt2_from_pretrained` and `gpt2_greedy_continuation`, offline: a random-weight
`GPT2LMHeadModel` and a small byte-level BPE tokenizer are written with `save_pretrained` to a temporary
directory and loaded from there (no mocks), and a Hub name fails instead of downloading."""

import pytest
import torch
from helpers import import_hf

from transformer_lib.gpt import GPT, gpt2_from_pretrained, gpt2_greedy_continuation

pytestmark = pytest.mark.usefixtures("no_network")   # tests/conftest.py: any connection fails

TEXT = ["def add(a, b):\n    return a + b\n", "for i in range(10):\n    print(i)\n",
        "class Point:\n    def __init__(self, x, y):\n        self.x = x\n"] * 20


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A directory holding what save_pretrained writes for a (tiny, random) GPT-2 and its tokenizer."""
    transformers = import_hf("transformers")
    tokenizers = import_hf("tokenizers")
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXT, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"],
                            show_progress=False)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>")
    config = transformers.GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                     eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    hf_model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for p in hf_model.parameters():
            p.add_(0.1 * torch.randn_like(p))          # every weight matters, LayerNorm gains included
    path = tmp_path_factory.mktemp("gpt2-random")
    hf_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_the_checkpoint_loads_into_our_gpt_with_equal_logits(checkpoint):
    ours, theirs = gpt2_from_pretrained(checkpoint, dtype=torch.float64)
    assert isinstance(ours, GPT) and not ours.training and not theirs.training
    assert next(ours.parameters()).dtype == torch.float64
    x = torch.randint(0, ours.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (ours(x) - theirs(input_ids=x).logits).abs().max().item()
    assert diff < 1e-10


def test_float32_by_default(checkpoint):
    ours, theirs = gpt2_from_pretrained(str(checkpoint))
    assert next(ours.parameters()).dtype == torch.float32 == next(theirs.parameters()).dtype


def test_greedy_continuation_gives_their_tokens(checkpoint):
    out = gpt2_greedy_continuation(checkpoint, "def add(a, b):\n", max_new_tokens=12, dtype=torch.float64)
    assert out["ours"].shape == (1, 12) and 1 <= out["theirs"].size(1) <= 12
    assert out["same"] and torch.equal(out["ours"][:, :out["theirs"].size(1)], out["theirs"])
    assert isinstance(out["text"], str) and out["parameters"] == sum(
        p.numel() for p in gpt2_from_pretrained(checkpoint)[0].parameters())


def test_same_is_false_when_the_tokens_differ(checkpoint, monkeypatch):
    """"same" compares real tokens: if our generate returned other tokens, it says so (the chapter asserts it)."""
    import transformer_lib.sampling as sampling

    real = sampling.generate
    monkeypatch.setattr(sampling, "generate", lambda *a, **k: (real(*a, **k) + 1) % 300)
    out = gpt2_greedy_continuation(checkpoint, "def add(a, b):\n", max_new_tokens=6, dtype=torch.float64)
    assert not out["same"]


def test_a_hub_name_fails_offline_instead_of_downloading():
    """What the chapter's cell catches: offline, loading 'gpt2' raises (OSError from transformers, or the no_network
    guard's RuntimeError if a connection is attempted); nothing is downloaded."""
    huggingface_hub = import_hf("huggingface_hub")
    if isinstance(huggingface_hub.try_to_load_from_cache("gpt2", "config.json"), str):
        pytest.skip("GPT-2 small is in this machine's Hugging Face cache: it would load, not fail")
    with pytest.raises((OSError, RuntimeError)):
        gpt2_from_pretrained("gpt2")
    assert huggingface_hub.constants.HF_HUB_OFFLINE


@pytest.mark.parametrize("kwargs, match", [
    ({"name_or_path": 3}, "name_or_path must be a Hub name"),
    ({"name_or_path": ""}, "name_or_path must be a Hub name"),
    ({"dtype": torch.int64}, "dtype must be a floating torch dtype"),
])
def test_bad_arguments_to_gpt2_from_pretrained(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gpt2_from_pretrained(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"prompt": ""}, "prompt must be a non-empty string"),
    ({"prompt": ["def"]}, "prompt must be a non-empty string"),
    ({"max_new_tokens": 0}, "max_new_tokens must be an int >= 1"),
])
def test_bad_arguments_to_gpt2_greedy_continuation(checkpoint, kwargs, match):
    with pytest.raises(ValueError, match=match):
        gpt2_greedy_continuation(checkpoint, **kwargs)
