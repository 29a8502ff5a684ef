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

from transformer_lib.attention import scaled_dot_product_attention
from transformer_lib.classifier import pool
from transformer_lib.exercises.attention import check_attention, close_to
from transformer_lib.exercises.classifier import check_pooling
from transformer_lib.exercises.encoder import check_encoder_layer
from transformer_lib.exercises.feed_forward import check_feed_forward
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


# --- a correct answer computed in float32 passes every float grader

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
    a = layer.sublayer1
    x = x.float()
    if a.norm_first:
        x = x + layer.self_attn(*(3 * [a.norm(x)]), mask)[0]
        return x + layer.feed_forward(layer.sublayer2.norm(x))
    x = a.norm(x + layer.self_attn(x, x, x, mask)[0])
    return layer.sublayer2.norm(x + layer.feed_forward(x))


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


FLOAT32_ANSWERS = [
    (check_attention, attention32), (check_feed_forward, ffn32), (check_layer_norm, layer_norm32),
    (check_encoder_layer, encoder_layer32), (check_label_smoothing, label_smoothing32),
    (check_pooling, pooling32), (check_top_p, top_p32),
]


@pytest.mark.parametrize("grader, answer", FLOAT32_ANSWERS, ids=[g.__name__ for g, _ in FLOAT32_ANSWERS])
def test_a_correct_float32_answer_passes(grader, answer, capsys):
    grader(answer)
    assert grader.__name__ in capsys.readouterr().out


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


FLOAT32_MISTAKES = [
    (check_attention, attention32_unscaled, "not divided by sqrt"),
    (check_attention, attention32_query_axis, "softmax over the wrong axis"),
    (check_layer_norm, layer_norm32_unbiased, "unbiased variance"),
    (check_layer_norm, layer_norm32_eps_outside, "eps added outside the square root"),
    (check_feed_forward, ffn32_no_b1, "b_1 missing"),
    (check_label_smoothing, label_smoothing32_padding_counted, "padding positions are not ignored"),
    (check_pooling, pooling32_padding_in_mean, "padding counted in the mean"),
]


@pytest.mark.parametrize("grader, answer, named", FLOAT32_MISTAKES, ids=[a.__name__ for _, a, _ in FLOAT32_MISTAKES])
def test_a_float32_mistake_is_still_named(grader, answer, named):
    with pytest.raises(AssertionError, match=named):
        grader(answer)


# --- check_encoder_layer refuses the shortcuts its exercise forbids (it used to accept layer(x, mask))

def encoder_layer_shortcut(layer, x, mask):
    return layer(x, mask)


def encoder_layer_through_sublayers(layer, x, mask):
    x = layer.sublayer1(x, lambda y: layer.self_attn(y, y, y, mask)[0])
    return layer.sublayer2(x, layer.feed_forward)


def encoder_layer_hidden_shortcut(layer, x, mask):
    try:
        return layer(x, mask)
    except Exception:                                  # a reader's try/except cannot hide the call
        return x


@pytest.mark.parametrize("answer, called", [(encoder_layer_shortcut, r"layer\(\.\.\.\)"),
                                            (encoder_layer_through_sublayers, r"layer\.sublayer1\(\.\.\.\)"),
                                            (encoder_layer_hidden_shortcut, r"layer\(\.\.\.\)")],
                         ids=["layer(x, mask)", "sublayers", "caught-by-the-reader"])
def test_check_encoder_layer_refuses_the_forbidden_calls(answer, called):
    with pytest.raises(AssertionError, match=rf"you called {called}"):
        check_encoder_layer(answer)
    check_encoder_layer(encoder_layer32)                # the layer's own forward is back afterwards
