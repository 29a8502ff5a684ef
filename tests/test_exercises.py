"""The graders accept a correct answer computed in float32 (issue 21) and still name the mistakes made in float32.

Each grader feeds float64 inputs; a reader who works in float32 (`x.float()`, `torch.full(...)` with the default
dtype) returns float32. `exercises.attention.close_to` sets the tolerance by the answer's dtype: float64 answers
are held to 1e-7 (relative), float32 to 1e-4, far below the differences the named mistakes make.
"""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import grader_row

from transformer_lib.attention import scaled_dot_product_attention
from transformer_lib.classifier import pool
from transformer_lib.exercises.attention import check_attention
from transformer_lib.exercises.classifier import check_pooling
from transformer_lib.exercises.encoder import check_encoder_layer
from transformer_lib.exercises.feed_forward import check_feed_forward
from transformer_lib.exercises.grading import close_to, first_difference, number
from transformer_lib.exercises.residual import check_layer_norm
from transformer_lib.exercises.sampling import check_top_p
from transformer_lib.exercises.training import check_label_smoothing
from transformer_lib.sampling import filter_logits


def f32(*tensors):
    return [t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in tensors]


def test_close_to_sets_the_tolerance_by_the_answers_dtype():
    want = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert close_to(want + 1e-10, want) and not close_to(want + 1e-5, want)          # float64: strict
    assert close_to((want + 1e-5).float(), want) and not close_to((want + 1e-2).float(), want)   # float32
    assert not close_to(want[:1], want)                                                # shapes must match
    assert close_to(1.00001, 1.0) and not close_to(1.001, 1.0) and close_to(torch.tensor(2.0), 2.0)   # numbers
    assert close_to([1.0, want], (1.0, want)) and not close_to([1.0], [1.0, 2.0]) and close_to(None, None)


def test_number_and_first_difference():
    assert number(torch.tensor([3.0]), "x") == 3.0
    with pytest.raises(AssertionError, match="x must be one number"):
        number([1, 2], "x")
    want = torch.zeros(2, 3, dtype=torch.float64)
    got = want.clone()
    got[1, 2] = 0.5
    assert first_difference(got, want) == ((1, 2), 0.5, 0.0) and first_difference(want, want) is None


# --- a correct answer computed in float32 passes every float grader (the rows of GRADERS, run by tests/test_graders.py)

def attention32(Q, K, V, mask=None, softmax_axis=-1):
    Q, K, V = f32(Q, K, V)
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(softmax_axis).nan_to_num(0.0) @ V


def ffn32(x, W_1, b_1, W_2, b_2):
    x, W_1, b_1, W_2, b_2 = f32(x, W_1, b_1, W_2, b_2)
    return torch.relu(x @ W_1 + b_1) @ W_2 + b_2


def layer_norm32(x, gamma, beta, eps):
    x, gamma, beta = f32(x, gamma, beta)
    return F.layer_norm(x, x.shape[-1:], gamma, beta, eps)


def encoder_layer32(layer, x, mask):
    import copy
    layer = copy.deepcopy(layer).float()
    a = layer.self_attn_residual
    x = x.float()
    if a.norm_first:
        x = x + layer.self_attn(*(3 * [a.norm(x)]), mask)[0]
        return x + layer.feed_forward(layer.feed_forward_residual.norm(x))
    x = a.norm(x + layer.self_attn(x, x, x, mask)[0])
    return layer.feed_forward_residual.norm(x + layer.feed_forward(x))


def label_smoothing32(logits, target, label_smoothing, pad_id):
    V = logits.size(-1)
    logp = F.log_softmax(logits.float(), -1)
    q = torch.full(logp.shape, label_smoothing / V)                       # float32, the default dtype
    q.scatter_(-1, target[..., None], 1 - label_smoothing + label_smoothing / V)
    loss = -(q * logp).sum(-1)
    keep = target != pad_id
    return loss[keep].mean()


