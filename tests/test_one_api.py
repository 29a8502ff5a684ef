"""One library across the families (issue 23): one convention at every model's door, tested family by family.

The convention (CONTRIBUTING.md, "One API across the families"):
- argument names: a single stack reads `tokens` (GPT, BERT, SequenceClassifier) or `images` (ViT); an
  encoder-decoder (Transformer, T5) reads `src` and `tgt`, with `src_mask` and `tgt_mask`; a single stack's mask
  is `mask`;
- `mask=None` / `src_mask=None` at a model's door masks the padding of the token ids that call reads
  (`config.pad_id`); GPT has no padding token, so its `None` is the causal mask alone; `tgt_mask=None` adds nothing
  to the decoder's causal mask; `decode(tgt, memory, src_mask)`, which sees no source tokens, requires its mask;
- a model returns one tensor: a model with a head its logits, a body (`encode`, `decode`, `BertModel`) its
  hidden states; attention weights are handed back by `attention_maps(model)`, never stored;
- every encoder-decoder decodes through Chapter 8's `greedy_decode` / `beam_search` and its KV cache.
"""

import inspect

import pytest
import torch

from transformer_lib.attention import causal_mask, padding_mask
from transformer_lib.bert import BertClassifier, BertConfig, BertForMaskedLM, BertModel
from transformer_lib.classifier import ClassifierConfig, SequenceClassifier
from transformer_lib.decoding import beam_search, greedy_decode, sequence_scores
from transformer_lib.gpt import GPT, GPTConfig
from transformer_lib.model import Transformer, TransformerConfig
from transformer_lib.multi_head import MultiHeadAttention, attention_maps
from transformer_lib.t5 import T5, T5Config, t5_generate
from transformer_lib.vit import ViT, ViTConfig

V, PAD, BOS, EOS = 30, 0, 1, 2
DT = torch.float64


def ids(*shape, seed=0, low=3):
    return torch.randint(low, V, shape, generator=torch.Generator().manual_seed(seed))


def padded(B=3, S=7, seed=0):
    """(B, S) ids with right padding in every row but the first (lengths S, S - 2, S - 4, ...)."""
    x = ids(B, S, seed=seed)
    for b in range(1, B):
        x[b, S - 2 * b:] = PAD
    return x


def transformer():
    torch.manual_seed(0)
    return Transformer(TransformerConfig(V, V, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=2,
                                         num_decoder_layers=2, dropout=0.0, pad_id=PAD)).to(DT).eval()


def t5():
    torch.manual_seed(1)
    return T5(T5Config(vocab_size=V, d_model=16, num_heads=2, d_ff=32, num_layers=2, num_decoder_layers=2,
                       num_buckets=8, max_distance=16, dropout=0.0, pad_id=PAD, eos_id=EOS)).to(DT).eval()


def bert_config():
    return BertConfig(vocab_size=V, max_len=16, d_model=16, num_layers=2, num_heads=2, d_ff=32, dropout=0.0,
                      pad_id=PAD)


def gpt():
    torch.manual_seed(2)
    return GPT(GPTConfig(vocab_size=V, max_len=32, d_model=16, num_layers=2, num_heads=2, d_ff=32,
                         dropout=0.0)).to(DT).eval()


ENCODER_DECODERS = {"Transformer": transformer, "T5": t5}


# --- names at the door -------------------------------------------------------------------------------------

DOORS = [
    (Transformer.forward, ["src", "tgt", "src_mask", "tgt_mask"]),
    (Transformer.encode, ["src", "src_mask"]),
    (Transformer.decode, ["tgt", "memory", "src_mask", "tgt_mask", "cache"]),
    (T5.forward, ["src", "tgt", "src_mask", "tgt_mask"]),
    (T5.encode, ["src", "src_mask"]),
    (T5.decode, ["tgt", "memory", "src_mask", "tgt_mask", "cache"]),
    (GPT.forward, ["tokens", "mask", "cache", "position_ids"]),
    (BertModel.forward, ["tokens", "segment_ids", "mask"]),
    (BertForMaskedLM.forward, ["tokens", "segment_ids", "mask"]),
    (BertClassifier.forward, ["tokens", "segment_ids", "mask"]),
    (SequenceClassifier.forward, ["tokens"]),
    (ViT.forward, ["images"]),
    (greedy_decode, ["model", "src", "src_mask"]),
    (beam_search, ["model", "src", "src_mask"]),
    (t5_generate, ["model", "src", "max_new_tokens", "src_mask"]),
]


