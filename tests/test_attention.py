"""transformer_lib.attention (Chapter 1) against torch.nn.functional.scaled_dot_product_attention."""

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.attention import causal_mask, padding_mask, scaled_dot_product_attention
from transformer_lib.exercises.attention import check_attention
from transformer_lib.validation import check_mask

DT = torch.float64


def rand(*shape, generator=None):
    return torch.randn(*shape, dtype=DT, generator=generator)


SHAPES = [  # (batch dims, n_q, n_k, d_k, d_v)
    ((), 1, 1, 1, 1),
    ((), 4, 6, 8, 3),
    ((2,), 5, 5, 16, 16),
    ((3, 4), 7, 9, 8, 5),
    ((2, 1), 3, 10, 4, 6),
]


@pytest.mark.parametrize("batch, n_q, n_k, d_k, d_v", SHAPES)
def test_equals_torch_sdpa_without_mask(batch, n_q, n_k, d_k, d_v):
    g = torch.Generator().manual_seed(n_q * 100 + n_k)
    Q, K, V = rand(*batch, n_q, d_k, generator=g), rand(*batch, n_k, d_k, generator=g), rand(*batch, n_k, d_v, generator=g)
    out, w = scaled_dot_product_attention(Q, K, V)
    ref = F.scaled_dot_product_attention(Q, K, V)
    assert out.shape == (*batch, n_q, d_v) and w.shape == (*batch, n_q, n_k)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(w.sum(-1), torch.ones(*batch, n_q, dtype=DT), rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_equals_torch_sdpa_with_random_masks(seed):
    g = torch.Generator().manual_seed(seed)
    B, h, n_q, n_k, d = 2, 3, 5, 7, 8
    Q, K, V = rand(B, h, n_q, d, generator=g), rand(B, h, n_k, d, generator=g), rand(B, h, n_k, d, generator=g)
    for shape in [(1, 1, n_q, n_k), (B, 1, n_q, n_k), (B, h, n_q, n_k), (1, h, 1, n_k)]:
        mask = torch.rand(*shape, generator=g) < 0.6
        mask[..., 0] = True
        out, _ = scaled_dot_product_attention(Q, K, V, mask)
        ref = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


def test_masked_weights_are_exactly_zero_and_rows_sum_to_one():
    g = torch.Generator().manual_seed(0)
    Q, K, V = rand(4, 6, generator=g), rand(9, 6, generator=g), rand(9, 2, generator=g)
    mask = torch.rand(4, 9, generator=g) < 0.5
    mask[:, 3] = True
    _, w = scaled_dot_product_attention(Q, K, V, mask)
    assert (w[~mask] == 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(4, dtype=DT))


def test_fully_masked_row_gives_zeros_not_nan_like_torch():
    g = torch.Generator().manual_seed(1)
    Q, K, V = rand(2, 3, 4, generator=g), rand(2, 5, 4, generator=g), rand(2, 5, 3, generator=g)
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    mask[1, 2] = False
    out, w = scaled_dot_product_attention(Q, K, V, mask)
    assert not torch.isnan(out).any() and not torch.isnan(w).any()
    assert (out[1, 2] == 0).all() and (w[1, 2] == 0).all()
    torch.testing.assert_close(out, F.scaled_dot_product_attention(Q, K, V, attn_mask=mask), rtol=0, atol=1e-12)
    # and the gradient through such a row is finite (zero), not NaN
    Q.requires_grad_(True)
    scaled_dot_product_attention(Q, K, V, mask)[0].sum().backward()
    assert torch.isfinite(Q.grad).all() and (Q.grad[1, 2] == 0).all()


def test_gradcheck_with_and_without_mask():
    g = torch.Generator().manual_seed(2)
    Q, K, V = (rand(2, 3, 4, generator=g).requires_grad_() for _ in range(3))
    mask = torch.tensor([[True, False, True], [True, True, False], [False, False, True]])
    assert torch.autograd.gradcheck(lambda q, k, v: scaled_dot_product_attention(q, k, v)[0], (Q, K, V))
    assert torch.autograd.gradcheck(lambda q, k, v: scaled_dot_product_attention(q, k, v, mask[None])[0], (Q, K, V))


def test_causal_mask_blocks_the_future():
    n = 7
    m = causal_mask(n)
    assert m.dtype == torch.bool and m.shape == (n, n)
    assert torch.equal(m, torch.tril(torch.ones(n, n)).bool())
    g = torch.Generator().manual_seed(3)
    X = rand(2, n, 5, generator=g)
    out, w = scaled_dot_product_attention(X, X, X, m[None])       # scores (2, n, n): the mask gets rank 3
    assert (w.triu(1) == 0).all()
    for t in range(n - 1):
        X2 = X.clone()
        X2[:, t + 1:] = rand(2, n - t - 1, 5, generator=g)
        out2, _ = scaled_dot_product_attention(X2, X2, X2, m[None])
        assert torch.equal(out[:, : t + 1], out2[:, : t + 1])


def test_padding_mask_hides_padding_from_every_query():
    PAD = 0
    tokens = torch.tensor([[3, 4, 5, PAD, PAD], [6, 7, 8, 9, 2]])
    m = padding_mask(tokens, PAD)
    assert m.shape == (2, 1, 1, 5) and m.dtype == torch.bool
    assert m[0, 0, 0].tolist() == [True, True, True, False, False] and m[1].all()
    g = torch.Generator().manual_seed(4)
    Q, K, V = rand(2, 2, 5, 4, generator=g), rand(2, 2, 5, 4, generator=g), rand(2, 2, 5, 3, generator=g)
    out, w = scaled_dot_product_attention(Q, K, V, m)
    assert (w[0, ..., 3:] == 0).all()
    # changing the keys and values at padded positions changes nothing
    K2, V2 = K.clone(), V.clone()
    K2[0, :, 3:], V2[0, :, 3:] = 100.0, -100.0
    out2, _ = scaled_dot_product_attention(Q, K2, V2, m)
    assert torch.equal(out, out2)


def test_dropout_is_applied_to_the_weights():
    torch.manual_seed(0)
    Q, K, V = rand(3, 4), rand(6, 4), rand(6, 2)
    drop = torch.nn.Dropout(0.5)
    _, w = scaled_dot_product_attention(Q, K, V, dropout=drop)
    _, w_ref = scaled_dot_product_attention(Q, K, V)
    kept = w != 0
    assert (~kept).any() and kept.any()
    torch.testing.assert_close(w[kept], 2 * w_ref[kept])     # inverted dropout rescales by 1 / (1 - p)


def test_scaling_is_by_sqrt_dk():
    Q, K, V = rand(2, 64), rand(3, 64), rand(3, 2)
    _, w = scaled_dot_product_attention(Q, K, V)
    torch.testing.assert_close(w, torch.softmax(Q @ K.T / math.sqrt(64), -1))


@pytest.mark.parametrize("args, kwargs, match", [
    ((torch.randn(5), torch.randn(7, 4), torch.randn(7, 4)), {}, r"Q must be a tensor of shape \(\.\.\., n, d\), got float32 tensor of shape \(5,\)"),
    ((torch.randn(5, 4), [1.0], torch.randn(7, 4)), {}, r"K must be a tensor"),
    ((torch.randn(5, 4), torch.randn(7, 3), torch.randn(7, 4)), {}, r"Q and K must share the last dimension d_k.*\(5, 4\).*\(7, 3\)"),
    ((torch.randn(5, 4), torch.randn(7, 4), torch.randn(6, 4)), {}, r"K and V must have the same number of positions n_k"),
    ((torch.randn(2, 5, 4), torch.randn(3, 7, 4), torch.randn(3, 7, 4)), {}, r"batch, head\) dimensions .* do not broadcast"),
    ((torch.randn(5, 4), torch.randn(7, 4), torch.randn(7, 4)), {"mask": torch.ones(5, 7)}, r"mask must be a bool tensor"),
    ((torch.randn(5, 4), torch.randn(7, 4), torch.randn(7, 4)), {"mask": torch.ones(7, 5).bool()}, r"mask of shape \(7, 5\) does not fit .* \(5, 7\)"),
    ((torch.randn(5, 4), torch.randn(7, 4), torch.randn(7, 4)), {"mask": torch.ones(2, 5, 7).bool()}, r"mask of shape \(2, 5, 7\) does not fit .* needs 2 axes"),
    ((torch.randn(3, 5, 4), torch.randn(3, 7, 4), torch.randn(3, 7, 4)), {"mask": torch.ones(5, 7).bool()}, r"needs 3 axes.*mask\[None\].*padding mask is mask\[:, None, :\]"),
    ((torch.ones(5, 4, dtype=torch.long), torch.randn(7, 4), torch.randn(7, 4)), {}, r"Q must be a floating-point tensor, got int64"),
    ((torch.randn(5, 4), torch.ones(7, 4, dtype=torch.bool), torch.randn(7, 4)), {}, r"K must be a floating-point tensor, got bool"),
    ((torch.randn(5, 4), torch.randn(7, 4), torch.randn(7, 4, dtype=torch.complex64)), {}, r"V must be a floating-point tensor, got complex64"),
    ((torch.randn(5, 4), torch.randn(7, 4, dtype=torch.float64), torch.randn(7, 4)), {}, r"Q, K and V must have one dtype.*K torch.float64"),
    ((torch.randn(5, 4), torch.randn(7, 4), torch.randn(7, 4, dtype=torch.float16)), {}, r"one dtype.*V torch.float16"),
    ((torch.randn(5, 0), torch.randn(7, 0), torch.randn(7, 4)), {}, r"d_k >= 1"),
])
def test_bad_input_raises_clear_value_error(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        scaled_dot_product_attention(*args, **kwargs)


@pytest.mark.parametrize("n", [-1, 2.0, "3", True, None])
def test_causal_mask_rejects_bad_n(n):
    with pytest.raises(ValueError, match="n_q must be an int >= 0"):
        causal_mask(n)


def test_causal_mask_of_length_zero_is_empty():
    assert causal_mask(0).shape == (0, 0) and causal_mask(1).tolist() == [[True]]


@pytest.mark.parametrize("tokens, match", [
    (torch.tensor([1, 2, 3]), r"tokens must be a tensor of shape \(B, S\).*got int64 tensor of shape \(3,\)"),
    (torch.zeros(1, 2, 3, dtype=torch.long), r"tokens must be a tensor of shape \(B, S\)"),
    ([[1, 2]], r"tokens must be a tensor of shape \(B, S\).*got list"),
    (torch.randn(2, 3), "tokens must be an integer tensor"),
    (torch.ones(2, 3, dtype=torch.bool), "tokens must be an integer tensor"),
])
def test_padding_mask_rejects_bad_tokens(tokens, match):
    with pytest.raises(ValueError, match=match):
        padding_mask(tokens, 0)


@pytest.mark.parametrize("pad_id", [True, 0.0, None, "0", -1])
def test_padding_mask_rejects_bad_pad_id(pad_id):
    with pytest.raises(ValueError, match="pad_id must be an int >= 0"):
        padding_mask(torch.tensor([[1, 2, 0]]), pad_id)


def test_rank_rule_rejects_a_padding_mask_even_when_it_would_broadcast():
    """A (B, S) padding mask for scores (B, n_q, S) broadcasts whenever B == n_q, and would then apply sentence
    b's padding to query b of every sentence. The rank rule rejects it; the (B, 1, S) form is the right one."""
    g = torch.Generator().manual_seed(5)
    B = n_q = 2
    Q, K, V = rand(B, n_q, 4, generator=g), rand(B, 6, 4, generator=g), rand(B, 6, 3, generator=g)
    pad = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])           # (B, S): sentence 1 has 3 padded keys
    assert torch.broadcast_shapes(pad.shape, (B, n_q, 6)) == (B, n_q, 6)  # PyTorch would accept it ...
    misread = F.scaled_dot_product_attention(Q, K, V, attn_mask=pad)
    right, w = scaled_dot_product_attention(Q, K, V, pad[:, None, :])
    assert not torch.allclose(misread, right)                             # ... and compute something else
    assert (w[1, :, 3:] == 0).all() and (w[0] > 0).all()
    with pytest.raises(ValueError, match=r"mask of shape \(2, 6\) does not fit .* needs 3 axes"):
        scaled_dot_product_attention(Q, K, V, pad)


