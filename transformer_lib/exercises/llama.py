"""The graders of Chapter 14's exercises (today's decoders), imported by the chapter's exercise cells.

Hand-written, not exported from the chapter: a grader's reference and named slips are the answers, and Colab shows
every cell of a chapter, so their code stays out of the chapters."""

__all__ = ['check_rope', 'check_gqa_attention', 'check_online_merge', 'check_lora_from_update']

import torch

from ..attention import causal_mask
from ..llama import RotaryEmbedding
from .grading import Verdict, call_reader, close_to, grade


def check_rope(fn) -> None:
    """Test fn(x (B, h, n, d_k), offset) -> x rotated as RoPE rotates it (pairs (i, i + d_k/2), angles
    (offset + index)·base^(-2i/d_k), base 10000) against RotaryEmbedding, in float32. Raises AssertionError naming
    the mistake; prints a verdict."""
    g = torch.Generator().manual_seed(0)

    def turned(x, offset, slip):
        """RoPE with one slip: "neighbours" (pairs (2i, 2i+1)), "backwards" or "i/d_k" (the exponent)."""
        d_k, half = x.size(-1), x.size(-1) // 2
        theta = 10000.0 ** (-torch.arange(half).float() * (1 if slip == "i/d_k" else 2) / d_k)
        angle = torch.arange(offset, offset + x.size(-2)).float()[:, None] * theta
        sign = -1 if slip == "backwards" else 1
        (a, b), stack = ((x[..., 0::2], x[..., 1::2]), torch.stack) if slip == "neighbours" else (
            (x[..., :half], x[..., half:]), torch.cat)
        out = stack([a * angle.cos() - sign * b * angle.sin(), b * angle.cos() + sign * a * angle.sin()], -1)
        return out.flatten(-2) if slip == "neighbours" else out
    mistakes = {
        "the pairs are neighbours (2i, 2i+1) here: pair feature i with feature i + d_k/2 (the first half with "
        "the second), as Hugging Face's Llama does": lambda x, offset: turned(x, offset, "neighbours"),
        "the rotation turns the wrong way: each pair is turned by -mθ_i instead of +mθ_i":
            lambda x, offset: turned(x, offset, "backwards"),
        "the positions must start at offset (the tokens already cached), not at 0":
            lambda x, offset: RotaryEmbedding(x.size(-1))(x, 0),
        "the angles use base^(-i/d_k): the exponent is -2i/d_k for pair i": lambda x, offset: turned(x, offset, "i/d_k"),
    }
    cases = {f"d_k={d_k}, offset={offset}": (torch.randn(2, 3, 7, d_k, generator=g), offset)
             for d_k, offset in ((8, 0), (16, 5), (64, 100))}
    grade(fn, lambda x, offset: RotaryEmbedding(x.size(-1))(x, offset), cases, mistakes, against="RoPE",
          shape="x's shape, ")
    print("check_rope: equal to RotaryEmbedding on 3 cases (d_k 8, 16, 64)")


