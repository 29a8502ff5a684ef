"""The graders of Chapter 5's exercises (residual connections and layer normalization), imported by the chapter's exercise cells.

Hand-written, not exported from the chapter: a grader's reference and named slips are the answers, and Colab shows
every cell of a chapter, so their code stays out of the chapters."""

__all__ = ['check_layer_norm', 'check_rms_norm', 'check_he_init', 'check_residual_scale', 'check_stream_std',
           'check_layer_norm_backward', 'check_fold_layer_norm', 'check_sublayer_connection']

import math

import torch

from ..feed_forward import PositionwiseFeedForward
from ..residual import LayerNorm, SublayerConnection
from ..validation import describe
from .grading import Verdict, call_reader, close_to, grade


def _reference_layer_norm(x, gamma, beta, eps):
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return gamma * (x - mean) / torch.sqrt(var + eps) + beta


def check_layer_norm(fn, seed: int = 0) -> None:
    """Test fn(x, gamma, beta, eps) -> LayerNorm of x over its last axis; x: (..., d), gamma, beta: (d,).

    Raises AssertionError naming the mistake; prints a line when fn is right."""
    g = torch.Generator().manual_seed(seed)
    d, eps = 16, 1e-5

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    gamma, beta = 1.0 + 0.5 * rand(d), rand(d)

    def centred(x):
        return x - x.mean(-1, keepdim=True)

    def affine(z):
        return gamma * z + beta

    mistakes = {
        "unbiased variance used: divide by d, not d - 1 (x.var(-1, unbiased=False))":
            lambda x: affine(centred(x) / torch.sqrt(x.var(-1, keepdim=True, unbiased=True) + eps)),
        "eps added outside the square root: use sqrt(var + eps), not std + eps":
            lambda x: affine(centred(x) / (x.var(-1, keepdim=True, unbiased=False).sqrt() + eps)),
        "eps missing: divide by sqrt(var + eps)":
            lambda x: affine(centred(x) / x.var(-1, keepdim=True, unbiased=False).sqrt()),
        "mean not subtracted: normalise x - mean":
            lambda x: affine(x / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps)),
        "divided by the root mean square instead of the standard deviation (that is RMSNorm)":
            lambda x: affine(centred(x) / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)),
        "gamma and beta swapped: gamma scales, beta shifts":
            lambda x: beta * centred(x) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps) + gamma,
        "gamma missing (the normalised x must be multiplied by gamma)":
            lambda x: _reference_layer_norm(x, 1.0, beta, eps),
        "beta missing (beta must be added after scaling)":
            lambda x: _reference_layer_norm(x, gamma, 0.0, eps),
        "statistics over the wrong axis: normalise each position over its last axis (features)":
            lambda x: affine((x - x.mean(-2, keepdim=True))
                             / torch.sqrt(x.var(-2, keepdim=True, unbiased=False) + eps)),
        "statistics over the whole tensor: normalise each position separately, over its last axis":
            lambda x: affine((x - x.mean()) / torch.sqrt(x.var(unbiased=False) + eps)),
    }
    xs = []
    for shape in [(3, 4, d), (5, d)]:
        scale = torch.exp(3 * rand(*shape[:-1], 1))               # stds from about 1e-4 to 1e4 ...
        scale.view(-1)[0] = 1e-3                                  # ... and one position where eps matters
        xs.append(5 * rand(*shape[:-1], 1) + scale * rand(*shape))
    grade(lambda x: fn(x, gamma, beta, eps), lambda x: _reference_layer_norm(x, gamma, beta, eps),
          {f"on x of shape {tuple(x.shape)}": (x,) for x in xs}, mistakes, scale=10, case_in_mistakes=False, pure="x")
    print(f"check_layer_norm: correct on inputs of shape (3, 4, {d}) and (5, {d})")