def test_empty_batch_and_empty_sequences_give_empty_or_zero_results():
    out, w = scaled_dot_product_attention(rand(0, 3, 4), rand(0, 5, 4), rand(0, 5, 2))
    assert out.shape == (0, 3, 2) and w.shape == (0, 3, 5)
    out, w = scaled_dot_product_attention(rand(2, 3, 4), rand(2, 0, 4), rand(2, 0, 2))   # no keys at all
    assert out.shape == (2, 3, 2) and torch.equal(out, torch.zeros(2, 3, 2, dtype=DT))
    out, w = scaled_dot_product_attention(rand(2, 0, 4), rand(2, 5, 4), rand(2, 5, 2),
                                          torch.ones(1, 0, 5, dtype=torch.bool))            # no queries
    assert out.shape == (2, 0, 2) and w.shape == (2, 0, 5)


def test_every_row_fully_masked_gives_zeros_not_nan():
    Q, K, V = rand(2, 3, 4), rand(2, 5, 4), rand(2, 5, 2)
    out, w = scaled_dot_product_attention(Q, K, V, torch.zeros(1, 1, 5, dtype=torch.bool))
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(w, torch.zeros_like(w))


@pytest.mark.parametrize("mask, match", [
    (torch.ones(2, 7, dtype=torch.bool), r"padding_mask\(tokens, pad_id\) -> \(B, 1, 1, S\).*mask\[None, None\]"),
    (torch.ones(1, 1, 5, 7), r"src_mask must be a bool tensor.*src_mask.bool\(\)"),
    ([[True]], r"src_mask must be a bool tensor .* got list"),
    (torch.ones(1, 1, 1, 5, 7, dtype=torch.bool), r"src_mask of shape \(1, 1, 1, 5, 7\) does not fit"),
    (torch.ones(3, 1, 5, 7, dtype=torch.bool), r"does not fit the attention scores \(B, h, n_q, n_k\) = \(2, 4, 5, 7\)"),
])
def test_check_mask_names_the_argument_and_says_what_fits(mask, match):
    with pytest.raises(ValueError, match=match):
        check_mask("src_mask" if not isinstance(mask, torch.Tensor) or mask.dim() != 2 else "mask", mask, (2, 4, 5, 7))


