"""Chapter 14's graders (transformer_lib.exercises.llama): the reference answers pass (float32 and float64), and
typical mistakes are caught with a message that names them."""

import torch
import torch.nn.functional as F
from helpers import grader_row

from transformer_lib.attention import causal_mask, scaled_dot_product_attention
from transformer_lib.exercises.llama import (
    check_gqa_attention,
    check_lora_from_update,
    check_online_merge,
    check_rope,
)
from transformer_lib.llama import RotaryEmbedding
from transformer_lib.multi_head import MultiHeadAttention


def rope(x, offset, neighbours=False, backwards=False, exponent=2):
    d_k, n = x.size(-1), x.size(-2)
    theta = 10000.0 ** (-torch.arange(0, d_k // 2).float() * exponent / d_k)
    angle = torch.arange(offset, offset + n).float()[:, None] * theta
    cos, sin = angle.cos(), (-1 if backwards else 1) * angle.sin()
    if neighbours:
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack([even * cos - odd * sin, odd * cos + even * sin], -1).flatten(-2)
    x1, x2 = x[..., :d_k // 2], x[..., d_k // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def merge(m1, l1, m2, l2):
    m = torch.maximum(torch.as_tensor(m1), torch.as_tensor(m2))
    return m, l1 * torch.exp(m1 - m) + l2 * torch.exp(m2 - m)


def rescaled_wrong_way(m1, l1, m2, l2):
    m = torch.maximum(m1, m2)
    return m, l1 * torch.exp(m - m1) + l2 * torch.exp(m - m2)


def gqa(q, k, v, repeat="interleave", causal=True, scale=None, axis=-1):
    group = q.size(1) // k.size(1)
    if repeat == "interleave":
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    else:
        k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
    s = q @ k.transpose(-2, -1) * (scale or q.size(-1) ** -0.5)
    if causal:
        allowed = causal_mask(q.size(-2))
        s = s.masked_fill(~(allowed.T if causal == "transposed" else allowed), float("-inf"))
    return s.softmax(axis) @ v


def lora_from_update(W, W_tuned, rank, alpha, of="update", end="largest", values=True, undo_scale=True):
    U, S, Vh = torch.linalg.svd(W_tuned - W if of == "update" else W_tuned, full_matrices=False)
    keep = slice(0, rank) if end == "largest" else slice(len(S) - rank, len(S))
    A, B = Vh[keep], U[:, keep] * (S[keep] if values else 1)
    return A, B * (rank / alpha if undo_scale is True else alpha / rank if undo_scale == "wrong way" else 1)


GRADERS = [
    grader_row(check_rope, correct=[lambda x, offset: RotaryEmbedding(x.size(-1))(x, offset),
                                    lambda x, offset: rope(x.double(), offset)], mistakes=[
        (lambda x, offset: rope(x, offset, neighbours=True), "neighbours"),
        (lambda x, offset: rope(x, offset, backwards=True), "wrong way"),
        (lambda x, offset: rope(x, offset, exponent=1), "exponent"),
        (lambda x, offset: rope(x, 0), "offset"),
        (lambda x, offset: x[..., :2], "shape"),
    ]),
    grader_row(check_gqa_attention, correct=[
        gqa, lambda q, k, v: gqa(q.double(), k.double(), v.double()),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
    ], mistakes=[
        (lambda q, k, v: gqa(q, k, v, repeat="tile"), "interleaved.*i % h_kv"),
        (lambda q, k, v: gqa(q, k, v, causal=False), "no causal mask"),
        (lambda q, k, v: gqa(q, k, v, causal="transposed"), "causal mask is transposed"),
        (lambda q, k, v: gqa(q, k, v, scale=1.0), "scores are not scaled"),
        (lambda q, k, v: gqa(q, k, v, scale=1 / q.size(-1)), "1/sqrt\\(d_k\\)"),
        (lambda q, k, v: gqa(q, k, v, axis=-2).nan_to_num(), "over the queries"),
        (lambda q, k, v: gqa(q[:, :k.size(1)], k, v), "one output head per K/V head"),
    ]),
    grader_row(check_online_merge, correct=[merge, lambda *a: tuple(v.double() for v in merge(*a))], mistakes=[
        (lambda m1, l1, m2, l2: (torch.maximum(m1, m2), l1 + l2), "against its own maximum"),
        (rescaled_wrong_way, "wrong way"),
        (lambda m1, l1, m2, l2: (torch.maximum(m1, m2), torch.tensor(float("nan"))), "not finite"),  # exp(-inf + inf)
        (lambda m1, l1, m2, l2: l1 + l2, "pair"),
    ]),
    grader_row(check_lora_from_update, correct=[
        lora_from_update,
        lambda W, Wt, r, a: tuple(t.double() for t in lora_from_update(W.double(), Wt.double(), r, a)),
        lambda W, Wt, r, a: lora_from_update(W, Wt, r, a)[::-1][::-1],
    ], mistakes=[
        (lambda *x: lora_from_update(*x, undo_scale=False), "scale is not undone"),
        (lambda *x: lora_from_update(*x, undo_scale="wrong way"), "undone the wrong way round"),
        (lambda *x: lora_from_update(*x, of="W_tuned"), "SVD of W_tuned itself"),
        (lambda *x: lora_from_update(*x, end="smallest"), "smallest singular values"),
        (lambda *x: lora_from_update(*x, values=False), "singular values were dropped"),
        (lambda *x: lora_from_update(*x)[::-1], "you returned \\(B, A\\)"),
        (lambda *x: lora_from_update(*x)[0], "pair \\(A, B\\)"),
    ]),
]


def test_gqa_reference_is_multi_head_attentions_grouping():
    """What check_gqa_attention calls grouped-query attention is what MultiHeadAttention(num_kv_heads=...) computes
    between its projections: query heads 0..h/h_kv - 1 share K/V head 0, and so on."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 8, dropout=0.0, bias=False, num_kv_heads=2).double().eval()
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    q = attn.W_q(x).view(2, 6, 8, 4).transpose(1, 2)
    k, v = (W(x).view(2, 6, 2, 4).transpose(1, 2) for W in (attn.W_k, attn.W_v))
    ours = attn.W_o(gqa(q, k, v).transpose(1, 2).reshape(2, 6, 32))
    with torch.no_grad():
        want, _ = attn(x, x, x, is_causal=True)
    assert (ours - want).abs().max() < 1e-12
    assert (ours - attn.W_o(gqa(q, k, v, repeat="tile").transpose(1, 2).reshape(2, 6, 32))).abs().max() > 1e-3
    assert (scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1),
                                         causal_mask(6)[None, None])[0] - gqa(q, k, v)).abs().max() < 1e-12