def _reference_rms_norm(x, gamma, eps):
    return gamma * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def check_rms_norm(fn, seed: int = 0) -> None:
    """Test fn(x, gamma, eps) -> RMSNorm of x over its last axis, γ ⊙ x / √(mean(x²) + ε), as nn.RMSNorm
    computes it; x: (..., d), gamma: (d,).

    Raises AssertionError naming the mistake; prints a line when fn is right."""
    g = torch.Generator().manual_seed(seed)
    d, eps = 16, 1e-5

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    gamma = 1.0 + 0.5 * rand(d)

    def mean_square(x, dim=-1):
        return x.pow(2).mean(dim, keepdim=True)

    mistakes = {
        "you subtracted the mean: RMSNorm divides x itself, not x - mean, by the root mean square "
        "(subtracting the mean is LayerNorm's step)":
            lambda x: _reference_rms_norm(x - x.mean(-1, keepdim=True), gamma, eps),
        "you divided by the standard deviation: RMSNorm divides by the root mean square sqrt(mean(x²) + eps), "
        "which keeps the mean in":
            lambda x: gamma * x / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + eps),
        "you divided by the (unbiased) standard deviation: RMSNorm divides by sqrt(mean(x²) + eps)":
            lambda x: gamma * x / torch.sqrt(x.var(-1, keepdim=True) + eps),
        "you subtracted the mean and divided by the standard deviation: that is LayerNorm (without beta)":
            lambda x: gamma * (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False)
                                                                          + eps),
        "eps outside the root: use sqrt(mean(x²) + eps), not sqrt(mean(x²)) + eps":
            lambda x: gamma * x / (mean_square(x).sqrt() + eps),
        "eps missing: divide by sqrt(mean(x²) + eps)": lambda x: gamma * x / mean_square(x).sqrt(),
        "square root missing: divide by the root mean square, sqrt(mean(x²) + eps), not the mean square":
            lambda x: gamma * x / (mean_square(x) + eps),
        "you divided by the norm sqrt(sum(x²)): RMSNorm takes the mean of the squares (sum / d)":
            lambda x: gamma * x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + eps),
        "gamma missing: multiply the normalised x by gamma": lambda x: _reference_rms_norm(x, 1.0, eps),
        "statistics over the wrong axis: each position's root mean square is over its last axis (features)":
            lambda x: gamma * x / torch.sqrt(mean_square(x, -2) + eps),
    }
    xs = []
    for shape in [(3, 4, d), (5, d)]:
        scale = torch.exp(2 * rand(*shape[:-1], 1))               # positions of very different scales ...
        scale.view(-1)[0] = 1e-3                                  # ... and one where eps matters
        xs.append(scale * (2 * rand(*shape[:-1], 1) + rand(*shape)))     # a clearly non-zero mean per position
    grade(lambda x: fn(x, gamma, eps), lambda x: _reference_rms_norm(x, gamma, eps),
          {f"on x of shape {tuple(x.shape)}": (x,) for x in xs}, mistakes, scale=10, case_in_mistakes=False, pure="x")
    print(f"check_rms_norm: correct on inputs of shape (3, 4, {d}) and (5, {d})")


def _feed_forward_stack(num_blocks=32, d_model=64):
    return [PositionwiseFeedForward(d_model, 4 * d_model, dropout=0.0).double() for _ in range(num_blocks)]


def _initialised(fn, block):
    before = [p.detach().clone() for p in block.parameters()]
    try:
        out = fn(block)
    except Exception as err:
        raise AssertionError(f"he_init(block) raised {type(err).__name__}: {err}") from err
    block = out if isinstance(out, torch.nn.Module) else block     # initialised in place, or returned
    if all(torch.equal(a, b) for a, b in zip(before, block.parameters(), strict=False)):
        raise AssertionError("he_init(block) did not change the block's parameters: initialise them in place "
                             "(nn.init.kaiming_normal_(block.linear1.weight, ...) and friends modify the tensor)")
    return block


def _he_gain(activation):
    """He's gain for a layer followed by activation (None: nothing): the factor that keeps the mean square of the
    next layer's input equal to that of this layer's output, 1 / sqrt(E[activation(z)^2]) for z ~ N(0, 1),
    the expectation integrated numerically (trapezoidal rule on [-12, 12])."""
    z = torch.linspace(-12, 12, 240001, dtype=torch.float64)
    density = torch.exp(-z ** 2 / 2) / math.sqrt(2 * math.pi)
    return 1 / torch.trapezoid((z if activation is None else activation(z)).pow(2) * density, z).sqrt().item()


