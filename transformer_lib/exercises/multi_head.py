"""The graders of Chapter 2's exercises (multi-head attention), imported by the chapter's exercise cells.

Hand-written, not exported from the chapter: a grader's reference and named slips are the answers, and Colab shows
every cell of a chapter, so their code stays out of the chapters."""

__all__ = ['check_split_merge', 'check_heads_loop', 'check_kv_counts', 'check_min_mse', 'check_padding_fix',
           'check_multi_head_attention', 'check_gpt2_attention']

import math

import torch
import torch.nn as nn

from ..attention import causal_mask, scaled_dot_product_attention
from ..multi_head import MultiHeadAttention, copy_to_torch_mha
from .grading import (
    Verdict,
    call_reader,
    close_to,
    first_difference,
    grade,
    module_answer,
    number,
    reader_module,
)


def _grade_split_merge(split_heads, merge_heads, B, n, h, d_k, g):
    """check_split_merge on one shape: split_heads on x (B, n, h * d_k), merge_heads on y (B, h, n, d_k);
    returns x."""
    ref = MultiHeadAttention(h * d_k, h)
    x = torch.randn(B, n, h * d_k, generator=g, dtype=torch.float64)
    grade(split_heads, ref.split_heads, {f"split_heads(x of shape {tuple(x.shape)}, num_heads={h})": (x, h)}, {
        "that is (B, n, h, d_k); swap the n and h axes with .transpose(1, 2)": lambda x, h: torch.Size((B, n, h, d_k)),
        f"right shape, wrong content. You reshaped straight to (B, h, n, d_k), so head 0 mixes positions: its row 1 "
        f"is x[b, 0, {d_k}:{2 * d_k}], head 1's features of position 0. View as (B, n, h, d_k) first, then "
        ".transpose(1, 2).": lambda x, h: x.view(B, h, n, d_k),
        "heads interleaved. Head i must hold the contiguous block of features i*d_k ... (i+1)*d_k - 1; yours holds "
        "features i, i + h, i + 2h, ... . View as (B, n, h, d_k), not (B, n, d_k, h).":
            lambda x, h: x.view(B, n, d_k, h).permute(0, 3, 1, 2)},
          name="split_heads", against="MultiHeadAttention.split_heads", shape="(B, h, n, d_k) = ",
          hint=lambda at, *_: f": head {at[1]}, position {at[2]}, feature {at[3]} (batch {at[0]}) should be "
                          f"x[{at[0]}, {at[2]}, {at[1] * d_k + at[3]}]")
    y = torch.randn(B, h, n, d_k, generator=g, dtype=torch.float64)
    grade(merge_heads, ref.merge_heads, {f"merge_heads(x of shape {tuple(y.shape)})": (y,)}, {
        "that is (B, n, h, d_k); flatten the last two axes into d_model = h * d_k":
            lambda y: torch.Size((B, n, h, d_k)),
        "right shape, wrong content. You reshaped (B, h, n, d_k) straight to (B, n, d_model), which mixes "
        "positions; move the head axis back first: .transpose(1, 2), then reshape.": lambda y: y.reshape(B, n, -1),
        "heads interleaved. Concat puts head 0's d_k features first, then head 1's, ...; yours puts feature 0 of "
        "every head first. Use .transpose(1, 2) -> (B, n, h, d_k), not .permute(0, 2, 3, 1).":
            lambda y: y.permute(0, 2, 3, 1).reshape(B, n, -1)},
          name="merge_heads", against="MultiHeadAttention.merge_heads", shape="(B, n, d_model) = ",
          hint=lambda at, *_: f": output[{at[0]}, {at[1]}, {at[2]}] should be x[{at[0]}, {at[2] // d_k}, {at[1]}, "
                          f"{at[2] % d_k}] (head {at[2] // d_k})")
    return x


def check_split_merge(split_heads, merge_heads):
    """Test a reader's split_heads(x, num_heads): (B, n, d_model) -> (B, h, n, d_k) and merge_heads(x):
    (B, h, n, d_k) -> (B, n, d_model) on random tensors against MultiHeadAttention's. Raises an
    AssertionError that says what is wrong; prints a one-line report when both are right."""
    g = torch.Generator().manual_seed(0)
    shapes = ((2, 5, 4, 3), (1, 6, 2, 8), (3, 4, 8, 2))            # (B, n, h, d_k)
    for B, n, h, d_k in shapes:
        x = _grade_split_merge(split_heads, merge_heads, B, n, h, d_k, g)
        back = call_reader(merge_heads, "merge_heads", call_reader(split_heads, "split_heads", x, h))
        if not torch.equal(back, x):
            raise AssertionError("merge_heads(split_heads(x, h)) must give back x exactly")
    print(f"check_split_merge: correct on {len(shapes)} shapes, and merge_heads(split_heads(x)) == x")


