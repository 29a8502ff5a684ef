"""The graders of Chapter 4's exercises (the feed-forward network), imported by the chapter's exercise cells.

Hand-written, not exported from the chapter: a grader's reference and named slips are the answers, and Colab shows
every cell of a chapter, so their code stays out of the chapters."""

__all__ = ['check_feed_forward', 'check_swiglu_width', 'check_swiglu', 'check_kernel_3', 'check_ffn_backward']

import math

import torch
import torch.nn.functional as F

from .grading import Verdict, call_reader, close_to, grade, number


def _reference_ffn(x, W_1, b_1, W_2, b_2):
    return torch.relu(x @ W_1 + b_1) @ W_2 + b_2


def check_feed_forward(fn, seed: int = 0) -> None:
    """Test fn(x, W_1, b_1, W_2, b_2) -> FFN(x), paper orientation (W_1: (d_model, d_ff), W_2: (d_ff, d_model)).

    Raises AssertionError naming the mistake; prints a line when fn is right."""
    g = torch.Generator().manual_seed(seed)
    d_model, d_ff = 6, 10                       # different sizes, so a transposed weight cannot go unnoticed

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    W_1, b_1, W_2, b_2 = rand(d_model, d_ff), rand(d_ff), rand(d_ff, d_model), rand(d_model)
    mistakes = {
        "ReLU missing: without max(0, .) the two layers collapse into one linear map":
            lambda x: (x @ W_1 + b_1) @ W_2 + b_2,
        "ReLU applied before adding b_1: it must be max(0, x W_1 + b_1)":
            lambda x: (torch.relu(x @ W_1) + b_1) @ W_2 + b_2,
        "ReLU applied after the second layer instead of between the layers":
            lambda x: torch.relu((x @ W_1 + b_1) @ W_2 + b_2),
        "ReLU applied to the output as well: the second layer is linear":
            lambda x: torch.relu(_reference_ffn(x, W_1, b_1, W_2, b_2)),
        "b_1 missing": lambda x: torch.relu(x @ W_1) @ W_2 + b_2,
        "b_2 missing": lambda x: torch.relu(x @ W_1 + b_1) @ W_2,
        "GELU used instead of ReLU: the paper's activation is max(0, .)":
            lambda x: F.gelu(x @ W_1 + b_1) @ W_2 + b_2,
    }

    def mixed(at, x):                                              # change position 0 only: do the others move?
        x_moved = x.clone()
        x_moved[..., 0, :] += 1.0
        out, moved = (fn(y, W_1, b_1, W_2, b_2) for y in (x, x_moved))
        return "" if close_to(moved[..., 1:, :], out[..., 1:, :].double()) else (
            ": positions are mixed: changing the input at position 0 changed the output at other positions; the "
            "network must act on each position (last axis) alone")
    grade(lambda x: fn(x, W_1, b_1, W_2, b_2), lambda x: _reference_ffn(x, W_1, b_1, W_2, b_2),
          {f"on x of shape {shape}": (rand(*shape),) for shape in [(2, 5, d_model), (7, d_model)]}, mistakes,
          case_in_mistakes=False, pure="x", hint=mixed, crash=f". Hint: W_1 has the paper's shape (d_model, d_ff) = "
                                                            f"{tuple(W_1.shape)}, so the first layer is x @ W_1 + b_1")
    print("check_feed_forward: correct on inputs of shape (2, 5, 6) and (7, 6)")


def _count(*layers):
    """Parameters of bias-free or biased nn.Linear layers given as (d_in, d_out, bias), counted on real modules."""
    return sum(p.numel() for d_in, d_out, bias in layers for p in torch.nn.Linear(d_in, d_out, bias=bias,
                                                                                    device="meta").parameters())


def _matched_width(d, relu_width=None, matrices=3, relu_bias=False, gated_bias=False):
    """The hidden width h at which a gated network (matrices - 1 layers d -> h and one h -> d) has as many
    parameters as a two-layer ReLU network d -> relu_width -> d (default 4 d). The counts are taken from modules of
    two widths (the gated count grows linearly with h) and the line is solved for the ReLU count."""
    relu = _count((d, 4 * d if relu_width is None else relu_width, relu_bias),
                  (4 * d if relu_width is None else relu_width, d, relu_bias))

    def gated(h):
        return _count(*[(d, h, gated_bias)] * (matrices - 1), (h, d, gated_bias))
    per_unit = gated(2) - gated(1)
    return (relu - (gated(1) - per_unit)) / per_unit


