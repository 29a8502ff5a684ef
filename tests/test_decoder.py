"""transformer_lib.decoder (Chapter 7) against nn.TransformerDecoderLayer / nn.TransformerDecoder in float64."""

import pytest
import torch
from helpers import randomize

from transformer_lib.attention import causal_mask, padding_mask
from transformer_lib.decoder import (
    Decoder,
    DecoderLayer,
    check_tgt_mask,
    decoder_layer_to_torch,
    decoder_to_torch,
)

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


def torch_kwargs(src_mask, tgt_mask):
    """Our masks (True = may attend) in PyTorch's convention (True = forbidden / padding)."""
    return dict(tgt_mask=~tgt_mask, memory_key_padding_mask=~src_mask[:, 0, 0, :])


# ---------------------------------------------------------------- equality with PyTorch

@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("train_mode", [True, False])
def test_layer_equals_torch(norm_first, train_mode):
    ours = randomize(DecoderLayer(32, 4, 48, dropout=0.0, norm_first=norm_first).double(), seed=1)
    ours.train(train_mode)
    theirs = decoder_layer_to_torch(ours)
    assert theirs.training == train_mode and theirs.norm_first == norm_first
    y, memory, src_mask, tgt_mask = problem(seed=2)
    with torch.set_grad_enabled(train_mode):
        a = ours(y, memory, src_mask, tgt_mask)
        b = theirs(y, memory, **torch_kwargs(src_mask, tgt_mask))
    torch.testing.assert_close(a, b, rtol=0, atol=ATOL)


def test_layer_equals_torch_without_masks():
    ours = randomize(DecoderLayer(16, 2, 32, dropout=0.0).double(), seed=3)
    y, memory, _, _ = problem(B=2, S=5, T=3, d_model=16, seed=4)
    torch.testing.assert_close(ours(y, memory), decoder_layer_to_torch(ours)(y, memory), rtol=0, atol=ATOL)


@pytest.mark.parametrize("num_layers, final_norm, norm_first", [(1, True, False), (3, True, False),
                                                               (2, False, False), (2, True, True)])
def test_decoder_equals_torch(num_layers, final_norm, norm_first):
    ours = Decoder(num_layers, 32, 4, 64, dropout=0.0, norm_first=norm_first, final_norm=final_norm).double()
    randomize(ours, seed=num_layers).eval()
    theirs = decoder_to_torch(ours)
    assert (theirs.norm is None) == (not final_norm) and len(theirs.layers) == num_layers
    y, memory, src_mask, tgt_mask = problem(seed=5)
    with torch.no_grad():
        torch.testing.assert_close(ours(y, memory, src_mask, tgt_mask),
                                   theirs(y, memory, **torch_kwargs(src_mask, tgt_mask)), rtol=0, atol=ATOL)


# ---------------------------------------------------------------- no leakage

def test_no_leakage_from_future_target_positions():
    dec = randomize(Decoder(2, 16, 4, 32, dropout=0.0).double(), seed=6).eval()
    y, memory, src_mask, tgt_mask = problem(B=3, T=7, d_model=16, seed=7)
    out = dec(y, memory, src_mask, tgt_mask)
    g = torch.Generator().manual_seed(8)
    for t in range(7):
        y2 = y.clone()
        y2[:, t + 1:] = 10 * torch.randn(y2[:, t + 1:].shape, generator=g, dtype=DT)
        torch.testing.assert_close(dec(y2, memory, src_mask, tgt_mask)[:, :t + 1], out[:, :t + 1],
                                   rtol=0, atol=ATOL)
    leaked = dec(y.flip(1), memory, src_mask, None)[:, 0] - dec(y.flip(1), memory, src_mask, tgt_mask)[:, 0]
    assert leaked.abs().max() > 1e-3                            # the test can fail: without the mask it leaks


def test_no_leakage_from_padded_source_positions():
    dec = randomize(Decoder(2, 16, 4, 32, dropout=0.0).double(), seed=9).eval()
    y, memory, src_mask, tgt_mask = problem(B=4, S=8, d_model=16, seed=10)
    real = src_mask[:, 0, 0, :]
    assert not real.all()
    memory2 = memory.clone()
    memory2[~real] = 1e3 * torch.randn(int((~real).sum()), 16, dtype=DT)
    out = dec(y, memory, src_mask, tgt_mask)
    torch.testing.assert_close(dec(y, memory2, src_mask, tgt_mask), out, rtol=0, atol=ATOL)
    assert (dec(y, memory2, None, tgt_mask) - out).abs().max() > 1e-3


