"""Chapter 4's exercise graders accept the right answers (float64 and float32) and name the typical mistakes."""

import math
from fractions import Fraction

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import Call, grader_row

from transformer_lib.exercises.feed_forward import (
    check_ffn_backward,
    check_kernel_3,
    check_swiglu,
    check_swiglu_width,
)

# --- exercise 1: the backward pass by hand

def _rows(t):
    return t.reshape(-1, t.size(-1))


def _backward(x, W_1, b_1, W_2, b_2, dy, slip=""):
    """(dx, dW_1, db_1, dW_2, db_2) of y = max(0, x W_1 + b_1) W_2 + b_2, by hand, with one optional slip."""
    h = x @ W_1 + b_1
    a = h if slip == "pre-activation" else torch.relu(h)
    mask = {"no mask": torch.ones_like(h), "mask without b_1": (x @ W_1 > 0).to(h.dtype)}.get(slip, (h > 0).to(h.dtype))
    dh = (dy @ W_2.T) * mask
    dW_1 = x.transpose(-2, -1) @ dh if slip == "per sequence" else _rows(x).T @ _rows(dh)
    dW_2 = _rows(a).T @ _rows(dy)
    db_1 = dh if slip == "per position" else _rows(dh).sum(0)
    return dh @ W_1.T, dW_1.T if slip == "dW_1 transposed" else dW_1, db_1, dW_2, _rows(dy).sum(0)


def ffn_backward(x, W_1, b_1, W_2, b_2, dy):
    return _backward(x, W_1, b_1, W_2, b_2, dy)


def ffn_backward32(*inputs):
    return _backward(*(t.float() for t in inputs))


def ffn_backward_einsum(x, W_1, b_1, W_2, b_2, dy):              # another way to write it
    h = x @ W_1 + b_1
    dh = torch.einsum("...m,fm->...f", dy, W_2) * (h > 0)
    lead = "abcdefg"[:x.dim() - 1]
    return (dh @ W_1.T, torch.einsum(f"{lead}m,{lead}f->mf", x, dh), dh.reshape(-1, dh.size(-1)).sum(0),
            torch.einsum(f"{lead}f,{lead}m->fm", torch.relu(h), dy), dy.reshape(-1, dy.size(-1)).sum(0))


def slipped(slip):
    def fn(*inputs):
        return _backward(*inputs, slip=slip)
    fn.__name__ = slip.replace(" ", "_")
    return fn


def by_autograd(x, W_1, b_1, W_2, b_2, dy):
    inputs = [t.requires_grad_() for t in (x, W_1, b_1, W_2, b_2)]
    return torch.autograd.grad(torch.relu(inputs[0] @ inputs[1] + inputs[2]) @ inputs[3] + inputs[4], inputs, dy)


def test_ffn_backward_leaves_autograd_on():
    check_ffn_backward(ffn_backward)
    assert torch.is_grad_enabled()


# --- exercise 2: the SwiGLU width


def swiglu_width(d_model, multiple_of=None):
    exact = 8 * d_model / 3
    return exact if multiple_of is None else multiple_of * math.ceil(exact / multiple_of)


def swiglu_width_exact(d_model, multiple_of=None):
    exact = Fraction(8 * d_model, 3)
    return exact if multiple_of is None else multiple_of * math.ceil(exact / multiple_of)


def swiglu_width_rounded_nearest(d_model, multiple_of=None):
    exact = 8 * d_model / 3
    return exact if multiple_of is None else multiple_of * round(exact / multiple_of)


def swiglu_width_not_a_multiple(d_model, multiple_of=None):
    exact = 8 * d_model / 3
    return exact if multiple_of is None else math.ceil(exact)


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
    grader_row(check_ffn_backward, correct=[ffn_backward, ffn_backward32, ffn_backward_einsum], mistakes=[
        (slipped("no mask"), "passed through the ReLU everywhere"),
        (slipped("mask without b_1"), "took it from x W_1 alone"),
        (slipped("pre-activation"), "the units before it"),
        (slipped("dW_1 transposed"), "dW_1 is transposed"),
        (slipped("per sequence"), "sum over the batch too"),
        (slipped("per position"), "one gradient per position"),
        (lambda *inputs: (*ffn_backward(*inputs)[:2], ffn_backward(*inputs)[2] / inputs[0][..., 0].numel(),
                          *ffn_backward(*inputs)[3:]), "db_1 is averaged over the positions instead of summed"),
        (lambda *inputs: (*ffn_backward(*inputs)[:4], ffn_backward(*inputs)[4] / inputs[0][..., 0].numel()),
         "db_2 is averaged over the positions instead of summed"),
        (by_autograd, "Autograd is off"),
        (lambda *inputs: ffn_backward(*inputs)[:4], "five tensors"),
    ], prints="equal autograd's"),
    grader_row(check_swiglu_width, correct=[swiglu_width, swiglu_width_exact, lambda d, m=None: torch.tensor(8.0 * d) / 3 if m is None else swiglu_width(d, m)], mistakes=[
        (same_width, "kept d_ff = 4·d_model"),
        (biases_counted, "biases counted"),
        (ratio_inverted, "multiplied 4·d_model by 3/2"),
        (rounded_width, "a whole number"),
        (lambda d: 2 * d / 3, "ReLU network of width d_model"),
        (swiglu_width_rounded_nearest, "round up"),
        (swiglu_width_not_a_multiple, "not to a multiple of multiple_of"),
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
        (Call(distance.abs() <= 2, 5), "kernel of size 5"),
        (Call((distance >= 0) & (distance <= 2), 5), "causal convolution"),
        (Call(torch.ones(5, 5), 5), "shape"),
        (Call(band, 3), "centred on the output"),
        (Call(band, 6), "too many"),
        (Call(band, 4), "too few"),
    ], prints='check_kernel_3: correct'),
]