def check_swiglu_width(fn) -> None:
    """Test fn(d_model, multiple_of=None) -> the hidden width d_ff' at which a bias-free SwiGLU network has as many
    parameters as a bias-free ReLU network with d_ff = 4·d_model: the exact value when multiple_of is None, else
    that value rounded up to a multiple of multiple_of. The reference matches the two networks' parameter counts,
    taken from nn.Linear modules. Raises AssertionError naming the mistake; prints a line when fn is right."""
    sizes = [768, 512, 64, 3, 1]
    mistakes = {
        "you kept d_ff = 4·d_model: with three matrices instead of two, the SwiGLU network then has more "
        "parameters than the ReLU network": lambda d: 4 * d,
        "you multiplied 4·d_model by 3/2: with three matrices instead of two, should the width grow or shrink?":
            lambda d: 6 * d,
        "you compared with a ReLU network of width d_model; its width is d_ff = 4·d_model":
            lambda d: _matched_width(d, relu_width=d),
        "biases counted in both networks: the comparison is between bias-free networks":
            lambda d: _matched_width(d, relu_bias=True, gated_bias=True),
        "biases counted in the ReLU network: the comparison is between bias-free networks":
            lambda d: _matched_width(d, relu_bias=True),
        "biases counted in the SwiGLU network: the comparison is between bias-free networks":
            lambda d: _matched_width(d, gated_bias=True),
    }

    def call(*inputs):
        try:
            return fn(*inputs)
        except Exception as err:
            raise AssertionError(f"swiglu_width{inputs} raised {type(err).__name__}: {err}") from err
    for d in sizes:
        got, want = number(call(d), f"swiglu_width({d})"), _matched_width(d)
        if abs(got - want) <= 1e-6 * want:                # float32 arithmetic is fine
            continue
        for message, wrong in mistakes.items():
            if abs(got - wrong(d)) <= 1e-6 * abs(wrong(d)):
                raise AssertionError(f"{message} (for d_model = {d} you returned {got:g})")
        if abs(got - want) < 1 and got == round(got):
            raise AssertionError(f"for d_model = {d} you returned {got:g}, a whole number: with multiple_of=None "
                                 "return the exact width, unrounded")
        raise AssertionError(f"for d_model = {d} you returned {got:g}: with that width the SwiGLU network has "
                             f"{got / want:.3g} times the ReLU network's parameters")
    for d, multiple in ((768, 256), (4096, 256), (512, 64), (96, 32)):
        got, exact = number(call(d, multiple), f"swiglu_width({d}, {multiple})"), _matched_width(d)
        want = multiple * math.ceil(exact / multiple)
        if got == want:
            continue
        if got % multiple == 0 and got < exact:
            named = ("below the exact width (rounded down, or to the nearest multiple): round up, so that the SwiGLU "
                     "network has at least the ReLU network's parameters")
        elif got == math.ceil(exact):
            named = "rounded to a whole number, but not to a multiple of multiple_of"
        else:
            named = ("it must be the smallest multiple of multiple_of that is at least the exact width" if got % multiple
                     else "a multiple, but not the smallest one at least the exact width")
        raise AssertionError(f"swiglu_width({d}, multiple_of={multiple}) returned {got:g}: {named}")
    print(f"check_swiglu_width: correct, exact widths for d_model = {', '.join(map(str, sizes))}, and rounded up to "
          "multiples")


def _swish(z):
    return z * torch.sigmoid(z)


