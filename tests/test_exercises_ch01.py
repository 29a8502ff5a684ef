"""Chapter 1's graders for exercises 2 (temperature limits) and 3 (additive attention): a correct answer passes in
float64 and float32, and each typical mistake is named."""

import torch
import torch.nn.functional as F
from helpers import grader_row

from transformer_lib.exercises.attention import check_additive_scores, check_temperature_limits


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
    grader_row(check_temperature_limits, correct=[limits, limits32, limits_numerically], mistakes=[
        (swapped_limits, "swapped"),
        (weights_at_c_equal_1, "weights at c = 1"),
        (uniform_ones, "sum to 5, not 1"),
        (smallest_score_wins, "SMALLEST score"),
        (argmax_breaks_the_tie, "two equal largest scores"),
        (lambda s: s.softmax(-1), "two tensors"),
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
