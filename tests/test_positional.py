"""Tests for transformer_lib.positional (Chapter 3): the sinusoidal table against the paper's formula and the
guide's reference values, its relative-position properties, PositionalEncoding, TokenEmbedding against
nn.Embedding in float64, every ValueError, and the exercise checker."""

import math

import pytest
import torch
import torch.nn as nn

from transformer_lib.exercises.positional import check_sinusoidal_encoding
from transformer_lib.multi_head import MultiHeadAttention
from transformer_lib.positional import PositionalEncoding, TokenEmbedding, sinusoidal_encoding

F64 = torch.float64


def formula(max_len, d_model):
    """The paper's formula, entry by entry with the math module (independent of the library's vectorised code)."""
    return torch.tensor([[math.sin(p / 10000 ** (j / d_model)) if j % 2 == 0
                          else math.cos(p / 10000 ** ((j - 1) / d_model)) for j in range(d_model)]
                         for p in range(max_len)], dtype=F64)


def test_reference_values_from_the_guide():
    pe = sinusoidal_encoding(5000, 512)
    expected = torch.tensor([0.841471, 0.540302, 0.821856, 0.569695])
    assert torch.allclose(pe[1, :4], expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("max_len, d_model", [(1, 2), (7, 6), (60, 16), (33, 64)])
def test_matches_formula_in_float64(max_len, d_model):
    assert (sinusoidal_encoding(max_len, d_model, dtype=F64) - formula(max_len, d_model)).abs().max() < 1e-12


def test_dtype_rows_and_norms():
    assert sinusoidal_encoding(4, 8).dtype == torch.get_default_dtype()
    pe = sinusoidal_encoding(1000, 128, dtype=F64)
    assert pe.dtype == F64 and pe.shape == (1000, 128)
    assert torch.equal(pe[0], torch.tensor([0.0, 1.0] * 64, dtype=F64))
    assert torch.allclose(pe.norm(dim=1), torch.full((1000,), 8.0, dtype=F64))   # sqrt(128 / 2)
    assert torch.allclose(sinusoidal_encoding(1000, 128), pe.float())


def test_wavelengths_are_geometric():
    d = 512
    pe = sinusoidal_encoding(2, d, dtype=F64)
    wavelength = 2 * math.pi / torch.atan2(pe[1, 0::2], pe[1, 1::2])
    assert math.isclose(wavelength[0].item(), 2 * math.pi, rel_tol=1e-12)
    ratios = wavelength[1:] / wavelength[:-1]
    assert torch.allclose(ratios, torch.full_like(ratios, 10000 ** (2 / d)), rtol=1e-9, atol=0)
    assert math.isclose(wavelength[-1].item(), 2 * math.pi * 10000 ** (1 - 2 / d), rel_tol=1e-9)


def rotation(k, d_model):
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=F64) / d_model)
    blocks = [torch.tensor([[math.cos(k * w), math.sin(k * w)], [-math.sin(k * w), math.cos(k * w)]], dtype=F64)
              for w in omega.tolist()]
    return torch.block_diag(*blocks)


@pytest.mark.parametrize("k", [1, 3, 250, 1999])
def test_offset_is_a_rotation_independent_of_position(k):
    pe = sinusoidal_encoding(2000, 64, dtype=F64)
    M = rotation(k, 64)
    assert (pe[:-k] @ M.T - pe[k:]).abs().max() < 1e-10
    assert torch.allclose(M.T @ M, torch.eye(64, dtype=F64), atol=1e-14)


def test_dot_product_depends_only_on_distance():
    pe = sinusoidal_encoding(80, 32, dtype=F64)
    G = pe @ pe.T
    for k in range(80):
        diagonal = torch.diagonal(G, offset=k)
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal), rtol=0, atol=1e-12)
    assert torch.allclose(G, G.T)