def check_he_init(fn, seed: int = 0) -> None:
    """Test fn(block) that gives a PositionwiseFeedForward He initialisation (He et al., 2015) in place, normal or
    uniform, with zero biases.

    Checks the scales on a (64, 256) block; then measures, with fn, how much of the gradient reaches block 1 of
    section 5.1's plain 32-block stack. Raises AssertionError naming the mistake; prints a line when right."""
    with torch.random.fork_rng(devices=[]):                        # leave the reader's random state as it was
        torch.manual_seed(seed)
        block = _initialised(fn, _feed_forward_stack(1)[0])
        d_model, d_ff = block.d_model, block.d_ff
        relu_gain, linear_gain = _he_gain(torch.relu), _he_gain(None)
        for name, fan_in, fan_out, gain, wrong_gain in [("linear1", d_model, d_ff, relu_gain, "linear"),
                                                        ("linear2", d_ff, d_model, linear_gain, "relu")]:
            layer = getattr(block, name)
            if layer.bias is not None and layer.bias.abs().max() > 0:
                raise AssertionError(f"{name}.bias is not zero: He initialisation sets the biases to 0 "
                                     "(nn.init.zeros_)")
            std = layer.weight.std().item()
            want = gain / fan_in ** 0.5
            if abs(std / want - 1) < 0.05:
                continue
            other_gain = linear_gain if gain > 1.2 else relu_gain
            candidates = {
                f"gain {other_gain:.3g}: use nonlinearity='{'relu' if gain > 1.2 else 'linear'}' for {name}, "
                f"not '{wrong_gain}'" + (" (kaiming_normal_'s default, leaky_relu with a = 0, is the ReLU gain)"
                                         if gain < 1.2 else ""): other_gain / fan_in ** 0.5,
                "mode='fan_out': He's rule divides by the fan-in, the number of inputs of each unit "
                f"({fan_in} for {name})": gain / fan_out ** 0.5,
                f"both nonlinearity='{wrong_gain}' and mode='fan_out'": other_gain / fan_out ** 0.5,
                "Xavier (Glorot) initialisation: He's uses √(gain² / fan_in), not √(2 / (fan_in + fan_out))":
                    (2 / (fan_in + fan_out)) ** 0.5,
                "PyTorch's default initialisation (kaiming_uniform_ with a = √5), not He's":
                    1 / (3 * fan_in) ** 0.5,
            }
            for message, wrong in candidates.items():
                if abs(std / wrong - 1) < 0.04:
                    raise AssertionError(f"{name}.weight has std {std:.3g}, He's is {want:.3g}: {message}")
            raise AssertionError(f"{name}.weight has std {std:.3g}, He's is {gain:.3g} / √fan_in = {want:.3g} "
                                 f"(fan_in = {fan_in}), {std / want:.3g} times too {'large' if std > want else 'small'}")
        # Section 5.1's plain stack, initialised by fn: how much gradient reaches block 1?
        blocks = [_initialised(fn, b) for b in _feed_forward_stack()]
        x = torch.randn(8, 16, d_model, dtype=torch.float64)
        for b in blocks:
            x = b(x)
        (x - torch.randn_like(x)).pow(2).mean().backward()
        ratio = (blocks[0].linear1.weight.grad.norm() / blocks[-1].linear1.weight.grad.norm()).item()
    if not ratio > 1e-3:
        raise AssertionError(f"with your initialisation the gradient at block 1 of the plain 32-block stack is "
                             f"{ratio:.1g} of that at block 32: it still vanishes")
    print(f"check_he_init: correct scales; with them the plain 32-block stack's gradient at block 1 is {ratio:.2g} "
          "of that at block 32")


def _measured_residual_std(fn=None, draws=4):
    """The std of x_32 = x_31 + F_31(x_31), ..., for 32 feed-forward blocks initialised by fn (default: He's rule,
    as _he_gain measures it) and an input of std 1: the geometric mean over `draws` random draws."""
    logs, gains = [], {torch.relu: _he_gain(torch.relu), None: _he_gain(None)}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for draw in range(draws):
            torch.manual_seed(100 + draw)
            blocks = _feed_forward_stack()
            for block in blocks:
                if fn is None:
                    for layer, activation in ((block.linear1, torch.relu), (block.linear2, None)):
                        torch.nn.init.normal_(layer.weight, std=gains[activation] / layer.in_features ** 0.5)
                        torch.nn.init.zeros_(layer.bias)
                else:
                    fn(block)
            x = torch.randn(8, 16, blocks[0].d_model, dtype=torch.float64)
            for block in blocks:
                x = x + block(x)
            logs.append(math.log2(x.std().item()))
    return 2 ** (sum(logs) / len(logs))


def check_residual_scale(std_after_32) -> None:
    """Test the reader's prediction (or measurement) of the std of the residual stack x_(l+1) = x_l + F_l(x_l)
    after 32 He-initialised feed-forward blocks of section 5.1, for an input of std 1, against the grader's own
    measurement on He-initialised stacks (the geometric mean of 4 draws). Accepts anything within a factor 2 of
    it (one draw, or a prediction, lands that close)."""
    try:
        got = float(std_after_32)
    except (TypeError, ValueError) as err:
        raise AssertionError(f"std_after_32 must be a number, got {type(std_after_32).__name__}") from err
    if not got > 0:
        raise AssertionError(f"a standard deviation is positive, got {got:g}")
    measured = _measured_residual_std()
    log2, want = math.log2(got), math.log2(measured)
    if abs(log2 - want) <= 1:
        print(f"check_residual_scale: correct, within a factor 2 of the std measured on He-initialised stacks "
              f"({measured:.3g}; you gave {got:.3g})")
        return
    answers = [(2 * want, "that is about the square of the std: it is the variance of x_32; take its square root", 2),
               (math.log2(33), "you added 1 per block (33): it is the variances that add, and each block adds "
                               "the variance of the stream it reads, which grows", 0.5),
               (math.log2(33) / 2, "√33 would hold if each block added unit variance; He initialisation makes "
                                   "Var F(x) equal to Var x, the stream's variance, which grows", 0.5),
               (0, "He initialisation preserves the scale through one block F, but the residual adds F(x) to x", 0.5)]
    for value, message, tolerance in answers:
        if abs(log2 - value) <= tolerance:
            raise AssertionError(message)
    raise AssertionError(f"you gave {got:.3g} = 2^{log2:.1f}, more than a factor 2 "
                         f"{'above' if got > measured else 'below'} the std the grader measures; with He initialisation each block adds a term with "
                         "the variance of the stream: how does the variance grow over 32 blocks?")


