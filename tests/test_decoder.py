"""transformer_lib.decoder (Chapter 7) against nn.TransformerDecoderLayer / nn.TransformerDecoder in float64;
the decoder is always causal (PyTorch's side gets the causal mask explicitly); the cache; errors that name the
caller's argument; the exercise checker (transformer_lib.exercises.decoder)."""

import pytest
import torch
from helpers import randomize

from transformer_lib.attention import causal_mask, padding_mask
from transformer_lib.decoder import Decoder, DecoderLayer, decoder_layer_to_torch, decoder_to_torch
from transformer_lib.exercises.decoder import check_tgt_mask
from transformer_lib.multi_head import AttentionCache, attention_maps

DT = torch.float64
ATOL = 1e-12


def problem(B=4, S=9, T=6, d_model=32, seed=0):
    """Embedded target y (B, T, d), memory (B, S, d), source padding mask (B, 1, 1, S), causal mask (T, T)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(B, T, d_model, generator=g, dtype=DT)
    memory = torch.randn(B, S, d_model, generator=g, dtype=DT)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S
    src_mask = (torch.arange(S) < lengths[:, None])[:, None, None, :]
    return y, memory, src_mask, causal_mask(T)


def torch_kwargs(src_mask, causal):
    """PyTorch's convention (True = forbidden / padding); PyTorch is causal only when given the mask."""
    return dict(tgt_mask=~causal, tgt_is_causal=True, memory_key_padding_mask=~src_mask[:, 0, 0, :])


# ---------------------------------------------------------------- equality with PyTorch

@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("train_mode", [True, False])
@pytest.mark.parametrize("pass_causal", [False, True])
def test_layer_equals_torch(norm_first, train_mode, pass_causal):
    ours = randomize(DecoderLayer(32, 4, 48, dropout=0.0, norm_first=norm_first).double(), seed=1)
    ours.train(train_mode)
    theirs = decoder_layer_to_torch(ours)
    assert theirs.training == train_mode and theirs.norm_first == norm_first
    y, memory, src_mask, causal = problem(seed=2)
    with torch.set_grad_enabled(train_mode):
        a = ours(y, memory, src_mask, causal[None, None] if pass_causal else None)   # causal either way
        b = theirs(y, memory, **torch_kwargs(src_mask, causal))
    torch.testing.assert_close(a, b, rtol=0, atol=ATOL)


def test_layer_equals_torch_without_source_mask():
    ours = randomize(DecoderLayer(16, 2, 32, dropout=0.0).double(), seed=3)
    y, memory, _, causal = problem(B=2, S=5, T=3, d_model=16, seed=4)
    theirs = decoder_layer_to_torch(ours)(y, memory, tgt_mask=~causal, tgt_is_causal=True)
    torch.testing.assert_close(ours(y, memory), theirs, rtol=0, atol=ATOL)


@pytest.mark.parametrize("num_layers, final_norm, norm_first", [(1, True, False), (3, True, False),
                                                               (2, False, False), (2, True, True)])
def test_decoder_equals_torch(num_layers, final_norm, norm_first):
    ours = Decoder(num_layers, 32, 4, 64, dropout=0.0, norm_first=norm_first, final_norm=final_norm).double()
    randomize(ours, seed=num_layers).eval()
    theirs = decoder_to_torch(ours)
    assert (theirs.norm is None) == (not final_norm) and len(theirs.layers) == num_layers
    y, memory, src_mask, causal = problem(seed=5)
    with torch.no_grad():
        torch.testing.assert_close(ours(y, memory, src_mask), theirs(y, memory, **torch_kwargs(src_mask, causal)),
                                   rtol=0, atol=ATOL)


# ---------------------------------------------------------------- always causal, no leakage