# --- exercise 2: the paper's equation, one head at a time
def _heads_loop(m, query, key, value, mask=None, bias=True, columns=False, order="concat", w_o="full",
                scale=None):
    """The module m's output with one deliberate change, to name a reader's slip in a loop over heads (m's own output
    when all are left at default), made on a copy of m's weights, not by looping: the biases of W_q, W_k, W_v
    dropped; each head's block of a weight read by columns instead of rows; the heads concatenated in reverse or
    interleaved (W_o's columns permuted to match); W_o or its bias left out; the scores divided by scale."""
    d, h, d_k = m.d_model, m.num_heads, m.d_k
    with torch.random.fork_rng(devices=[]):
        twin = MultiHeadAttention(d, h, dropout=0.0, scale=None if scale is None else 1 / scale)
    twin = twin.to(m.W_q.weight.dtype).eval()
    twin.load_state_dict(m.state_dict())
    with torch.no_grad():
        for W in (twin.W_q, twin.W_k, twin.W_v):
            if columns:                                   # block i of rows <- the transposed block i of columns
                W.weight.copy_(torch.cat([c.T for c in W.weight.split(d_k, dim=1)], dim=0))
            if not bias:
                W.bias.zero_()
        if order == "reversed":
            twin.W_o.weight.copy_(torch.cat(twin.W_o.weight.split(d_k, dim=1)[::-1], dim=1))
        elif order == "interleaved":
            twin.W_o.weight.copy_(twin.W_o.weight.reshape(d, d_k, h).transpose(1, 2).reshape(d, d))
        if w_o == "none":
            twin.W_o.weight.copy_(torch.eye(d, dtype=twin.W_o.weight.dtype))
        if w_o != "full":
            twin.W_o.bias.zero_()
        return twin(query, key, value, mask)[0]


def check_heads_loop(fn, seed: int = 0) -> None:
    """Test a reader's fn(mha, query, key, value, mask=None) -> (B, n_q, d_model) that computes multi-head
    attention one head at a time from mha's weights, against the module itself (float64, eval, dropout 0):
    self-attention with a causal mask, cross-attention with a padding mask, and no mask. mask has the module's
    shape (B|1, 1, n_q|1, n_k). Names the usual slips: forgotten biases, columns instead of rows of the weights,
    heads concatenated in the wrong order, a missing W_o (or its bias), scores scaled by sqrt(d_model)."""
    g = torch.Generator().manual_seed(seed)
    B, n, S, d_model, h = 2, 5, 7, 16, 4
    with torch.random.fork_rng(devices=[]):                            # leave the caller's random state alone
        mha = MultiHeadAttention(d_model, h, dropout=0.0).to(torch.float64).eval()
    with torch.no_grad():
        for p in mha.parameters():                                     # biases as large as the weights
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) / math.sqrt(d_model))
    x = torch.randn(B, n, d_model, generator=g, dtype=torch.float64)
    memory = torch.randn(B, S, d_model, generator=g, dtype=torch.float64)
    lengths = torch.tensor([S, 4])
    cases = {"self-attention with a causal mask": (x, x, x, causal_mask(n)[None, None]),
             "cross-attention with a padding mask": (x, memory, memory,
                                                     (torch.arange(S) < lengths[:, None])[:, None, None]),
             "self-attention without a mask": (x, x, x, None)}
    slips = [
        (dict(bias=False), "the biases of W_q, W_k, W_v are missing: head i adds rows i*d_k ... (i+1)*d_k - 1 "
                           "of each bias, W.bias[rows], to its projection"),
        (dict(columns=True), "you sliced columns, x @ W.weight[:, rows]; nn.Linear stores W transposed "
                             "(out_features, in_features), so head i's projection is x @ W.weight[rows].T"),
        (dict(order="reversed"), "the heads are concatenated in reverse order: head 0 must come first"),
        (dict(order="interleaved"), "the heads are interleaved feature by feature (torch.stack(..., dim=-1)); "
                                    "Concat puts head 0's d_k features first, then head 1's: torch.cat(heads, dim=-1)"),
        (dict(w_o="none"), "W_o is missing: the concatenated heads must go through W_o"),
        (dict(w_o="no bias"), "W_o's bias is missing: apply the whole layer, mha.W_o(concat)"),
        (dict(scale=math.sqrt(d_model)), f"the scores are divided by sqrt(d_model) = {math.sqrt(d_model):g}; "
                                         f"each head divides by sqrt(d_k) = {math.sqrt(d_model // h):g}, its own width"),
        (dict(bias=False, w_o="no bias"), "every bias is missing (W_q, W_k, W_v and W_o)"),
    ]
    mistakes = {message: (lambda q, k, v, mask, switches=switches: _heads_loop(mha, q, k, v, mask, **switches))
                for switches, message in slips}
    mistakes = {"the mask is ignored; pass mask[:, 0] (B|1, n_q|1, n_k) to scaled_dot_product_attention for "
                "every head": lambda q, k, v, mask: None if mask is None else mha(q, k, v)[0], **mistakes}
    with torch.no_grad():
        grade(lambda q, k, v, mask: fn(mha, q, k, v) if mask is None else fn(mha, q, k, v, mask),
              lambda q, k, v, mask: mha(q, k, v, mask)[0], cases, mistakes, name="your loop",
              against="MultiHeadAttention", shape="(B, n_q, d_model) = ")
    print(f"check_heads_loop: your loop over heads equals MultiHeadAttention in all {len(cases)} cases")