def _torch_pre_norm_layers(num_layers, d_model, num_heads, d_ff, seed):
    """num_layers pre-norm nn.TransformerEncoderLayers in float64, Xavier-initialised (section 5.4), random γ, β."""
    torch.manual_seed(seed)
    layers = torch.nn.ModuleList(
        torch.nn.TransformerEncoderLayer(d_model, num_heads, d_ff, dropout=0.0, activation="relu",
                                         batch_first=True, norm_first=True) for _ in range(num_layers)).double()
    for p in layers.parameters():
        if p.dim() > 1:
            torch.nn.init.xavier_uniform_(p)
    with torch.no_grad():
        for layer in layers:
            for norm in (layer.norm1, layer.norm2):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.normal_(0.0, 0.1)
    return layers


def check_stream_std(fn, seed: int = 0) -> None:
    """Test fn(layers, x) -> the L + 1 standard deviations of the residual stream x_0 = x, x_1, ..., x_L of a
    stack of L layers (x_(l+1) = layers[l](x_l)), each over all entries (x_l.std(), biased or unbiased).

    Runs fn on 12 pre-norm nn.TransformerEncoderLayers. Raises AssertionError naming the mistake; prints a line
    when fn is right."""
    L, d_model = 12, 32
    with torch.random.fork_rng(devices=[]):
        layers = _torch_pre_norm_layers(L, d_model, 4, 64, seed)
        x0 = torch.randn(4, 8, d_model, dtype=torch.float64)
    with torch.no_grad():
        xs = [x0]
        for layer in layers:
            xs.append(layer(xs[-1]))
        norm = LayerNorm(d_model).double()
        adds = "you measured what each layer adds, x_(l+1) - x_l, not the stream x_(l+1) itself"
        steps = [b - a for a, b in zip(xs, xs[1:], strict=False)]
        wrong = {
            "the input's std is missing: start the list with x_0.std(), so L layers give L + 1 values":
                [[x.std() for x in xs[1:]]],
            "the last layer's output is missing: L layers give L + 1 values, x_0 ... x_L": [[x.std() for x in xs[:-1]]],
            "every layer got the input x_0: feed each layer the previous layer's output, x_(l+1) = layers[l](x_l)":
                [[x0.std()] + [layer(x0).std() for layer in layers]],
            adds: [[x0.std()] + [x.std() for x in steps]],
            adds + " (and x_0 is missing)": [[x.std() for x in steps]],
            "you returned variances: take their square root (x.std())": [[x.var() for x in xs]],
            "you averaged each position's std over its features: measure x_l.std() over all entries":
                [[x.std(-1).mean() for x in xs], [x.std(-1, unbiased=False).mean() for x in xs]],
            "you measured a normalised stream, LayerNorm(x_l): in a pre-norm stack the stream x_l itself is never "
            "normalised, and its std is what grows": [[norm(x).std() for x in xs]],
        }
    mistakes = {message: [lambda *_, v=v: torch.tensor([float(t) for t in v], dtype=torch.float64) for v in values]
                for message, values in wrong.items()}
    want = torch.tensor([x.std().item() for x in xs], dtype=torch.float64)
    with torch.no_grad():
        grade(lambda layers, x: torch.tensor([float(v) for v in fn(layers, x)], dtype=torch.float64),
              lambda layers, x: want, {"": (layers, x0)}, mistakes, name="stream_std(layers, x)", scale=1e4,
              against="the stream's stds",
              shape="L + 1 values, x_0 ... x_L: ", hint=lambda at, *_: f": the std of x_{at[0]}",
              crash=" (return L + 1 numbers: a list or a 1-d tensor)")
    print(f"check_stream_std: correct; on this 12-layer pre-norm stack the std grows from {want[0]:.2f} to "
          f"{want[-1]:.2f}")

