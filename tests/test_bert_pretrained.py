"""Chapter 10, section 10.9: BERT-base's real weights in the book's BertForMaskedLM (issue 22, item 2).

The chapter's cell downloads `bert-base-uncased` where there is a network (Colab) and skips offline. These tests
run the same two functions, `bert_from_pretrained` and `bert_fill_mask`, offline: a random-weight
`transformers.BertForMaskedLM` and a small WordPiece tokenizer are written with `save_pretrained` to a temporary
directory and loaded from there (no mocks), and a Hub name fails instead of downloading."""

import pytest
import torch
from helpers import import_hf, wordpiece_tokenizer

from transformer_lib.bert import BertForMaskedLM, bert_fill_mask, bert_from_pretrained

pytestmark = pytest.mark.usefixtures("no_network")   # tests/conftest.py: any connection fails

WORDS = ["the", "capital", "of", "france", "is", "paris", "berlin", "a", "city", "river", "and", "big", "."]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A directory holding what save_pretrained writes for a (tiny, random) BERT and its WordPiece tokenizer."""
    transformers = import_hf("transformers")
    tokenizer = wordpiece_tokenizer(WORDS)
    assert len(tokenizer) == 5 + len(WORDS)
    ids = tokenizer("The capital of France is [MASK].")["input_ids"]       # real words, one mask, no [UNK]
    assert ids[0] == 2 and ids[-1] == 3 and ids.count(4) == 1 and 1 not in ids and len(ids) == 9
    path = tmp_path_factory.mktemp("bert-random")
    config = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=32)
    torch.manual_seed(0)
    hf_model = transformers.BertForMaskedLM(config)
    with torch.no_grad():
        for p in hf_model.parameters():
            p.add_(0.1 * torch.randn_like(p))          # every weight matters, LayerNorm gains included
    hf_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_the_checkpoint_loads_into_our_bert_with_equal_logits(checkpoint):
    ours, theirs = bert_from_pretrained(checkpoint, dtype=torch.float64)
    assert isinstance(ours, BertForMaskedLM) and not ours.training and not theirs.training
    x = torch.randint(5, ours.bert.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (ours(x) - theirs(input_ids=x).logits).abs().max().item()
    assert diff < 1e-10


def test_fill_mask_gives_their_top_words(checkpoint):
    out = bert_fill_mask(checkpoint, "the capital of france is [MASK] .", top_k=5, dtype=torch.float64)
    assert out["same"] and out["max_diff"] < 1e-10
    assert len(out["words"]) == 5 and all(w in WORDS + ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                          for w in out["words"])
    probs = out["probabilities"]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-9


def test_same_is_false_when_the_top_words_differ(checkpoint, monkeypatch):
    """"same" compares real rankings: if our model's logits were reversed, it says so (the chapter asserts it)."""
    real = BertForMaskedLM.forward
    monkeypatch.setattr(BertForMaskedLM, "forward", lambda self, *args, **kwargs: -real(self, *args, **kwargs))
    out = bert_fill_mask(checkpoint, "the capital of france is [MASK] .", top_k=3, dtype=torch.float64)
    assert not out["same"]


def test_a_hub_name_fails_offline_instead_of_downloading():
    """What the chapter's cell catches: offline, loading 'bert-base-uncased' raises (OSError from transformers, or
    the no_network guard's RuntimeError if a connection is attempted); nothing is downloaded."""
    huggingface_hub = import_hf("huggingface_hub")
    if isinstance(huggingface_hub.try_to_load_from_cache("bert-base-uncased", "config.json"), str):
        pytest.skip("bert-base-uncased is in this machine's Hugging Face cache: it would load, not fail")
    with pytest.raises((OSError, RuntimeError)):
        bert_from_pretrained("bert-base-uncased")


@pytest.mark.parametrize("kwargs, match", [
    ({"name_or_path": None}, "name_or_path must be a Hub name"),
    ({"name_or_path": ""}, "name_or_path must be a Hub name"),
    ({"dtype": torch.bool}, "dtype must be a floating torch dtype"),
])
def test_bad_arguments_to_bert_from_pretrained(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bert_from_pretrained(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"text": ""}, "text must be a non-empty string"),
    ({"text": "the capital of france is paris ."}, r"mask token \[MASK\] exactly once, got 0"),
    ({"text": "[MASK] is the [MASK] of france"}, r"exactly once, got 2"),
    ({"top_k": 0}, "top_k must be an int >= 1"),
])
def test_bad_arguments_to_bert_fill_mask(checkpoint, kwargs, match):
    with pytest.raises(ValueError, match=match):
        bert_fill_mask(checkpoint, **kwargs)


@pytest.mark.parametrize("class_name", ["BertForMaskedLMs", 3, "__version__"])
def test_from_pretrained_names_a_bad_class_name(checkpoint, class_name):
    """The shared door of both *_from_pretrained functions (transformer_lib.hf.from_pretrained)."""
    from transformer_lib.hf import from_pretrained

    with pytest.raises(ValueError, match="class_name must name a transformers model class"):
        from_pretrained(class_name, checkpoint)
