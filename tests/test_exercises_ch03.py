"""The graders of Chapter 3's exercises 2-4 (transformer_lib.exercises.positional): the reference answers pass,
in float64 and float32, and the typical wrong answers are caught with a message that names the mistake."""

import torch
import torch.nn as nn
from helpers import grader_row

from transformer_lib.exercises.positional import check_learned_positions, check_offset_distances, check_rotary
from transformer_lib.positional import sinusoidal_encoding

# --- exercise 2: check_offset_distances

def _omega(d_model, base, exponent=2, dtype=torch.float64):
    return base ** (-exponent * torch.arange(d_model // 2, dtype=dtype) / d_model)


def distances(k, d_model, base):
    return (d_model - 2 * torch.cos(k[:, None] * _omega(d_model, base)).sum(1)).clamp(min=0).sqrt()


def distances_from_tables(k, d_model, base):                    # built from the table itself, in float32
    n = int(k.max()) + 1
    angles = torch.arange(n, dtype=torch.float64)[:, None] * _omega(d_model, base)
    pe = torch.stack([angles.sin(), angles.cos()], -1).flatten(1).float()
    return (pe[k.long()] - pe[0]).norm(dim=1)


def squared(k, d_model, base):
    return distances(k, d_model, base) ** 2


def dot_product(k, d_model, base):
    return torch.cos(k[:, None] * _omega(d_model, base)).sum(1)


def base_ignored(k, d_model, base):
    return distances(k, d_model, 10000.0)


def exponent_i(k, d_model, base):
    return (d_model - 2 * torch.cos(k[:, None] * _omega(d_model, base, exponent=1)).sum(1)).clamp(min=0).sqrt()


def factor_2_missing(k, d_model, base):
    return (d_model - torch.cos(k[:, None] * _omega(d_model, base)).sum(1)).clamp(min=0).sqrt()


def test_offset_distances_equal_the_library_table():
    pe = sinusoidal_encoding(300, 64, dtype=torch.float64)
    k = torch.arange(1, 300, dtype=torch.float64)
    torch.testing.assert_close(distances(k, 64, 10000.0), (pe[1:] - pe[0]).norm(dim=1))


# --- exercise 3: check_learned_positions

class LearnedPositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len):
        super().__init__()
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, x):
        return x + self.table(torch.arange(x.size(1), device=x.device))


class LearnedParameter64(nn.Module):                             # an nn.Parameter (1, max_len, d), float64
    def __init__(self, d_model, max_len):
        super().__init__()
        self.max_len = max_len
        self.P = nn.Parameter(torch.randn(1, max_len, d_model, dtype=torch.float64))

    def forward(self, x):
        if x.size(1) > self.max_len:
            raise ValueError("too long")
        return x + self.P[:, :x.size(1)]


class PositionsOnly(LearnedPositionalEncoding):
    def forward(self, x):
        return self.table(torch.arange(x.size(1))).expand_as(x)


class IndexedByBatch(LearnedPositionalEncoding):
    def forward(self, x):
        return x + self.table(torch.arange(x.size(0)))[:, None]


class Clamped(LearnedPositionalEncoding):
    def forward(self, x):
        return x + self.table(torch.arange(x.size(1)).clamp(max=self.table.num_embeddings - 1))


class Fixed(nn.Module):                                          # a buffer, not learned
    def __init__(self, d_model, max_len):
        super().__init__()
        self.register_buffer("table", sinusoidal_encoding(max_len, d_model))

    def forward(self, x):
        return x + self.table[:x.size(1)]


class OneRowTooMany(LearnedPositionalEncoding):
    def __init__(self, d_model, max_len):
        super().__init__(d_model, max_len + 1)


class WithProjection(LearnedPositionalEncoding):
    def __init__(self, d_model, max_len):
        super().__init__(d_model, max_len)
        self.proj = nn.Linear(d_model, d_model)


class RowZeroEverywhere(LearnedPositionalEncoding):
    def forward(self, x):
        return x + self.table.weight[0]


# --- exercise 4: check_rotary

def offset_matrix(k, d_model):                                    # the chapter's M_k
    omega = _omega(d_model, 10000.0)
    c, s = torch.cos(k * omega), torch.sin(k * omega)
    return torch.block_diag(*torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2))


def rotate(x, positions):
    return torch.stack([offset_matrix(int(p), x.size(-1)) @ row for p, row in zip(positions, x, strict=True)])


def rotate32(x, positions):                                       # pairwise, without matrices, in float32
    x = x.float()
    angle = positions[:, None].float() * _omega(x.size(-1), 10000.0, dtype=torch.float32)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack([a * angle.cos() + b * angle.sin(), b * angle.cos() - a * angle.sin()], -1).flatten(1)


def rotate_backwards(x, positions):
    return rotate(x, -positions)


def rotate_half(x, positions):
    half = x.size(-1) // 2
    angle = positions[:, None].double() * _omega(x.size(-1), 10000.0)
    a, b = x[:, :half], x[:, half:]
    return torch.cat([a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()], -1)


def pe_added(x, positions):
    return x + sinusoidal_encoding(2000, x.size(-1), dtype=torch.float64)[positions]


def by_row_index(x, positions):
    return rotate(x, torch.arange(len(x)))


def slow_frequencies(x, positions):
    d = x.size(-1)
    angle = positions[:, None].double() * _omega(d, 10000.0, exponent=1)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack([a * angle.cos() + b * angle.sin(), b * angle.cos() - a * angle.sin()], -1).flatten(1)


def test_learned_positions_leaves_the_global_random_state_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    check_learned_positions(LearnedPositionalEncoding)
    assert torch.equal(before, torch.get_rng_state())


GRADERS = [
    grader_row(check_offset_distances, correct=[distances, distances_from_tables], mistakes=[
        (squared, "squared distance"),
        (dot_product, "that is f"),
        (base_ignored, "use the base"),
        (exponent_i, "exponent must be 2i/d_model"),
        (factor_2_missing, "factor 2 is missing"),
        (lambda k, d_model, base: distances(k, d_model, base)[:10], "one distance per offset"),
    ], prints=["base 10000: max over k <= 50 5.91, min over k >= 300 5.99",
               "base 100: max over k <= 50 8.12, min over k >= 300 6.46"]),
    grader_row(check_learned_positions, correct=[LearnedPositionalEncoding, LearnedParameter64], mistakes=[
        (PositionsOnly, "position vectors alone"),
        (IndexedByBatch, "not along the batch axis"),
        (Clamped, "position 12 has no learned row"),
        (Fixed, "no trainable parameters"),
        (OneRowTooMany, "one row too many"),
        (WithProjection, "no extra layer"),
        (RowZeroEverywhere, "every position gets row 0"),
    ]),
    grader_row(check_rotary, correct=[rotate, rotate32], mistakes=[
        (rotate_backwards, "rotate by -p"),
        (rotate_half, "rotate-half layout"),
        (pe_added, "added PE"),
        (by_row_index, "by its index t"),
        (slow_frequencies, "exponent must be 2i/d_model"),
        (lambda x, positions: x.clone(), "unrotated"),
        (lambda x, positions: rotate(x, positions)[:, :4], "one rotated row per row"),
    ], prints="p' - p = 7"),
]
