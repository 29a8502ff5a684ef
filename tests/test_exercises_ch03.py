"""The graders of Chapter 3's exercises (transformer_lib.exercises.positional): the reference answers pass,
in float64 and float32, and the typical wrong answers are caught with a message that names the mistake."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import Call, grader_row

from transformer_lib.exercises.positional import (
    check_learned_positions,
    check_pe_recurrence,
    check_rotary,
    check_smallest_base,
    check_stretch_table,
)
from transformer_lib.positional import sinusoidal_encoding


def _omega(d_model, base, exponent=2, dtype=torch.float64):
    return base ** (-exponent * torch.arange(d_model // 2, dtype=dtype) / d_model)


# --- the learned table (exercise 3 before session 50): check_learned_positions

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


# --- exercise 3: check_stretch_table

def stretch_table(table, new_len):                                # F.interpolate, corners aligned
    return F.interpolate(table.T[None], size=new_len, mode="linear", align_corners=True)[0].T


def stretch_table32(table, new_len):                              # by hand, float32 weights, any table dtype
    t = torch.linspace(0, len(table) - 1, new_len, dtype=torch.float32)
    i = t.floor().long().clamp(max=len(table) - 2)
    f = (t - i)[:, None].to(table.dtype)
    return (1 - f) * table[i] + f * table[i + 1]


def stretch_centres(table, new_len):                              # align_corners=False
    return F.interpolate(table.T[None], size=new_len, mode="linear", align_corners=False)[0].T


def stretch_in_place(table, new_len):
    out = stretch_table(table, new_len)
    table.zero_()
    return out


def stretch_scaled(table, new_len):                               # q * max_len / new_len
    t = torch.arange(new_len, dtype=torch.float64) * len(table) / new_len
    i = t.floor().long().clamp(max=len(table) - 1)
    j = (i + 1).clamp(max=len(table) - 1)
    f = (t - i)[:, None].to(table.dtype)
    return (1 - f) * table[i] + f * table[j]


def stretch_nearest(table, new_len):
    return table[torch.linspace(0, len(table) - 1, new_len).round().long()]


def stretch_appended(table, new_len):
    return torch.cat([table, table[-1:].expand(new_len - len(table), -1)]) if new_len > len(table) else table[:new_len]


# --- exercise 4: check_rotary

def offset_matrix(k, d_model):                                    # the chapter's M_k
    omega = _omega(d_model, 10000.0)
    c, s = torch.cos(k * omega), torch.sin(k * omega)
    return torch.block_diag(*torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2))


def rotate(x, positions):                                         # with the matrices M_p, any leading axes
    if x.dim() > 2:
        return torch.stack([rotate(rows, positions) for rows in x])
    return torch.stack([offset_matrix(int(p), x.size(-1)) @ row for p, row in zip(positions, x, strict=True)])


def rotate64(x, positions):                                       # pairwise, without matrices, in float64
    angle = positions[:, None].double() * _omega(x.size(-1), 10000.0)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * angle.cos() + b * angle.sin(), b * angle.cos() - a * angle.sin()], -1).flatten(-2)


_CACHE = {}


def rotate_cached(x, positions):                                  # a cos/sin cache of 5,000 positions, as LLaMA's
    d = x.size(-1)
    if d not in _CACHE:
        angle = torch.arange(5000, dtype=torch.float64)[:, None] * _omega(d, 10000.0)
        _CACHE[d] = angle.cos(), angle.sin()
    c, s = (t[positions].to(x.dtype) for t in _CACHE[d])
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c + b * s, b * c - a * s], -1).flatten(-2)


def rotate_one_matrix(x, positions):                              # one M_p at a time, never a stack: still O(d^2)
    return torch.stack([torch.stack([offset_matrix(int(p), x.size(-1)).to(x.dtype) @ r
                                     for p, r in zip(positions, rows, strict=True)])
                        for rows in x.reshape(-1, *x.shape[-2:])]).reshape(x.shape)


def rotate32(x, positions):                                       # pairwise, without matrices, in float32
    x = x.float()
    angle = positions[:, None].float() * _omega(x.size(-1), 10000.0, dtype=torch.float32)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * angle.cos() + b * angle.sin(), b * angle.cos() - a * angle.sin()], -1).flatten(-2)


def rotate_hf(x, positions):                                      # Hugging Face / LLaMA style: float32 angles,
    d = x.size(-1)                                                # promoted to a float64 x (review 50b, B3-2)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    angle = positions[:, None] * inv_freq
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * angle.cos() + b * angle.sin(), b * angle.cos() - a * angle.sin()], -1).flatten(-2)


def rotate_angle_off(x, positions):                               # every angle 1e-6 too large: 1e-3 rad at p = 1000
    angle = positions[:, None].double() * _omega(x.size(-1), 10000.0) * (1 + 1e-6)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * angle.cos() + b * angle.sin(), b * angle.cos() - a * angle.sin()], -1).flatten(-2)


def rotate_2d_only(x, positions):                                 # right on (n, d), flattens a batch wrongly
    return rotate(x.reshape(-1, x.size(-2), x.size(-1))[0], positions) if x.dim() > 2 else rotate(x, positions)


def rotate_crashes_on_batches(x, positions):                      # pairs taken along axis 1: fine on (n, d) only
    angle = positions[:, None].double() * 10000.0 ** (-torch.arange(0, x.size(-1), 2, dtype=torch.float64) / x.size(-1))
    c, s = angle.cos(), angle.sin()
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack([c * a + s * b, c * b - s * a], dim=-1).flatten(-2)


def rotate_backwards(x, positions):
    return rotate(x, -positions)


def rotate_half(x, positions):
    half = x.size(-1) // 2
    angle = positions[:, None].double() * _omega(x.size(-1), 10000.0)
    a, b = x[..., :half], x[..., half:]
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


# --- exercise 1: check_pe_recurrence

def by_rotation(max_len, d_model, dtype, sign=1.0, start=(0.0, 1.0), exponent=2):
    """Row by row, pair by pair, every operation in dtype."""
    omega = _omega(d_model, 10000.0, exponent)
    c, s = omega.cos().to(dtype), (sign * omega.sin()).to(dtype)
    a, b = (torch.full((d_model // 2,), v, dtype=dtype) for v in start)
    rows = []
    for _ in range(max_len):
        rows.append(torch.stack([a, b], -1).flatten())
        a, b = c * a + s * b, c * b - s * a
    return torch.stack(rows)


def by_matrix(max_len, d_model, dtype):                          # M_1 as a matrix, column vectors
    M = offset_matrix(1, d_model).to(dtype)
    rows = [torch.tensor([0.0, 1.0] * (d_model // 2), dtype=dtype)]
    for _ in range(max_len - 1):
        rows.append(M @ rows[-1])
    return torch.stack(rows)


def errors(table):
    return (table.double() - sinusoidal_encoding(len(table), table.size(1), dtype=torch.float64)).abs().amax(1)


def first_drift(table, tol):
    over = (errors(table) > tol).nonzero()
    return int(over[0]) if len(over) else None


def first_drift_numpy(table, tol):                              # another way to say it: -> an int64 tensor
    over = torch.where(errors(table) > tol)[0]
    return over[0] if len(over) else None


def backwards(max_len, d_model, dtype):
    return by_rotation(max_len, d_model, dtype, sign=-1.0)


def from_cos_sin(max_len, d_model, dtype):
    return by_rotation(max_len, d_model, dtype, start=(1.0, 0.0))


def rows_exponent_i(max_len, d_model, dtype):
    return by_rotation(max_len, d_model, dtype, exponent=1)


def from_pe_1(max_len, d_model, dtype):
    return by_rotation(max_len + 1, d_model, dtype)[1:]


def from_the_formula(max_len, d_model, dtype):                  # no recurrence: no drift in float32
    return sinusoidal_encoding(max_len, d_model, dtype=dtype)


def the_formula_in_float32(max_len, d_model, dtype):            # sin and cos of p w, all in dtype: no recurrence
    angle = torch.arange(max_len, dtype=dtype)[:, None] * _omega(d_model, 10000.0, dtype=dtype)
    return torch.stack([angle.sin(), angle.cos()], -1).flatten(1)


def in_float64_then_cast(max_len, d_model, dtype):
    return by_rotation(max_len, d_model, torch.float64).to(dtype)


def last_within(table, tol):
    return first_drift(table, tol) - 1 if first_drift(table, tol) is not None else None


def how_many(table, tol):
    return int((errors(table) > tol).sum())


def mean_error(table, tol):
    mean = (table.double() - sinusoidal_encoding(len(table), table.size(1), dtype=torch.float64)).abs().mean(1)
    return next((p for p, e in enumerate(mean.tolist()) if e > tol), None)


def test_the_float32_drift_is_steady_and_predictable():
    """The chapter's claim: the float32 recurrence drifts in proportion to p, about p times the error float32's
    rounding of cos 1 and sin 1 puts into M_1, and passes 1e-4 near p = 2,500, for either way of writing it."""
    c32, s32 = (torch.tensor(v, dtype=torch.float32).double().item() for v in (math.cos(1.0), math.sin(1.0)))
    per_step = math.hypot(math.atan2(s32, c32) - 1.0, math.hypot(c32, s32) - 1.0)
    for fn in (by_rotation, by_matrix):
        first = first_drift(fn(5000, 64, torch.float32), 1e-4)
        assert abs(first - 1e-4 / per_step) < 100, (fn.__name__, first)
        assert errors(fn(300, 64, torch.float64)).max() < 1e-12


# --- exercise 2: check_smallest_base

def smallest_base(n, d_model):
    return ((n - 1) / math.pi) ** (d_model / (d_model - 2))


def smallest_base32(n, d_model):
    return torch.tensor((n - 1) / math.pi, dtype=torch.float32) ** torch.tensor(d_model / (d_model - 2))


def test_smallest_base_makes_the_slowest_pair_turn_by_pi():
    for n, d in ((5000, 512), (1000, 64), (60, 4)):
        table = sinusoidal_encoding(n, d, dtype=torch.float64)  # base 10000: its slowest column's angle at n - 1
        b = smallest_base(n, d)
        assert abs((n - 1) * b ** (-(d - 2) / d) - math.pi) < 1e-9
        assert math.atan2(table[1, -2], table[1, -1]) == pytest.approx(10000.0 ** (-(d - 2) / d), rel=1e-12)


def test_learned_positions_leaves_the_global_random_state_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    check_learned_positions(LearnedPositionalEncoding)
    assert torch.equal(before, torch.get_rng_state())


GRADERS = [
    grader_row(check_pe_recurrence, correct=[Call(by_rotation, first_drift), Call(by_matrix, first_drift),
                                             Call(by_rotation, first_drift_numpy)], mistakes=[
        (Call(backwards, first_drift), "rotate backwards"),
        (Call(from_cos_sin, first_drift), "you started from \\(1, 0"),
        (Call(lambda n, d, dtype: by_rotation(n, d, dtype)[:, [i ^ 1 for i in range(d)]], first_drift),
         "your even and odd columns are swapped: PE\\(p, 2i\\) is the sine"),
        (Call(rows_exponent_i, first_drift), "exponent must be 2i/d_model"),
        (Call(from_pe_1, first_drift), "starts at PE\\(1\\)"),
        (Call(from_the_formula, first_drift), "not built by rotating in float32"),
        (Call(in_float64_then_cast, first_drift), "not built by rotating in float32"),
        (Call(the_formula_in_float32, first_drift), "pair 0 .* equals sin p and cos p"),
        (Call(lambda n, d, dtype: by_rotation(n, d, dtype)[:-1], first_drift), "one row per position"),
        (Call(by_rotation, last_within), "the last position still within tol"),
        (Call(by_rotation, how_many), "how many positions"),
        (Call(by_rotation, mean_error), "mean error"),
        (Call(by_rotation, lambda table, tol: -1 if first_drift(table, tol) is None else first_drift(table, tol)),
         "expected None"),
    ], prints=["float64 equals the formula", "first by more than 1e-4 at position 2"]),
    grader_row(check_smallest_base, correct=[smallest_base, smallest_base32], mistakes=[
        (lambda n, d: ((n - 1) / (2 * math.pi)) ** (d / (d - 2)), "full turn"),
        (lambda n, d: (n - 1) / math.pi, "excluded next pair"),
        (lambda n, d: ((n - 1) / math.pi) ** (2 * d / (d - 2)), "exponent of pair i is 2i/d_model"),
        (lambda n, d: (n / math.pi) ** (d / (d - 2)), "n - 1 steps apart"),
        (lambda n, d: ((n - 1) / math.pi) ** ((d - 2) / d), "turns by 3.327 rad"),
        (lambda n, d: "10000", "one number"),
        (lambda n, d: float(math.ceil(smallest_base(n, d))), "return the exact real base"),
        (lambda n, d: float(round(smallest_base(n, d))), "return the exact real base"),
    ]),
    grader_row(check_learned_positions, correct=[LearnedPositionalEncoding, LearnedParameter64], mistakes=[
        (PositionsOnly, "position vectors alone"),
        (IndexedByBatch, "not along the batch axis"),
        (Clamped, "position 12 has no learned row"),
        (Fixed, "no trainable parameters"),
        (OneRowTooMany, "one row too many"),
        (WithProjection, "no extra layer"),
        (RowZeroEverywhere, "every position gets row 0"),
    ]),
    grader_row(check_stretch_table, correct=[stretch_table, stretch_table32], mistakes=[
        (stretch_centres, "align_corners=False"),
        (stretch_in_place, "in place"),
        (stretch_scaled, "max_len / new_len"),
        (stretch_nearest, "nearest old row"),
        (stretch_appended, "appended copies"),
    ], prints=["first and last rows kept"]),
    grader_row(check_rotary, correct=[rotate64, rotate32, rotate_cached, rotate_hf], mistakes=[
        (rotate_angle_off, r"expected -?\d\.\d{8}.*slightly off"),
        (rotate, r"shape \(5, 768, 768\)|shape \(768, 768\)"),          # the chapter's offset_matrix, stacked
        (rotate_one_matrix, r"a d_model x d_model matrix"),
        (rotate_backwards, "rotate by -p"),
        (rotate_half, "rotate-half layout"),
        (pe_added, "added PE"),
        (by_row_index, "by its index t"),
        (slow_frequencies, "exponent must be 2i/d_model"),
        (lambda x, positions: x.clone(), "unrotated"),
        (lambda x, positions: rotate(x, positions)[:, :4], "one rotated row per row"),
        (rotate_2d_only, "whatever axes come before them"),
        (rotate_crashes_on_batches, "the positions run along axis -2"),
    ], prints=["p' - p = 7", "also on (B, h, n, d_model)"]),
]
