"""transformer_lib.model (Chapter 7): the whole Transformer against nn.Transformer (float64), parameter counts,
weight tying, causality without any target mask (a hypothesis property), padding invariance, the cache through
decode, attention weights, and the input errors (named after the caller's argument)."""

import functools
import math
import warnings

import pytest
import torch
from helpers import randomize
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_lib.attention import causal_mask, padding_mask
from transformer_lib.model import Transformer, TransformerConfig, transformer_to_torch
from transformer_lib.multi_head import attention_maps
from transformer_lib.positional import sinusoidal_encoding

DT = torch.float64
ALL4 = torch.ones(2, 1, 1, 4, dtype=torch.bool)          # every memory position of a (2, 4) source
ATOL = 1e-12


def small_config(**overrides):
    fields = dict(src_vocab_size=50, tgt_vocab_size=50, d_model=32, num_heads=4, d_ff=64, num_encoder_layers=2,
                  num_decoder_layers=2, dropout=0.0)
    return TransformerConfig(**{**fields, **overrides})


def reference_logits(model, src, tgt):
    """nn.Transformer plus the paper's embedding and output formulas, independent of Transformer.forward."""
    c = model.config
    E_src, E_tgt, W = model.src_embed.weight, model.tgt_embed.weight, model.lm_head.weight
    pe = sinusoidal_encoding(max(src.size(1), tgt.size(1)), c.d_model).to(DT)
    x = E_src[src] * math.sqrt(c.d_model) + pe[:src.size(1)]
    y = E_tgt[tgt] * math.sqrt(c.d_model) + pe[:tgt.size(1)]
    T = tgt.size(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = transformer_to_torch(model)(
            x, y, tgt_mask=torch.ones(T, T, dtype=torch.bool).triu(1),
            src_key_padding_mask=src == c.pad_id, memory_key_padding_mask=src == c.pad_id)
    return out @ W.T


def tokens(B, n, vocab, seed, pad_from=None):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(1, vocab, (B, n), generator=g)
    if pad_from is not None:
        for b, start in enumerate(pad_from):
            t[b, start:] = 0
    return t


# ---------------------------------------------------------------- configuration and parameter counts

def closed_form(V, d, d_ff, N):
    return V * d + N * (12 * d * d + 4 * d * d_ff + 2 * d_ff + 24 * d) + 4 * d


def count(config):
    with torch.device("meta"):
        return sum(p.numel() for p in Transformer(config).parameters())


def test_presets_follow_table_3():
    base, big = TransformerConfig.base(), TransformerConfig.big()
    assert (base.d_model, base.d_ff, base.num_heads, base.num_encoder_layers, base.num_decoder_layers,
            base.dropout) == (512, 2048, 8, 6, 6, 0.1)
    assert (big.d_model, big.d_ff, big.num_heads, big.num_encoder_layers, big.dropout) == (1024, 4096, 16, 6, 0.3)
    assert big.d_model // big.num_heads == base.d_model // base.num_heads == 64
    assert base.src_vocab_size == base.tgt_vocab_size == 37000 and base.tie_embeddings
    assert TransformerConfig.base(1000, dropout=0.0).dropout == 0.0


def test_parameter_counts_are_exact_and_near_the_paper():
    n_base, n_big = count(TransformerConfig.base()), count(TransformerConfig.big())
    assert n_base == closed_form(37000, 512, 2048, 6) == 63_084_544
    assert n_big == closed_form(37000, 1024, 4096, 6) == 214_249_472
    assert count(TransformerConfig.base(final_norm=False)) == 63_082_496
    assert abs(n_base / 65e6 - 1) < 0.05 and abs(n_big / 213e6 - 1) < 0.05
    untied = count(TransformerConfig.base(tie_embeddings=False))
    assert untied - n_base == 2 * 37000 * 512


# ---------------------------------------------------------------- equality with nn.Transformer

@pytest.mark.parametrize("overrides", [{}, {"norm_first": True}, {"num_encoder_layers": 1, "num_decoder_layers": 3},
                                       {"tie_embeddings": False, "tgt_vocab_size": 70}, {"final_norm": False}])
def test_model_equals_nn_transformer(overrides):
    model = randomize(Transformer(small_config(**overrides)).double(), seed=1).eval()
    src = tokens(4, 9, 50, seed=2, pad_from=[9, 6, 3, 1])
    tgt = tokens(4, 7, model.config.tgt_vocab_size, seed=3)
    with torch.no_grad():
        ours = model(src, tgt, model.make_src_mask(src))          # no tgt_mask: our decoder is causal anyway
        theirs = reference_logits(model, src, tgt)
    assert ours.shape == (4, 7, model.config.tgt_vocab_size)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=ATOL)


