"""Chapter 14's graders (transformer_lib.exercises.llama): the reference answers pass (float32 and float64), and
typical mistakes are caught with a message that names them."""

import pytest
import torch

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


def test_rope_grader_accepts_the_module_and_a_float64_answer(capsys):
    check_rope(lambda x, offset: RotaryEmbedding(x.size(-1))(x, offset))
    check_rope(lambda x, offset: rope(x.double(), offset))
    assert "check_rope" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, message", [
    (dict(neighbours=True), "neighbours"), (dict(backwards=True), "wrong way"), (dict(exponent=1), "exponent")])
def test_rope_grader_names_the_mistake(wrong, message):
    with pytest.raises(AssertionError, match=message):
        check_rope(lambda x, offset: rope(x, offset, **wrong))
    with pytest.raises(AssertionError, match="offset"):
        check_rope(lambda x, offset: rope(x, 0))
    with pytest.raises(AssertionError, match="shape"):
        check_rope(lambda x, offset: x[..., :2])


def test_cache_bytes_grader():
    check_gqa_cache_bytes(lambda L, h, kv, d, b: 2 * L * kv * (d // h) * b)
    for wrong, message in ((lambda L, h, kv, d, b: 2 * L * h * (d // h) * b, "num_kv_heads"),
                           (lambda L, h, kv, d, b: L * kv * (d // h) * b, "K or V"),
                           (lambda L, h, kv, d, b: 2 * kv * (d // h) * b, "layers"),
                           (lambda L, h, kv, d, b: 2 * L * kv * d * b, "d_k"),
                           (lambda L, h, kv, d, b: 16 * L * kv * (d // h) * b, "bits")):
        with pytest.raises(AssertionError, match=message):
            check_gqa_cache_bytes(wrong)


def merge(m1, l1, m2, l2):
    m = torch.maximum(torch.as_tensor(m1), torch.as_tensor(m2))
    return m, l1 * torch.exp(m1 - m) + l2 * torch.exp(m2 - m)


def test_online_merge_grader():
    check_online_merge(merge)
    check_online_merge(lambda m1, l1, m2, l2: tuple(v.double() for v in merge(m1, l1, m2, l2)))
    with pytest.raises(AssertionError, match="rescale"):
        check_online_merge(lambda m1, l1, m2, l2: (torch.maximum(m1, m2), l1 + l2))
    with pytest.raises(AssertionError, match="wrong way"):
        check_online_merge(lambda m1, l1, m2, l2: (torch.maximum(m1, m2), l1 * torch.exp(torch.maximum(m1, m2) - m1)
                                                   + l2 * torch.exp(torch.maximum(m1, m2) - m2)))
    with pytest.raises(AssertionError, match="not finite"):        # e.g. exp(-inf + inf) = nan
        check_online_merge(lambda m1, l1, m2, l2: (torch.maximum(m1, m2), torch.tensor(float("nan"))))
    with pytest.raises(AssertionError, match="pair"):
        check_online_merge(lambda m1, l1, m2, l2: l1 + l2)


def test_lora_merge_grader():
    check_lora_merge(lambda W, A, B, alpha: W + (alpha / A.shape[0]) * B @ A)
    check_lora_merge(lambda W, A, B, alpha: (W.double() + (alpha / A.shape[0]) * B.double() @ A.double()))
    for wrong, message in ((lambda W, A, B, alpha: W + B @ A, "scale alpha / rank is missing"),
                           (lambda W, A, B, alpha: W + alpha * B @ A, "not alpha"),
                           (lambda W, A, B, alpha: W.clone(), "update B A is missing"),
                           (lambda W, A, B, alpha: A, "shape")):
        with pytest.raises(AssertionError, match=message):
            check_lora_merge(wrong)
