"""The one Hugging Face bridge (transformer_lib.hf, Chapter 10): load by a name map with strict checks, and the
inverse, ours -> theirs. For BERT, GPT-2, T5 and ViT: a random Hugging Face model A goes into ours, ours goes into
a Hugging Face model B built with other random weights, and B must then equal A, tensor for tensor (tied weights
still tied) and output for output. Built from configs only, never downloaded."""

import pytest
import test_bert
import test_gpt
import test_t5
import test_vit
import torch
import torch.nn as nn
from helpers import import_hf, max_diff, noisy

from transformer_lib.bert import (
    BertConfig,
    BertForMaskedLM,
    BertModel,
    bert_hf_names,
    load_hf_bert,
    to_hf_bert,
)
from transformer_lib.gpt import GPT, GPTConfig, load_hf_gpt2, to_hf_gpt2
from transformer_lib.hf import HFTensor, load_by_names, save_by_names
from transformer_lib.t5 import T5, T5Config, load_hf_t5, to_hf_t5
from transformer_lib.vit import ViT, ViTConfig, load_hf_vit, to_hf_vit

pytestmark = pytest.mark.usefixtures("no_network")


def assert_same_state(a: nn.Module, b: nn.Module):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def round_trip(make_hf, ours, load, to_hf):
    """A (random) -> ours -> B (other random) must give B == A."""
    a, b = noisy(make_hf(), seed=1), noisy(make_hf(), seed=2)
    assert any(not torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(),
                                                      strict=True))
    load(ours, a)
    assert to_hf(ours, b) is b
    assert_same_state(a, b)
    return a, b