def test_no_leakage_from_future_target_positions_without_any_target_mask():
    dec = randomize(Decoder(2, 16, 4, 32, dropout=0.0).double(), seed=6).eval()
    y, memory, src_mask, _ = problem(B=3, T=7, d_model=16, seed=7)
    out = dec(y, memory, src_mask)                               # tgt_mask=None
    g = torch.Generator().manual_seed(8)
    for t in range(7):
        y2 = y.clone()
        y2[:, t + 1:] = 10 * torch.randn(y2[:, t + 1:].shape, generator=g, dtype=DT)
        assert torch.equal(dec(y2, memory, src_mask)[:, :t + 1], out[:, :t + 1])   # bit-identical
        if t < 6:                                                # the later positions did change
            assert (dec(y2, memory, src_mask)[:, t + 1:] - out[:, t + 1:]).abs().max() > 1e-3


def test_a_target_mask_can_only_remove_keys():
    layer = randomize(DecoderLayer(16, 2, 32, dropout=0.0).double(), seed=18).eval()
    y, memory, src_mask, _ = problem(B=2, T=5, d_model=16, seed=19)
    everything = torch.ones(1, 1, 5, 5, dtype=torch.bool)        # "attend to all": still causal
    with attention_maps(layer) as maps:
        layer(y, memory, src_mask, everything)
    assert torch.all(maps["self_attn"].triu(1) == 0)
    torch.testing.assert_close(layer(y, memory, src_mask, everything), layer(y, memory, src_mask), rtol=0, atol=0)


def test_no_leakage_from_padded_source_positions():
    dec = randomize(Decoder(2, 16, 4, 32, dropout=0.0).double(), seed=9).eval()
    y, memory, src_mask, _ = problem(B=4, S=8, d_model=16, seed=10)
    real = src_mask[:, 0, 0, :]
    assert not real.all()
    memory2 = memory.clone()
    memory2[~real] = 1e3 * torch.randn(int((~real).sum()), 16, dtype=DT)
    out = dec(y, memory, src_mask)
    torch.testing.assert_close(dec(y, memory2, src_mask), out, rtol=0, atol=ATOL)
    assert (dec(y, memory2, None) - out).abs().max() > 1e-3


def test_appending_source_padding_changes_nothing():
    dec = randomize(Decoder(2, 16, 2, 32, dropout=0.0).double(), seed=11).eval()
    y, memory, _, _ = problem(B=1, S=5, d_model=16, seed=12)
    padded = torch.cat([memory, torch.randn(1, 3, 16, dtype=DT)], dim=1)
    mask = (torch.arange(8) < 5)[None, None, None, :]
    torch.testing.assert_close(dec(y, padded, mask), dec(y, memory), rtol=0, atol=ATOL)


def test_attention_maps_hands_back_both_maps_and_stores_nothing():
    dec = Decoder(2, 16, 4, 32, dropout=0.0).double().eval()
    y, memory, src_mask, _ = problem(B=3, S=7, T=5, d_model=16, seed=13)
    with attention_maps(dec) as maps:
        out = dec(y, memory, src_mask)
    assert list(maps) == [f"layers.{i}.{kind}" for i in range(2) for kind in ("self_attn", "cross_attn")]
    for i in range(2):
        s, c = maps[f"layers.{i}.self_attn"], maps[f"layers.{i}.cross_attn"]
        assert s.shape == (3, 4, 5, 5) and c.shape == (3, 4, 5, 7)
        assert torch.all(s.triu(1) == 0)
        assert torch.all(c.masked_select(~src_mask.expand_as(c)) == 0)
        torch.testing.assert_close(c.sum(-1), torch.ones(3, 4, 5, dtype=DT), rtol=0, atol=ATOL)
    torch.testing.assert_close(out, dec(y, memory, src_mask), rtol=0, atol=ATOL)   # fused path: same result
    assert not any(isinstance(v, torch.Tensor) and v.dim() == 4 for m in dec.modules() for v in vars(m).values())


