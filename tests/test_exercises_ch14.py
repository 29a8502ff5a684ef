"""Chapter 14's graders (transformer_lib.exercises.llama): the reference answers pass (float32 and float64), and
typical mistakes are caught with a message that names them."""

import torch
from helpers import grader_row

from transformer_lib.exercises.llama import (
    check_gqa_cache_bytes,
    check_lora_merge,
    check_online_merge,
    check_rope,
)
from transformer_lib.llama import RotaryEmbedding


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


GRADERS = [
    grader_row(check_rope, correct=[lambda x, offset: RotaryEmbedding(x.size(-1))(x, offset),
                                    lambda x, offset: rope(x.double(), offset)], mistakes=[
        (lambda x, offset: rope(x, offset, neighbours=True), "neighbours"),
        (lambda x, offset: rope(x, offset, backwards=True), "wrong way"),
        (lambda x, offset: rope(x, offset, exponent=1), "exponent"),
        (lambda x, offset: rope(x, 0), "offset"),
        (lambda x, offset: x[..., :2], "shape"),
    ]),
    grader_row(check_gqa_cache_bytes, correct=[lambda L, h, kv, d, b: 2 * L * kv * (d // h) * b], mistakes=[
        (lambda L, h, kv, d, b: 2 * L * h * (d // h) * b, "num_kv_heads"),
        (lambda L, h, kv, d, b: L * kv * (d // h) * b, "K or V"),
        (lambda L, h, kv, d, b: 2 * kv * (d // h) * b, "layers"),
        (lambda L, h, kv, d, b: 2 * L * kv * d * b, "d_k"),
        (lambda L, h, kv, d, b: 16 * L * kv * (d // h) * b, "bits"),
    ]),
    grader_row(check_online_merge, correct=[merge, lambda *a: tuple(v.double() for v in merge(*a))], mistakes=[
        (lambda m1, l1, m2, l2: (torch.maximum(m1, m2), l1 + l2), "rescale"),
        (rescaled_wrong_way, "wrong way"),
        (lambda m1, l1, m2, l2: (torch.maximum(m1, m2), torch.tensor(float("nan"))), "not finite"),  # exp(-inf + inf)
        (lambda m1, l1, m2, l2: l1 + l2, "pair"),
    ]),
    grader_row(check_lora_merge, correct=[
        lambda W, A, B, alpha: W + (alpha / A.shape[0]) * B @ A,
        lambda W, A, B, alpha: (W.double() + (alpha / A.shape[0]) * B.double() @ A.double()),
    ], mistakes=[
        (lambda W, A, B, alpha: W + B @ A, "scale alpha / rank is missing"),
        (lambda W, A, B, alpha: W + alpha * B @ A, "not alpha"),
        (lambda W, A, B, alpha: W.clone(), "update B A is missing"),
        (lambda W, A, B, alpha: A, "shape"),
    ]),
]