def test_encode_decode_compose_to_forward():
    model = Transformer(small_config()).double().eval()
    src, tgt = tokens(2, 6, 50, seed=4, pad_from=[6, 2]), tokens(2, 5, 50, seed=5)
    src_mask, tgt_mask = model.make_src_mask(src), model.make_tgt_mask(tgt)
    memory = model.encode(src, src_mask)
    assert memory.shape == (2, 6, 32)
    hidden = model.decode(tgt, memory, src_mask, tgt_mask)
    assert hidden.shape == (2, 5, 32)
    torch.testing.assert_close(model.lm_head(hidden), model(src, tgt, src_mask, tgt_mask), rtol=0, atol=0)
    with attention_maps(model) as maps:
        memory_w = model.encode(src, src_mask)
        hidden_w = model.decode(tgt, memory_w, src_mask, tgt_mask)
    torch.testing.assert_close(hidden_w, hidden, rtol=0, atol=ATOL)
    assert maps["encoder.layers.0.self_attn"].shape == (2, 4, 6, 6)
    assert maps["decoder.layers.1.cross_attn"].shape == (2, 4, 5, 6)
    assert torch.all(maps["decoder.layers.1.cross_attn"][1, :, :, 2:] == 0)


def test_attention_maps_of_the_whole_model():
    model = Transformer(small_config()).double().eval()
    src, tgt = tokens(2, 6, 50, seed=4, pad_from=[6, 2]), tokens(2, 5, 50, seed=5)
    with torch.no_grad(), attention_maps(model) as maps:
        logits = model(src, tgt, model.make_src_mask(src))
    torch.testing.assert_close(logits, model(src, tgt, model.make_src_mask(src)), rtol=0, atol=ATOL)
    weights = {kind: [w for name, w in maps.items() if name.startswith(stack) and name.endswith(attn)]
               for kind, stack, attn in (("encoder", "encoder", "self_attn"), ("decoder_self", "decoder", "self_attn"),
                                         ("decoder_cross", "decoder", "cross_attn"))}
    assert len(maps) == 6
    assert [tuple(w.shape) for w in weights["encoder"]] == [(2, 4, 6, 6)] * 2
    assert [tuple(w.shape) for w in weights["decoder_self"]] == [(2, 4, 5, 5)] * 2
    assert [tuple(w.shape) for w in weights["decoder_cross"]] == [(2, 4, 5, 6)] * 2
    assert all(torch.all(w.triu(1) == 0) for w in weights["decoder_self"])     # causal without a tgt_mask
    assert all(torch.all(w[1, :, :, 2:] == 0) for w in weights["decoder_cross"] + weights["encoder"])


def test_masks_from_pad_id():
    model = Transformer(small_config(pad_id=3))
    src = torch.tensor([[5, 6, 3, 3]])
    assert model.make_src_mask(src).tolist() == [[[[True, True, False, False]]]]
    tgt = torch.tensor([[3, 5, 6]])
    expected = torch.tensor([[False, False, False], [False, True, False], [False, True, True]])
    assert torch.equal(model.make_tgt_mask(tgt), expected[None, None])


# ---------------------------------------------------------------- causality and padding (properties)

@functools.cache
def causal_model():
    return randomize(Transformer(small_config(d_model=16, d_ff=32, num_heads=2)).double(), seed=6).eval()


