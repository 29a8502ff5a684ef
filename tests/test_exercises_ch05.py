"""Chapter 5's exercise graders accept the right answers (float64 and float32) and name the typical mistakes: exercise 1
(LayerNorm's backward pass), 2 (folding gamma and beta), 3 (He initialisation and the residual scale), 4 (the std of
the residual stream), 5 (the bug hunt: a sublayer connection), and check_rms_norm, which the check command uses."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import grader_row

from transformer_lib.exercises.residual import (
    check_fold_layer_norm,
    check_he_init,
    check_identity_probe,
    check_layer_norm_backward,
    check_residual_scale,
    check_rms_norm,
    check_stream_std,
    check_sublayer_connection,
)
from transformer_lib.residual import LayerNorm, SublayerConnection

# --- exercise 1: LayerNorm's backward pass by hand


def _backward(x, gamma, dy, eps=1e-5, slip=""):
    """(dx, dgamma, dbeta) of y = LayerNorm(x), by hand, with one optional slip."""
    d = x.size(-1)
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True) * (d / (d - 1) if slip == "unbiased" else 1)
    rstd = 1 / torch.sqrt(var + (0.0 if slip == "no eps" else eps))
    x_hat = (x - mean) * rstd
    g = dy if slip == "no gamma" else gamma * dy
    through_mean = 0 if slip in ("mean held", "both held") else g.mean(-1, keepdim=True)
    through_var = 0 if slip in ("var held", "both held") else x_hat * (g * x_hat).mean(-1, keepdim=True)
    dx = rstd * (g - through_mean - through_var)
    dgamma = (dy * (x if slip == "dgamma from x" else x_hat)).reshape(-1, d).sum(0)
    dbeta = dy.reshape(-1, d).sum(0)
    if slip == "not summed":
        dgamma = dy * x_hat
    if slip == "swapped":
        dgamma, dbeta = dbeta, dgamma
    if slip == "averaged":
        dbeta = dy.reshape(-1, d).mean(0)
    return dx, dgamma, dbeta


def layer_norm_backward(x, gamma, dy, eps=1e-5):
    return _backward(x, gamma, dy, eps)


def layer_norm_backward32(x, gamma, dy, eps=1e-5):
    return _backward(x.float(), gamma.float(), dy.float(), eps)


def layer_norm_backward_by_autograd(x, gamma, dy, eps=1e-5):
    x, gamma = x.requires_grad_(), gamma.requires_grad_()
    beta = torch.zeros_like(gamma, requires_grad=True)
    return torch.autograd.grad(F.layer_norm(x, x.shape[-1:], gamma, beta, eps), (x, gamma, beta), dy)


def _slip(name):
    return lambda x, gamma, dy, eps=1e-5: _backward(x, gamma, dy, eps, slip=name)


# --- exercise 2: folding LayerNorm's gamma and beta into the next linear layer


def fold_layer_norm(gamma, beta, W, b):
    return W * gamma, b + W @ beta


def fold_as_a_linear(gamma, beta, W, b):                             # an nn.Linear is accepted too
    linear = nn.Linear(W.size(1), W.size(0)).to(W.dtype)
    with torch.no_grad():
        linear.weight.copy_(W * gamma)
        linear.bias.copy_(b + W @ beta)
    return linear


def fold32(gamma, beta, W, b):
    return fold_layer_norm(gamma.float(), beta.float(), W.float(), b.float())


def gamma_on_rows(gamma, beta, W, b):
    return gamma[:, None] * W, b + W @ beta


def beta_not_folded(gamma, beta, W, b):
    return W * gamma, b


def beta_added_as_it_is(gamma, beta, W, b):
    return W * gamma, b + beta


def gamma_on_beta_too(gamma, beta, W, b):
    return W * gamma, b + W @ (gamma * beta)


def beta_through_w_transposed(gamma, beta, W, b):
    return W * gamma, b + W.T @ beta


def folded_in_place(gamma, beta, W, b):
    return W.mul_(gamma), b + W @ beta

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


# --- exercise 3 (continued): the std of the residual stream

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


# --- exercise 4: the bug hunt, a sublayer connection


class Sublayer(nn.Module):
    """The wrapper of section 5.3, with one optional slip."""

    def __init__(self, d_model, dropout=0.1, norm_first=False, slip=""):
        super().__init__()
        self.norm, self.dropout, self.norm_first, self.slip = LayerNorm(d_model), nn.Dropout(dropout), norm_first, slip

    def forward(self, x, sublayer):
        slip, drop = self.slip, self.dropout
        if slip == "swapped":
            return x + drop(sublayer(self.norm(x))) if not self.norm_first else self.norm(x + drop(sublayer(x)))
        if self.norm_first:
            if slip == "residual normalised":                           # the exercise's bug
                x = self.norm(x)
                return x + drop(sublayer(x))
            if slip == "dropout on the sum":
                return drop(x + sublayer(self.norm(x)))
            if slip == "no dropout":
                return x + sublayer(self.norm(x))
            return x + drop(sublayer(self.norm(x)))
        if slip == "dropout on the sum":
            return self.norm(drop(x + sublayer(x)))
        if slip == "dropout after the norm":
            return drop(self.norm(x + sublayer(x)))
        if slip == "norm on the branch":
            return x + self.norm(drop(sublayer(x)))
        if slip == "no dropout":
            return self.norm(x + sublayer(x))
        return self.norm(x + drop(sublayer(x)))


def sublayer_class(slip="", dtype=torch.float64):
    def build(d_model, dropout=0.1, norm_first=False):
        return Sublayer(d_model, dropout, norm_first, slip).to(dtype)
    return build


class NoNormAttribute(nn.Module):
    def __init__(self, d_model, dropout=0.1, norm_first=False):
        super().__init__()
        self.layer_norm = LayerNorm(d_model)

    def forward(self, x, sublayer):
        return self.layer_norm(x + sublayer(x))


def identity_probe(d_model=8, dtype=torch.float64, compare=torch.equal, norm_first=True, zeros=True):
    """keeps_identity(wrapper_cls): the pre-norm wrapper with a sublayer of zeros returns x itself."""
    def keeps_identity(wrapper_cls):
        torch.manual_seed(0)
        wrapper = wrapper_cls(d_model, 0.0, norm_first=norm_first).to(dtype).eval()
        x = 3 * torch.randn(2, 5, d_model, dtype=dtype) + 1
        with torch.no_grad():
            out = wrapper(x, torch.zeros_like if zeros else (lambda y: y))
        return compare(out, x)
    return keeps_identity


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
        (2.0**32, "square of the std"), (2.0**14, "more than a factor 2 below"), (2.0**8, "more than a factor 2 below"),
        (2.0**20, "more than a factor 2 above"), (33, "added 1 per block"), (33**0.5, "unit variance"),
        (1.0, "preserves the scale"), (-1, "positive")]),
    grader_row(check_layer_norm_backward, correct=[layer_norm_backward, layer_norm_backward32], mistakes=[
        (_slip("mean held"), "gradient through the mean is missing"),
        (_slip("var held"), "gradient through the variance is missing"),
        (_slip("both held"), "as if mean and variance were constants"),
        (_slip("no gamma"), "gamma is missing from dx"),
        (_slip("no eps"), "eps is missing"),
        (_slip("unbiased"), "unbiased variance"),
        (_slip("dgamma from x"), "dgamma multiplies dy by x"),
        (_slip("not summed"), "dgamma must have gamma's shape"),
        (_slip("swapped"), "swapped"),
        (_slip("averaged"), "dbeta is averaged"),
        (layer_norm_backward_by_autograd, "Autograd is off"),
        (lambda x, gamma, dy, eps=1e-5: _backward(x, gamma, dy, eps)[:2], "three tensors"),
    ], prints="equal autograd's"),
    grader_row(check_fold_layer_norm, correct=[fold_layer_norm, fold_as_a_linear, fold32], mistakes=[
        (gamma_on_rows, "gamma scales W's rows"),
        (beta_not_folded, "beta is not folded"),
        (beta_added_as_it_is, "beta was added to the bias as it is"),
        (gamma_on_beta_too, "gamma scaled beta too"),
        (beta_through_w_transposed, "transposed"),
        (folded_in_place, "changed gamma, beta, W and b in place"),
        (lambda gamma, beta, W, b: W * gamma, "two tensors"),
    ], prints="folded into the linear layer"),
    grader_row(check_sublayer_connection, correct=[sublayer_class(), sublayer_class(dtype=torch.float32),
                                                   SublayerConnection], mistakes=[
        (sublayer_class("residual normalised"), r"pre-norm \(norm_first=True\), in .* mode: your output differs from SublayerConnection's by up to"),
        (sublayer_class("dropout on the sum"), "training mode .* dropout is applied to the sum"),
        (sublayer_class("dropout after the norm"), "dropout acts after the normalisation"),
        (sublayer_class("norm on the branch"), "the norm sits on the branch"),
        (sublayer_class("no dropout"), "dropout is missing"),
        (sublayer_class("swapped"), "the two forms are swapped"),
        (NoNormAttribute, "self.norm"),
    ], prints="both forms equal SublayerConnection"),
    grader_row(check_identity_probe, correct=[identity_probe(), identity_probe(dtype=torch.float32),
                                              identity_probe(compare=lambda a, b: bool(((a - b).abs() < 1e-6).all())),
                                              lambda cls: torch.tensor(identity_probe()(cls))], mistakes=[
        (identity_probe(norm_first=False), "the library's SublayerConnection loses the identity path.*norm_first=True"),
        (identity_probe(compare=lambda a, b: torch.allclose(a, b, rtol=1e-2)), "scaled by 0.999.*tolerance"),
        (identity_probe(zeros=False), "loses the identity path"),
        (lambda cls: "yes", "must return True or False"),
    ], prints="check_identity_probe: your probe tells"),
]
