"""Chapter 5's exercise graders accept the right answers (float64 and float32) and name the typical mistakes."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import grader_row

from transformer_lib.exercises.residual import (
    check_he_init,
    check_pre_norm_stack,
    check_residual_scale,
    check_rms_norm,
    check_stream_std,
)
from transformer_lib.feed_forward import PositionwiseFeedForward
from transformer_lib.multi_head import MultiHeadAttention
from transformer_lib.residual import LayerNorm, SublayerConnection

# --- exercise 2: RMSNorm


def rms_norm(x, gamma, eps=1e-6):
    return gamma * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm32(x, gamma, eps=1e-6):
    return F.rms_norm(x.float(), x.shape[-1:], gamma.float(), eps)


def subtracted_the_mean(x, gamma, eps=1e-6):
    return rms_norm(x - x.mean(-1, keepdim=True), gamma, eps)


def eps_outside_the_root(x, gamma, eps=1e-6):
    return gamma * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps)


def divided_by_std(x, gamma, eps=1e-6):
    return gamma * x / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps)


def summed_not_averaged(x, gamma, eps=1e-6):
    return gamma * x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def gamma_missing(x, gamma, eps=1e-6):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


# --- exercise 3: He initialisation

def he_init(block):
    nn.init.kaiming_normal_(block.linear1.weight, nonlinearity="relu")
    nn.init.kaiming_normal_(block.linear2.weight, nonlinearity="linear")
    nn.init.zeros_(block.linear1.bias)
    nn.init.zeros_(block.linear2.bias)


def he_init_uniform(block):                                          # the same variance, uniform: also He's rule
    nn.init.kaiming_uniform_(block.linear1.weight, nonlinearity="relu")
    nn.init.kaiming_uniform_(block.linear2.weight, nonlinearity="linear")
    nn.init.zeros_(block.linear1.bias)
    nn.init.zeros_(block.linear2.bias)


def he_init_returning_the_block(block):                                     # returns a new, initialised module
    he_init(block)
    return block


def fan_out_mode(block):
    he_init(block)
    nn.init.kaiming_normal_(block.linear1.weight, mode="fan_out", nonlinearity="relu")


def relu_gain_everywhere(block):                                     # kaiming_normal_'s default on both layers
    he_init(block)
    nn.init.kaiming_normal_(block.linear2.weight)


def xavier(block):
    he_init(block)
    nn.init.xavier_normal_(block.linear1.weight)


def biases_left(block):
    nn.init.kaiming_normal_(block.linear1.weight, nonlinearity="relu")
    nn.init.kaiming_normal_(block.linear2.weight, nonlinearity="linear")


def not_in_place(block):
    torch.nn.init.kaiming_normal_(block.linear1.weight.clone(), nonlinearity="relu")


def test_he_init_leaves_the_global_random_state_alone():
    torch.manual_seed(1)
    before = torch.random.get_rng_state()
    check_he_init(he_init)
    assert torch.equal(before, torch.random.get_rng_state())


# --- exercise 4: the std of the residual stream

def stream_std(layers, x):
    stds = [x.std()]
    for layer in layers:
        x = layer(x)
        stds.append(x.std())
    return torch.stack(stds)


def stream_std_biased_floats(layers, x):
    stds = [x.std(unbiased=False).item()]
    for layer in layers:
        x = layer(x)
        stds.append(x.std(unbiased=False).item())
    return stds


def stream_std32(layers, x):
    return stream_std(layers, x).float()


def input_missing(layers, x):
    return stream_std(layers, x)[1:]


def increments(layers, x):
    stds = [x.std()]
    for layer in layers:
        y = layer(x)
        stds.append((y - x).std())
        x = y
    return stds


def variances(layers, x):
    return stream_std(layers, x) ** 2


def per_position(layers, x):
    stds = [x.std(-1).mean()]
    for layer in layers:
        x = layer(x)
        stds.append(x.std(-1).mean())
    return stds


def input_to_every_layer(layers, x):
    return [x.std()] + [layer(x).std() for layer in layers]


# --- exercise 5: the bug hunt, a pre-norm stack without its final LayerNorm

class Block(nn.Module):                                              # as in the chapter, section 5.3
    def __init__(self, d_model, num_heads, d_ff, norm_first=False, dropout=0.0):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout=dropout)
        self.sublayer1 = SublayerConnection(d_model, dropout, norm_first=norm_first)
        self.sublayer2 = SublayerConnection(d_model, dropout, norm_first=norm_first)

    def forward(self, x, mask=None):
        x = self.sublayer1(x, lambda y: self.self_attn(y, y, y, mask)[0])
        return self.sublayer2(x, self.feed_forward)


class PreNormStack(nn.Module):                                       # the bug: no final LayerNorm
    def __init__(self, num_layers, d_model, num_heads, d_ff):
        super().__init__()
        self.layers = nn.ModuleList(Block(d_model, num_heads, d_ff, norm_first=True) for _ in range(num_layers))

    def forward(self, x, mask=None):
        for layer in self.layers:
            x = layer(x, mask)
        return x


class FixedStack(PreNormStack):
    def __init__(self, num_layers, d_model, num_heads, d_ff):
        super().__init__(num_layers, d_model, num_heads, d_ff)
        self.norm = LayerNorm(d_model)

    def forward(self, x, mask=None):
        return self.norm(super().forward(x, mask))


class FixedStack64(FixedStack):
    def __init__(self, *args):
        super().__init__(*args)
        self.double()


class NormNotApplied(FixedStack):
    def forward(self, x, mask=None):
        return PreNormStack.forward(self, x, mask)


class NormAfterEveryLayer(FixedStack):
    def forward(self, x, mask=None):
        for layer in self.layers:
            x = self.norm(layer(x, mask))
        return x


class NormAtTheInput(FixedStack):
    def forward(self, x, mask=None):
        return PreNormStack.forward(self, self.norm(x), mask)


class NormWithoutParameters(FixedStack):
    def forward(self, x, mask=None):
        return F.layer_norm(PreNormStack.forward(self, x, mask), (x.size(-1),))


class PostNormLayers(FixedStack):
    def __init__(self, num_layers, d_model, num_heads, d_ff):
        super().__init__(num_layers, d_model, num_heads, d_ff)
        self.layers = nn.ModuleList(Block(d_model, num_heads, d_ff, norm_first=False) for _ in range(num_layers))


def test_pre_norm_stack_measures_the_growth():
    with pytest.raises(AssertionError) as err:
        check_pre_norm_stack(PreNormStack)
    low, high = (float(s.split(" with")[0]) for s in str(err.value).split("output: ")[1].split(", ")[:2])
    assert high > 2 * low


GRADERS = [
    grader_row(check_rms_norm, correct=[rms_norm, rms_norm32, lambda x, gamma, eps: nn.functional.rms_norm(x, (x.size(-1),), gamma, eps)], mistakes=[
        (subtracted_the_mean, "subtracted the mean"),
        (eps_outside_the_root, "eps outside the root"),
        (divided_by_std, "divided by the standard deviation"),
        (summed_not_averaged, "mean of the squares"),
        (gamma_missing, "gamma missing"),
        (lambda x, gamma, eps: rms_norm(x.mul_(2), gamma, eps), "changed x in place"),
        (lambda x, gamma, eps: rms_norm(x, gamma, eps).mean(-1), r"on x of shape \(3, 4, 16\): output shape \(3, 4\)"),
        (lambda x, gamma, eps: 1.01 * rms_norm(x, gamma, eps), "your function differs from the reference by up to"),
    ], prints='check_rms_norm: correct'),
    grader_row(check_he_init, correct=[he_init, he_init_uniform, he_init_returning_the_block], mistakes=[
        (fan_out_mode, "mode='fan_out'"),
        (relu_gain_everywhere, "use nonlinearity='linear' for linear2"),
        (xavier, "Xavier"),
        (biases_left, "bias is not zero"),
        (not_in_place, "did not change"),
    ], prints='check_he_init: correct scales'),
    grader_row(check_stream_std, correct=[stream_std, stream_std_biased_floats, stream_std32], mistakes=[
        (input_missing, "input's std is missing"),
        (increments, "what each layer adds"),
        (variances, "variances"),
        (per_position, "averaged each position's std"),
        (input_to_every_layer, "every layer got the input"),
    ], prints='check_stream_std: correct'),
    grader_row(check_residual_scale, correct=[2**16, 4.7e4, torch.tensor(65536.0)], prints="correct", mistakes=[
        (2.0**32, "growth of the variance"), (33, "added 1 per block"), (33**0.5, "unit variance"),
        (1.0, "preserves the scale"), (-1, "positive")]),
    grader_row(check_pre_norm_stack, correct=[FixedStack], mistakes=[], prints="correct, equal to nn.TransformerEncoder"),
    grader_row(check_pre_norm_stack, correct=[FixedStack64], prints="in float64", mistakes=[
        (PreNormStack, "scale grows with depth: a pre-norm stack needs a final LayerNorm"),
        (NormNotApplied, "needs a final LayerNorm"),
        (NormAfterEveryLayer, "after every layer"),
        (NormAtTheInput, "applied to the input"),
        (NormWithoutParameters, "ignores the weight and bias"),
        (PostNormLayers, "post-norm"),
    ]),
]