def pooling32(hidden, keep, method):
    return pool(hidden.float(), keep, method)


def top_p32(logits, p):
    return filter_logits(logits.float(), top_p=p)


# --- and the mistakes are still named when the reader works in float32

def attention32_unscaled(Q, K, V, mask=None):
    return scaled_dot_product_attention(*f32(Q * math.sqrt(Q.size(-1)), K, V), mask)[0]


def attention32_query_axis(Q, K, V, mask=None):
    return attention32(Q, K, V, mask, softmax_axis=-2)


def layer_norm32_unbiased(x, gamma, beta, eps):
    x, gamma, beta = f32(x, gamma, beta)
    return gamma * (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=True) + eps) + beta


def layer_norm32_eps_outside(x, gamma, beta, eps):
    x, gamma, beta = f32(x, gamma, beta)
    return gamma * (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True, unbiased=False).sqrt() + eps) + beta


def ffn32_no_b1(x, W_1, b_1, W_2, b_2):
    x, W_1, W_2, b_2 = f32(x, W_1, W_2, b_2)
    return torch.relu(x @ W_1) @ W_2 + b_2


def label_smoothing32_padding_counted(logits, target, label_smoothing, pad_id):
    return nn.CrossEntropyLoss(label_smoothing=label_smoothing)(logits.float().flatten(0, 1), target.flatten())


def pooling32_padding_in_mean(hidden, keep, method):
    hidden = hidden.float()
    return (hidden * keep[..., None]).sum(1) / hidden.size(1) if method == "mean" else pool(hidden, keep, method)


GRADERS = [
    grader_row(check_attention, correct=[attention32], mistakes=[
        (attention32_unscaled, "not divided by sqrt"), (attention32_query_axis, "softmax over the wrong axis")]),
    grader_row(check_feed_forward, correct=[ffn32], mistakes=[(ffn32_no_b1, "b_1 missing")]),
    grader_row(check_layer_norm, correct=[layer_norm32], mistakes=[
        (layer_norm32_unbiased, "unbiased variance"), (layer_norm32_eps_outside, "eps added outside the square root")]),
    grader_row(check_encoder_layer, correct=[encoder_layer32], mistakes=[]),
    grader_row(check_label_smoothing, correct=[label_smoothing32], mistakes=[
        (label_smoothing32_padding_counted, "padding positions are not ignored")]),
    grader_row(check_pooling, correct=[pooling32], mistakes=[(pooling32_padding_in_mean, "padding counted in the mean")]),
    grader_row(check_top_p, correct=[top_p32], mistakes=[]),
]


# --- check_encoder_layer refuses the shortcuts its exercise forbids (it used to accept layer(x, mask))

def encoder_layer_shortcut(layer, x, mask):
    return layer(x, mask)


def encoder_layer_through_sublayers(layer, x, mask):
    x = layer.self_attn_residual(x, lambda y: layer.self_attn(y, y, y, mask)[0])
    return layer.feed_forward_residual(x, layer.feed_forward)


def encoder_layer_hidden_shortcut(layer, x, mask):
    try:
        return layer(x, mask)
    except Exception:                                  # a reader's try/except cannot hide the call
        return x


@pytest.mark.parametrize("answer, called", [(encoder_layer_shortcut, r"layer\(\.\.\.\)"),
                                            (encoder_layer_through_sublayers, r"layer\.self_attn_residual\(\.\.\.\)"),
                                            (encoder_layer_hidden_shortcut, r"layer\(\.\.\.\)")],
                         ids=["layer(x, mask)", "sublayers", "caught-by-the-reader"])
def test_check_encoder_layer_refuses_the_forbidden_calls(answer, called):
    with pytest.raises(AssertionError, match=rf"you called {called}"):
        check_encoder_layer(answer)
    check_encoder_layer(encoder_layer32)                # the layer's own forward is back afterwards