# --- exercise 1: LayerNorm's backward pass by hand, graded against autograd (the reference is autograd itself)
def _autograd_layer_norm(x, gamma, dy, eps, held=(), unbiased=False):
    """(dx, dgamma, dbeta) of y = LayerNorm(x) (gain gamma, shift beta) for the upstream gradient dy, by autograd
    in float64. The reference runs F.layer_norm; a reader's slip is autograd of the same forward with the
    statistics in held ("mean", "std") taken as constants, or with the variance divided by d - 1 (unbiased)."""
    x, gamma = (t.detach().to(torch.float64).requires_grad_() for t in (x, gamma))
    beta = torch.zeros_like(gamma, requires_grad=True)
    with torch.enable_grad():
        if not held and not unbiased:
            y = torch.nn.functional.layer_norm(x, x.shape[-1:], gamma, beta, eps)
        else:
            mean = x.mean(-1, keepdim=True)
            std = torch.sqrt(x.var(-1, keepdim=True, unbiased=unbiased) + eps)
            mean = mean.detach() if "mean" in held else mean
            std = std.detach() if "std" in held else std
            y = gamma * (x - mean) / std + beta
        return torch.autograd.grad(y, (x, gamma, beta), dy.to(torch.float64))


def check_layer_norm_backward(fn, seed: int = 0) -> None:
    """Test a reader's fn(x, gamma, dy, eps) -> (dx, dgamma, dbeta), the gradients of a loss with respect to
    LayerNorm's input x (..., d), gain gamma (d,) and shift beta (d,), given dy = dL/dy for y = LayerNorm(x),
    computed by hand: autograd is switched off while fn runs. Compared with autograd in float64 (float32 work is
    accepted) on inputs of shapes (3, 4, 16) and (5, 16), one position with a variance near eps. Names the
    mistake: the gradient through the mean or through the variance left out, gamma or eps forgotten, the unbiased
    variance (in dgamma, which is graded first), dgamma from x instead of the normalised x, dgamma and dbeta swapped,
    not summed over the positions or averaged."""
    g = torch.Generator().manual_seed(seed)
    d, eps = 16, 1e-5

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)
    gamma = 1.0 + 0.5 * rand(d)
    crash = (". Autograd is off inside this check: compute the gradients from the formulas, going backwards "
             "through y = gamma * x_hat + beta, x_hat = (x - mean) / sqrt(var + eps), var and mean")

    def reader(*inputs):
        with torch.no_grad():                       # by hand: autograd has nothing to differentiate here
            got = fn(*inputs)
        if not (isinstance(got, (tuple, list)) and len(got) == 3):
            raise Verdict(f"fn(x, gamma, dy, eps) must return three tensors (dx, dgamma, dbeta), got "
                          f"{type(got).__name__}")
        return got

    def slip(i, **how):
        return lambda x, gamma, dy, eps: _autograd_layer_norm(x, gamma, dy, eps, **how)[i]
    mean_held = ("the gradient through the mean is missing: mean = (1/d) sum_j x_j depends on every feature of "
                 "the position, so each x_i also moves x_hat through the mean")
    std_held = ("the gradient through the variance is missing: var depends on every feature of the position, so "
                "each x_i also moves every x_hat_j through sqrt(var + eps)")
    cases = {}
    for shape in [(3, 4, d), (5, d)]:
        scale = torch.exp(rand(*shape[:-1], 1))                  # positions of different scales ...
        scale.view(-1)[0] = 3e-3                                  # ... and one whose variance is near eps
        x = 2 * rand(*shape[:-1], 1) + scale * rand(*shape)
        cases[f"on x of shape {shape}"] = (x, gamma, rand(*shape), eps)
    for what, inputs in cases.items():
        try:
            call_reader(reader, f"{what}: fn(x, gamma, dy, eps)", *(t.clone() if isinstance(t, torch.Tensor)
                                                                    else t for t in inputs))
        except Verdict:
            raise
        except AssertionError as error:
            raise AssertionError(f"{error}{crash}") from error.__cause__
        for i, name in ((1, "dgamma"), (2, "dbeta"), (0, "dx")):
            summed = (f"{name} must have gamma's shape (d,): a parameter shared by every position collects the "
                      "gradient of all of them (sum over every axis but the last)")
            mistakes = {} if i == 0 else {summed: [lambda x, *_: x.shape,
                                                   lambda x, *_: torch.Size(x.shape[1:]) if x.dim() > 2 else None]}
            if i == 0:
                mistakes.update({
                    mean_held: slip(0, held=("mean",)),
                    std_held: slip(0, held=("std",)),
                    "you divided dy by sqrt(var + eps) as if mean and variance were constants: both depend on x, "
                    "and the two terms through them are missing": slip(0, held=("mean", "std")),
                    "gamma is missing from dx: y = gamma * x_hat + beta, so the gradient reaching x_hat is "
                    "gamma * dy": lambda x, gamma, dy, eps: _autograd_layer_norm(x, torch.ones_like(gamma), dy,
                                                                                 eps)[0],
                    "eps is missing: the forward divides by sqrt(var + eps), and the backward must too (it shows "
                    "at the position whose variance is near eps)":
                        lambda x, gamma, dy, eps: _autograd_layer_norm(x, gamma, dy, 0.0)[0],
                })
            if i == 1:
                mistakes["eps is missing: the forward divides by sqrt(var + eps), and x_hat in dgamma must too"] = (
                    lambda x, gamma, dy, eps: _autograd_layer_norm(x, gamma, dy, 0.0)[1])
                mistakes["the unbiased variance (divide by d - 1): LayerNorm's variance divides by d"] = slip(
                    1, unbiased=True)
                mistakes["dgamma multiplies dy by x, but gamma multiplies the normalised x_hat: sum dy * x_hat"] = (
                    lambda x, gamma, dy, eps: (dy * x).reshape(-1, x.size(-1)).sum(0))
                mistakes["dgamma and dbeta are swapped: beta is added (its gradient is dy summed), gamma "
                         "multiplies x_hat"] = slip(2)
            if i == 2:
                mistakes["dgamma and dbeta are swapped: beta is added (its gradient is dy summed), gamma "
                         "multiplies x_hat"] = slip(1)
                mistakes["dbeta is averaged over the positions: a shared parameter's gradient is their sum"] = (
                    lambda x, gamma, dy, eps: dy.reshape(-1, x.size(-1)).mean(0))
            grade(lambda *x, i=i: reader(*x)[i], lambda *x, i=i: _autograd_layer_norm(*x)[i], {what: inputs},
                  mistakes, name=f"your {name}", against=f"autograd's {name}", crash=crash, scale=10)
    print("check_layer_norm_backward: dx, dgamma and dbeta equal autograd's on inputs of shape (3, 4, 16) and (5, 16)")