def test_attention_is_permutation_equivariant_without_positions_only():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2).to(F64).eval()
    x = torch.randn(2, 9, 16, dtype=F64)
    perm = torch.randperm(9)
    pe = sinusoidal_encoding(9, 16, dtype=F64)
    with torch.no_grad():
        y, y_perm = mha(x, x, x)[0], mha(x[:, perm], x[:, perm], x[:, perm])[0]
        assert torch.allclose(y_perm, y[:, perm], rtol=0, atol=1e-13)
        xp, xq = x + pe, x[:, perm] + pe
        assert not torch.allclose(mha(xq, xq, xq)[0], mha(xp, xp, xp)[0][:, perm], atol=1e-3)


# ---- PositionalEncoding -------------------------------------------------------------------------------------
def test_positional_encoding_adds_table_and_offsets():
    pos = PositionalEncoding(32, dropout=0.1, max_len=50).eval()
    x = torch.randn(3, 20, 32)
    assert torch.equal(pos(x), x + sinusoidal_encoding(20, 32))
    assert torch.equal(pos(x[:, 7:], start=7), pos(x)[:, 7:])
    steps = torch.cat([pos(x[:, t:t + 1], start=t) for t in range(20)], dim=1)
    assert torch.equal(steps, pos(x))
    assert torch.equal(pos(torch.zeros(1, 50, 32)), sinusoidal_encoding(50, 32)[None])   # exactly max_len fits
    assert "pe" not in pos.state_dict() and pos.pe.shape == (50, 32)


def test_positional_encoding_float64_and_dropout():
    with torch.no_grad():
        pos = PositionalEncoding(16, dropout=0.25, max_len=40).to(F64)
    assert pos.pe.dtype == F64
    pos.train()
    torch.manual_seed(0)
    x = torch.full((200, 40, 16), 2.0, dtype=F64)         # x + PE is never 0
    out = pos(x)
    kept = out != 0
    expected = (x + sinusoidal_encoding(40, 16).to(F64))[kept] / 0.75
    assert torch.allclose(out[kept], expected)
    assert abs((~kept).double().mean().item() - 0.25) < 0.01
    pos.eval()
    assert torch.equal(pos(x), pos(x))


def test_default_dropout_is_the_papers_0_1():
    torch.manual_seed(0)
    pos = PositionalEncoding(16, max_len=40)                   # no dropout argument; a new module trains
    out = pos(torch.full((100, 40, 16), 2.0))                  # x + PE is never 0
    assert abs((out == 0).float().mean().item() - 0.1) < 0.01


def test_length_zero_and_empty_batch():
    pos = PositionalEncoding(8, max_len=10).eval()
    assert pos(torch.zeros(2, 0, 8)).shape == (2, 0, 8)
    assert pos(torch.zeros(0, 4, 8), start=6).shape == (0, 4, 8)
    assert TokenEmbedding(10, 4)(torch.zeros(0, 3, dtype=torch.long)).shape == (0, 3, 4)


@pytest.mark.parametrize("call, match", [
    (lambda pos: pos(torch.zeros(1, 11, 8)), r"positions 0..10 do not fit in max_len=10"),
    (lambda pos: pos(torch.zeros(1, 3, 8), start=8), r"positions 8..10 do not fit in max_len=10"),
    (lambda pos: pos(torch.zeros(1, 3, 8), start=-1), "start must be an int >= 0, got -1"),
    (lambda pos: pos(torch.zeros(1, 3, 8), start=1.0), "start must be an int >= 0, got float 1.0"),
    (lambda pos: pos(torch.zeros(1, 3, 8), start=True), "start must be an int >= 0, got bool True"),
    (lambda pos: pos(torch.zeros(1, 3, 6)), r"x must be a tensor of shape \(B, n, d_model=8\), got float32 tensor of shape \(1, 3, 6\)"),
    (lambda pos: pos(torch.zeros(3, 8)), r"x must be a tensor of shape .* got float32 tensor of shape \(3, 8\)"),
    (lambda pos: pos([1.0]), "x must be a tensor of shape .* got list"),
    (lambda pos: pos(torch.zeros(1, 3, 8, dtype=torch.long)), "x must be a floating-point tensor, got int64"),
])
def test_positional_encoding_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call(PositionalEncoding(8, max_len=10))