def check_swiglu(module_class, seed: int = 0) -> None:
    """Test a SwiGLU network class: module_class(d_model, d_ff) with three bias-free nn.Linear layers W, V
    (d_model -> d_ff) and W_2 (d_ff -> d_model), computing (Swish(x W) ⊙ x V) W_2 with Swish(z) = z·σ(z).

    The module may compute in float32 or float64 (its parameters' dtype). Raises AssertionError naming the
    mistake; prints a line when the module is right."""
    d_model, d_ff = 6, 10
    try:
        with torch.random.fork_rng(devices=[]):          # the module draws its initial weights: seed them, and
            torch.manual_seed(seed)                      # leave the reader's random state as it was
            module = module_class(d_model, d_ff)
    except Exception as err:
        raise AssertionError(f"{getattr(module_class, '__name__', 'your class')}({d_model}, {d_ff}) raised "
                             f"{type(err).__name__}: {err}") from err
    for name, shape in [("W", (d_ff, d_model)), ("V", (d_ff, d_model)), ("W_2", (d_model, d_ff))]:
        layer = getattr(module, name, None)
        if not isinstance(layer, torch.nn.Linear):
            raise AssertionError(f"your module has no nn.Linear called {name}: name the layers W and V "
                                 "(d_model -> d_ff) and W_2 (d_ff -> d_model), as in the formula")
        if tuple(layer.weight.shape) != shape:
            raise AssertionError(f"{name}.weight has shape {tuple(layer.weight.shape)}, expected {shape} "
                                 f"(nn.Linear stores its matrix transposed)")
    extra = sum(p.numel() for p in module.parameters()) - 3 * d_model * d_ff
    if extra > 0:
        biases = [name for name in ("W", "V", "W_2") if getattr(module, name).bias is not None]
        raise AssertionError(f"your module has {extra} parameters beyond its three matrices"
                             + (f" (biases in {', '.join(biases)}): SwiGLU has no biases, use bias=False"
                                if biases else ""))
    dtype = module.W.weight.dtype
    W, V, W_2 = (getattr(module, name).weight.detach().to("cpu", torch.float64).T for name in ("W", "V", "W_2"))
    mistakes = {
        "Swish applied to the wrong branch: it gates x W (the layer W), and x V stays linear":
            lambda x: (x @ W * _swish(x @ V)) @ W_2,
        "Swish applied to both branches: x V stays linear": lambda x: (_swish(x @ W) * _swish(x @ V)) @ W_2,
        "Swish missing: without it the network is bilinear, (x W ⊙ x V) W_2": lambda x: (x @ W * (x @ V)) @ W_2,
        "sigmoid σ(x W) used instead of Swish(x W) = x W · σ(x W) (that is the original GLU)":
            lambda x: (torch.sigmoid(x @ W) * (x @ V)) @ W_2,
        "ReLU used instead of Swish (that is ReGLU)": lambda x: (torch.relu(x @ W) * (x @ V)) @ W_2,
        "GELU used instead of Swish (that is GEGLU)": lambda x: (F.gelu(x @ W) * (x @ V)) @ W_2,
        "the two branches are added, not multiplied element-wise": lambda x: (_swish(x @ W) + x @ V) @ W_2,
        "Swish applied after W_2 instead of to x W": lambda x: _swish((x @ W * (x @ V)) @ W_2),
    }
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        grade(lambda x: module(x.to(module.W.weight.device, dtype)), lambda x: (_swish(x @ W) * (x @ V)) @ W_2,
              {f"on x of shape {shape}": (torch.randn(*shape, generator=g, dtype=torch.float64),)
               for shape in [(2, 5, d_model), (7, d_model)]}, mistakes, name="your module", case_in_mistakes=False)
    print(f"check_swiglu: correct (in {str(dtype).replace('torch.', '')}) on inputs of shape (2, 5, 6) and (7, 6)")


