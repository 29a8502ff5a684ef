"""transformer_lib.encoder (Chapter 6) against nn.TransformerEncoderLayer / nn.TransformerEncoder in float64."""

import warnings

import pytest
import torch
import torch.nn as nn
from helpers import randomize

from transformer_lib.encoder import (
    Encoder,
    EncoderLayer,
    encoder_layer_to_torch,
    encoder_to_torch,
    to_torch_layer,
    to_torch_stack,
)
from transformer_lib.exercises.encoder import check_encoder_layer
from transformer_lib.multi_head import MultiHeadAttention, attention_maps, copy_to_torch_mha

DT = torch.float64
ATOL = 1e-12


def padded_batch(B, S, d_model, seed):
    """x (B, S, d_model) float64 and a (B, 1, 1, S) padding mask with random lengths (at least one real token)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, S, d_model, generator=g, dtype=DT)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S                                               # one full-length sentence
    mask = (torch.arange(S) < lengths[:, None])[:, None, None, :]
    return x, mask


# ---------------------------------------------------------------- equality with PyTorch

def test_attention_copy_equals_nn_multihead_attention():
    ours = randomize(MultiHeadAttention(24, 3, dropout=0.0).double(), 0)
    theirs = nn.MultiheadAttention(24, 3, batch_first=True, dtype=DT)
    copy_to_torch_mha(ours, theirs)
    x, mask = padded_batch(3, 7, 24, seed=1)
    a, _ = ours(x, x, x, mask)
    b, _ = theirs(x, x, x, key_padding_mask=~mask[:, 0, 0, :], need_weights=False)
    torch.testing.assert_close(a, b, rtol=0, atol=ATOL)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("train_mode", [True, False])
def test_layer_equals_torch_with_padding(norm_first, train_mode):
    ours = randomize(EncoderLayer(32, 4, 48, dropout=0.0, norm_first=norm_first).double(), seed=2)
    ours.train(train_mode)
    theirs = encoder_layer_to_torch(ours)
    assert theirs.training == train_mode and theirs.norm_first == norm_first
    x, mask = padded_batch(4, 9, 32, seed=3)
    with torch.set_grad_enabled(train_mode):               # eval + no_grad: PyTorch's fused fast path
        a = ours(x, mask)
        b = theirs(x, src_key_padding_mask=~mask[:, 0, 0, :])
    torch.testing.assert_close(a, b, rtol=0, atol=ATOL)


def test_layer_equals_torch_without_mask_and_with_a_general_mask():
    ours = randomize(EncoderLayer(16, 2, 32, dropout=0.0).double(), seed=4)
    theirs = encoder_layer_to_torch(ours)
    x, _ = padded_batch(2, 6, 16, seed=5)
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=ATOL)
    allowed = torch.rand(6, 6, generator=torch.Generator().manual_seed(6)) < 0.6
    allowed |= torch.eye(6, dtype=torch.bool)                # every query keeps at least itself
    torch.testing.assert_close(ours(x, allowed[None, None]), theirs(x, src_mask=~allowed), rtol=0, atol=ATOL)


@pytest.mark.parametrize("num_layers, final_norm, norm_first", [(1, True, False), (3, True, False),
                                                               (2, False, False), (2, True, True)])
def test_encoder_equals_torch(num_layers, final_norm, norm_first):
    ours = Encoder(num_layers, 32, 4, 64, dropout=0.0, norm_first=norm_first, final_norm=final_norm).double()
    randomize(ours, seed=num_layers)
    theirs = encoder_to_torch(ours)
    assert (theirs.norm is None) == (not final_norm) and len(theirs.layers) == num_layers
    x, mask = padded_batch(3, 8, 32, seed=7)
    torch.testing.assert_close(ours(x, mask), theirs(x, src_key_padding_mask=~mask[:, 0, 0, :]),
                               rtol=0, atol=ATOL)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_with_gelu_equals_torch(activation, norm_first):
    ours = Encoder(2, 32, 4, 64, dropout=0.0, norm_first=norm_first, activation=activation).double()
    randomize(ours, seed=3)
    assert all(layer.feed_forward.activation == activation for layer in ours.layers)
    theirs = encoder_to_torch(ours)
    x, mask = padded_batch(3, 8, 32, seed=7)
    torch.testing.assert_close(ours(x, mask), theirs(x, src_key_padding_mask=~mask[:, 0, 0, :]),
                               rtol=0, atol=ATOL)


def test_torch_fast_path_zeroes_padding_but_real_positions_agree():
    ours = randomize(Encoder(2, 16, 2, 32, dropout=0.0).double(), seed=8).eval()
    theirs = encoder_to_torch(ours, enable_nested_tensor=True)
    x, mask = padded_batch(4, 7, 16, seed=9)
    real = mask[:, 0, 0, :]
    assert not real.all()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = ours(x, mask), theirs(x, src_key_padding_mask=~real)
    assert torch.all(b[~real] == ours.norm.bias)               # zeros, then the final LayerNorm: LN(0) = beta
    assert not torch.allclose(a[~real], b[~real])              # we compute something there
    torch.testing.assert_close(a[real], b[real], rtol=0, atol=ATOL)


# ---------------------------------------------------------------- masks and invariances

def test_padding_is_invisible_to_real_tokens():
    g = torch.Generator().manual_seed(10)
    enc = randomize(Encoder(2, 16, 4, 32, dropout=0.0).double(), seed=11).eval()
    for _ in range(20):
        n, extra = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(1, 6, (1,), generator=g))
        x = torch.randn(1, n + extra, 16, generator=g, dtype=DT)
        mask = (torch.arange(n + extra) < n)[None, None, None, :]
        alone = enc(x[:, :n])
        torch.testing.assert_close(enc(x, mask)[:, :n], alone, rtol=0, atol=ATOL)
        assert (enc(x)[:, :n] - alone).abs().max() > 1e-3       # without the mask the padding leaks in


def test_no_leakage_from_values_at_padded_positions():
    enc = randomize(Encoder(2, 16, 4, 32, dropout=0.0).double(), seed=12).eval()
    x, mask = padded_batch(4, 8, 16, seed=13)
    real = mask[:, 0, 0, :]
    x2 = x.clone()
    x2[~real] = 1e3 * torch.randn(int((~real).sum()), 16, dtype=DT)
    torch.testing.assert_close(enc(x2, mask)[real], enc(x, mask)[real], rtol=0, atol=ATOL)


def test_batch_equals_sentences_alone():
    enc = randomize(Encoder(2, 16, 2, 32, dropout=0.0).double(), seed=14).eval()
    x, mask = padded_batch(5, 6, 16, seed=15)
    together = enc(x, mask)
    for b in range(5):
        n = int(mask[b].sum())
        torch.testing.assert_close(together[b, :n], enc(x[b:b + 1, :n])[0], rtol=0, atol=ATOL)


def test_permutation_equivariance_without_positional_encoding():
    layer = randomize(EncoderLayer(16, 4, 32, dropout=0.0).double(), seed=16)
    x, _ = padded_batch(2, 7, 16, seed=17)
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(layer(x[:, perm]), layer(x)[:, perm], rtol=0, atol=ATOL)


def test_post_norm_output_is_standardized_at_initialization():
    layer = EncoderLayer(16, 4, 32, dropout=0.0).double()
    y = layer(5 * padded_batch(2, 5, 16, seed=18)[0])
    torch.testing.assert_close(y.mean(-1), torch.zeros(2, 5, dtype=DT), rtol=0, atol=1e-10)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(2, 5, dtype=DT), rtol=0, atol=1e-3)


def test_attention_maps_hands_back_every_layers_weights():
    enc = Encoder(2, 16, 4, 32, dropout=0.0).double().eval()
    x, mask = padded_batch(3, 6, 16, seed=19)
    with attention_maps(enc) as maps:
        out = enc(x, mask)
    torch.testing.assert_close(out, enc(x, mask), rtol=0, atol=ATOL)   # the slow path gives the same result
    assert list(maps) == ["layers.0.self_attn", "layers.1.self_attn"]
    for w in maps.values():
        assert w.shape == (3, 4, 6, 6)
        assert torch.all(w.masked_select(~mask.expand_as(w)) == 0)
        torch.testing.assert_close(w.sum(-1), torch.ones(3, 4, 6, dtype=DT), rtol=0, atol=ATOL)
    kept = dict(maps)
    enc(x[:1], mask[:1])                                  # outside the block: nothing recorded, nothing stored
    assert all(maps[k] is v for k, v in kept.items())
    assert not any(isinstance(v, torch.Tensor) and v.dim() == 4 for m in enc.modules() for v in vars(m).values())


def test_attention_maps_in_training_mode_frees_the_graph_with_the_dict():
    """The maps carry the autograd graph while the caller keeps them, and only then (nothing on the modules)."""
    import gc
    import weakref

    enc = Encoder(1, 16, 4, 32, dropout=0.1).double().train()
    x, mask = padded_batch(2, 5, 16, seed=3)
    with attention_maps(enc) as maps:
        out = enc(x.requires_grad_(), mask)
    w = maps["layers.0.self_attn"]
    assert w.requires_grad and w.grad_fn is not None
    ref = weakref.ref(w)
    del maps, w, out
    gc.collect()
    assert ref() is None


def test_attention_maps_errors_and_nesting():
    enc = Encoder(1, 16, 4, 32, dropout=0.0).double().eval()
    x, mask = padded_batch(2, 5, 16, seed=3)
    with pytest.raises(ValueError, match="^model must be an nn.Module"):
        with attention_maps("encoder"):
            pass
    with pytest.raises(ValueError, match="^model must contain a MultiHeadAttention"):
        with attention_maps(nn.Linear(2, 2)):
            pass
    with attention_maps(enc) as outer, attention_maps(enc.layers[0]) as inner:
        enc(x, mask)
    assert torch.equal(outer["layers.0.self_attn"], inner["self_attn"])


# ---------------------------------------------------------------- structure, dropout, gradients

def test_layers_have_independent_weights_and_the_closed_form_count():
    enc = Encoder(3, 32, 4, 64)
    assert len(enc.layers) == 3 and isinstance(enc.norm, nn.Module)
    assert not torch.equal(enc.layers[0].self_attn.W_q.weight, enc.layers[1].self_attn.W_q.weight)
    d, d_ff = 32, 64
    per_layer = 4 * (d * d + d) + 2 * d * d_ff + d_ff + d + 4 * d
    assert sum(p.numel() for p in enc.layers[0].parameters()) == per_layer
    assert sum(p.numel() for p in enc.parameters()) == 3 * per_layer + 2 * d
    assert Encoder(2, 32, 4, 64, final_norm=False).norm is None


def test_dropout_is_active_only_in_training():
    layer = EncoderLayer(16, 2, 32, dropout=0.5).double()
    x, _ = padded_batch(2, 5, 16, seed=20)
    layer.train()
    assert not torch.allclose(layer(x), layer(x))
    layer.eval()
    torch.testing.assert_close(layer(x), layer(x), rtol=0, atol=0)


def test_gradcheck():
    layer = randomize(EncoderLayer(8, 2, 12, dropout=0.0).double(), seed=21)
    x, mask = padded_batch(2, 4, 8, seed=22)
    x.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: layer(t, mask), (x,))


# ---------------------------------------------------------------- errors

def test_clear_value_errors():
    layer = EncoderLayer(16, 4, 32)
    with pytest.raises(ValueError, match=r"x must be a tensor of shape \(B, S, d_model=16\), got float32 tensor of shape \(2, 5, 12\)"):
        layer(torch.randn(2, 5, 12))
    with pytest.raises(ValueError, match=r"x must be a tensor of shape \(B, S, d_model=16\)"):
        layer(torch.randn(5, 16))
    with pytest.raises(ValueError, match="x is torch.float64 but the module is torch.float32"):
        layer(torch.randn(2, 5, 16, dtype=DT))
    with pytest.raises(ValueError, match="src_mask must be a bool tensor"):
        layer(torch.randn(2, 5, 16), torch.ones(2, 1, 1, 5))
    with pytest.raises(ValueError, match=r"src_mask of shape \(2, 1, 1, 6\) does not fit"):
        layer(torch.randn(2, 5, 16), torch.ones(2, 1, 1, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"src_mask of shape \(2, 5\) .*padding_mask\(tokens, pad_id\)"):
        layer(torch.randn(2, 5, 16), torch.ones(2, 5, dtype=torch.bool))      # never misread as (n_q, n_k)
    with pytest.raises(ValueError, match="src_mask of shape"):
        Encoder(1, 16, 4, 32)(torch.randn(5, 5, 16), torch.ones(5, 5, dtype=torch.bool))   # B == S: still refused
    with pytest.raises(ValueError, match="divisible"):
        EncoderLayer(16, 3, 32)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_layers=0), "num_layers must be an int >= 1, got 0"),
    (dict(num_layers=True), "num_layers must be an int >= 1, got bool True"),
    (dict(num_layers=2.0), "num_layers must be an int >= 1, got float"),
    (dict(norm_first="False"), "norm_first must be True or False, got str 'False'"),
    (dict(final_norm=1), "final_norm must be True or False, got int 1"),
    (dict(dropout=1.0), r"dropout must lie in \[0, 1\)"),
    (dict(dropout=True), "dropout must be a number, got bool"),
])
def test_encoder_constructor_value_errors(kwargs, match):
    args = dict(num_layers=2, d_model=16, num_heads=4, d_ff=32) | kwargs
    with pytest.raises(ValueError, match=match):
        Encoder(**args)


@pytest.mark.parametrize("call, match", [
    (lambda: to_torch_layer("oops", nn.TransformerEncoderLayer, {}), "^layer must be one of our layers .*got str"),
    (lambda: to_torch_layer(EncoderLayer(16, 4, 32), nn.Linear, {}), "^torch_class must be .*got Linear"),
    (lambda: to_torch_layer(EncoderLayer(16, 4, 32), nn.TransformerEncoderLayer, ["self_attn"]),
     "^attentions must be a dict"),
    (lambda: to_torch_layer(EncoderLayer(16, 4, 32), nn.TransformerDecoderLayer, {"cross_attn": "multihead_attn"}),
     "^layer has no cross_attn: got EncoderLayer"),
    (lambda: to_torch_stack("oops", nn.TransformerEncoder, encoder_layer_to_torch), "^stack must be .*got str"),
    (lambda: to_torch_stack(EncoderLayer(16, 4, 32), nn.TransformerEncoder, encoder_layer_to_torch),
     "^stack must be one of our stacks .*got EncoderLayer"),
    (lambda: to_torch_stack(Encoder(1, 16, 4, 32), nn.TransformerEncoderLayer, encoder_layer_to_torch),
     "^torch_class must be nn.TransformerEncoder or nn.TransformerDecoder, got TransformerEncoderLayer"),
    (lambda: to_torch_stack(Encoder(1, 16, 4, 32), nn.TransformerEncoder, 3), "^layer_to_torch must be a function"),
])
def test_converters_check_their_arguments(call, match):
    """The public converters raise a ValueError naming the argument (the appendix's door rule), not AttributeError."""
    with pytest.raises(ValueError, match=match):
        call()


def test_default_dropout_is_the_papers():
    layer = EncoderLayer(16, 4, 32)
    x = torch.randn(2, 5, 16)
    assert not torch.equal(layer(x), layer(x))                   # P_drop = 0.1 in training ...
    layer.eval()
    assert torch.equal(layer(x), layer(x))                       # ... and none in evaluation


def test_empty_batch():
    out = Encoder(2, 16, 4, 32).eval()(torch.randn(0, 5, 16), torch.ones(0, 1, 1, 5, dtype=torch.bool))
    assert out.shape == (0, 5, 16)


# ---------------------------------------------------------------- the exercise checker

def reference(layer, x, mask):
    """The exercise's answer: the layer composed from its parts (calling layer(x, mask) is refused)."""
    def attend(y):
        return layer.self_attn(y, y, y, mask)[0]
    norm1, norm2 = layer.self_attn_residual.norm, layer.feed_forward_residual.norm
    if layer.self_attn_residual.norm_first:
        x = x + attend(norm1(x))
        return x + layer.feed_forward(norm2(x))
    x = norm1(x + attend(x))
    return norm2(x + layer.feed_forward(x))


def always_post_norm(layer, x, mask):
    x = layer.self_attn_residual.norm(x + layer.self_attn(x, x, x, mask)[0])
    return layer.feed_forward_residual.norm(x + layer.feed_forward(x))


def no_mask(layer, x, mask):
    return reference(layer, x, None)


def no_residual(layer, x, mask):
    def attend(y):
        return layer.self_attn(y, y, y, mask)[0]
    if layer.self_attn_residual.norm_first:
        x = attend(layer.self_attn_residual.norm(x))
        return x + layer.feed_forward(layer.feed_forward_residual.norm(x))
    x = layer.self_attn_residual.norm(attend(x))
    return layer.feed_forward_residual.norm(x + layer.feed_forward(x))


def test_check_encoder_layer_accepts_the_reference(capsys):
    check_encoder_layer(reference)
    assert "match" in capsys.readouterr().out


@pytest.mark.parametrize("fn, message", [
    (always_post_norm, "other norm placement"),
    (no_mask, "ignores the padding mask"),
    (no_residual, "residual connection around self-attention"),
    (lambda layer, x, mask: x[:, :1], r"output shape \(3, 1, 24\), expected \(B, S, d_model\)"),
    (lambda layer, x, mask: None, "must return a tensor, got NoneType"),
    (lambda layer, x, mask: reference(layer, x, mask) + 1e-3, "differs from EncoderLayer.forward by up to"),
    (lambda layer, x, mask: layer(x, mask), "you called layer"),
])
def test_check_encoder_layer_names_the_mistake(fn, message):
    with pytest.raises(AssertionError, match=message.replace("|", r"\|")):
        check_encoder_layer(fn)