def check_gqa_attention(fn) -> None:
    """Test fn(q (B, h, n, d_k), k (B, h_kv, n, d_k), v (B, h_kv, n, d_k)) -> (B, h, n, d_k): causal self-attention
    in which each group of h / h_kv consecutive query heads shares one key/value head, as MultiHeadAttention with
    num_kv_heads does, in float32 or float64. Raises AssertionError naming the mistake; prints a verdict."""
    g = torch.Generator().manual_seed(3)

    def attend(q, k, v, share="consecutive", causal=True, scale=None, axis=-1):
        group = q.size(1) // k.size(1)
        if share == "consecutive":
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        else:
            k, v = k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1)
        s = q @ k.transpose(-2, -1) * (scale or q.size(-1) ** -0.5)
        if causal:
            allowed = causal_mask(q.size(-2)).to(q.device)
            s = s.masked_fill(~(allowed.T if causal == "transposed" else allowed), float("-inf"))
        return s.softmax(axis).nan_to_num() @ v

    def grouped(*shape_of_groups):
        return lambda q, k, v: None if k.size(1) in (1, q.size(1)) else attend(q, k, v, *shape_of_groups)
    mistakes = {
        "the groups are interleaved: query head i shares K/V head i % h_kv here (what .repeat makes), where "
        "consecutive query heads must form a group": grouped("tiled"),
        "no causal mask: position i must see only positions 0 .. i": lambda q, k, v: attend(q, k, v, causal=False),
        "the causal mask is transposed: each position sees itself and the positions after it, not the ones before":
            lambda q, k, v: attend(q, k, v, causal="transposed"),
        "the scores are not scaled: attention divides them by sqrt(d_k)": lambda q, k, v: attend(q, k, v, scale=1.0),
        "the scores are scaled by 1/d_k: the scale is 1/sqrt(d_k)": lambda q, k, v: attend(q, k, v, scale=1 / q.size(-1)),
        "the softmax runs over the queries (dim -2): each query's weights over the keys must sum to 1":
            lambda q, k, v: attend(q, k, v, axis=-2),
        "one output head per K/V head: every one of the h query heads needs its own output":
            lambda q, k, v: torch.Size((q.size(0), k.size(1), q.size(2), q.size(3))),
    }
    cases = {f"h={h}, h_kv={kv}": (torch.randn(B, h, n, d, generator=g), torch.randn(B, kv, n, d, generator=g),
                                   torch.randn(B, kv, n, d, generator=g))
             for B, h, kv, n, d in ((2, 8, 2, 6, 4), (1, 6, 3, 5, 8), (2, 4, 1, 7, 4), (1, 4, 4, 5, 4))}
    grade(fn, attend, cases, mistakes, against="grouped-query attention", shape="(B, h, n, d_k) = ")
    print(f"check_gqa_attention: equal to grouped-query attention on {len(cases)} cases (GQA, MQA and MHA)")


