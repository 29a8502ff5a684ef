"""The graders of Chapter 1's exercises (scaled dot-product attention), imported by the chapter's exercise cells.

Hand-written, not exported from the chapter: a grader's reference and named slips are the answers, and Colab shows
every cell of a chapter, so their code stays out of the chapters."""

__all__ = ['check_attention', 'check_temperature_limits', 'check_additive_scores', 'check_attention_backward', 'copy_weights']

import math

import torch
import torch.nn.functional as F

from ..attention import scaled_dot_product_attention
from .grading import TOLERANCES, Verdict, call_reader, close_to, grade  # noqa: F401 (close_to was defined here: older code imports it from here)


def check_attention(fn, trials: int = 4, seed: int = 0) -> None:
    """Test a reader's `fn(Q, K, V, mask=None) -> output` against `scaled_dot_product_attention`.

    Runs random float64 inputs with batch and head dimensions, without and with masks (including a query
    row that may attend to nothing); float32 work is accepted (close_to). Raises AssertionError saying what is wrong: the shape, the
    scaling, the mask convention, the softmax axis, or NaN in fully masked rows."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    def sdpa(Q, K, V, mask, scale=1.0):                               # the reference, scores times scale
        return scaled_dot_product_attention(Q * scale, K, V, mask)[0]

    def wrong_axis(Q, K, V, mask):
        scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
        scores = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(dim=-2).nan_to_num(0.0) @ V
    mistakes = {
        "the scores are not divided by sqrt(d_k)": lambda Q, K, V, m: sdpa(Q, K, V, m, math.sqrt(Q.size(-1))),
        "the scores are divided by d_k instead of sqrt(d_k)": lambda Q, K, V, m: sdpa(Q, K, V, m, Q.size(-1) ** -0.5),
        "the mask is ignored": lambda Q, K, V, m: None if m is None else sdpa(Q, K, V, None),
        "the mask is inverted: True must mean 'may attend'": lambda Q, K, V, m: None if m is None else sdpa(Q, K, V, ~m),
        "softmax over the wrong axis; each query's weights over the keys (the last dimension) must sum to 1": wrong_axis,
        "a query row whose mask is all False must output zeros: softmax over a row of -inf gives NaN (zero such rows "
        "explicitly), a -1e9 fill gives the mean of V": lambda Q, K, V, m: None if m is None else sdpa(
            Q, K, V, m).masked_fill(~m.any(-1, keepdim=True), float("nan")),    # NaN: any value in those rows
    }
    for t in range(trials):
        B, h, n_q, n_k, d_k, d_v = 2, 1 + t % 3, 3 + t, 4 + 2 * t, 8 * (t + 1), 5 + t
        Q, K, V = rand(B, h, n_q, d_k), rand(B, h, n_k, d_k), rand(B, h, n_k, d_v)
        mask = torch.rand(B, 1, n_q, n_k, generator=g) < 0.7
        mask[..., 0] = True                      # every row may attend somewhere ...
        mask[0, 0, -1] = False                   # ... except the last query of the first sequence
        grade(lambda Q, K, V, m: fn(Q, K, V) if m is None else fn(Q, K, V, m), sdpa,
              {"without a mask": (Q, K, V, None), "with a mask": (Q, K, V, mask)}, mistakes,
              shape="(B, h, n_q, d_v) = ")
    print(f"check_attention: all {2 * trials} cases match the reference")

def _row_sums(w):
    return w.double().sum(-1)


def check_temperature_limits(fn, seed: int = 0) -> None:
    """Test a reader's `fn(scores) -> (w_zero, w_inf)`: the limits of the attention weights softmax(c * scores)
    (over the keys, the last axis) as c -> 0 and as c -> infinity. Multiplying Q by c multiplies every score by c.
    The scores (B, n_q, n_k) include a row whose two largest scores are equal. Raises AssertionError naming the
    mistake (limits swapped, the smallest score winning, rows that do not sum to 1, a tie given to one key, a c
    that is not small or large enough when the limits are taken numerically)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)        # (B, n_q, n_k)
    row = scores[1, 2]
    row[(int(row.argmax()) + 2) % 5] = row.max()                          # a tie for the largest score
    n_k = scores.size(-1)
    want_zero = torch.softmax(1e-12 * scores, -1)                         # the limits, numerically: a tiny and a
    want_inf = torch.softmax(1e12 * scores, -1)                           # huge c (exact in float64 here)
    got = fn(scores.clone())
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
        raise AssertionError("fn(scores) must return two tensors: (weights as c -> 0, weights as c -> infinity)")
    w_zero, w_inf = got
    for name, w in (("c -> 0", w_zero), ("c -> infinity", w_inf)):
        if tuple(w.shape) != tuple(scores.shape):
            raise AssertionError(f"your weights for {name} have shape {tuple(w.shape)}; they must have the scores' "
                                 f"shape (B, n_q, n_k) = {tuple(scores.shape)}")
    if close_to(w_zero, want_inf) and close_to(w_inf, want_zero):
        raise AssertionError("your two limits are swapped: as c -> 0 every score c*s goes to 0, so all keys weigh "
                             "the same; as c -> infinity the largest score takes all the weight")
    if not close_to(w_zero, want_zero):
        s = _row_sums(w_zero)
        if close_to(w_zero, scores.softmax(-1)):
            raise AssertionError("your c -> 0 weights are softmax(scores), the weights at c = 1: as c -> 0 every "
                                 f"score c*s goes to 0 and each of the n_k = {n_k} keys gets 1/{n_k}")
        if not torch.allclose(s, torch.ones_like(s), atol=1e-4):
            raise AssertionError(f"the rows of your c -> 0 weights sum to {s.flatten()[0]:.3g}, not 1: attention "
                                 f"weights always sum to 1, so each of the {n_k} equal weights is 1/{n_k}")
        off = (w_zero.detach().double().cpu() - want_zero).abs().max().item()
        if off < 1e-2:
            raise AssertionError(f"your c -> 0 weights are close to uniform (off by up to {off:.1g}), but not close "
                                 "enough: the check compares at about 1e-7 (1e-4 for float32 work). If you took a "
                                 "small c, take it far smaller (c = 1e-12), or write the limit down")
        raise AssertionError(f"your c -> 0 weights are not uniform: each of the n_k = {n_k} keys must get 1/{n_k} "
                             f"= {1 / n_k:.3g} (all scores c*s tend to 0)")
    if not close_to(w_inf, want_inf):
        low = (scores == scores.amin(-1, keepdim=True)).double()
        if close_to(w_inf, low / low.sum(-1, keepdim=True)):
            raise AssertionError("your c -> infinity weights go to the SMALLEST score: the largest score c*s grows "
                                 "fastest and takes all the weight")
        s = _row_sums(w_inf)
        if not torch.allclose(s, torch.ones_like(s), atol=1e-4):
            bad = int((s - 1).abs().argmax())
            raise AssertionError(f"a row of your c -> infinity weights sums to {s.flatten()[bad]:.3g}, not 1: "
                                 "with a tie, the tied keys share the weight (1/2 each)")
        one_hot = F.one_hot(scores.argmax(-1), n_k).double()
        if close_to(w_inf, one_hot):
            raise AssertionError("query 2 of batch 1 has two equal largest scores, and your c -> infinity weights "
                                 "give all of it to one key (argmax picks one): softmax keeps tied scores equal for "
                                 "every c, so the limit gives each of them 1/2")
        off = (w_inf.detach().double().cpu() - want_inf).abs().max().item()
        if off < 1e-2:
            raise AssertionError(f"your c -> infinity weights are close to the limit (off by up to {off:.1g}), but "
                                 "not close enough: the check compares at about 1e-7 (1e-4 for float32 work). If you "
                                 "took a large c, take it far larger (c = 1e12), or write the limit down")
        raise AssertionError("your c -> infinity weights are not one-hot on the largest score of each row (tied "
                             "largest scores share the weight equally)")
    print("check_temperature_limits: both limits are right, the tie included")