def test_target_padding_mask_combines_with_causal():
    layer = randomize(DecoderLayer(16, 2, 32, dropout=0.0).double(), seed=14)
    y, memory, src_mask, _ = problem(B=2, T=5, d_model=16, seed=15)
    tgt = torch.tensor([[0, 0, 4, 5, 6], [3, 4, 5, 6, 7]])           # left padding in sentence 0
    with attention_maps(layer) as maps:
        layer(y, memory, src_mask, padding_mask(tgt, 0))                 # (B, 1, 1, T): padding only
    w = maps["self_attn"]
    assert torch.all(w[0, :, :, :2] == 0) and torch.all(w.triu(1) == 0)
    assert torch.all(w[0, :, :2] == 0)                               # rows with nothing to attend to: zeros
    full = padding_mask(tgt, 0) & causal_mask(5)                     # make_tgt_mask's (B, 1, T, T): the same
    torch.testing.assert_close(layer(y, memory, src_mask, full), layer(y, memory, src_mask, padding_mask(tgt, 0)),
                               rtol=0, atol=0)
    assert not torch.isnan(layer(y, memory, src_mask, full)).any()


# ---------------------------------------------------------------- the cache

@pytest.mark.parametrize("chunks", [[1] * 6, [2, 1, 3], [6]])
def test_cache_through_the_layer_equals_full_decoding(chunks):
    layer = randomize(DecoderLayer(16, 4, 32, dropout=0.0).double(), seed=20).eval()
    y, memory, src_mask, _ = problem(B=3, S=5, T=6, d_model=16, seed=21)
    full = layer(y, memory, src_mask)
    cache = layer.new_cache()
    assert isinstance(cache[0], AttentionCache) and not cache[0].static and cache[1].static
    outs, t = [], 0
    for n in chunks:
        outs.append(layer(y[:, t:t + n], memory, src_mask, cache=cache))
        t += n
        assert len(cache[0]) == t and len(cache[1]) == 5
    torch.testing.assert_close(torch.cat(outs, dim=1), full, rtol=0, atol=ATOL)


def test_cache_through_the_decoder_with_target_padding():
    dec = randomize(Decoder(2, 16, 4, 32, dropout=0.0).double(), seed=22).eval()
    y, memory, src_mask, _ = problem(B=2, S=5, T=5, d_model=16, seed=23)
    tgt = torch.tensor([[0, 0, 4, 5, 6], [3, 4, 5, 6, 7]])
    keys = padding_mask(tgt, 0)                                      # (B, 1, 1, T)
    full = dec(y, memory, src_mask, keys)
    cache = dec.new_cache()
    steps = [dec(y[:, i:i + 1], memory, src_mask, keys[..., :i + 1], cache=cache) for i in range(5)]
    assert dec.cache_length(cache) == 5
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=ATOL)


def test_cache_errors():
    layer = DecoderLayer(16, 4, 32).eval()
    y, memory = torch.randn(2, 1, 16), torch.randn(2, 7, 16)
    for bad in [AttentionCache(), (AttentionCache(), AttentionCache()), [AttentionCache(), AttentionCache(True)]]:
        with pytest.raises(ValueError, match="cache must come from DecoderLayer.new_cache"):
            layer(y, memory, cache=bad)
    with pytest.raises(ValueError, match="cache must come from Decoder.new_cache"):
        Decoder(2, 16, 4, 32)(y, memory, cache=[layer.new_cache()])
    cache = layer.new_cache()
    layer(y, memory, cache=cache)
    with pytest.raises(ValueError, match=r"tgt_mask of shape \(2, 1, 1, 3\) does not fit .*\(2, 4, 1, 2\)"):
        layer(y, memory, tgt_mask=torch.ones(2, 1, 1, 3, dtype=torch.bool), cache=cache)   # keys: 1 cached + 1


# ---------------------------------------------------------------- structure, gradients, errors

def test_parameter_count_of_a_layer():
    d, d_ff = 32, 64
    layer = DecoderLayer(d, 4, d_ff)
    assert sum(p.numel() for p in layer.parameters()) == 8 * (d * d + d) + 2 * d * d_ff + d_ff + d + 6 * d
    dec = Decoder(3, d, 4, d_ff)
    assert not torch.equal(dec.layers[0].cross_attn.W_k.weight, dec.layers[2].cross_attn.W_k.weight)
    assert Decoder(1, d, 4, d_ff, final_norm=False).norm is None


