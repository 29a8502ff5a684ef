"""Chapter 9's exact counts against what PyTorch counts: parameters, FLOPs (FlopCounterMode), saved bytes."""

import random

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.attention import causal_mask, scaled_dot_product_attention
from transformer_lib.complexity import (
    count_flops,
    explicit_attention_saved_bytes,
    ffn_flops,
    ffn_params,
    fused_attention_saved_bytes,
    loglog_slope,
    mha_flops,
    mha_params,
    saved_tensor_bytes,
    transformer_flops,
    transformer_params,
)
from transformer_lib.feed_forward import PositionwiseFeedForward
from transformer_lib.model import Transformer, TransformerConfig
from transformer_lib.multi_head import MultiHeadAttention, attention_maps


def random_config(rng):
    h = rng.choice([1, 2, 4])
    tie = rng.random() < 0.5
    V_src = rng.randint(3, 40)
    return TransformerConfig(src_vocab_size=V_src, tgt_vocab_size=V_src if tie else rng.randint(3, 40),
                             d_model=2 * h * rng.randint(1, 3), num_heads=h, d_ff=rng.randint(1, 30),
                             num_encoder_layers=rng.randint(1, 2), num_decoder_layers=rng.randint(1, 2),
                             dropout=0.0, tie_embeddings=tie, final_norm=rng.random() < 0.5, max_len=32)


@pytest.mark.parametrize("seed", range(6))
def test_parameter_count_equals_numel(seed):
    config = random_config(random.Random(seed))
    assert transformer_params(config) == sum(p.numel() for p in Transformer(config).parameters())


def test_module_parameter_counts():
    assert mha_params(24) == sum(p.numel() for p in MultiHeadAttention(24, 4).parameters())
    assert mha_params(24, bias=False) == sum(p.numel() for p in MultiHeadAttention(24, 4, bias=False).parameters())
    assert ffn_params(24, 37) == sum(p.numel() for p in PositionwiseFeedForward(24, 37).parameters())


@pytest.mark.parametrize("seed", range(6))
def test_flops_equal_flop_counter(seed):
    rng = random.Random(100 + seed)
    config = random_config(rng)
    model = Transformer(config)
    B, S, T = rng.randint(1, 3), rng.randint(1, 9), rng.randint(1, 9)
    V = min(config.src_vocab_size, config.tgt_vocab_size)
    src, tgt = torch.randint(0, V, (B, S)), torch.randint(0, V, (B, T))
    assert count_flops(model, src, tgt) == transformer_flops(config, B, S, T)
    with attention_maps(model):                              # Chapter 1's path, the weights materialised
        assert count_flops(model, src, tgt) == transformer_flops(config, B, S, T)
        assert count_flops(lambda: model(src, tgt).sum().backward()) == \
            transformer_flops(config, B, S, T, backward=True, fused=False)
    assert count_flops(lambda: model(src, tgt).sum().backward()) == transformer_flops(config, B, S, T, backward=True)


def test_module_flops():
    mha, ffn = MultiHeadAttention(16, 4, dropout=0.0), PositionwiseFeedForward(16, 40, dropout=0.0)
    q, kv, x = torch.randn(2, 5, 16), torch.randn(2, 7, 16), torch.randn(3, 4, 16)
    assert count_flops(mha, q, kv, kv) == mha_flops(2, 5, 7, 16)
    assert count_flops(ffn, x) == ffn_flops(12, 16, 40)


@pytest.mark.parametrize("n_q,n_k,d_k", [(1, 1, 1), (5, 9, 8), (16, 16, 4), (33, 7, 16)])
def test_saved_bytes_of_attention(n_q, n_k, d_k):
    Q = torch.randn(2, 3, n_q, d_k, requires_grad=True)
    K, V = (torch.randn(2, 3, n_k, d_k, requires_grad=True) for _ in range(2))
    assert saved_tensor_bytes(scaled_dot_product_attention, Q, K, V) == explicit_attention_saved_bytes(6, n_q, n_k, d_k)
    mask = torch.rand(1, 1, n_q, n_k) > 0.3
    assert saved_tensor_bytes(scaled_dot_product_attention, Q, K, V, mask) == \
        explicit_attention_saved_bytes(6, n_q, n_k, d_k, masked=True)
    assert saved_tensor_bytes(F.scaled_dot_product_attention, Q, K, V) == fused_attention_saved_bytes(6, n_q, n_k, d_k)
    Q64, K64, V64 = (t.detach().double().requires_grad_() for t in (Q, K, V))
    assert saved_tensor_bytes(scaled_dot_product_attention, Q64, K64, V64) == \
        explicit_attention_saved_bytes(6, n_q, n_k, d_k, element_size=8)


def test_saved_bytes_of_ffn_exclude_parameters():
    ffn = PositionwiseFeedForward(8, 20, dropout=0.0)
    x = torch.randn(3, 5, 8)
    assert saved_tensor_bytes(ffn, x, exclude=ffn.parameters()) == 3 * 5 * (8 + 20) * 4
    assert saved_tensor_bytes(ffn, x) > 3 * 5 * (8 + 20) * 4            # the weights, when not excluded
    with torch.no_grad():
        assert saved_tensor_bytes(ffn, x) == 0                          # nothing is saved without autograd


def test_causal_mask_does_not_change_the_flops():
    Q, K, V = (torch.randn(1, 2, 12, 4) for _ in range(3))
    assert count_flops(scaled_dot_product_attention, Q, K, V, causal_mask(12)[None, None]) == \
        count_flops(scaled_dot_product_attention, Q, K, V) == 4 * 2 * 12 * 12 * 4


def test_loglog_slope():
    assert loglog_slope([1, 2, 4, 8], [3, 12, 48, 192]) == pytest.approx(2.0)
    assert loglog_slope([10, 100], [5, 50]) == pytest.approx(1.0)


@pytest.mark.parametrize("call,argument", [
    (lambda: transformer_params({"d_model": 8}), "config"),
    (lambda: transformer_flops(TransformerConfig(10, 10, d_model=8, num_heads=2), 0.5, 3, 3), "batch"),
    (lambda: transformer_flops(TransformerConfig(10, 10, d_model=8, num_heads=2), 1, 0, 3), "src_len"),
    (lambda: count_flops("model"), "fn"),
    (lambda: saved_tensor_bytes(None), "fn"),
    (lambda: loglog_slope([1, 1], [2, 3]), "xs"),
    (lambda: loglog_slope([1, 2], [0, 3]), "ys"),             # names the list that holds the 0
])
def test_bad_inputs_raise_value_error_naming_the_argument(call, argument):
    with pytest.raises(ValueError, match=argument):
        call()