def check_additive_scores(fn, seed: int = 0) -> None:
    """Test a reader's `fn(Q, K, W_1, W_2, w) -> scores` for additive attention s_ij = w . tanh(W_1 q_i + W_2 k_j),
    with Q (B, n_q, d_k), K (B, n_k, d_k), W_1 and W_2 (d_hidden, d_k) (stored as nn.Linear stores its weight,
    so W_1 q_i is Q @ W_1.T), w (d_hidden,), and scores (B, n_q, n_k). Every size differs, so a transposed
    result shows. Raises AssertionError naming the mistake."""
    g = torch.Generator().manual_seed(seed)
    B, n_q, n_k, d_k, d_hidden = 2, 3, 4, 5, 6
    Q, K = torch.randn(B, n_q, d_k, generator=g, dtype=torch.float64), torch.randn(B, n_k, d_k, generator=g,
                                                                                   dtype=torch.float64)
    W_1, W_2 = (torch.randn(d_hidden, d_k, generator=g, dtype=torch.float64) for _ in range(2))
    w = torch.randn(d_hidden, generator=g, dtype=torch.float64)

    def additive(Q, K, W_1, W_2, w, act=torch.tanh):   # score by score, as the formula reads (slow and plain)
        return torch.stack([torch.stack([act(Q[:, i] @ W_1.T + K[:, j] @ W_2.T) @ w for j in range(K.size(1))], -1)
                            for i in range(Q.size(1))], 1)                      # (B, n_q, n_k)
    mistakes = {f"your scores equal {what}": mutant for what, mutant in {
        "W_1 and W_2 swapped (W_1 transforms the queries, W_2 the keys)":
            lambda Q, K, W_1, W_2, w: additive(Q, K, W_2, W_1, w),
        "no tanh: without it the score is linear, s_ij = w.W_1 q_i + w.W_2 k_j, and the query's term is the "
        "same for every key, so it cancels in the softmax":
            lambda Q, K, W_1, W_2, w: additive(Q, K, W_1, W_2, w, act=lambda t: t),
        "dot-product scores Q K^T, not additive ones": lambda Q, K, W_1, W_2, w: Q @ K.transpose(-2, -1),
        "tanh applied after the product with w (it goes inside, on W_1 q_i + W_2 k_j)":
            lambda Q, K, W_1, W_2, w: torch.tanh(additive(Q, K, W_1, W_2, w, act=lambda t: t))}.items()}
    mistakes["transposed; row i must hold query i's scores over the keys"] = lambda *_: torch.Size((B, n_k, n_q))
    grade(fn, additive, {"": (Q, K, W_1, W_2, w)}, mistakes, against="w . tanh(W_1 q_i + W_2 k_j)",
          shape="(B, n_q, n_k) = ", crash=". W_1 and W_2 have shape (d_hidden, d_k), as an nn.Linear weight: W_1 q_i "
          "for all queries is Q @ W_1.T, and the sum of a query's and a key's term needs broadcasting: give each "
          "term an axis of size 1 where the other has its positions")
    print("check_additive_scores: your additive scores match s_ij = w . tanh(W_1 q_i + W_2 k_j)")