@pytest.mark.parametrize("fn, names", DOORS, ids=[f.__qualname__ for f, _ in DOORS])
def test_every_door_uses_the_same_argument_names(fn, names):
    params = [p for p in inspect.signature(fn).parameters if p != "self"]
    assert params[:len(names)] == names


# --- what None means -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ENCODER_DECODERS)
def test_src_mask_none_masks_the_padding_in_forward_and_encode(family):
    model = ENCODER_DECODERS[family]()
    src, tgt = padded(seed=3), ids(3, 5, seed=4)
    explicit, everything = model.make_src_mask(src), torch.ones(1, 1, 1, src.size(1), dtype=torch.bool)
    with torch.no_grad():
        assert torch.equal(model(src, tgt), model(src, tgt, explicit))
        assert torch.equal(model.encode(src), model.encode(src, explicit))
        # the test can fail: attending to the padding changes the padded rows
        assert not torch.allclose(model(src, tgt)[1:], model(src, tgt, everything)[1:])
        # decode sees no source tokens: it cannot mask their padding, so its src_mask is required
        memory = model.encode(src)
        with pytest.raises(ValueError, match="src_mask is required"):
            model.decode(tgt, memory, None)
        assert torch.equal(model.lm_head(model.decode(tgt, memory, explicit)), model(src, tgt))


@pytest.mark.parametrize("model_fn", [lambda: BertModel(bert_config()), lambda: BertForMaskedLM(bert_config()),
                                      lambda: BertClassifier(bert_config(), 3)],
                         ids=["BertModel", "BertForMaskedLM", "BertClassifier"])
def test_bert_mask_none_masks_the_padding(model_fn):
    torch.manual_seed(5)
    model = model_fn().to(DT).eval()
    x = padded(seed=6)
    with torch.no_grad():
        assert torch.equal(model(x), model(x, mask=padding_mask(x, PAD)))
        assert not torch.allclose(model(x)[1:], model(x, mask=torch.ones(1, 1, 1, x.size(1), dtype=torch.bool))[1:])


def test_gpt_mask_none_is_the_causal_mask_alone():
    model, x = gpt(), ids(2, 6, seed=7)
    with torch.no_grad():
        assert torch.equal(model(x), model(x, mask=torch.ones(1, 1, 1, 6, dtype=torch.bool)))
        assert torch.equal(model(x), model(x, mask=causal_mask(6)[None, None]))   # the causal mask: no change


@pytest.mark.parametrize("family", ENCODER_DECODERS)
def test_tgt_mask_none_adds_nothing_to_the_causal_mask(family):
    model = ENCODER_DECODERS[family]()
    src, tgt = ids(2, 6, seed=8), ids(2, 5, seed=9)
    with torch.no_grad():
        assert torch.equal(model(src, tgt), model(src, tgt, tgt_mask=torch.ones(1, 1, 1, 5, dtype=torch.bool)))


# --- one output type ------------------------------------------------------------------------------------------

def test_every_model_returns_one_tensor():
    torch.manual_seed(10)
    x, src, tgt = ids(2, 6, seed=11), ids(2, 6, seed=12), ids(2, 4, seed=13)
    images = torch.randn(2, 1, 8, 8, dtype=DT)
    cases = {
        "Transformer": (lambda m: m(src, tgt), transformer(), (2, 4, V)),
        "Transformer.encode": (lambda m: m.encode(src), transformer(), (2, 6, 16)),
        "Transformer.decode": (lambda m: m.decode(tgt, m.encode(src), m.make_src_mask(src)), transformer(), (2, 4, 16)),
        "T5": (lambda m: m(src, tgt), t5(), (2, 4, V)),
        "T5.encode": (lambda m: m.encode(src), t5(), (2, 6, 16)),
        "T5.decode": (lambda m: m.decode(tgt, m.encode(src), m.make_src_mask(src)), t5(), (2, 4, 16)),
        "GPT": (lambda m: m(x), gpt(), (2, 6, V)),
        "BertModel": (lambda m: m(x), BertModel(bert_config()).to(DT).eval(), (2, 6, 16)),
        "BertModel.pooler_output": (lambda m: m.pooler_output(m(x)), BertModel(bert_config()).to(DT).eval(), (2, 16)),
        "BertForMaskedLM": (lambda m: m(x), BertForMaskedLM(bert_config()).to(DT).eval(), (2, 6, V)),
        "BertClassifier": (lambda m: m(x), BertClassifier(bert_config(), 3).to(DT).eval(), (2, 3)),
        "SequenceClassifier": (lambda m: m(x), SequenceClassifier(ClassifierConfig(V, 3, d_model=16, num_heads=2, d_ff=32)).to(DT).eval(),
                               (2, 3)),
        "ViT": (lambda m: m(images), ViT(ViTConfig(image_size=8, patch_size=4, d_model=16, num_layers=1, num_heads=2,
                                                   d_ff=32, num_classes=3)).to(DT).eval(), (2, 3)),
    }
    with torch.no_grad():
        for name, (call, model, shape) in cases.items():
            out = call(model)
            assert isinstance(out, torch.Tensor), f"{name} returned {type(out).__name__}"
            assert tuple(out.shape) == shape and out.dtype == DT, name


