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


def merge(L1, O1, L2, O2, weights="shares", guard=True, L_of="logaddexp"):
    """The merge of two blocks' (log-sum-exp, normalised output), or it with one slip."""
    L = {"logaddexp": torch.logaddexp(L1, L2), "max": torch.maximum(L1, L2), "sum": L1 + L2,
         "naive": torch.log(L1.exp() + L2.exp())}[L_of]
    safe = torch.where(torch.isinf(L), 0.0, L) if guard else L
    w1, w2 = torch.exp(L1 - safe), torch.exp(L2 - safe)
    out = {"shares": w1 * O1 + w2 * O2, "swapped": w2 * O1 + w1 * O2, "equal": (O1 + O2) / 2,
         "unnormalised": L1.exp() * O1 + L2.exp() * O2, "naive": (L1.exp() * O1 + L2.exp() * O2) / L.exp(),
         "sum": O1 + O2}[weights]
    return L, out


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
    grader_row(check_online_merge, correct=[merge, lambda *a: tuple(v.double() for v in merge(*a)),
                                            lambda *a: tuple(v.double() for v in merge(*(t.double() for t in a)))],
               mistakes=[
        (lambda *a: merge(*a, L_of="naive", weights="naive"), "near 1,000.*overflows"),
        (lambda *a: merge(*(t.double() for t in a), L_of="naive", weights="naive"), "near 1,000.*overflows"),
        (lambda *a: merge(*a, guard=False), "both empty"),
        (lambda *a: merge(*a, L_of="max"), "larger of L1 and L2"),
        (lambda *a: merge(*a, L_of="sum"), "log of a product"),
        (lambda *a: merge(*a, weights="equal"), "equal weight"),
        (lambda *a: merge(*a, weights="swapped"), "other block's weight"),
        (lambda *a: merge(*a, weights="unnormalised"), "do not sum to 1"),
        (lambda *a: merge(*a, weights="sum"), "sum O1 \\+ O2"),
        (lambda *a: merge(*a)[1], "pair \\(L, O\\)"),
        (lambda *a: (merge(*a)[0].squeeze(-1), merge(*a)[1]), "shape"),
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