def test_check_mask_accepts_every_axis_equal_or_one():
    for shape in [(2, 4, 5, 7), (1, 1, 1, 7), (2, 1, 1, 7), (1, 4, 5, 7), (1, 1, 5, 7)]:
        m = torch.ones(shape, dtype=torch.bool)
        assert check_mask("mask", m, (2, 4, 5, 7)) is m


def _reference(Q, K, V, mask=None):
    return scaled_dot_product_attention(Q, K, V, mask)[0]


def _unscaled(Q, K, V, mask=None):
    return scaled_dot_product_attention(Q * math.sqrt(Q.size(-1)), K, V, mask)[0]


def _fill_minus_1e9(Q, K, V, mask=None):
    s = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    if mask is not None:
        s = s.masked_fill(~mask, -1e9)
    return s.softmax(-1) @ V


def _nan_rows(Q, K, V, mask=None):
    s = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return s.softmax(-1) @ V


def _wrong_axis(Q, K, V, mask=None):
    return (Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))).softmax(-2) @ V


@pytest.mark.parametrize("fn, message", [
    (_unscaled, "not divided by sqrt"),
    (lambda Q, K, V, mask=None: scaled_dot_product_attention(Q / math.sqrt(Q.size(-1)), K, V, mask)[0], "divided by d_k instead"),
    (lambda Q, K, V, mask=None: _reference(Q, K, V), "mask is ignored"),
    (lambda Q, K, V, mask=None: _reference(Q, K, V, None if mask is None else ~mask), "mask is inverted"),
    (_fill_minus_1e9, "must output zeros"),
    (_nan_rows, r"must output zeros: softmax over a row of -inf gives NaN"),
    (_wrong_axis, "wrong axis"),
    (lambda Q, K, V, mask=None: _reference(Q, K, V, mask)[..., :1], "output shape"),
    (lambda Q, K, V, mask=None: _reference(Q, K, V, mask).tolist(), "must return a tensor"),
    (lambda Q, K, V, mask=None: _reference(Q, K, V, mask) + 1e-3, "differs from the reference"),
])
def test_check_attention_says_what_is_wrong(fn, message):
    with pytest.raises(AssertionError, match=message):
        check_attention(fn)