# --- exercise 3: multi-query and grouped-query attention, counted
def _kv_counts(d_model, num_heads, kv_heads):
    """(parameters, numbers cached per token and layer) of attention with num_heads query heads and kv_heads
    key/value heads of width d_k, from the layers themselves (built on the meta device: no memory, no time)."""
    d_k = d_model // num_heads
    layers = [nn.Linear(d_model, d_model, device="meta"), nn.Linear(d_model, kv_heads * d_k, device="meta"),
              nn.Linear(d_model, kv_heads * d_k, device="meta"), nn.Linear(d_model, d_model, device="meta")]
    return sum(p.numel() for layer in layers for p in layer.parameters()), 2 * kv_heads * d_k   # keys + values


def _grade_kv_counts(fn, d_model, h, kv):
    """check_kv_counts on one size: the parameters, then the numbers cached per token."""
    call, d_k, (params, cached) = f"fn(d_model={d_model}, num_heads={h}, kv_heads={kv})", d_model // h, \
        _kv_counts(d_model, h, kv)

    def part(i):                                                      # the reader's count i of the two
        def answer(*size):
            got = fn(*size)
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                raise Verdict(f"{call} must return two numbers (parameters, cached numbers per token), got {got!r}")
            return number(got[i], f"{call}[{i}]")
        return answer
    group = h % kv == 0                                               # kv_heads could be read as a group size
    grade(part(0), lambda *size: params, {call: (d_model, h, kv)}, {
        "you counted K/V heads of width d_model; each key/value head has width d_k = d_model/num_heads = "
        f"{d_k}, so W_k and W_v map d_model -> kv_heads * d_k": 2 * (d_model * d_model + d_model) * (1 + kv),
        "the biases are missing: every nn.Linear adds out_features biases (d_model for W_q and W_o, kv_heads * d_k "
        "for W_k and W_v)": params - 2 * d_model - 2 * kv * d_k,
        "that is the count of full multi-head attention: W_k and W_v shrink to kv_heads * d_k outputs":
            _kv_counts(d_model, h, h)[0],
        "you shrank W_q too: multi-query and grouped-query attention keep all num_heads query heads; only the key "
        "and value heads are shared": params - (d_model - kv * d_k) * (d_model + 1),
        f"you read the third argument as the group size g; it is the number of key/value heads (num_heads / g = "
        f"{kv} here)": _kv_counts(d_model, h, h // kv)[0] if group else None},
          scale=1e-5, says="parameters {got:,.0f}, expected {want:,}", hint=lambda got, *_: f" (off by {got - params:+,.0f})")
    grade(part(1), lambda *size: cached, {call: (d_model, h, kv)}, {
        "you counted only the keys: the cache holds keys and values": cached // 2,
        f"you counted K/V heads of width d_model; each cached head holds d_k = {d_k} numbers per token":
            2 * kv * d_model,
        "that is full multi-head attention's cache: only the kv_heads shared heads are cached, not num_heads":
            2 * d_model,
        "that looks like bytes of float32 (or keys + values counted twice): count numbers, one key and one value "
        "vector of width d_k per cached head": 4 * cached,
        "you read the third argument as the group size g; it is the number of key/value heads":
            2 * (h // kv) * d_k if group else None},
          scale=1e-5, says="cached numbers per token {got:,.0f}, expected {want:,}")                  # counts: exact


def check_kv_counts(fn) -> None:
    """Test a reader's fn(d_model, num_heads, kv_heads) -> (parameters, cached): the parameters of an attention
    layer (W_q, W_k, W_v, W_o, with biases) with num_heads query heads and kv_heads key/value heads of width
    d_k = d_model / num_heads (kv_heads = num_heads: multi-head; 1: multi-query; between: grouped-query), and
    the numbers of keys and values a decoder caches per token and layer. Checked against nn.Linear layers of
    those shapes for several sizes; names the usual miscounts. Refuses an fn that builds the chapter's
    MultiHeadAttention (it has num_kv_heads: its parameters would be the answer)."""
    sizes = ((512, 8, 8), (512, 8, 4), (512, 8, 2), (512, 8, 1), (64, 4, 2), (96, 12, 3), (96, 12, 1))
    for size in sizes:
        _grade_kv_counts(_without_library_attention(fn), *size)
    print(f"check_kv_counts: parameters and cache sizes right for all {len(sizes)} sizes")


def _without_library_attention(fn):
    """fn, refusing to build the chapter's MultiHeadAttention during a call: it already has num_kv_heads, so
    counting its parameters would answer the exercise for the reader. The chapter defines the class in a cell, so
    the refusal goes by name: nn.Module.__init__ is replaced for the call only, and refuses any module with a
    class named MultiHeadAttention among its bases; the refusal stands even when fn catches it."""
    def call(*args):
        built, original = [], nn.Module.__init__

        def refuse(self, *a, **kw):
            if any(k.__name__ == "MultiHeadAttention" for k in type(self).__mro__):
                built.append(type(self).__name__)
                raise Verdict("you built a MultiHeadAttention")
            original(self, *a, **kw)
        nn.Module.__init__ = refuse
        try:
            return fn(*args)
        except Verdict:
            if not built:
                raise
        finally:
            nn.Module.__init__ = original                           # the real constructor again
            if built:
                raise Verdict(f"your function builds the chapter's {built[0]} (it has num_kv_heads) and counts its "
                              "parameters: build the projections W_q, W_k, W_v, W_o yourself (nn.Linear layers of "
                              "the right shapes), or count them from the shapes")
    return call


# --- exercise 4: why one head stalls at 3/7
def _least_squares_errors(alpha: float, scale=None) -> tuple:
    """The MSE of s * (alpha u + (1 - alpha) v) against the target u and against v, at the best read-out scale s (by
    least squares) or at s = scale, measured on 4,096 samples of u and v made exactly uncorrelated with unit second
    moments (QR), so that the sample's answer is the exact one."""
    g = torch.Generator().manual_seed(0)
    u, v = torch.linalg.qr(torch.randn(4096, 2, generator=g, dtype=torch.float64))[0].T * 64   # mean(u u) = 1 ...
    blend = alpha * u + (1 - alpha) * v
    return tuple(((((blend @ t) / (blend @ blend) if scale is None else scale) * blend - t) ** 2).mean().item()
                 for t in (u, v))


def check_min_mse(fn) -> None:
    """Test a reader's fn(alpha) -> (best MSE when the target is u, best MSE when the target is v) for the
    blend s * (alpha u + (1 - alpha) v) of two independent features of mean 0 and variance 1, minimised over
    the read-out scale s, on alphas from 0.05 to 0.95. Accepts a formula or a least-squares estimate on random
    samples: each error within 5 % (plus 1e-4) of the exact one, which 10,000 Gaussian samples meet (their
    estimate's relative spread is sqrt(2/N) = 1.4 %). Names the usual slips: s left at 1, targets swapped, alpha
    where alpha^2 belongs, the normalisation missing; an answer within 25 % that is none of them is told that its
    estimate is too noisy (too few samples)."""
    alphas = (0.05, 0.2, 0.3, 0.5, 0.7, 0.9, 0.95)

    def near(got, want, rel):
        return all(abs(x - y) <= rel * abs(y) + 1e-4 for x, y in zip(got, want, strict=True))
    answers = {}
    for a in alphas:
        got = call_reader(fn, f"fn(alpha={a})", a)
        if not isinstance(got, (tuple, list, torch.Tensor)) or len(got) != 2:
            raise AssertionError(f"fn(alpha={a}) must return two numbers (MSE for target u, MSE for target v), "
                                 f"got {got!r}")
        answers[a] = tuple(float(value) for value in got)
    wants = {a: _least_squares_errors(a) for a in alphas}
    wrong = [a for a in alphas if not near(answers[a], wants[a], 0.05)]
    if not wrong:
        print(f"check_min_mse: right for all {len(alphas)} alphas")
        return
    slips = {       # a slip is named when the answer follows it at every alpha (one alpha could be sampling noise)
        "the two are swapped: with weight alpha on u, the target u keeps the smaller error when alpha > 1/2":
            lambda a: wants[a][::-1],
        "that is the error with s = 1; the read-out scale s is free: take the s that minimises the error, for "
        "each target": lambda a: _least_squares_errors(a, scale=1.0),
        "you used alpha and 1 - alpha where their squares belong: the blend's variance is alpha^2 + (1 - alpha)^2":
            lambda a: (1 - a, a),
        "the normalisation is missing: divide by the blend's variance alpha^2 + (1 - alpha)^2":
            lambda a: tuple(w * (a * a + (1 - a) ** 2) for w in wants[a])}
    a = wrong[0]
    said = (f"fn(alpha={a}) = ({answers[a][0]:.4g}, {answers[a][1]:.4g}), expected ({wants[a][0]:.4g}, "
            f"{wants[a][1]:.4g})")
    for message, slip in slips.items():
        if all(near(answers[b], slip(b), 0.05) for b in alphas):
            raise AssertionError(f"{said}: {message}")
    if all(near(answers[b], wants[b], 0.25) for b in alphas):
        raise AssertionError(f"{said}: close, but off by more than 5 %: if you estimate it on random samples, your "
                             "estimate is too noisy (its relative spread is about sqrt(2/N) for N samples): take "
                             "N >= 10,000 (10^5 to be safe), or derive the formula")
    raise AssertionError(said)


# --- exercise 5 (bug hunt): a padding mask applied to the queries
def check_padding_fix(cls, seed: int = 0) -> None:
    """Test a reader's repaired class: cls(d_model, num_heads, dropout=0.0), a MultiHeadAttention whose
    forward(x, key_padding_mask) does self-attention over x (B, n, d_model) with key_padding_mask (B, n),
    True = padding (nn.MultiheadAttention's convention). Loads the weights of a reference module, compares the
    real positions' outputs with nn.MultiheadAttention's, on both of the module's paths, and changes the padding
    vectors to check that no real position sees them. Says where the mask went when it is not on the keys."""
    g = torch.Generator().manual_seed(seed)
    B, n, d_model, h = 3, 6, 16, 4
    with torch.random.fork_rng(devices=[]):                            # leave the caller's random state alone
        torch.manual_seed(seed)
        ref = MultiHeadAttention(d_model, h, dropout=0.0).to(torch.float64).eval()
        try:
            model = cls(d_model, h, dropout=0.0)
        except TypeError:
            model = cls(d_model, h)
        theirs = nn.MultiheadAttention(d_model, h, batch_first=True, dtype=torch.float64)
    model = model.to(torch.float64).eval()
    try:
        model.load_state_dict(ref.state_dict())
    except Exception as error:
        raise AssertionError(f"{cls.__name__} must keep MultiHeadAttention's parameters (W_q, W_k, W_v, W_o): "
                             f"{error}") from error
    theirs = copy_to_torch_mha(ref, theirs).eval()
    x = torch.randn(B, n, d_model, generator=g, dtype=torch.float64)
    lengths = torch.tensor([n, 4, 2])
    key_padding_mask = torch.arange(n) >= lengths[:, None]              # (B, n), True = padding
    real = ~key_padding_mask                                            # the positions whose outputs count
    other = x.clone()                                                   # other padding vectors, same real ones
    other[key_padding_mask] = 10 * torch.randn(int(key_padding_mask.sum()), d_model, generator=g,
                                               dtype=torch.float64)
    with torch.no_grad():
        want = theirs(x, x, x, key_padding_mask=key_padding_mask, need_weights=False)[0]   # (B, n, d_model)
        unmasked = ref(x, x, x)[0]
        inverted = ref(x[1:], x[1:], x[1:], key_padding_mask[1:, None, None, :])[0]    # sequences with padding
    for need_weights in (False, True):
        where = f"forward(x, key_padding_mask, need_weights={need_weights})"
        with torch.no_grad():
            try:
                got, other_got = (model(inputs, key_padding_mask, need_weights=need_weights) for inputs in (x, other))
            except Exception as error:
                raise AssertionError(f"{cls.__name__}: {where} raised {type(error).__name__}: {error}") from error
        got = got[0] if isinstance(got, tuple) else got
        other_got = other_got[0] if isinstance(other_got, tuple) else other_got
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (B, n, d_model):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise AssertionError(f"{where}: output {shape}, expected a tensor (B, n, d_model) = {(B, n, d_model)}")
        moved = (other_got[real] - got[real]).abs().max().item()
        if close_to(got[real], want[real]) and close_to(other_got[real], got[real]):
            continue
        if close_to(got[real], unmasked[real]):
            padded = key_padding_mask
            if got[padded].isnan().any() or not close_to(got[padded], unmasked[padded]):
                raise AssertionError(
                    f"{where}: padding query rows change, but real positions still attend to the padding keys "
                    f"(their outputs move by up to {moved:.2g} when only the padding vectors change): the mask is "
                    "applied to the queries, not the keys. key_padding_mask[:, None, :, None] (B, 1, n, 1) masks "
                    "rows of the scores (queries); the keys are the last axis: [:, None, None, :] (B, 1, 1, n)")
            raise AssertionError(f"{where}: the padding mask has no effect: real positions attend to the padding "
                                 f"(their outputs move by up to {moved:.2g} when only the padding vectors change)")
        if close_to(got[1:][real[1:]], inverted[real[1:]]):
            raise AssertionError(f"{where}: the mask is inverted: real positions attend only to the padding; "
                                 "key_padding_mask is True at padding, so hide the keys where it is True")
        if not close_to(other_got[real], got[real]):
            raise AssertionError(f"{where}: real positions' outputs move by up to {moved:.2g} when only the "
                                 "padding vectors change: some real query still attends to padding keys")
        diff = (got[real].double() - want[real]).abs().max().item()
        raise AssertionError(f"{where}: the real positions' outputs differ from nn.MultiheadAttention's "
                             f"(key_padding_mask) by up to {diff:.2g}")
    print("check_padding_fix: real positions match nn.MultiheadAttention on both paths and ignore the padding")


# --- float64 output at float32's rounding: the mixed-precision slip of both module graders below
_THROUGH_FLOAT32 = ("your weights (or inputs) went through float32: the difference is at float32's rounding, about "
                   "1e-7 relative; keep them float64 or compare at float32's tolerance")


def _grade_noting_float32(answer, reference, cases, mistakes, **options) -> None:
    """grade(answer, reference, cases, mistakes, **options) with one more mistake, tried last: a float64 output
    that equals the reference only to float32's tolerance (a float64 module holding float32-rounded weights, or
    computing inside in float32). That message shows the first difference to 10 digits, so the two numbers differ
    visibly, and the largest difference, also relative to the largest output (a float32 module returns float32 and
    passes as it is)."""
    seen = {}

    def answer_seen(*inputs):                                           # the reader's last output, for the message
        seen["inputs"], seen["got"] = inputs, answer(*inputs)
        return seen["got"]
    try:
        grade(answer_seen, reference, cases, {**mistakes, _THROUGH_FLOAT32: lambda *inputs: reference(*inputs).float()},
              **options)
    except AssertionError as error:
        if not str(error).endswith(_THROUGH_FLOAT32):
            raise
        got, want = seen["got"], reference(*seen["inputs"])
        got = (got[0] if isinstance(got, tuple) else got).detach().to("cpu", torch.float64)
        index, value, expected = first_difference(got, want)
        worst = (got - want).abs().max().item()
        raise AssertionError(f"{error} (first at {list(index)}: {value:.10f}, expected {expected:.10f}; largest "
                             f"difference {worst:.1e}, {worst / want.abs().max().item():.1e} of the largest "
                             "output)") from None


# --- a reader's own MultiHeadAttention class (for `python -m transformer_lib.check` and readers who write modules)
def _mha_variant(ref, q, k, v, mask, scale=None, inverted=False, w_o=True):
    """The book's module's computation with one deliberate change, to name a reader's mistake: scores times scale
    (None = 1/sqrt(d_k)), the mask inverted (NaN in the rows it leaves without keys: any output there), or no
    output projection W_o."""
    Q, K, V = ref.split_heads(ref.W_q(q)), ref.split_heads(ref.W_k(k)), ref.split_heads(ref.W_v(v))
    scores = Q @ K.transpose(-2, -1) * (ref.d_k ** -0.5 if scale is None else scale)   # (B, h, n_q, n_k)
    if mask is not None:
        scores = scores.masked_fill(mask if inverted else ~mask, float("-inf"))
    weights = scores.softmax(-1)
    out = ref.merge_heads((weights if inverted else weights.nan_to_num(0.0)) @ V)      # (B, n_q, d_model)
    return ref.W_o(out) if w_o else out


def check_multi_head_attention(cls, seed: int = 0) -> None:
    """Test a reader's multi-head attention class: cls(d_model, num_heads) (dropout=0.0 passed when the constructor
    takes it) with forward(query, key, value, mask=None) -> (B, n_q, d_model) (or a tuple whose first element it
    is); mask bool, True = may attend, with the rank of the scores: (1, 1, n, n) causal, (B, 1, 1, n_k) padding.
    The weights of the book's MultiHeadAttention are copied in (copy_weights: by name, by order, or by
    sub-module), and the outputs compared in float64 (a float32 module is accepted) on self-attention with a
    causal mask, cross-attention with padding (n_q != n_k) and no mask. Names the mistake: mask ignored or
    inverted, scores scaled by sqrt(d_model) or not at all, W_o missing, a wrong output shape."""
    B, d_model, h = 2, 24, 4                                           # d_k = 6: sqrt(d_k), sqrt(d_model), d_k differ
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):                            # leave the caller's random state alone
        torch.manual_seed(seed)
        ref = MultiHeadAttention(d_model, h, dropout=0.0).to(torch.float64).eval()
        with torch.no_grad():
            for p in ref.parameters():
                p.copy_(0.4 * torch.randn(p.shape, generator=g, dtype=torch.float64))
        model, _, hint = reader_module(cls, ref, d_model, h, dropout=0.0,
                                       advice="; declare W_q, W_k, W_v, W_o in that order")

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)
    x, q, kv = rand(B, 5, d_model), rand(B, 3, d_model), rand(B, 6, d_model)
    padding = (torch.arange(6) < torch.tensor([4, 2])[:, None])[:, None, None, :]     # (B, 1, 1, n_k)
    cases = {
        "self-attention with a causal mask (1, 1, n, n)": (x, x, x, causal_mask(5, 5)[None, None]),
        "cross-attention with a padding mask (B, 1, 1, n_k)": (q, kv, kv, padding),
        "cross-attention without a mask": (q, kv, kv, None),
    }

    def variant(**change):
        return lambda q, k, v, mask: _mha_variant(ref, q, k, v, **{"mask": mask, **change})
    mistakes = {
        "the mask is ignored": lambda q, k, v, mask: None if mask is None else _mha_variant(ref, q, k, v, None),
        "the mask is inverted: True means 'may attend', so hide the keys where it is False (masked_fill(~mask, -inf))":
            lambda q, k, v, mask: None if mask is None else _mha_variant(ref, q, k, v, mask, inverted=True),
        "the scores are divided by sqrt(d_model), not by sqrt(d_k) = sqrt(d_model / num_heads)":
            variant(scale=d_model ** -0.5),
        "the scores are not scaled: divide them by sqrt(d_k)": variant(scale=1.0),
        "the scores are divided by d_k, not by sqrt(d_k)": variant(scale=1 / (d_model // h)),
        "the output projection W_o is missing: the merged heads must go through W_o": variant(w_o=False),
        "that is (B, h, n_q, d_k), the heads not merged back":
            lambda q, k, v, mask: torch.Size((B, h, q.size(1), d_model // h)),
        "that is (B, n_k, d_model), one row per key; there is one output per query":
            lambda q, k, v, mask: torch.Size((B, k.size(1), d_model)),
    }
    with torch.no_grad():
        _grade_noting_float32(module_answer(model), lambda q, k, v, mask: ref(q, k, v, mask)[0], cases, mistakes,
                              name="your forward", against="MultiHeadAttention", shape="(B, n_q, d_model) = ",
                              hint=hint)
    print(f"check_multi_head_attention: {cls.__name__} matches MultiHeadAttention in all {len(cases)} cases "
          "(causal, padding, no mask)")


# --- exercise 1: GPT-2's fused c_attn and c_proj (Conv1D: x @ weight + bias) into W_q, W_k, W_v, W_o
def _gpt2_attention(x, c_attn_weight, c_attn_bias, c_proj_weight, c_proj_bias, num_heads, order=(0, 1, 2),
                    attn_t=False, proj_t=False):
    """GPT-2's attention computed on its own fused weights, as GPT-2 does: qkv = x @ c_attn_weight + c_attn_bias, cut
    into [query | key | value], heads as in section 2.3, causal attention, then @ c_proj_weight + c_proj_bias. The
    switches name a reader's slips: order, the three parts taken in another order; attn_t / proj_t, each d x d
    block of the weight transposed (a Conv1D weight copied into nn.Linear as it is)."""
    B, n, d = x.shape
    blocks = list(c_attn_weight.split(d, dim=1))
    blocks = [b.T for b in blocks] if attn_t else blocks
    biases = c_attn_bias.split(d)
    q, k, v = (x @ blocks[i] + biases[i] for i in order)
    heads = [t.view(B, n, num_heads, d // num_heads).transpose(1, 2) for t in (q, k, v)]
    out, _ = scaled_dot_product_attention(*heads, causal_mask(n, device=x.device)[None, None])
    out = out.transpose(1, 2).reshape(B, n, d)
    return out @ (c_proj_weight.T if proj_t else c_proj_weight) + c_proj_bias


def check_gpt2_attention(fn, seed: int = 0) -> None:
    """Test a reader's fn(mha, c_attn_weight, c_attn_bias, c_proj_weight, c_proj_bias), which copies GPT-2's fused
    attention weights (Conv1D layout: weight (in, out), y = x @ weight + bias; c_attn's output is [query | key |
    value]) into a MultiHeadAttention mha in place. The loaded module, run with a causal mask, must equal GPT-2's
    computation on the fused weights (float64; a module the reader turned to float32 is accepted). Names the slips:
    a parameter left as it was, a Conv1D weight copied untransposed, query, key and value in the wrong order."""
    g = torch.Generator().manual_seed(seed)
    B, n, d_model, h = 2, 5, 12, 3

    def rand(*shape):
        return 0.5 * torch.randn(*shape, generator=g, dtype=torch.float64)
    weights = (rand(d_model, 3 * d_model), rand(3 * d_model), rand(d_model, d_model), rand(d_model))
    x = rand(B, n, d_model)

    def loaded(x, *weights):                        # the reader's module, loaded by fn, on x
        with torch.random.fork_rng(devices=[]):
            mha = MultiHeadAttention(d_model, h, dropout=0.0).to(torch.float64).eval()
        with torch.no_grad():
            for p in mha.parameters():
                p.fill_(float("nan"))               # so that a parameter fn leaves alone shows
        call_reader(fn, "fn(mha, c_attn_weight, c_attn_bias, c_proj_weight, c_proj_bias)", mha,
                    *(w.clone() for w in weights))
        left = [name for name, p in mha.named_parameters() if p.isnan().any()]
        if left:
            raise Verdict(f"{', '.join(left)} still hold{'s' if len(left) == 1 else ''} what they held before: "
                          "every parameter of W_q, W_k, W_v and W_o comes from c_attn or c_proj (the biases too)")
        with torch.no_grad():
            return mha(x.to(mha.W_q.weight.dtype), *[x.to(mha.W_q.weight.dtype)] * 2,
                       causal_mask(n, device=x.device)[None, None])[0]

    def slip(**change):
        return lambda x, *w: _gpt2_attention(x, *w, h, **change)
    untransposed = ("a Conv1D weight is the transpose of an nn.Linear weight: Conv1D computes x @ weight, "
                    "nn.Linear x @ weight.T, so each block must be transposed on the way in")
    mistakes = {
        untransposed: [slip(attn_t=True, proj_t=True), slip(attn_t=True), slip(proj_t=True)],
        "query, key and value are in the wrong order: c_attn's output is [query | key | value], d_model "
        "features each": [slip(order=o) for o in ((1, 0, 2), (0, 2, 1), (2, 1, 0), (1, 2, 0), (2, 0, 1))],
        "you reshaped c_attn's weight (d_model, 3 d_model) into nn.MultiheadAttention's (3 d_model, d_model) "
        "layout; a reshape only re-reads the numbers in memory order, it does not transpose: the three parts are "
        "blocks of columns of the Conv1D weight": [lambda x, *w, t=t: _gpt2_attention(
            x, torch.cat([b.T for b in w[0].reshape(3 * d_model, d_model).split(d_model)], 1), *w[1:], h, proj_t=t)
            for t in (False, True)],
    }
    _grade_noting_float32(loaded, lambda x, *w: _gpt2_attention(x, *w, h), {"causal self-attention, B = 2, n = 5, "
                          "d_model = 12, h = 3": (x, *weights)}, mistakes, name="your loaded MultiHeadAttention",
                          against="GPT-2's attention on the fused weights", shape="(B, n, d_model) = ")
    print("check_gpt2_attention: your loaded MultiHeadAttention computes GPT-2's attention")