# --- exercise 1: attention's backward pass by hand, graded against autograd (the reference is autograd itself)
def _autograd_grads(Q, K, V, dO, softmax_backward="exact"):
    """(dQ, dK, dV, dS) of O = softmax(Q Kᵀ / √d_k) V for the upstream gradient dO, by autograd. softmax_backward
    changes what autograd takes as the softmax's backward, keeping its forward value (a reader's slip):
    "identity" passes the gradient through unchanged; "diagonal" multiplies it by the weights elementwise."""
    Q, K, V = (t.detach().to(torch.float64).requires_grad_() for t in (Q, K, V))
    with torch.enable_grad():
        S = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
        P = S.softmax(-1)
        if softmax_backward == "identity":
            P = P.detach() + (S - S.detach())
        elif softmax_backward == "diagonal":
            P = P.detach() * (1 + S - S.detach())
        return torch.autograd.grad(P @ V, (Q, K, V, S), dO.to(torch.float64))   # (dQ, dK, dV, dS)


def check_attention_backward(fn, seed: int = 0) -> None:
    """Test a reader's fn(Q, K, V, dO) -> (dQ, dK, dV), the gradients of a loss L with respect to Q, K and V given
    dO = dL/dO for O = softmax(Q Kᵀ / √d_k) V (no mask), computed by hand: autograd is switched off while fn runs.
    Compared with autograd in float64 (float32 work is accepted) on self-attention (n_q = n_k) and
    cross-attention (n_q != n_k) with batch and head axes; d_v != d_k. Names the mistake: the softmax skipped or
    only its Jacobian's diagonal used, the 1/√d_k forgotten on the way back, the weights or the scores' gradient
    not transposed, a gradient of the wrong shape."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)
    crash = (". Autograd is off inside this check: compute the gradients from the formulas, going backwards "
             "through O = P V, the softmax and S = Q K^T / sqrt(d_k)")

    def reader(*inputs):
        with torch.no_grad():                       # by hand: autograd has nothing to differentiate here
            got = fn(*inputs)
        if not (isinstance(got, (tuple, list)) and len(got) == 3):
            raise Verdict(f"fn(Q, K, V, dO) must return three tensors (dQ, dK, dV), got {type(got).__name__}")
        return got

    def slip(i, softmax_backward):                  # output i of autograd with the softmax's backward changed
        return lambda *x: _autograd_grads(*x, softmax_backward=softmax_backward)[i]
    skipped = ("you passed the gradient straight through the softmax, as if it were the identity; it must go "
               "through the softmax's Jacobian, p_i (delta_ij - p_j), row by row (section 1.4)")
    diagonal = ("you used only the diagonal of the softmax's Jacobian (each weight depends on its own score "
                "only); every weight of a row depends on every score of that row: the Jacobian's -p_i p_j terms "
                "are missing")
    for what, n_q, n_k in (("self-attention (n_q = n_k = 5)", 5, 5), ("cross-attention (n_q = 3, n_k = 6)", 3, 6)):
        B, h, d_k, d_v = 2, 3, 8, 4
        inputs = (rand(B, h, n_q, d_k), rand(B, h, n_k, d_k), rand(B, h, n_k, d_v), rand(B, h, n_q, d_v))
        try:
            call_reader(reader, f"{what}: fn(Q, K, V, dO)", *(t.clone() for t in inputs))
        except Verdict:
            raise
        except AssertionError as error:
            raise AssertionError(f"{error}{crash}") from error.__cause__
        for i, name in ((2, "dV"), (0, "dQ"), (1, "dK")):
            mistakes = {skipped: slip(i, "identity"), diagonal: slip(i, "diagonal")}
            if i < 2:
                mistakes[f"{name} is too large by sqrt(d_k): the scores are Q K^T / sqrt(d_k), so the factor "
                         "1/sqrt(d_k) comes back in the gradients of Q and K"] = (
                    lambda Q, K, V, dO, i=i: _autograd_grads(Q, K, V, dO)[i] * math.sqrt(Q.size(-1)))
                mistakes[f"{name} must have the shape of {'QK'[i]}: one row per {'query' if i == 0 else 'key'}"] = (
                    lambda Q, K, V, dO, i=i: torch.Size((*Q.shape[:2], (K if i == 0 else Q).size(2), Q.size(3))))
            if i == 1:
                mistakes["dK takes the scores' gradient untransposed: dK has one row per key, and row j gathers "
                         "from every query that scored key j"] = (
                    lambda Q, K, V, dO: None if Q.size(2) != K.size(2) else
                    _autograd_grads(Q, K, V, dO)[3] @ Q / math.sqrt(Q.size(-1)))
            if i == 2:
                mistakes["dV uses the weights untransposed: dV has one row per key, and row j gathers dO from every "
                         "query, weighted by how much that query read key j"] = (
                    lambda Q, K, V, dO: None if Q.size(2) != K.size(2) else
                    torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1)), -1) @ dO)
                mistakes["dV must have the shape of V: one row per key"] = (
                    lambda Q, K, V, dO: torch.Size((*Q.shape[:3], V.size(3))))
            grade(lambda *x, i=i: reader(*x)[i], lambda *x, i=i: _autograd_grads(*x)[i], {what: inputs}, mistakes,
                  name=f"your {name}", against=f"autograd's {name}", crash=crash)
    print("check_attention_backward: dQ, dK and dV equal autograd's on self- and cross-attention")


def _shapes(params):
    return [tuple(p.shape) for p in params.values()]


def _groups(params):
    """Parameters grouped by the top-level child module that holds them ("self_attn.W_q.weight" -> "self_attn"),
    in order of first appearance: {child: {name: parameter}}."""
    groups = {}
    for name, p in params.items():
        groups.setdefault(name.split(".")[0], {})[name] = p
    return groups


def _listing(params):
    return ", ".join(f"{name} {tuple(p.shape)}" for name, p in params.items())


def copy_weights(src, dst) -> dict:
    """Copy the parameters of module src (the book's) into module dst (a reader's module of the same layer),
    whatever dst calls them. Tried in turn: the same names and shapes (copy by name); the same list of shapes
    in order (copy in order: an Annotated-Transformer `linears` ModuleList of W_q, W_k, W_v, W_o); parameters
    grouped by top-level child module, each of dst's groups taking the first unused group of src with the same
    list of shapes (a nanoGPT block ln_1, attn, ln_2, mlp onto self_attn, feed_forward, self_attn_residual,
    feed_forward_residual).
    Returns {dst name: src name}; raises AssertionError listing both modules' parameters when nothing fits.
    Copies with torch.no_grad(), into dst's dtype; draws no random numbers."""
    theirs, ours = dict(dst.named_parameters()), dict(src.named_parameters())
    mapping = None
    if theirs.keys() == ours.keys() and _shapes(theirs) == [tuple(ours[n].shape) for n in theirs]:
        mapping = {name: name for name in theirs}
    elif _shapes(theirs) == _shapes(ours):
        mapping = dict(zip(theirs, ours, strict=True))
    else:
        free = dict(_groups(ours))                               # src's groups not yet taken
        mapping = {}
        for group in _groups(theirs).values():
            match = next((g for g, params in free.items() if _shapes(params) == _shapes(group)), None)
            if match is None:
                mapping = None
                break
            mapping.update(zip(group, free.pop(match), strict=True))
        if free:
            mapping = None
    if mapping is None:
        raise AssertionError(f"cannot match your module's parameters with the book's {type(src).__name__}'s, by "
                             f"name, by order or by sub-module. Yours: {_listing(theirs) or 'none'}. The book's: "
                             f"{_listing(ours)}")
    with torch.no_grad():
        for mine, book in mapping.items():
            theirs[mine].copy_(ours[book])
    return mapping