# --- exercise 2: LayerNorm's gain and shift folded into the linear layer that reads it
def _affine_fit(fn, d, dtype=torch.float64):
    """The (W, b) of the affine map z -> fn(z) on R^d, by least squares on 4d random points (exact for an affine
    fn, up to rounding): the reference never writes the folded weights down."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(4 * d, d, generator=g, dtype=dtype)
    ones = torch.ones(4 * d, 1, dtype=dtype)
    solution = torch.linalg.lstsq(torch.cat([z, ones], 1), fn(z)).solution         # (d + 1, d_out)
    return solution[:d].T.contiguous(), solution[d].contiguous()


def check_fold_layer_norm(fn, seed: int = 0) -> None:
    """Test a reader's fn(gamma, beta, W, b) -> (W_folded, b_folded): the weight (d_out, d) and bias (d_out,) of
    one linear layer such that  W_folded @ z + b_folded = W @ (gamma * z + beta) + b  for every z, so that a
    LayerNorm without gain and shift followed by the folded layer computes what LayerNorm(gamma, beta) followed
    by nn.Linear(W, b) computes. W as nn.Linear stores it: (d_out, d). Run on a square (d_out = d) and a
    non-square layer; fn must not change its inputs. Names the mistake: gamma on the wrong side of W, beta not
    folded or folded without W, gamma applied to beta too."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    def composed(gamma, beta, W, b):
        return lambda z: torch.nn.functional.linear(gamma * z + beta, W, b)
    cases = {}
    for d, d_out in ((8, 8), (8, 12)):
        cases[f"with W of shape ({d_out}, {d})"] = (1.0 + 0.5 * rand(d), rand(d), rand(d_out, d) / d ** 0.5,
                                                     rand(d_out))
    for where, inputs in cases.items():
        for i, name in ((0, "W_folded"), (1, "b_folded")):
            def reference(gamma, beta, W, b, i=i):
                return _affine_fit(composed(gamma, beta, W, b), gamma.numel())[i]

            def wrong(fit, square_only=False, i=i):    # the folded weights of a slipped composition
                return lambda gamma, beta, W, b: (None if square_only and W.size(0) != W.size(1) else
                                                  _affine_fit(fit(gamma, beta, W, b), gamma.numel())[i])
            mistakes = {
                "gamma scales W's rows (its output features); it multiplies LayerNorm's output, the layer's input: "
                "it must scale what each input feature contributes":
                    wrong(lambda gamma, beta, W, b: lambda z: gamma * (z @ W.T) + beta @ W.T + b, square_only=True),
                "beta is not folded: the shift beta enters the linear layer too, and comes out through W":
                    lambda gamma, beta, W, b, i=i: b if i == 1 else None,
                "beta was added to the bias as it is: it enters the layer before W, so it comes out through W":
                    lambda gamma, beta, W, b, i=i: b + beta if i == 1 and W.size(0) == W.size(1) else None,
                "gamma scaled beta too: LayerNorm adds beta after scaling by gamma":
                    wrong(lambda gamma, beta, W, b: composed(gamma, gamma * beta, W, b)),
                "beta went through W transposed: W as nn.Linear stores it is (d_out, d), and the layer computes "
                "z @ W.T":
                    wrong(lambda gamma, beta, W, b: lambda z: (gamma * z) @ W.T + W.T @ beta + b, square_only=True),
            }
            shape = "(d_out, d) = " if i == 0 else "(d_out,) = "
            grade(lambda *x, i=i: _folded(fn, *x)[i], reference, {where: inputs}, mistakes, name=f"your {name}",
                  against=f"the folded {'weight' if i == 0 else 'bias'}", shape=shape, pure="gamma, beta, W and b")
    print("check_fold_layer_norm: LayerNorm's gain and shift are folded into the linear layer (square and "
          "non-square W)")