@settings(max_examples=20, deadline=None)
@given(data=st.data(), B=st.integers(1, 3), S=st.integers(1, 6), T=st.integers(2, 7))
def test_future_target_tokens_never_change_earlier_logits(data, B, S, T):
    model = causal_model()
    src = torch.tensor(data.draw(st.lists(st.lists(st.integers(1, 49), min_size=S, max_size=S),
                                          min_size=B, max_size=B)))
    tgt = torch.tensor(data.draw(st.lists(st.lists(st.integers(1, 49), min_size=T, max_size=T),
                                          min_size=B, max_size=B)))
    t = data.draw(st.integers(0, T - 2))
    new_tail = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, 49), min_size=T - t - 1,
                                                        max_size=T - t - 1), min_size=B, max_size=B)))
    changed = tgt.clone()
    changed[:, t + 1:] = new_tail
    with torch.no_grad():
        a = model(src, tgt)                                      # tgt_mask=None: the decoder is causal anyway
        b = model(src, changed)
    assert torch.equal(b[:, :t + 1], a[:, :t + 1])               # bit-identical


def test_no_leakage_through_decode_with_tgt_mask_none():
    model = causal_model()
    src, tgt = tokens(2, 5, 50, seed=7), tokens(2, 6, 50, seed=8)
    changed = tgt.clone()
    changed[:, -1] = (changed[:, -1] % 49) + 1                    # only the last target token differs
    with torch.no_grad():
        memory, keep = model.encode(src), model.make_src_mask(src)
        a, b = model.decode(tgt, memory, keep), model.decode(changed, memory, keep)
    assert torch.equal(a[:, :-1], b[:, :-1])
    assert (a[:, -1] - b[:, -1]).abs().max() > 1e-6               # the test can fail: the last position did change
    with torch.no_grad():                                         # make_tgt_mask (padding & causal): the same
        torch.testing.assert_close(model(src, tgt, tgt_mask=model.make_tgt_mask(tgt)), model(src, tgt),
                                   rtol=0, atol=ATOL)


def test_target_padding_mask_keeps_real_logits():
    model = causal_model()
    src, tgt = tokens(2, 5, 50, seed=13), tokens(2, 4, 50, seed=14)
    padded = torch.cat([tgt, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    with torch.no_grad():
        a = model(src, tgt)
        b = model(src, padded, tgt_mask=padding_mask(padded, 0))       # (B, 1, 1, T): padding only
    torch.testing.assert_close(b[:, :4], a, rtol=0, atol=ATOL)


def test_cache_through_decode_equals_full_decoding():
    model = causal_model()
    src, tgt = tokens(3, 5, 50, seed=15, pad_from=[5, 3, 1]), tokens(3, 6, 50, seed=16)
    src_mask = model.make_src_mask(src)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory, src_mask)
        cache = model.decoder.new_cache()
        steps = [model.decode(tgt[:, i:i + 1], memory, src_mask, cache=cache) for i in range(6)]
    assert model.decoder.cache_length(cache) == 6
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=ATOL)


@settings(max_examples=12, deadline=None)
@given(lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3), extra=st.integers(1, 4), T=st.integers(1, 5))
def test_appending_source_padding_changes_no_logit(lengths, extra, T):
    model = causal_model()
    S = max(lengths)
    src = tokens(len(lengths), S, 50, seed=sum(lengths), pad_from=lengths)
    padded = torch.cat([src, torch.zeros(len(lengths), extra, dtype=torch.long)], dim=1)
    tgt = tokens(len(lengths), T, 50, seed=T)
    with torch.no_grad():
        a = model(src, tgt, model.make_src_mask(src))
        b = model(padded, tgt, model.make_src_mask(padded))
    torch.testing.assert_close(a, b, rtol=0, atol=ATOL)


# ---------------------------------------------------------------- weight tying, initialization, dropout