def check_online_merge(fn) -> None:
    """Test fn(L1, O1, L2, O2) -> (L, O): attention of rows of queries over two blocks of keys, merged from each
    block's own result, L_i (rows, 1) the log-sum-exp of the block's scores and O_i (rows, d) its output normalised
    over that block alone (an empty block: L_i = -inf, O_i = 0), against attention computed over both blocks at
    once, in float32 (float64 answers too): scores of moderate size, scores near 1,000, empty blocks. Raises
    AssertionError naming the mistake; prints a verdict."""
    g = torch.Generator().manual_seed(1)
    inf = float("inf")

    def block(scores, values):                          # one block's (L, O) in float64; no key: (-inf, 0)
        if scores.size(-1) == 0:
            return torch.full((len(scores), 1), -inf, dtype=torch.float64), torch.zeros(len(scores), values.size(-1),
                                                                                       dtype=torch.float64)
        return scores.logsumexp(-1, keepdim=True), scores.softmax(-1) @ values

    def case(shift, n1=5, n2=7, d=4, rows=3, empty=()):   # empty: (row, block) pairs whose keys are all masked
        s1, s2 = (torch.randn(rows, n, generator=g, dtype=torch.float64) * 3 + shift for n in (n1, n2))
        s2 = s2 + 2.0                                                          # the blocks' sizes differ
        v1, v2 = (torch.randn(n, d, generator=g, dtype=torch.float64) for n in (n1, n2))
        for row, which in empty:
            (s1 if which == 1 else s2)[row] = -inf
        both = torch.cat([s1, s2], -1)
        L, out = both.logsumexp(-1, keepdim=True), (both.softmax(-1) @ torch.cat([v1, v2])).nan_to_num()
        (L1, O1), (L2, O2) = block(s1, v1), block(s2, v2)
        for row, which in empty:                                              # an empty block: L = -inf, O = 0
            (O1 if which == 1 else O2)[row] = 0.0
        return [t.float() for t in (L1, O1, L2, O2)], (L.float(), out.float())   # the reader's inputs are float32

    cases = {"two blocks of moderate scores": case(0.0),
             "scores near 1,000": case(1000.0),
             "row 0: block 2 empty; row 1: block 1 empty; row 2: both empty": case(0.0, empty=((0, 2), (1, 1), (2, 1),
                                                                                             (2, 2)))}
    for where, (inputs, (want_L, want_O)) in cases.items():
        scale = 10.0 if "1,000" in where else 1.0          # float32 numbers near 1,000 are 6e-5 apart
        near = lambda got, want, scale=scale: close_to(got, want, scale)    # noqa: E731
        out = call_reader(fn, f"{where}: my_merge", *(t.clone() for t in inputs))
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise AssertionError(f"{where}: return the pair (L, O), got {type(out).__name__}")
        L, O = (torch.as_tensor(t) for t in out)   # noqa: E741 (the exercise's names)
        if (tuple(L.shape), tuple(O.shape)) != (tuple(want_L.shape), tuple(want_O.shape)):
            raise AssertionError(f"{where}: L must have shape (rows, 1) = {tuple(want_L.shape)} and O (rows, d) = "
                                 f"{tuple(want_O.shape)}, got {tuple(L.shape)} and {tuple(O.shape)}")
        L1, O1, L2, O2 = (t.double() for t in inputs)
        bad = [r for r in range(len(L)) if not (near(L[r], want_L[r]) and torch.isfinite(O[r]).all())]
        if bad:
            r, got = bad[0], L[bad[0]].item()
            if not (torch.isfinite(O[r]).all() and not torch.isnan(L[r]).any()):
                why = ("exp of scores near 1,000 overflows (above about 88 in float32, 709 in float64): compute "
                       "with differences of log-sum-exps, never with exp(L_i) alone" if "1,000" in where else
                       "an empty block has L = -inf, and -inf - (-inf) or 0 / 0 is NaN: a row whose two blocks are "
                       "both empty must give L = -inf and O = 0" if r == 2 and "empty" in where else
                       "a block with no key (L = -inf, O = 0) must add nothing")
                raise AssertionError(f"{where}, row {r}: L = {got:.4g} and O holds NaN or inf: {why}")
            if near(L[r], torch.maximum(L1[r], L2[r])):
                raise AssertionError(f"{where}, row {r}: L = {got:.4f} is the larger of L1 and L2, expected "
                                     f"{want_L[r].item():.4f}: L must count every key of both blocks, not only the "
                                     f"block with the larger sum")
            if near(L[r], L1[r] + L2[r]):
                raise AssertionError(f"{where}, row {r}: L = L1 + L2, the log of a product of the two blocks' "
                                     f"sums of exp(score); the keys of both blocks enter one sum")
            raise AssertionError(f"{where}, row {r}: L = {got:.4f}, expected {want_L[r].item():.4f}")
        if near(O, want_O):
            continue
        r = next(r for r in range(len(O)) if not near(O[r], want_O[r]))
        e1, e2 = (torch.exp(Li[r] - torch.where(torch.isinf(want_L[r]), 0.0, want_L[r])) for Li in (L1, L2))
        slips = {"O gives the two blocks' outputs equal weight: a block whose scores are larger must count for more":
                 (O1[r] + O2[r]) / 2,
                 "each block's output carries the other block's weight": e2 * O1[r] + e1 * O2[r],
                 "the two weights do not sum to 1: O must stay an average of values, as each O_i is":
                 torch.exp(L1[r]) * O1[r] + torch.exp(L2[r]) * O2[r],
                 "O is the sum O1 + O2: the weights of the two outputs must sum to 1": O1[r] + O2[r]}
        named = [m for m, wrong in slips.items() if torch.isfinite(wrong).all() and near(O[r], wrong)]
        raise AssertionError(f"{where}, row {r}: L is right, but O differs from attention over both blocks by up to "
                             f"{(O[r].double() - want_O[r]).abs().max().item():.2g}" + (f": {named[0]}" if named else ""))
    print(f"check_online_merge: equal to attention over both blocks on {len(cases)} cases (large scores, empty "
          f"blocks)")


