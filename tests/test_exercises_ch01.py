"""Chapter 1's graders for exercises 1 (attention's backward pass), 2 (temperature limits) and 3 (additive
attention): a correct answer passes in float64 and float32, and each typical mistake is named."""

import math

import torch
import torch.nn.functional as F
from helpers import grader_row

from transformer_lib.exercises.attention import (
    check_additive_scores,
    check_attention_backward,
    check_temperature_limits,
)

# --- exercise 1: the backward pass by hand

def _backward(Q, K, V, dO, slip=""):
    """(dQ, dK, dV) of O = softmax(Q K^T / sqrt(d_k)) V, by hand, with one optional slip."""
    d_k = Q.size(-1)
    P = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(d_k), dim=-1)
    dV = P @ dO if slip == "dV untransposed" else P.transpose(-2, -1) @ dO
    dP = dO @ V.transpose(-2, -1)
    dS = {"identity": dP, "diagonal": P * dP}.get(slip, P * (dP - (P * dP).sum(-1, keepdim=True)))
    s = 1.0 if slip == "no scale" else math.sqrt(d_k)
    dK = (dS if slip == "dK untransposed" else dS.transpose(-2, -1)) @ Q / s
    return dS @ K / s, dK, dV


def attention_backward(Q, K, V, dO):
    return _backward(Q, K, V, dO)


def attention_backward32(Q, K, V, dO):
    return _backward(*(t.float() for t in (Q, K, V, dO)))


def softmax_skipped(Q, K, V, dO):
    return _backward(Q, K, V, dO, "identity")


def jacobian_diagonal_only(Q, K, V, dO):
    return _backward(Q, K, V, dO, "diagonal")


def scale_forgotten(Q, K, V, dO):
    return _backward(Q, K, V, dO, "no scale")


def dv_untransposed(Q, K, V, dO):
    return _backward(Q, K, V, dO, "dV untransposed")


def dk_untransposed(Q, K, V, dO):
    return _backward(Q, K, V, dO, "dK untransposed")


def by_autograd(Q, K, V, dO):
    Q, K, V = (t.requires_grad_() for t in (Q, K, V))
    out = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1)), -1) @ V
    return torch.autograd.grad(out, (Q, K, V), dO)


def two_gradients(Q, K, V, dO):
    return _backward(Q, K, V, dO)[:2]


def limits(scores):
    top = (scores == scores.amax(-1, keepdim=True)).to(scores.dtype)
    return torch.full_like(scores, 1 / scores.size(-1)), top / top.sum(-1, keepdim=True)


def limits32(scores):
    return tuple(w.float() for w in limits(scores.float()))


def limits_numerically(scores):
    return torch.softmax(1e-9 * scores, -1), torch.softmax(1e9 * scores, -1)


def swapped_limits(scores):
    return limits(scores)[::-1]


def weights_at_c_equal_1(scores):
    return scores.softmax(-1), limits(scores)[1]


def uniform_ones(scores):
    return torch.ones_like(scores), limits(scores)[1]


def smallest_score_wins(scores):
    return limits(scores)[0], F.one_hot(scores.argmin(-1), scores.size(-1)).to(scores.dtype)


def argmax_breaks_the_tie(scores):
    return limits(scores)[0], F.one_hot(scores.argmax(-1), scores.size(-1)).to(scores.dtype)


def additive(Q, K, W_1, W_2, w):
    return torch.tanh((Q @ W_1.T)[:, :, None, :] + (K @ W_2.T)[:, None, :, :]) @ w


def additive32(Q, K, W_1, W_2, w):
    return additive(*(t.float() for t in (Q, K, W_1, W_2, w)))


def transposed_scores(Q, K, W_1, W_2, w):
    return additive(Q, K, W_1, W_2, w).transpose(1, 2)


def swapped_weights(Q, K, W_1, W_2, w):
    return additive(Q, K, W_2, W_1, w)


def no_tanh(Q, K, W_1, W_2, w):
    return ((Q @ W_1.T)[:, :, None, :] + (K @ W_2.T)[:, None, :, :]) @ w


def tanh_after_w(Q, K, W_1, W_2, w):
    return torch.tanh(((Q @ W_1.T)[:, :, None, :] + (K @ W_2.T)[:, None, :, :]) @ w)


def untransposed_weights(Q, K, W_1, W_2, w):
    return torch.tanh((Q @ W_1)[:, :, None, :] + (K @ W_2)[:, None, :, :]) @ w


def dot_product(Q, K, W_1, W_2, w):
    return Q @ K.transpose(-2, -1)


GRADERS = [
    grader_row(check_attention_backward, correct=[attention_backward, attention_backward32], mistakes=[
        (softmax_skipped, "straight through the softmax"),
        (jacobian_diagonal_only, "only the diagonal"),
        (scale_forgotten, "too large by sqrt"),
        (dv_untransposed, "dV uses the weights untransposed"),
        (dk_untransposed, "dK takes the scores' gradient untransposed"),
        (by_autograd, "Autograd is off"),
        (two_gradients, "three tensors"),
    ], prints="equal autograd's"),
    grader_row(check_temperature_limits, correct=[limits, limits32, limits_numerically], mistakes=[
        (swapped_limits, "swapped"),
        (weights_at_c_equal_1, "weights at c = 1"),
        (uniform_ones, "sum to 5, not 1"),
        (smallest_score_wins, "SMALLEST score"),
        (argmax_breaks_the_tie, "two equal largest scores"),
        (lambda s: s.softmax(-1), "two tensors"),
        (lambda s: ((1e-3 * s).float().softmax(-1), (1e3 * s).float().softmax(-1)), "c -> 0 weights are close"),
        (lambda s: ((1e-12 * s).softmax(-1), (20 * s).softmax(-1)), "c -> infinity weights are close"),
    ], prints='both limits are right'),
    grader_row(check_additive_scores, correct=[additive, additive32], mistakes=[
        (transposed_scores, "transposed"),
        (swapped_weights, "W_1 and W_2 swapped"),
        (no_tanh, "no tanh"),
        (tanh_after_w, "tanh applied after the product with w"),
        (untransposed_weights, r"Q @ W_1\.T"),
        (dot_product, "dot-product scores"),
    ], prints='match'),
]
