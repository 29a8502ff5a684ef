"""Chapter 4's exercise graders accept the right answers (float64 and float32) and name the typical mistakes."""

from fractions import Fraction

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import Call, grader_row

from transformer_lib.exercises.feed_forward import check_kernel_3, check_swiglu, check_swiglu_width

# --- exercise 2: the SwiGLU width


def swiglu_width(d_model):
    return 8 * d_model / 3


def swiglu_width_exact(d_model):
    return Fraction(8 * d_model, 3)


def same_width(d_model):
    return 4 * d_model


def biases_counted(d_model):
    return (8 * d_model**2 + 4 * d_model) / (3 * d_model + 2)


def ratio_inverted(d_model):
    return 4 * d_model * 3 / 2


def rounded_width(d_model):
    return round(8 * d_model / 3)


# --- exercise 2: the SwiGLU module

class SwiGLUFeedForward(nn.Module):
    def __init__(self, d_model, d_ff, bias=False, dtype=None):
        super().__init__()
        self.W = nn.Linear(d_model, d_ff, bias=bias, dtype=dtype)
        self.V = nn.Linear(d_model, d_ff, bias=bias, dtype=dtype)
        self.W_2 = nn.Linear(d_ff, d_model, bias=bias, dtype=dtype)

    def forward(self, x):
        return self.W_2(F.silu(self.W(x)) * self.V(x))


class SwiGLU64(SwiGLUFeedForward):
    def __init__(self, d_model, d_ff):
        super().__init__(d_model, d_ff, dtype=torch.float64)


class SwishOnWrongBranch(SwiGLUFeedForward):
    def forward(self, x):
        return self.W_2(self.W(x) * F.silu(self.V(x)))


class WithBiases(SwiGLUFeedForward):
    def __init__(self, d_model, d_ff):
        super().__init__(d_model, d_ff, bias=True)


class SigmoidGate(SwiGLUFeedForward):
    def forward(self, x):
        return self.W_2(torch.sigmoid(self.W(x)) * self.V(x))


class NoSwish(SwiGLUFeedForward):
    def forward(self, x):
        return self.W_2(self.W(x) * self.V(x))


class BranchesAdded(SwiGLUFeedForward):
    def forward(self, x):
        return self.W_2(F.silu(self.W(x)) + self.V(x))


class OtherNames(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)


def test_swiglu_leaves_the_global_random_state_alone():
    torch.manual_seed(1)
    before = torch.random.get_rng_state()
    check_swiglu(SwiGLUFeedForward)
    assert torch.equal(before, torch.random.get_rng_state())


# --- exercise 3: kernel size 3

n = 6
distance = torch.arange(n)[:, None] - torch.arange(n)
band = distance.abs() <= 1


GRADERS = [
    grader_row(check_swiglu_width, correct=[swiglu_width, swiglu_width_exact, lambda d: torch.tensor(8.0 * d) / 3], mistakes=[
        (same_width, "kept d_ff = 4·d_model"),
        (biases_counted, "biases counted"),
        (ratio_inverted, "multiplied 4·d_model by 3/2"),
        (rounded_width, "rounded width"),
        (lambda d: 2 * d / 3, "forgot the factor 4"),
    ], prints='check_swiglu_width: correct'),
    grader_row(check_swiglu, correct=[SwiGLUFeedForward], mistakes=[], prints="correct (in float32)"),
    grader_row(check_swiglu, correct=[SwiGLU64], prints="correct (in float64)", mistakes=[
        (SwishOnWrongBranch, "Swish applied to the wrong branch"),
        (WithBiases, "biases in W, V, W_2"),
        (SigmoidGate, "sigmoid"),
        (NoSwish, "Swish missing"),
        (BranchesAdded, "added, not multiplied"),
        (OtherNames, "no nn.Linear called W"),
    ]),
    grader_row(check_kernel_3, correct=[Call(band, 5), Call(band.int().tolist(), 5.0), Call(np.asarray(band, dtype=np.float32), torch.tensor(5))], mistakes=[
        (Call(distance == 0, 5), "kernel size 1"),                 # the kernel-size-1 pattern
        (Call(torch.ones(n, n), 5), "that is attention"),
        (Call(distance.abs() <= 2, 5), "not two"),
        (Call((distance >= 0) & (distance <= 2), 5), "causal convolution"),
        (Call(torch.ones(5, 5), 5), "shape"),
        (Call(band, 3), "centred on the output"),
        (Call(band, 6), "off by one"),
        (Call(band, 4), "x_1 ... x_5 only"),
    ], prints='check_kernel_3: correct'),
]