def check_lora_from_update(fn) -> None:
    """Test fn(W (out, in), W_tuned (out, in), rank, alpha) -> (A (rank, in), B (out, rank)) such that
    W + (alpha / rank) B A is as close as a rank-`rank` update can be to W_tuned (in the sum of squared entries),
    in float32 or float64. Raises AssertionError naming the mistake; prints a verdict."""
    g = torch.Generator().manual_seed(2)

    def best(delta, rank, end="largest"):                       # the update's best rank-r part (Eckart-Young)
        U, S, Vh = torch.linalg.svd(delta, full_matrices=False)
        keep = slice(0, rank) if end == "largest" else slice(len(S) - rank, len(S))
        return U[:, keep] * S[keep] @ Vh[keep]

    def case(out_f, in_f, rank, alpha):
        W = torch.randn(out_f, in_f, generator=g)
        U, _ = torch.linalg.qr(torch.randn(out_f, out_f, generator=g))
        V, _ = torch.linalg.qr(torch.randn(in_f, in_f, generator=g))
        k = min(out_f, in_f)
        S = 2.0 ** -torch.arange(k).float() * 3                 # well-separated singular values: one best answer
        return W, W + (U[:, :k] * S) @ V[:, :k].T, rank, alpha

    def merged(answer):                                          # the reader's (A, B) -> W + (alpha / r) B A
        def weight(W, W_tuned, rank, alpha):
            pair = call_reader(answer, f"rank {rank}: your function", W, W_tuned, rank, alpha)
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(t, torch.Tensor) for t in pair)):
                raise Verdict(f"rank {rank}: return the pair (A, B) of tensors, got {type(pair).__name__}")
            A, B = pair
            want_A, want_B = (rank, W.size(1)), (W.size(0), rank)
            if (tuple(A.shape), tuple(B.shape)) == (want_B, want_A):
                raise Verdict(f"rank {rank}: A is (rank, in_features) = {want_A} and B is (out_features, rank) = "
                              f"{want_B}: you returned (B, A)")
            if (tuple(A.shape), tuple(B.shape)) != (want_A, want_B):
                raise Verdict(f"rank {rank}: A must be (rank, in_features) = {want_A} and B (out_features, rank) = "
                              f"{want_B}, got {tuple(A.shape)} and {tuple(B.shape)}")
            return W + (alpha / rank) * (B @ A)
        return weight

    mistakes = {
        "the scale is not undone: the layer multiplies B A by alpha / rank, and your factors do not compensate":
            lambda W, Wt, r, a: None if a == r else W + (a / r) * best(Wt - W, r),
        "the scale is undone the wrong way round: your B A carries the factor the layer applies, alpha / rank, so "
        "the layer applies it twice": lambda W, Wt, r, a: None if a == r else W + (a / r) ** 2 * best(Wt - W, r),
        "the SVD of W_tuned itself: the adapter learns the update W_tuned - W": lambda W, Wt, r, a: W + best(Wt, r),
        "the r smallest singular values were kept: keep the r largest": lambda W, Wt, r, a: W + best(Wt - W, r,
                                                                                                     "smallest"),
        "the singular values were dropped: B A holds the right directions with every weight 1":
            lambda W, Wt, r, a: W + torch.linalg.svd(Wt - W)[0][:, :r] @ torch.linalg.svd(Wt - W)[2][:r],
    }
    cases = {f"out {o}, in {i}, rank {r}, alpha {a:g}": case(o, i, r, a)
             for o, i, r, a in ((6, 4, 2, 4.0), (16, 8, 4, 16.0), (5, 9, 1, 1.0), (12, 12, 3, 6.0))}
    grade(merged(fn), lambda W, Wt, r, a: W + best(Wt - W, r), cases, mistakes, name="W + (alpha / rank) B A",
          against="the best rank-r update", case_in_mistakes=False)
    print(f"check_lora_from_update: W + (alpha / rank) B A is the best rank-r update on {len(cases)} cases")