def test_attention_maps_are_handed_back_for_every_family_and_never_stored():
    src, tgt, x = ids(2, 6, seed=14), ids(2, 4, seed=15), ids(2, 6, seed=16)
    models = {"Transformer": (transformer(), lambda m: m(src, tgt)), "T5": (t5(), lambda m: m(src, tgt)),
              "GPT": (gpt(), lambda m: m(x)), "BERT": (BertForMaskedLM(bert_config()).to(DT).eval(), lambda m: m(x)),
              "ViT": (ViT(ViTConfig(image_size=8, patch_size=4, d_model=16, num_layers=1, num_heads=2, d_ff=32,
                                    num_classes=3)).to(DT).eval(), lambda m: m(torch.randn(2, 1, 8, 8, dtype=DT)))}
    for name, (model, call) in models.items():
        before = {k: set(vars(m)) for k, m in model.named_modules()}
        with attention_maps(model) as maps, torch.no_grad():
            call(model)
        attention = [k for k, m in model.named_modules() if isinstance(m, MultiHeadAttention)]
        assert list(maps) == attention, name                        # every attention module, in module order
        for weights in maps.values():
            assert weights.dim() == 4 and torch.allclose(weights.sum(-1), torch.ones((), dtype=DT)), name
        assert {k: set(vars(m)) for k, m in model.named_modules()} == before, f"{name} kept something"


# --- one decoding path ----------------------------------------------------------------------------------------

def ends(family):
    """The start and end tokens: T5 starts from pad_id."""
    return dict(bos_id=PAD, eos_id=EOS, pad_id=PAD) if family == "T5" else dict(bos_id=BOS, eos_id=EOS, pad_id=PAD)


@pytest.mark.parametrize("family", ENCODER_DECODERS)
def test_greedy_and_beam_search_decode_every_encoder_decoder_with_the_cache(family):
    model = ENCODER_DECODERS[family]()
    src = padded(seed=17)
    kw = dict(ends(family), max_new_tokens=8)
    cached, scores = greedy_decode(model, src, **kw)
    recomputed, scores_recomputed = greedy_decode(model, src, use_cache=False, **kw)
    assert torch.equal(cached, recomputed) and torch.allclose(scores, scores_recomputed)
    assert torch.equal(greedy_decode(model, src, model.make_src_mask(src), **kw)[0], cached)   # None = padding
    beam1, beam1_scores = beam_search(model, src, beam_size=1, **kw)
    assert torch.equal(beam1, cached[:, :beam1.size(1)]) and torch.allclose(beam1_scores, scores)
    beam4, beam4_scores = beam_search(model, src, beam_size=4, **kw)
    rescored = sequence_scores(model, src, None, beam4, bos_id=kw["bos_id"], eos_id=EOS)   # teacher forcing
    assert torch.allclose(beam4_scores, rescored)
    for b in range(src.size(0)):                                      # the padding is invisible: a row alone
        n = int((src[b] != PAD).sum())
        alone, _ = greedy_decode(model, src[b:b + 1, :n], **kw)
        assert torch.equal(alone[0], cached[b, :alone.size(1)])


def test_t5_generate_is_greedy_decode_with_t5s_tokens():
    model, src = t5(), padded(seed=18)
    assert torch.equal(t5_generate(model, src, 8), greedy_decode(model, src, **ends("T5"), max_new_tokens=8)[0])