def test_gradcheck_through_target_and_memory():
    layer = randomize(DecoderLayer(8, 2, 12, dropout=0.0).double(), seed=16)
    y, memory, src_mask, _ = problem(B=2, S=3, T=3, d_model=8, seed=17)
    y.requires_grad_(True)
    memory.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, m: layer(a, m, src_mask), (y, memory))


def test_clear_value_errors_name_the_argument():
    layer = DecoderLayer(16, 4, 32)
    y, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    cases = [
        (lambda: layer(y, torch.randn(2, 7, 8)), r"memory must be a tensor of shape \(B, S, d_model=16\)"),
        (lambda: layer(y, torch.randn(3, 7, 16)), "memory must have the target's batch size B=2"),
        (lambda: layer(y, memory.double()), "memory is torch.float64 but the module is torch.float32"),
        (lambda: layer(torch.randn(2, 5, 12), memory), r"x must be a tensor of shape \(B, T, d_model=16\)"),
        (lambda: layer(y, memory, tgt_mask=causal_mask(4)[None, None]), r"tgt_mask of shape \(1, 1, 4, 4\)"),
        (lambda: layer(y, memory, tgt_mask=causal_mask(5)), r"tgt_mask of shape \(5, 5\) .*mask\[None, None\]"),
        (lambda: layer(y, memory, tgt_mask=torch.ones(2, 5, dtype=torch.bool)), r"tgt_mask .*padding_mask"),
        (lambda: layer(y, memory, tgt_mask=causal_mask(5)[None, None].float()), "tgt_mask must be a bool tensor"),
        (lambda: layer(y, memory, src_mask=torch.ones(2, 1, 1, 6, dtype=torch.bool)), r"src_mask of shape \(2, 1, 1, 6\)"),
        (lambda: layer(y, memory, src_mask=torch.ones(2, 7, dtype=torch.bool)), "src_mask of shape"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_layers=0), "num_layers must be an int >= 1, got 0"),
    (dict(num_layers=True), "num_layers must be an int >= 1, got bool True"),
    (dict(norm_first="False"), "norm_first must be True or False, got str 'False'"),
    (dict(final_norm="yes"), "final_norm must be True or False"),
    (dict(dropout=1.0), r"dropout must lie in \[0, 1\)"),
])
def test_decoder_constructor_value_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Decoder(**(dict(num_layers=2, d_model=16, num_heads=4, d_ff=32) | kwargs))


def test_empty_batch():
    out = Decoder(2, 16, 4, 32).eval()(torch.randn(0, 5, 16), torch.randn(0, 7, 16))
    assert out.shape == (0, 5, 16)


# ---------------------------------------------------------------- the exercise checker

def reference_mask(tgt, pad_id):
    return padding_mask(tgt, pad_id) & causal_mask(tgt.size(1))


def test_check_tgt_mask_accepts_correct_masks(capsys):
    check_tgt_mask(reference_mask)
    check_tgt_mask(lambda tgt, pad_id: reference_mask(tgt, pad_id).expand(-1, 3, -1, -1)[:, :1])
    assert "correct" in capsys.readouterr().out


@pytest.mark.parametrize("fn, message", [
    (lambda tgt, pad_id: ~reference_mask(tgt, pad_id), "inverted"),
    (lambda tgt, pad_id: causal_mask(tgt.size(1))[None, None], "which is padding"),
    (lambda tgt, pad_id: padding_mask(tgt, pad_id), "future position"),
    (lambda tgt, pad_id: reference_mask(tgt, pad_id) & torch.eye(tgt.size(1), dtype=torch.bool), "cannot attend"),
    (lambda tgt, pad_id: reference_mask(tgt, pad_id).float(), "bool"),
    (lambda tgt, pad_id: reference_mask(tgt, pad_id)[:, 0], "does not fit"),
    (lambda tgt, pad_id: causal_mask(tgt.size(1)), "rank of the attention scores"),
    (lambda tgt, pad_id: None, "expected a tensor"),
])
def test_check_tgt_mask_names_the_mistake(fn, message):
    with pytest.raises(AssertionError, match=message):
        check_tgt_mask(fn)
