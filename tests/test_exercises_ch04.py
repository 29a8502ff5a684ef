"""Chapter 4's exercise graders accept the right answers (float64 and float32) and name the typical mistakes."""

from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

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


def test_swiglu_width_accepts_the_formula(capsys):
    check_swiglu_width(swiglu_width)
    check_swiglu_width(swiglu_width_exact)
    check_swiglu_width(lambda d: torch.tensor(8.0 * d) / 3)      # a float32 tensor
    assert "check_swiglu_width: correct" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, words", [
    (same_width, "kept d_ff = 4·d_model"),
    (biases_counted, "biases counted"),
    (ratio_inverted, "multiplied 4·d_model by 3/2"),
    (rounded_width, "rounded width"),
    (lambda d: 2 * d / 3, "forgot the factor 4"),
])
def test_swiglu_width_names_the_mistake(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_swiglu_width(wrong)


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


def test_swiglu_accepts_float32_and_float64(capsys):
    check_swiglu(SwiGLUFeedForward)                                # float32, PyTorch's default
    assert "correct (in float32)" in capsys.readouterr().out
    check_swiglu(SwiGLU64)
    assert "correct (in float64)" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, words", [
    (SwishOnWrongBranch, "Swish applied to the wrong branch"),
    (WithBiases, "biases in W, V, W_2"),
    (SigmoidGate, "sigmoid"),
    (NoSwish, "Swish missing"),
    (BranchesAdded, "added, not multiplied"),
    (OtherNames, "no nn.Linear called W"),
])
def test_swiglu_names_the_mistake(wrong, words):
    with pytest.raises(AssertionError, match=words):
        check_swiglu(wrong)


def test_swiglu_leaves_the_global_random_state_alone():
    torch.manual_seed(1)
    before = torch.random.get_rng_state()
    check_swiglu(SwiGLUFeedForward)
    assert torch.equal(before, torch.random.get_rng_state())


# --- exercise 3: kernel size 3

n = 6
distance = torch.arange(n)[:, None] - torch.arange(n)
band = distance.abs() <= 1


def test_kernel_3_accepts_the_answer_in_any_container(capsys):
    check_kernel_3(band, 5)
    check_kernel_3(band.int().tolist(), 5.0)
    check_kernel_3(np.asarray(band, dtype=np.float32), torch.tensor(5))
    assert "check_kernel_3: correct" in capsys.readouterr().out


@pytest.mark.parametrize("nonzero, words", [
    (distance == 0, "kernel size 1"),                              # the kernel-size-1 pattern
    (torch.ones(n, n), "that is attention"),
    (distance.abs() <= 2, "not two"),
    ((distance >= 0) & (distance <= 2), "causal convolution"),
    (torch.ones(5, 5), "shape"),
])
def test_kernel_3_names_a_wrong_pattern(nonzero, words):
    with pytest.raises(AssertionError, match=words):
        check_kernel_3(nonzero, 5)


@pytest.mark.parametrize("layers, words", [(3, "centred on the output"), (6, "off by one"), (4, "x_1 ... x_5 only")])
def test_kernel_3_names_a_wrong_number_of_layers(layers, words):
    with pytest.raises(AssertionError, match=words):
        check_kernel_3(band, layers)