def test_bert_round_trip():
    transformers = import_hf("transformers")
    cfg = test_bert.hf_config()
    for hf_class, ours_class in ((transformers.BertModel, BertModel), (transformers.BertForMaskedLM, BertForMaskedLM)):
        a, b = round_trip(lambda c=hf_class: c(cfg), ours_class(BertConfig.from_hf(cfg)).double(), load_hf_bert,
                          to_hf_bert)
        ids = torch.randint(2, test_bert.V, (2, 7), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            out_a, out_b = a(input_ids=ids), b(input_ids=ids)
        first = out_a.last_hidden_state if hf_class is transformers.BertModel else out_a.logits
        second = out_b.last_hidden_state if hf_class is transformers.BertModel else out_b.logits
        assert torch.equal(first, second)
    mlm = transformers.BertForMaskedLM(cfg)                                # its decoder stays tied to the bias
    to_hf_bert(load_hf_bert(BertForMaskedLM(BertConfig.from_hf(cfg)), noisy(transformers.BertForMaskedLM(cfg), 4)),
               mlm)
    assert torch.equal(mlm.cls.predictions.decoder.weight, mlm.bert.embeddings.word_embeddings.weight)


def test_gpt2_round_trip_keeps_the_output_layer_tied():
    transformers = import_hf("transformers")
    cfg = test_gpt.hf_config()
    a, b = round_trip(lambda: transformers.GPT2LMHeadModel(cfg), GPT(GPTConfig.from_hf(cfg)).double(), load_hf_gpt2,
                      to_hf_gpt2)
    assert b.lm_head.weight.data_ptr() == b.transformer.wte.weight.data_ptr()
    ids = torch.randint(0, test_gpt.V, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)


def test_t5_round_trip():
    transformers = import_hf("transformers")
    cfg = test_t5.hf_config()
    a, b = round_trip(lambda: transformers.T5ForConditionalGeneration(cfg), T5(T5Config.from_hf(cfg)).double(),
                      load_hf_t5, to_hf_t5)
    src = torch.randint(2, 64, (2, 6), generator=torch.Generator().manual_seed(6))
    tgt = torch.randint(2, 64, (2, 4), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        assert torch.equal(a(input_ids=src, decoder_input_ids=tgt).logits, b(input_ids=src, decoder_input_ids=tgt).logits)


@pytest.mark.parametrize("hf_class_name, num_classes", [("ViTForImageClassification", 10), ("ViTModel", 0)])
def test_vit_round_trip(hf_class_name, num_classes):
    transformers = import_hf("transformers")
    cfg = test_vit.hf_config()
    kwargs = {} if num_classes else {"add_pooling_layer": False}
    a, b = round_trip(lambda: getattr(transformers, hf_class_name)(cfg, **kwargs),
                      ViT(ViTConfig.from_hf(cfg, num_classes)).double(), load_hf_vit, to_hf_vit)
    images = torch.randn(2, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        first, second = a(pixel_values=images), b(pixel_values=images)
    key = "logits" if num_classes else "last_hidden_state"
    assert torch.equal(getattr(first, key), getattr(second, key))


def test_ours_after_the_round_trip_computes_what_theirs_does():
    """The bridge moves weights, not a promise: ours (loaded from A) equals B (written from ours) in float64."""
    transformers = import_hf("transformers")
    cfg = test_gpt.hf_config()
    ours = load_hf_gpt2(GPT(GPTConfig.from_hf(cfg)).double().eval(), noisy(transformers.GPT2LMHeadModel(cfg), 9))
    b = to_hf_gpt2(ours, transformers.GPT2LMHeadModel(cfg).double().eval())
    ids = torch.randint(0, test_gpt.V, (2, 9), generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        assert max_diff(ours(ids), b(ids).logits) < 1e-12


# ---------------------------------------------------------------- the bridge's own checks, in both directions

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 3)


class Fused(nn.Module):                                   # theirs: one (2, 6) matrix, transposed, two slices
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.arange(12.0).reshape(2, 6))
        self.b = nn.Parameter(torch.zeros(3))


def test_hf_tensor_reads_and_writes_a_transposed_slice():
    names = {"a.weight": HFTensor("w", part=(1, 2), axis=1, transposed=True), "a.bias": "b"}
    theirs = Fused()
    ours = load_by_names(Tiny(), theirs.state_dict(), {**names}, "HINT", ignore=())  # w[:, 3:6].T
    assert torch.equal(ours.a.weight, torch.arange(12.0).reshape(2, 6)[:, 3:].T)
    with torch.no_grad():
        ours.a.weight.mul_(-1)
    save_by_names(ours, theirs, names, "HINT")
    assert torch.equal(theirs.w[:, 3:], -torch.arange(12.0).reshape(2, 6)[:, 3:])      # the slice written back
    assert torch.equal(theirs.w[:, :3], torch.arange(12.0).reshape(2, 6)[:, :3])       # the other slice kept


def test_save_by_names_checks_as_load_does():
    theirs = Fused()
    with pytest.raises(ValueError, match=r"no Hugging Face name for our \['a.bias'\]: HINT"):
        save_by_names(Tiny(), theirs, {"a.weight": HFTensor("w", part=(0, 2), axis=1, transposed=True)}, "HINT")
    with pytest.raises(ValueError, match=r"hf_model's 'w' has shape \(2, 6\), our 'a.weight' \(3, 2\): HINT"):
        save_by_names(Tiny(), theirs, {"a.weight": "w", "a.bias": "b"}, "HINT")
    with pytest.raises(ValueError, match=r"hf_model must be a Hugging Face model"):
        save_by_names(Tiny(), {"w": torch.ones(3, 2)}, {"a.weight": "w", "a.bias": "b"}, "HINT")
    with pytest.raises(ValueError, match=r"theirs must be a state_dict"):
        load_by_names(Tiny(), Fused(), {"a.weight": "w", "a.bias": "b"}, "HINT")


def test_to_hf_refuses_a_model_of_other_sizes():
    transformers = import_hf("transformers")
    ours = BertModel(BertConfig.from_hf(test_bert.hf_config()))
    with pytest.raises(ValueError, match=r"hf_model's .* has shape"):
        to_hf_bert(ours, transformers.BertModel(test_bert.hf_config(hidden_size=64, num_attention_heads=4)))
    assert set(bert_hf_names(ours)) == set(ours.state_dict())