def test_appending_source_padding_changes_nothing():
    dec = randomize(Decoder(2, 16, 2, 32, dropout=0.0).double(), seed=11).eval()
    y, memory, _, tgt_mask = problem(B=1, S=5, d_model=16, seed=12)
    padded = torch.cat([memory, torch.randn(1, 3, 16, dtype=DT)], dim=1)
    mask = (torch.arange(8) < 5)[None, None, None, :]
    torch.testing.assert_close(dec(y, padded, mask, tgt_mask), dec(y, memory, None, tgt_mask), rtol=0, atol=ATOL)


def test_need_weights_keeps_both_attention_maps():
    dec = Decoder(2, 16, 4, 32, dropout=0.0).double().eval()
    y, memory, src_mask, tgt_mask = problem(B=3, S=7, T=5, d_model=16, seed=13)
    out = dec(y, memory, src_mask, tgt_mask, need_weights=True)
    for layer in dec.layers:
        s, c = layer.self_attn_weights, layer.cross_attn_weights
        assert s.shape == (3, 4, 5, 5) and c.shape == (3, 4, 5, 7)
        assert torch.all(s.triu(1) == 0)
        assert torch.all(c.masked_select(~src_mask.expand_as(c)) == 0)
        torch.testing.assert_close(c.sum(-1), torch.ones(3, 4, 5, dtype=DT), rtol=0, atol=ATOL)
    torch.testing.assert_close(out, dec(y, memory, src_mask, tgt_mask), rtol=0, atol=ATOL)
    assert all(layer.self_attn_weights is None and layer.cross_attn_weights is None for layer in dec.layers)


def test_target_padding_mask_combines_with_causal():
    layer = randomize(DecoderLayer(16, 2, 32, dropout=0.0).double(), seed=14)
    y, memory, src_mask, _ = problem(B=2, T=5, d_model=16, seed=15)
    tgt = torch.tensor([[0, 0, 4, 5, 6], [3, 4, 5, 6, 7]])           # left padding in sentence 0
    mask = padding_mask(tgt, 0) & causal_mask(5)                     # (B, 1, T, T)
    layer(y, memory, src_mask, mask, need_weights=True)
    assert torch.all(layer.self_attn_weights[0, :, :, :2] == 0)
    assert torch.all(layer.self_attn_weights[0, :, :2] == 0)         # rows with nothing to attend to: zeros
    assert not torch.isnan(layer(y, memory, src_mask, mask)).any()


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
    y, memory, src_mask, tgt_mask = problem(B=2, S=3, T=3, d_model=8, seed=17)
    y.requires_grad_(True)
    memory.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, m: layer(a, m, src_mask, tgt_mask), (y, memory))


def test_clear_value_errors():
    layer = DecoderLayer(16, 4, 32)
    y, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    with pytest.raises(ValueError, match="d_model=16"):
        layer(y, torch.randn(2, 7, 8))
    with pytest.raises(ValueError, match="d_model=16"):
        layer(torch.randn(2, 5, 12), memory)
    with pytest.raises(ValueError, match="broadcast"):
        layer(y, memory, tgt_mask=causal_mask(4))
    with pytest.raises(ValueError, match="broadcast"):
        layer(y, memory, src_mask=torch.ones(2, 1, 1, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        layer(y, memory, tgt_mask=causal_mask(5).float())
    with pytest.raises(ValueError, match="num_layers"):
        Decoder(0, 16, 4, 32)


# ---------------------------------------------------------------- the exercise checker

def reference_mask(tgt, pad_id):
    return padding_mask(tgt, pad_id) & causal_mask(tgt.size(1))


def test_check_tgt_mask_accepts_correct_masks(capsys):
    check_tgt_mask(reference_mask)
    check_tgt_mask(lambda tgt, pad_id: reference_mask(tgt, pad_id).expand(-1, 3, -1, -1)[:, :1])
    assert "correct" in capsys.readouterr().out


@pytest.mark.parametrize("fn, message", [
    (lambda tgt, pad_id: ~reference_mask(tgt, pad_id), "inverted"),
    (lambda tgt, pad_id: causal_mask(tgt.size(1)), "which is padding"),
    (lambda tgt, pad_id: padding_mask(tgt, pad_id), "future position"),
    (lambda tgt, pad_id: reference_mask(tgt, pad_id) & torch.eye(tgt.size(1), dtype=torch.bool), "cannot attend"),
    (lambda tgt, pad_id: reference_mask(tgt, pad_id).float(), "bool"),
    (lambda tgt, pad_id: reference_mask(tgt, pad_id)[:, 0], "does not broadcast"),
    (lambda tgt, pad_id: None, "expected a tensor"),
])
def test_check_tgt_mask_names_the_mistake(fn, message):
    with pytest.raises(AssertionError, match=message):
        check_tgt_mask(fn)