def _conv_layer(d=4, seed=0):
    """One layer of the exercise, in float64: Conv1d(d, 4d, kernel_size=3, padding=1), ReLU, Conv1d(4d, d, 1), as a
    function (n, d) -> (n, d)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        first = torch.nn.Conv1d(d, 4 * d, kernel_size=3, padding=1).double()
        second = torch.nn.Conv1d(4 * d, d, kernel_size=1).double()
    return lambda s: second(torch.relu(first(s.T))).T


def _reach(num_layers, n=6, d=4):
    """(n, n) booleans: does output position i of a stack of num_layers such layers depend on input position j?
    Measured with autograd on random weights and a random input."""
    layers = [_conv_layer(d, seed) for seed in range(num_layers)]

    def stack(s):
        for layer in layers:
            s = layer(s)
        return s
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    J = torch.autograd.functional.jacobian(stack, x)                  # (n, d, n, d)
    return J.abs().sum((1, 3)) > 0


def check_kernel_3(nonzero, num_layers) -> None:
    """Test the answers to the kernel-size-3 exercise, for a sequence of n = 6 positions.

    nonzero: (6, 6) booleans (tensor, array or nested lists), nonzero[i][j] True when the Jacobian block
    dy_i / dx_j of one layer is non-zero; num_layers: the smallest number of such layers after which output
    position 5 depends on input position 0. The reference is measured with autograd on a real stack of such layers.
    Raises AssertionError naming the mistake; prints a line when right."""
    n = 6
    try:
        got = torch.as_tensor(nonzero).to("cpu")
    except Exception as err:
        raise AssertionError(f"nonzero must be a (6, 6) tensor or nested list, got {type(nonzero).__name__}") from err
    if tuple(got.shape) != (n, n):
        raise AssertionError(f"nonzero must have shape (6, 6), one entry per block dy_i / dx_j; got {tuple(got.shape)}")
    got = got != 0
    distance = torch.arange(n)[:, None] - torch.arange(n)          # (n, n): i - j
    want = _reach(1)
    patterns = {
        "only the diagonal blocks: that is kernel size 1; a kernel of size 3 reads more than position i":
            distance == 0,
        "every block non-zero: that is attention; a kernel of size 3 reads only a few neighbouring positions":
            torch.ones(n, n, dtype=torch.bool),
        "a band of width 5 (|i - j| <= 2): that is what a kernel of size 5 would read":
            distance.abs() <= 2,
        "a one-sided band (j = i - 2, i - 1, i): that is a causal convolution (padding only on the left); "
        "padding=1 pads both ends, which centres the kernel": (distance >= 0) & (distance <= 2),
        "a one-sided band: with padding=1 the kernel is centred on position i": (distance >= 0) & (distance <= 1),
    }
    if not torch.equal(got, want):
        for message, wrong in patterns.items():
            if torch.equal(got, wrong) or torch.equal(got, wrong.T):
                raise AssertionError(message)
        wrong_blocks = [(i, j) for i in range(n) for j in range(n) if got[i, j] != want[i, j]][:3]
        raise AssertionError(f"wrong blocks, e.g. (i, j) = {', '.join(map(str, wrong_blocks))}: block (i, j) is "
                             "non-zero exactly when y_i depends on x_j")
    layers = number(num_layers, "num_layers")
    if layers != round(layers) or not 1 <= layers <= 20:
        raise AssertionError(f"num_layers must be a whole number of layers, 1 or more; got {layers:g}")
    layers = int(layers)
    if not _reach(layers)[5, 0]:
        raise AssertionError(("3 layers give a window of 2·3 + 1 = 7 positions, but it is centred on the output: "
                              "after 3 layers y_5's window does not reach x_0" if layers == 3 else
                              f"too few: after {layers} such layer{'s' if layers > 1 else ''} y_5 does not depend on "
                              "x_0 yet (measured with autograd on a stack of them)") +
                             "; count how far each layer moves information")
    if _reach(layers - 1)[5, 0] if layers > 1 else False:
        raise AssertionError(f"too many: y_5 already depends on x_0 after fewer than {layers} layers; num_layers is "
                             "the smallest number after which it does")
    print("check_kernel_3: correct: the non-zero blocks, and the smallest depth at which position 0 reaches "
          "position 5")


# --- exercise 1: the feed-forward network's backward pass by hand, graded against autograd (the reference is
# autograd itself)
def _autograd_ffn(x, W_1, b_1, W_2, b_2, dy, slip=""):
    """(dx, dW_1, db_1, dW_2, db_2) of y = max(0, x W_1 + b_1) W_2 + b_2 for the upstream gradient dy, by autograd,
    in float64. slip changes what autograd differentiates, keeping the forward values (a reader's slip):
    "no mask": the ReLU passes every unit's gradient; "mask without b_1": its mask is taken from x W_1 alone;
    "pre-activation": W_2's gradient is taken with the hidden units before the ReLU."""
    x, W_1, b_1, W_2, b_2 = (t.detach().to(torch.float64).requires_grad_() for t in (x, W_1, b_1, W_2, b_2))
    with torch.enable_grad():
        h = x @ W_1 + b_1                                            # (..., d_ff)
        a = torch.relu(h)
        if slip == "no mask":
            a = a.detach() + (h - h.detach())
        elif slip == "mask without b_1":
            a = a.detach() + (x @ W_1 > 0).to(h.dtype) * (h - h.detach())
        elif slip == "pre-activation":                               # the value of h, the gradient of a
            a = a + (h - a).detach()
        return torch.autograd.grad(a @ W_2 + b_2, (x, W_1, b_1, W_2, b_2), dy.to(torch.float64))


def _shaped(*dims):
    """A mutant that names an output of this shape."""
    size = torch.Size(dims)
    return lambda *inputs: size


def check_ffn_backward(fn, seed: int = 0) -> None:
    """Test a reader's fn(x, W_1, b_1, W_2, b_2, dy) -> (dx, dW_1, db_1, dW_2, db_2), the gradients of a loss L
    given dy = dL/dy for y = max(0, x W_1 + b_1) W_2 + b_2 (paper orientation: W_1 (d_model, d_ff), W_2
    (d_ff, d_model)) and x of shape (..., d_model), computed by hand: autograd is switched off while fn runs.
    Compared with autograd in float64 (float32 work is accepted) on x of shape (2, 5, 6) and (7, 6). Names the
    mistake: the ReLU's mask missing or taken without b_1, W_2's gradient from the units before the ReLU, a
    weight's gradient transposed (nn.Linear's orientation) or not summed over every position and sequence."""
    g = torch.Generator().manual_seed(seed)
    d_model, d_ff = 6, 10

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)
    crash = (". Autograd is off inside this check: compute the gradients from the formulas, going backwards "
             "through y = a W_2 + b_2, a = max(0, h) and h = x W_1 + b_1")

    def reader(*inputs):
        with torch.no_grad():                       # by hand: autograd has nothing to differentiate here
            got = fn(*inputs)
        if not (isinstance(got, (tuple, list)) and len(got) == 5):
            raise Verdict("fn(x, W_1, b_1, W_2, b_2, dy) must return five tensors (dx, dW_1, db_1, dW_2, db_2), got "
                          f"{type(got).__name__}" + (f" of {len(got)}" if isinstance(got, (tuple, list)) else ""))
        return got

    def slip(i, name):
        return lambda *inputs: _autograd_ffn(*inputs, slip=name)[i]
    no_mask = ("the gradient passed through the ReLU everywhere: max(0, h) passes it only where h > 0, and "
               "blocks it where the unit was off")
    no_bias = "the ReLU's mask must come from h = x W_1 + b_1, with b_1: you took it from x W_1 alone"
    pre = ("W_2 multiplies the units after the ReLU, a = max(0, h): its gradient sums a^T dy, and you used h, "
           "the units before it")
    names = ("dx", "dW_1", "db_1", "dW_2", "db_2")
    shapes = {"dx": "one row per position, the shape of x", "dW_1": "(d_model, d_ff), W_1's shape",
              "db_1": "(d_ff,), b_1's shape", "dW_2": "(d_ff, d_model), W_2's shape", "db_2": "(d_model,)"}
    for what, lead in (("on x of shape (2, 5, 6)", (2, 5)), ("on x of shape (7, 6)", (7,))):
        W_1, b_1, W_2, b_2 = rand(d_model, d_ff), rand(d_ff), rand(d_ff, d_model), rand(d_model)
        inputs = (rand(*lead, d_model), W_1, b_1, W_2, b_2, rand(*lead, d_model))
        try:
            call_reader(reader, f"{what}: fn(x, W_1, b_1, W_2, b_2, dy)", *(t.clone() for t in inputs))
        except Verdict:
            raise
        except AssertionError as error:
            raise AssertionError(f"{error}{crash}") from error.__cause__
        for i in (4, 3, 2, 1, 0):                                    # backwards, as the gradient flows
            name = names[i]
            mistakes = {}
            if i <= 2:
                mistakes[no_mask], mistakes[no_bias] = slip(i, "no mask"), slip(i, "mask without b_1")
            if i == 3:
                mistakes[pre] = slip(i, "pre-activation")
            if i in (1, 3):
                transposed = (d_ff, d_model) if i == 1 else (d_model, d_ff)
                mistakes[f"{name} is transposed: this exercise uses the paper's orientation, {shapes[name]} (nn.Linear "
                         "stores the transpose)"] = _shaped(*transposed)
            if i >= 1 and len(lead) > 1:
                per_sequence = (lead[0], d_model, d_ff) if i == 1 else (lead[0], d_ff, d_model) if i == 3 else (
                    (lead[0], d_ff) if i == 2 else (lead[0], d_model))
                mistakes[f"{name} has one gradient per sequence: sum over the batch too, the same weights serve every "
                         "position of every sequence"] = _shaped(*per_sequence)
            if i in (2, 4):
                mistakes[f"{name} has one gradient per position: sum them, the same bias is added at every "
                         "position"] = _shaped(*lead, d_ff if i == 2 else d_model)
            if i >= 1:
                positions = torch.Size(lead).numel()
                mistakes[f"{name} is averaged over the positions instead of summed: the same "
                         f"{'weight' if i in (1, 3) else 'bias'} serves every position, and each adds its whole "
                         "gradient"] = lambda *x, i=i, positions=positions: _autograd_ffn(*x)[i] / positions
            grade(lambda *x, i=i: reader(*x)[i], lambda *x, i=i: _autograd_ffn(*x)[i], {what: inputs}, mistakes,
                  name=f"your {name}", against=f"autograd's {name}", shape=f"{shapes[name]}: ", crash=crash)
    print("check_ffn_backward: dx, dW_1, db_1, dW_2 and db_2 equal autograd's on x of shape (2, 5, 6) and (7, 6)")