def test_three_way_tying_shares_one_matrix_and_its_gradient():
    model = Transformer(small_config())
    assert model.src_embed.weight is model.tgt_embed.weight is model.lm_head.weight
    src, tgt = tokens(2, 4, 50, seed=9), tokens(2, 3, 50, seed=10)
    model(src, tgt).sum().backward()
    grad = model.lm_head.weight.grad
    assert grad is not None and grad.shape == (50, 32)
    untied = Transformer(small_config(tie_embeddings=False, tgt_vocab_size=60))
    assert untied.src_embed.weight.shape == (50, 32) and untied.tgt_embed.weight.shape == (60, 32)
    assert untied.lm_head.weight.data_ptr() != untied.tgt_embed.weight.data_ptr()


def test_initialization_gives_unit_scale_embeddings_and_logits():
    torch.manual_seed(0)
    model = Transformer(small_config(src_vocab_size=2000, tgt_vocab_size=2000, d_model=256, d_ff=64,
                                     num_encoder_layers=1, num_decoder_layers=1)).eval()
    ids = torch.randint(0, 2000, (4, 16))
    with torch.no_grad():
        assert abs(model.src_embed(ids).std().item() - 1) < 0.05
        assert 0.7 < model(ids, ids).std().item() < 1.4


def test_dropout_only_in_training():
    model = Transformer(small_config(dropout=0.3))
    src, tgt = tokens(2, 5, 50, seed=11), tokens(2, 4, 50, seed=12)
    model.train()
    assert not torch.allclose(model(src, tgt), model(src, tgt))
    model.eval()
    torch.testing.assert_close(model(src, tgt), model(src, tgt), rtol=0, atol=0)


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("kwargs, message", [
    ({"src_vocab_size": 50, "tgt_vocab_size": 60}, "tie_embeddings=True needs one shared vocabulary"),
    ({"num_heads": 5}, r"d_model=32 must be divisible by num_heads=5"),
    ({"num_encoder_layers": 0}, "num_encoder_layers must be an int >= 1, got 0"),
    ({"num_decoder_layers": True}, "num_decoder_layers must be an int >= 1, got bool True"),
    ({"d_model": 33, "num_heads": 3}, "even"),
    ({"dropout": 1.0}, r"dropout must lie in \[0, 1\), got 1.0"),
    ({"dropout": True}, "dropout must be a number, got bool"),
    ({"pad_id": 50}, "pad_id must be a token id of both vocabularies"),
    ({"pad_id": True}, "pad_id must be an int >= 0, got bool True"),
    ({"pad_id": -1}, "pad_id must be an int >= 0"),
    ({"d_ff": 2.5}, "d_ff must be an int >= 1, got float 2.5"),
    ({"norm_first": "False"}, "norm_first must be True or False, got str 'False'"),
    ({"final_norm": 0}, "final_norm must be True or False, got int 0"),
    ({"tie_embeddings": "yes"}, "tie_embeddings must be True or False"),
])
def test_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        small_config(**kwargs)