@pytest.mark.parametrize("args, match", [
    ((0, 8), "max_len must be an int >= 1, got 0"),
    ((10.0, 8), "max_len must be an int >= 1, got float"),
    ((True, 8), "max_len must be an int >= 1, got bool"),
    ((10, 7), "d_model must be even"),
    ((10, 0), "d_model must be an int >= 2, got 0"),
    ((10, 8, torch.long), "dtype must be a floating-point torch.dtype.*int64"),
    ((10, 8, "float32"), "dtype must be a floating-point torch.dtype"),
])
def test_sinusoidal_encoding_errors(args, match):
    with pytest.raises(ValueError, match=match):
        sinusoidal_encoding(*args)


@pytest.mark.parametrize("cls, kwargs, match", [
    (PositionalEncoding, dict(d_model=8, dropout=1.0), r"dropout must lie in \[0, 1\), got 1.0"),
    (PositionalEncoding, dict(d_model=8, dropout=-0.5), r"dropout must lie in \[0, 1\)"),
    (PositionalEncoding, dict(d_model=7), "d_model must be even"),
    (PositionalEncoding, dict(d_model=True), "d_model must be an int >= 1, got bool"),
    (PositionalEncoding, dict(d_model=8, max_len=0), "max_len must be an int >= 1, got 0"),
    (TokenEmbedding, dict(vocab_size=0, d_model=4), "vocab_size must be an int >= 1, got 0"),
    (TokenEmbedding, dict(vocab_size=10, d_model=4.0), "d_model must be an int >= 1, got float"),
    (TokenEmbedding, dict(vocab_size=10, d_model=4, padding_idx=10), r"padding_idx must lie in \[-vocab_size, vocab_size\)"),
    (TokenEmbedding, dict(vocab_size=10, d_model=4, padding_idx=-11), "padding_idx must be an int >= -10"),
    (TokenEmbedding, dict(vocab_size=10, d_model=4, padding_idx=True), "padding_idx must be an int >= -10, got bool"),
])
def test_constructor_errors(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


# ---- TokenEmbedding ------------------------------------------------------------------------------------------
def test_token_embedding_equals_scaled_nn_embedding_float64():
    torch.manual_seed(0)
    ours = TokenEmbedding(100, 64, padding_idx=0).to(F64)
    ref = nn.Embedding(100, 64, padding_idx=0, dtype=F64)
    with torch.no_grad():
        ref.weight.copy_(ours.weight)
    tokens = torch.randint(0, 100, (4, 11))
    out = ours(tokens)
    assert out.shape == (4, 11, 64)
    assert (out - ref(tokens) * math.sqrt(64)).abs().max() == 0
    assert ours.weight is ours.embedding.weight and isinstance(ours.embedding, nn.Embedding)


def test_token_embedding_init_padding_and_tying():
    torch.manual_seed(0)
    emb = TokenEmbedding(2000, 256, padding_idx=3)
    assert torch.equal(emb.weight[3], torch.zeros(256))
    std = emb.weight[torch.arange(2000) != 3].std().item()
    assert abs(std - 256 ** -0.5) < 0.002                          # entries ~ d^-1/2 ...
    assert abs(emb(torch.arange(4, 2000)[None]).pow(2).mean().sqrt().item() - 1) < 0.01   # ... scaled to ~1
    emb(torch.tensor([[3, 5]])).sum().backward()
    assert torch.equal(emb.weight.grad[3], torch.zeros(256))       # padding row gets no gradient
    head = nn.Linear(256, 2000, bias=False)
    head.weight = emb.weight                                       # tying works through the property
    assert head.weight.data_ptr() == emb.embedding.weight.data_ptr()
    assert TokenEmbedding(10, 4, padding_idx=-1).weight[9].abs().sum() == 0


@pytest.mark.parametrize("tokens, match", [
    (torch.tensor([[1.0, 2.0]]), "tokens must be an integer tensor of token ids, got float32"),
    (torch.tensor([[True, False]]), "tokens must be an integer tensor of token ids, got bool"),
    ([[1, 2]], r"tokens must be a tensor of shape \(B, length\), got list"),
    (torch.tensor([1, 2]), r"tokens must be a tensor of shape \(B, length\), got int64 tensor of shape \(2,\)"),
    (torch.tensor([[1, 10]]), r"tokens holds token ids from 1 to 10, outside the vocabulary \[0, 9\]"),
    (torch.tensor([[-1, 2]]), r"tokens holds token ids from -1 to 2"),
])
def test_token_embedding_errors(tokens, match):
    with pytest.raises(ValueError, match=match):
        TokenEmbedding(10, 4)(tokens)


def test_token_embedding_names_the_callers_argument():
    with pytest.raises(ValueError, match=r"^src holds token ids from 0 to 12"):
        TokenEmbedding(10, 4)(torch.tensor([[0, 12]]), name="src")
    with pytest.raises(ValueError, match=r"^tgt must be an integer tensor"):
        TokenEmbedding(10, 4)(torch.tensor([[0.5]]), name="tgt")


# ---- the exercise checker ------------------------------------------------------------------------------------
def table(max_len, d_model, base=10000.0, first=0, cos_first=False, concat=False, pair_exponent=2):
    p = torch.arange(first, first + max_len, dtype=F64)[:, None]
    i = torch.arange(d_model // 2, dtype=F64)
    ang = p / base ** (pair_exponent * i / d_model)
    a, b = (ang.cos(), ang.sin()) if cos_first else (ang.sin(), ang.cos())
    return torch.cat([a, b], 1) if concat else torch.stack([a, b], -1).flatten(1)


def per_column(max_len, d_model):
    p = torch.arange(max_len, dtype=F64)[:, None]
    j = torch.arange(d_model, dtype=F64)
    ang = p / 10000 ** (j / d_model)
    return torch.where(j % 2 == 0, ang.sin(), ang.cos())


def test_checker_accepts_correct(capsys):
    check_sinusoidal_encoding(table)
    check_sinusoidal_encoding(lambda n, d: table(n, d).float())
    check_sinusoidal_encoding(sinusoidal_encoding)
    assert "matches for all 3 sizes" in capsys.readouterr().out


def broken_entry(n, d):
    t = table(n, d)
    t[3, 5] += 0.1
    return t


def crashes(n, d):
    raise IndexError("boom")


@pytest.mark.parametrize("fn, match", [
    (lambda n, d: table(n, d, cos_first=True), "sin and cos are swapped"),
    (lambda n, d: table(n, d, concat=True), "first half"),
    (lambda n, d: table(n, d, pair_exponent=1), "you used i/d_model"),
    (per_column, "same frequency as the sine"),
    (lambda n, d: table(n, d, base=1e-4), "you multiplied the position"),
    (lambda n, d: table(n, d, first=1), "positions start at 0"),
    (lambda n, d: table(n, d, base=1000.0), "base must be 10000; .* base 1000"),
    (lambda n, d: table(n, d).T, r"that is \(d_model, max_len\), transpose it"),
    (lambda n, d: table(n, d)[:, : d // 2], "must have shape"),
    (lambda n, d: table(n, d).tolist(), "floating-point tensor, got list"),
    (lambda n, d: table(n, d).long(), "floating-point tensor, got torch.int64"),
    (crashes, "raised IndexError: boom"),
    (broken_entry, r"PE\[3, 5\] should be cos\(3 / 10000\^\(4/16\)\)"),
])
def test_checker_diagnoses_mistakes(fn, match):
    with pytest.raises(AssertionError, match=match):
        check_sinusoidal_encoding(fn)