def test_check_attention_accepts_a_correct_function(capsys):
    check_attention(_reference)
    check_attention(lambda Q, K, V, mask=None: F.scaled_dot_product_attention(Q, K, V, attn_mask=mask))
    assert "match the reference" in capsys.readouterr().out


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_padded_key_holding_nan_or_inf_cannot_change_the_output(bad):
    """Issue 26: masked means it cannot matter. A padding key's weight is 0, but 0 * NaN = NaN: its value is zeroed.
    Every output, the weights and the gradients of the real positions are exactly those of finite padding."""
    torch.manual_seed(0)
    Q = torch.randn(2, 2, 3, 4, dtype=torch.float64)
    K, V = torch.randn(2, 2, 5, 4, dtype=torch.float64), torch.randn(2, 2, 5, 6, dtype=torch.float64)
    mask = padding_mask(torch.tensor([[1, 2, 3, 0, 0], [4, 5, 0, 0, 0]]), pad_id=0)      # (B, 1, 1, 5)
    K_bad, V_bad = K.clone(), V.clone()
    K_bad[0, :, 3], V_bad[0, :, 4], V_bad[1, :, 2] = bad, bad, bad                       # padding positions only
    out, w = scaled_dot_product_attention(Q, K, V, mask)
    out_bad, w_bad = scaled_dot_product_attention(Q, K_bad, V_bad, mask)
    assert torch.equal(out, out_bad) and torch.equal(w, w_bad)
    for t in (Q, V_bad):
        t.requires_grad_(True)
    scaled_dot_product_attention(Q, K_bad, V_bad, mask)[0].sum().backward()
    assert torch.isfinite(Q.grad).all() and torch.equal(V_bad.grad[0, :, 4], torch.zeros_like(V_bad.grad[0, :, 4]))


def test_a_nan_value_that_some_query_may_see_still_shows():
    """A real NaN is not hidden: under the causal mask a NaN value at position 3 reaches query 3 (and later), and,
    as in PyTorch's kernels, the earlier queries too (their weight 0 times NaN); only keys no query sees are zeroed."""
    torch.manual_seed(0)
    Q, K, V = (torch.randn(1, 1, 5, 4, dtype=torch.float64) for _ in range(3))
    V[0, 0, 3] = float("nan")
    out, _ = scaled_dot_product_attention(Q, K, V, causal_mask(5)[None, None])
    ref = F.scaled_dot_product_attention(Q, K, V, is_causal=True)
    assert out[0, 0, 3:].isnan().all() and torch.equal(out.isnan(), ref.isnan())