def _folded(fn, gamma, beta, W, b):
    with torch.no_grad():
        got = fn(gamma, beta, W, b)
    if isinstance(got, torch.nn.Linear):
        got = (got.weight, got.bias)
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise Verdict(f"fn(gamma, beta, W, b) must return two tensors (W_folded, b_folded), got {type(got).__name__}")
    return got

# --- exercise 4: the bug hunt, a sublayer connection (the reference is the library's SublayerConnection)
def check_sublayer_connection(cls, seed: int = 0) -> None:
    """Test a reader's residual wrapper cls(d_model, dropout, norm_first=...) with its LayerNorm in self.norm and
    forward(x, sublayer), against the library's SublayerConnection with the same gain and shift: both forms (norm_first False and True), in
    eval mode and in training mode with dropout 0.5 (the same random numbers for both: dropout drawn once, on a
    tensor of x's shape, as nn.Dropout draws it). Names the usual mistakes of either form (where the dropout
    and the norm sit, the two forms swapped); for any other difference it says which form and mode differ, and by
    how much. The module may compute in float32 or float64."""
    d_model, p = 16, 0.5
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 5, d_model, generator=g, dtype=torch.float64)
    gain, shift = 1.0 + 0.5 * torch.rand(d_model, generator=g, dtype=torch.float64), torch.randn(
        d_model, generator=g, dtype=torch.float64)
    W = torch.randn(d_model, d_model, generator=g, dtype=torch.float64) / d_model ** 0.5

    def sublayer(y):                                         # a sublayer with a shape-preserving nonlinearity
        return torch.tanh(y @ W.to(y.dtype).T)
    drop_seed = 1000 + seed

    def slips(norm, drop):
        """The usual slips, each as (message, its post-norm form, its pre-norm form); None: not a slip of that form."""
        return [
            ("dropout is applied to the sum of x and the sublayer's output: it must drop only the sublayer's output, "
             "never the residual path", lambda x: norm(drop(x + sublayer(x))), lambda x: drop(x + sublayer(norm(x)))),
            ("dropout is missing: in training it acts on the sublayer's output (nn.Dropout(dropout))",
             lambda x: norm(x + sublayer(x)), lambda x: x + sublayer(norm(x))),
            ("dropout acts after the normalisation: the post-norm form drops the sublayer's output, then adds, "
             "then normalises", lambda x: drop(norm(x + sublayer(x))), None),
            ("the norm sits on the branch, before the addition: the post-norm form normalises the sum",
             lambda x: x + norm(drop(sublayer(x))), None),
            ("the two forms are swapped: norm_first=False is the paper's post-norm, True the pre-norm",
             lambda x: x + drop(sublayer(norm(x))), lambda x: norm(x + drop(sublayer(x)))),
        ]

    def run(f):
        """f(x) without grad, dropout's random numbers drawn from drop_seed (the same for every f)."""
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(drop_seed)
            return f(x)
    for norm_first in (False, True):
        form = "pre-norm (norm_first=True)" if norm_first else "post-norm (norm_first=False)"
        try:
            module = cls(d_model, p, norm_first=norm_first)
        except Exception as err:
            raise AssertionError(f"{cls.__name__}({d_model}, {p}, norm_first={norm_first}) raised "
                                 f"{type(err).__name__}: {err}") from err
        book = SublayerConnection(d_model, p, norm_first=norm_first).double()
        for m in (module, book):
            norm = getattr(m, "norm", None)
            if not isinstance(norm, torch.nn.Module) or not hasattr(norm, "weight"):
                raise AssertionError(f"{cls.__name__} must keep its LayerNorm in self.norm, as SublayerConnection "
                                     "does")
            with torch.no_grad():
                norm.weight.copy_(gain)
                norm.bias.copy_(shift)
        params = list(module.parameters())
        dtype = params[0].dtype if params else torch.float64
        for training in (False, True):
            module.train(training)
            book.train(training)
            mode = "in training mode (dropout 0.5)" if training else "in eval mode"
            try:
                got = run(lambda x, module=module, dtype=dtype: module(x.to(dtype), sublayer))
            except Exception as err:
                raise AssertionError(f"{form}, {mode}: your module raised {type(err).__name__}: {err}") from err
            if not isinstance(got, torch.Tensor) or got.shape != x.shape:
                raise AssertionError(f"{form}, {mode}: expected a tensor of x's shape {tuple(x.shape)}, got "
                                     f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}")
            want = run(lambda x, book=book: book(x, sublayer))
            if close_to(got, want):
                continue
            for message, *pair in slips(book.norm, lambda y, training=training: torch.nn.functional.dropout(y, p, training)):
                wrong = pair[1 if norm_first else 0]
                if wrong is not None and close_to(got, run(wrong)):
                    raise AssertionError(f"{form}, {mode}: {message}")
            error = (got.double() - want).abs().max().item()
            raise AssertionError(f"{form}, {mode}: your output differs from SublayerConnection's by up to "
                                 f"{error:.2g}")
    print("check_sublayer_connection: both forms equal SublayerConnection, in eval mode and with dropout in training")


