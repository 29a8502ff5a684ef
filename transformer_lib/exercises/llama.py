"""The graders of Chapter 14's exercises (today's decoders), imported by the chapter's exercise cells.

Hand-written, not exported from the chapter: a grader's reference and named slips are the answers, and Colab shows
every cell of a chapter, so their code stays out of the chapters."""

__all__ = ['check_rope', 'check_gqa_attention', 'check_online_merge', 'check_lora_from_update']

import torch

from ..attention import causal_mask
from .grading import Verdict, call_reader, grade
from ..llama import RotaryEmbedding


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
    """Test fn(m1, l1, m2, l2) -> (m, l): the running max and sum of exp(s - m) over two blocks of scores, from each
    block's own (m_i, l_i = Σ exp(s - m_i)), on random blocks (float32 allowed), including an empty block
    (m = -inf, l = 0). Raises AssertionError naming the mistake; prints a verdict."""
    g = torch.Generator().manual_seed(1)
    blocks = [(torch.randn(5, generator=g) * 3, torch.randn(7, generator=g) * 3 + 4) for _ in range(4)]
    blocks.append((torch.randn(6, generator=g), torch.empty(0)))
    for a, b in blocks:
        stats = [(s.max() if len(s) else torch.tensor(float("-inf")),
                  (s - s.max()).exp().sum() if len(s) else torch.tensor(0.0)) for s in (a, b)]
        (m1, l1), (m2, l2) = stats
        out = fn(m1, l1, m2, l2)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise AssertionError(f"return a pair (m, l), got {type(out).__name__}")
        m, ell = (torch.as_tensor(v, dtype=torch.float64) for v in out)
        both = torch.cat([a, b]).double()
        want_m, want_l = both.max(), (both - both.max()).exp().sum()
        if not torch.isfinite(ell):
            raise AssertionError("l is not finite: an empty block has m = -inf and l = 0, and your arithmetic met "
                                 "exp(-inf + inf) = nan; an empty block must contribute nothing")
        if abs(m - want_m) > 1e-5:
            raise AssertionError(f"m must be the larger of the two maxima ({want_m.item():.4f}), got {m.item():.4f}")
        if abs(ell - want_l) <= 1e-4 * want_l:
            continue
        if abs(ell - (l1 + l2)) <= 1e-4 * want_l:
            raise AssertionError("each l was summed against its own maximum: the two sums are on different scales "
                                 "until both refer to the common maximum")
        if abs(ell - (l1 * (m - m1).exp() + l2 * (m - m2).exp())) <= 1e-4 * abs(ell):
            raise AssertionError("the rescaling goes the wrong way: a block whose maximum is below the common one "
                                 "must shrink, not grow")
        raise AssertionError(f"l = {ell.item():.4f}, expected {want_l.item():.4f}")
    print(f"check_online_merge: correct on {len(blocks)} pairs of blocks, one of them empty")


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