def test_input_errors():
    model = Transformer(small_config())
    good = torch.zeros(2, 4, dtype=torch.long)
    cases = [
        (lambda: model(torch.rand(2, 4), good), "src must be an integer tensor of token ids, got float32"),
        (lambda: model(good, torch.zeros(4, dtype=torch.long)), r"tgt must be a tensor of shape \(B, length\)"),
        (lambda: model(good, torch.zeros(2, 4, dtype=torch.bool)), "tgt must be an integer tensor"),
        (lambda: model.encode(torch.tensor([[1, 50]])), "src holds token ids from 1 to 50, outside the vocabulary"),
        (lambda: model(good, torch.tensor([[-1, 2, 3, 4], [1, 2, 3, 4]])), "tgt holds token ids from -1"),
        (lambda: model(good, torch.zeros(3, 4, dtype=torch.long)), "src and tgt must have the same batch size"),
        (lambda: model.decode(good, torch.zeros(3, 4, 32), ALL4), r"memory must have shape \(B=2, S, d_model=32\)"),
        (lambda: model.decode(good, torch.zeros(2, 4, 16), ALL4), r"memory must be a tensor of shape \(B=2, S, d_model=32\)"),
        (lambda: model.decode(good, torch.zeros(2, 4, 32, dtype=DT), ALL4), "memory is torch.float64 but the model"),
        (lambda: model.decode(good, torch.zeros(2, 4, 32, dtype=torch.long), ALL4), "memory must be a floating-point"),
        (lambda: model(good, good, tgt_mask=causal_mask(3)), r"tgt_mask of shape \(3, 3\) does not fit"),
        (lambda: model(good, good, tgt_mask=causal_mask(4)), r"tgt_mask of shape \(4, 4\) .*mask\[None, None\]"),
        (lambda: model(good, good, src_mask=good != 0), r"src_mask of shape \(2, 4\) .*padding_mask"),
        (lambda: model(good, good[:, :3], src_mask=model.make_tgt_mask(good)), r"src_mask .*\(B, h, T, S\)"),
        (lambda: model(good, good, src_mask=(good != 0).float()[:, None, None]), "src_mask must be a bool tensor"),
        (lambda: model.decode(good, torch.zeros(2, 4, 32), ALL4, cache=[]), "cache must come from Decoder.new_cache"),
        (lambda: model.decode(good, torch.zeros(2, 4, 32), None), "src_mask is required: decode does not see"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()


def test_checks_run_once_at_the_door(monkeypatch):
    """The model checks its arguments once; its layers, called inside, skip theirs (Chapter 1's checks_due)."""
    from transformer_lib.decoder import DecoderLayer
    from transformer_lib.encoder import EncoderLayer
    calls = []
    for cls in (EncoderLayer, DecoderLayer):
        real = cls.check_inputs
        monkeypatch.setattr(cls, "check_inputs", lambda self, *a, _real=real, **k: calls.append(type(self).__name__)
                            or _real(self, *a, **k))
    model = Transformer(small_config())
    model(tokens(2, 4, 50, seed=1), tokens(2, 3, 50, seed=2))
    assert calls == []                                     # no layer re-checks what the model has checked
    model.encoder(torch.randn(2, 4, 32))                   # a stack called directly: its door, checked once
    assert calls == ["EncoderLayer"]
    with pytest.raises(ValueError, match="src has token ids from 0 to 50, outside the vocabulary|src holds token ids"):
        model(torch.tensor([[1, 50]]), tokens(1, 3, 50, seed=2))      # out of range: still a clear error


def test_empty_batch():
    model = Transformer(small_config()).eval()
    empty = torch.zeros(0, 4, dtype=torch.long)
    assert model(empty, empty[:, :3]).shape == (0, 3, 50)


def test_encode_takes_any_mask_with_the_rank_of_its_scores():
    """CONTRIBUTING's rule at the model's door: encode's src_mask is (B|1, h|1, S|1, S), as Encoder's is."""
    model = Transformer(small_config()).double().eval()
    src = tokens(2, 6, 50, seed=4, pad_from=[6, 2])
    padding = model.make_src_mask(src)                                  # (B, 1, 1, S)
    square = padding.expand(2, 1, 6, 6)                                 # (B, 1, S, S): the same keys per query
    torch.testing.assert_close(model.encode(src, square), model.encode(src, padding), rtol=0, atol=0)
    per_head = padding.expand(2, 4, 6, 6)                               # (B, h, S, S)
    torch.testing.assert_close(model.encode(src, per_head), model.encode(src, padding), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"src_mask of shape \(2, 1, 5, 6\) does not fit the attention scores "
                                         r"\(B, h, S, S\) = \(2, 4, 6, 6\)"):
        model.encode(src, padding.expand(2, 1, 5, 6))
    memory = model.encode(src, padding)
    with pytest.raises(ValueError, match=r"src_mask .* does not fit the attention scores \(B, h, T, S\) = \(2, 4, 3, 6\)"):
        model.decode(tokens(2, 3, 50, seed=5), memory, square)          # (B, 1, S, S) is not a cross mask