# --- exercise 4: a probe of the identity path (the bug hunt's finding, graded on wrappers the reader has not seen)
class _Wrapper(torch.nn.Module):
    """A residual wrapper cls(d_model, dropout, norm_first) whose forward(x, sublayer) is rule(self, x, sublayer)."""

    rule = None

    def __init__(self, d_model, dropout=0.1, norm_first=False):
        super().__init__()
        self.norm = LayerNorm(d_model)
        self.norm2 = LayerNorm(d_model)
        self.dropout = torch.nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x, sublayer):
        if not self.norm_first:
            return self.norm(x + self.dropout(sublayer(x)))
        return type(self).rule(self, x, sublayer)


def _wrappers():
    """(name, class, keeps the identity path in pre-norm form)."""
    def make(name, rule):
        return type(name, (_Wrapper,), {"rule": rule})
    return [
        ("the library's SublayerConnection", SublayerConnection, True),
        ("a wrapper that normalises the stream it adds back",
         make("Renormalised", lambda m, x, f: (lambda y: y + m.dropout(f(y)))(m.norm(x))), False),
        ("a wrapper with a second LayerNorm on the branch's output (a 'sandwich' norm)",
         make("Sandwich", lambda m, x, f: x + m.dropout(m.norm2(f(m.norm(x))))), True),
        ("a wrapper that normalises the sum in both forms",
         make("AlwaysPostNorm", lambda m, x, f: m.norm(x + m.dropout(f(x)))), False),
        ("a wrapper whose identity path is scaled by 0.999",
         make("Scaled", lambda m, x, f: 0.999 * x + m.dropout(f(m.norm(x)))), False),
        ("a wrapper with no residual path", make("NoResidual", lambda m, x, f: m.dropout(f(m.norm(x)))), False),
    ]


def check_identity_probe(fn) -> None:
    """Test the reader's probe fn(wrapper_cls) -> bool: True when the pre-norm form of the residual wrapper
    wrapper_cls(d_model, dropout, norm_first=True) leaves the identity path of section 5.1 untouched (with a
    sublayer that outputs zeros, forward(x, sublayer) returns x itself), False otherwise. The grader hands wrappers
    the reader has not seen (the library's, a correct variant, and four that change the identity path). Raises
    AssertionError naming the probe's mistake; prints a verdict."""
    for name, cls, keeps in _wrappers():
        got = call_reader(fn, "keeps_identity(wrapper_cls)", cls)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if type(got).__name__ not in ("bool", "bool_"):
            raise AssertionError(f"keeps_identity must return True or False, got {describe(got)}")
        got = bool(got)
        if got == keeps:
            continue
        if cls is SublayerConnection:
            raise AssertionError("your probe says the library's SublayerConnection loses the identity path, but its "
                                 "pre-norm form returns x itself when the sublayer outputs zeros: build the wrapper "
                                 "with norm_first=True (the post-norm form normalises the sum, x included), and "
                                 "compare its output with x")
        if keeps:
            raise AssertionError(f"on {name}: your probe says it loses the identity path, but with a sublayer that "
                                 "outputs zeros it returns x itself; feed it such a sublayer (torch.zeros_like) and "
                                 "compare its output with x")
        if "scaled" in name:
            raise AssertionError(f"on {name}: your probe says it keeps the identity path; its output is 0.999 x, "
                                 "which a loose comparison calls equal: compare with a tolerance near round-off "
                                 "(1e-6 in float32, or torch.equal)")
        raise AssertionError(f"on {name}: your probe says it keeps the identity path, but with a sublayer that "
                             "outputs zeros its pre-norm form does not return x; compare the output with x itself "
                             "(not with LayerNorm(x)), with norm_first=True")
    print(f"check_identity_probe: your probe tells which of {len(_wrappers())} wrappers it had not seen keep the "
          "identity path in pre-norm form")
