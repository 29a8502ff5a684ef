"""The graders of Chapter 12's exercises (transformer_lib.exercises.t5): each accepts the reference answer, in
float64 and float32, and names the typical mistakes."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import grader_row

from transformer_lib.exercises.t5 import (
    check_alibi,
    check_alibi_reach,
    check_gated_ffn,
    check_new_buckets,
    check_overlapping_patches,
    gelu_tanh,
)
from transformer_lib.t5 import relative_position_bucket
from transformer_lib.vit import patchify

# --- check_buckets (python -m transformer_lib.check runs it) is tested in tests/test_t5.py

# --- exercise 1: ALiBi --------------------------------------------------------------------------------------


def alibi(num_heads, n_q, n_k):
    slopes = 2.0 ** (-8.0 * torch.arange(1, num_heads + 1, dtype=torch.float64) / num_heads)
    i = torch.arange(n_k - n_q, n_k)[:, None]
    return -slopes[:, None, None] * (i - torch.arange(n_k)[None, :]).abs()


def alibi32(num_heads, n_q, n_k):                       # float32, and the slopes as a geometric sequence
    ratio = 2.0 ** (-8.0 / num_heads)
    slopes = torch.tensor([ratio ** h for h in range(1, num_heads + 1)], dtype=torch.float32)
    offsets = torch.arange(n_k, dtype=torch.float32)[None, :] - torch.arange(n_k - n_q, n_k, dtype=torch.float32)[:, None]
    return -(slopes[:, None, None] * offsets.abs())


def slopes_from_zero(num_heads, n_q, n_k):
    return alibi(num_heads, n_q, n_k) * 2.0 ** (8.0 / num_heads)


def slopes_two_to_minus_h(num_heads, n_q, n_k):
    slopes = 2.0 ** -torch.arange(1, num_heads + 1, dtype=torch.float64)
    i = torch.arange(n_k - n_q, n_k)[:, None]
    return -slopes[:, None, None] * (i - torch.arange(n_k)[None, :]).abs()


def heads_reversed(num_heads, n_q, n_k):
    return alibi(num_heads, n_q, n_k).flip(0)


def rewards_distance(num_heads, n_q, n_k):
    return -alibi(num_heads, n_q, n_k)


def signed_distance(num_heads, n_q, n_k):
    slopes = 2.0 ** (-8.0 * torch.arange(1, num_heads + 1, dtype=torch.float64) / num_heads)
    i = torch.arange(n_k - n_q, n_k)[:, None]
    return -slopes[:, None, None] * (i - torch.arange(n_k)[None, :])


def queries_from_zero(num_heads, n_q, n_k):
    return alibi(num_heads, n_k, n_k)[:, :n_q]


def heads_last(num_heads, n_q, n_k):
    return alibi(num_heads, n_q, n_k).permute(1, 2, 0)


def one_head(num_heads, n_q, n_k):
    return alibi(num_heads, n_q, n_k)[0]


# --- exercise 2: the gated-GELU FFN --------------------------------------------------------------------

class Gated(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear0 = nn.Linear(d_model, d_ff, bias=False)
        self.linear1 = nn.Linear(d_model, d_ff, bias=False)
        self.linear2 = nn.Linear(d_ff, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def hidden(self, x):
        return gelu_tanh(self.linear0(x)) * self.linear1(x)

    def forward(self, x):
        return self.linear2(self.dropout(self.hidden(x)))


class GeluOnTheWrongBranch(Gated):
    def hidden(self, x):
        return self.linear0(x) * gelu_tanh(self.linear1(x))


class ExactGelu(Gated):
    def hidden(self, x):
        return F.gelu(self.linear0(x)) * self.linear1(x)


class ReluGate(Gated):
    def hidden(self, x):
        return torch.relu(self.linear0(x)) * self.linear1(x)


class NoGate(Gated):
    def hidden(self, x):
        return gelu_tanh(self.linear0(x))


class GeluAfterProduct(Gated):
    def hidden(self, x):
        return gelu_tanh(self.linear0(x) * self.linear1(x))


class WithBiases(Gated):
    def __init__(self, d_model, d_ff):
        super().__init__(d_model, d_ff)
        self.linear0 = nn.Linear(d_model, d_ff)


class HFNames(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.wi_0 = nn.Linear(d_model, d_ff, bias=False)
        self.wi_1 = nn.Linear(d_model, d_ff, bias=False)
        self.wo = nn.Linear(d_ff, d_model, bias=False)


def test_gelu_tanh_is_hugging_faces_gelu_new():
    # transformers' NewGELUActivation (ACT2FN["gelu_new"], T5DenseGatedActDense's act for "gated-gelu"); the
    # chapter's solution compares the whole module with T5DenseGatedActDense
    x = torch.linspace(-6, 6, 101, dtype=torch.float64)
    gelu_new = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    assert (gelu_tanh(x) - gelu_new).abs().max() < 1e-15
    assert (F.gelu(x) - gelu_new).abs().max() > 1e-4           # the exact GELU is a different function


# --- exercise 3: untrained buckets of longer inputs ------------------------------------------------------

def new_buckets(train_length, test_length, bidirectional, num_buckets, max_distance):
    def used(n):
        offsets = torch.arange(-(n - 1), n if bidirectional else 1)
        return set(relative_position_bucket(offsets, bidirectional, num_buckets, max_distance).tolist())
    return sorted(used(test_length) - used(train_length))


def off_by_one(train_length, test_length, *rest):
    return new_buckets(train_length + 1, test_length + 1, *rest)


def past_only(train_length, test_length, bidirectional, num_buckets, max_distance):
    def used(n):
        return set(relative_position_bucket(torch.arange(-(n - 1), 1), bidirectional, num_buckets,
                                            max_distance).tolist())
    return sorted(used(test_length) - used(train_length))


def every_test_bucket(train_length, test_length, bidirectional, num_buckets, max_distance):
    return new_buckets(1, test_length, bidirectional, num_buckets, max_distance) + [0]


def new_distances(train_length, test_length, *rest):
    return list(range(train_length, test_length))


def decoder_sees_the_future(train_length, test_length, bidirectional, num_buckets, max_distance):
    return new_buckets(train_length, test_length, True, num_buckets, max_distance)


def test_the_chapters_model_meets_one_untrained_decoder_bucket():
    assert new_buckets(40, 53, True, 16, 64) == []
    assert new_buckets(32, 40, False, 16, 64) == [14]


# --- exercise 4: overlapping patches ---------------------------------------------------------------------

def overlapping(images, p, s):
    B, C = images.shape[:2]
    w = images.unfold(2, p, s).unfold(3, p, s)                     # (B, C, rows, cols, p, p)
    return w.permute(0, 2, 3, 1, 4, 5).reshape(B, w.size(2) * w.size(3), C * p * p)


def stride_equals_patch_size(images, p, s):
    return patchify(images, p)


def channels_last(images, p, s):
    w = images.unfold(2, p, s).unfold(3, p, s)
    return w.permute(0, 2, 3, 4, 5, 1).reshape(images.size(0), w.size(2) * w.size(3), -1)


def column_order(images, p, s):
    w = images.unfold(2, p, s).unfold(3, p, s)
    return w.permute(0, 3, 2, 1, 4, 5).reshape(images.size(0), w.size(2) * w.size(3), -1)


def transposed_patches(images, p, s):
    w = images.unfold(2, p, s).unfold(3, p, s)
    return w.permute(0, 2, 3, 1, 5, 4).reshape(images.size(0), w.size(2) * w.size(3), -1)


def shuffled_order(images, p, s):
    out = overlapping(images, p, s)
    return out[:, torch.randperm(out.size(1), generator=torch.Generator().manual_seed(1))]


def too_few_windows(images, p, s):
    return overlapping(images, p, s)[:, :-1]


def test_overlapping_patches_with_stride_p_are_patchify():
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(overlapping(x, 4, 4), patchify(x, 4))


# --- exercise 1, second part: how far each ALiBi head reaches -----------------------------------------------

def alibi_reach(num_heads, gap):
    slopes = 2.0 ** (-8.0 * torch.arange(1, num_heads + 1, dtype=torch.float64) / num_heads)
    return (gap / slopes).floor().long().add(1).tolist()


def alibi_reach32(num_heads, gap):                         # float32 slopes, a tensor returned
    slopes = 2.0 ** (-8.0 * torch.arange(1, num_heads + 1, dtype=torch.float32) / num_heads)
    return (gap / slopes).floor().long() + 1


def alibi_reach_by_scanning(num_heads, gap):               # walk out until the bias drops below -gap
    reach = []
    for h in range(1, num_heads + 1):
        d = 0
        while -(2.0 ** (-8.0 * h / num_heads)) * d >= -gap:
            d += 1
        reach.append(d)
    return reach


def reach_at_most(num_heads, gap):                         # a bias of exactly -gap counted as below
    return [math.ceil(gap / 2.0 ** (-8.0 * h / num_heads)) for h in range(1, num_heads + 1)]


def reach_slopes_from_zero(num_heads, gap):
    return [math.floor(gap / 2.0 ** (-8.0 * (h - 1) / num_heads)) + 1 for h in range(1, num_heads + 1)]


def reach_reversed(num_heads, gap):
    return alibi_reach(num_heads, gap)[::-1]


def reach_multiplied(num_heads, gap):
    return [math.floor(gap * 2.0 ** (-8.0 * h / num_heads)) + 1 for h in range(1, num_heads + 1)]


def reach_one_short(num_heads, gap):
    return alibi_reach(num_heads, gap)[:-1]


def reach_head_off(num_heads, gap):
    return [d + (h == 1) for h, d in enumerate(alibi_reach(num_heads, gap))]


def test_alibi_reach_is_where_alibi_bias_drops_below_the_gap():
    for H, gap in ((8, 10.0), (4, 3.0)):
        bias = alibi(H, 1, 3000)[:, 0, :].flip(-1)          # distances 0 .. 2999
        for h, d in enumerate(alibi_reach(H, gap)):
            assert bias[h, d] < -gap <= bias[h, d - 1]


GRADERS = [
    grader_row(check_alibi, correct=[alibi, alibi32], mistakes=[
        (slopes_from_zero, "start at h = 0"),
        (slopes_two_to_minus_h, r"2\^\(-h\)"),
        (heads_reversed, "reverse order"),
        (rewards_distance, "rewards distance"),
        (signed_distance, "has a sign"),
        (queries_from_zero, "queries start at position 0"),
        (heads_last, "heads are on the last axis"),
        (one_head, "one head's bias for all"),
    ]),
    grader_row(check_alibi_reach, correct=[alibi_reach, alibi_reach32, alibi_reach_by_scanning], mistakes=[
        (reach_at_most, "exactly -gap, not below"),
        (reach_slopes_from_zero, "head 1 has slope 1"),
        (reach_reversed, "reverse order"),
        (reach_multiplied, "reaches shrink"),
        (reach_one_short, "one per head"),
        (reach_head_off, "head 2's distance"),
    ], prints="check_alibi_reach: the first distance"),
    grader_row(check_gated_ffn, correct=[Gated, Gated(16, 24).float(), Gated(8, 12, dropout=0.1)], mistakes=[
        (GeluOnTheWrongBranch, "GELU on the wrong branch"),
        (ExactGelu, "tanh approximation"),
        (ReluGate, "ReLU instead of GELU"),
        (NoGate, "no gate"),
        (GeluAfterProduct, "after the product"),
        (WithBiases, "no biases"),
        (HFNames, "linear0"),
    ], prints='check_gated_ffn: equals'),
    grader_row(check_new_buckets, correct=[new_buckets, lambda *a: torch.tensor(new_buckets(*a), dtype=torch.long)], mistakes=[
        (off_by_one, "off by one"),
        (past_only, "keys after the query are forgotten"),
        (every_test_bucket, "all the buckets the test sequence uses"),
        (new_distances, "not their buckets"),
        (decoder_sees_the_future, "decoder sees only the past"),
    ], prints='check_new_buckets: correct'),
    grader_row(check_overlapping_patches, correct=[overlapping, lambda images, p, s: overlapping(images.float(), p, s), lambda images, p, s: F.unfold(images, p, stride=s).transpose(1, 2)], mistakes=[
        (stride_equals_patch_size, "stride equals patch size"),
        (channels_last, "channels last"),
        (column_order, "wrong patch order"),
        (transposed_patches, "column by column"),
        (shuffled_order, "wrong order"),
        (too_few_windows, "expected 3 rows"),
    ], prints='check_overlapping_patches: equal'),
]
