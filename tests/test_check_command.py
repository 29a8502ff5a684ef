"""`python -m transformer_lib.check FILE.py` (issue 21): run as a reader runs it, in a subprocess, on a file with
correct and broken components (functions, classes, an exercise's my_ name); one line per component, the mistakes
named, exit status 1. The other exit statuses are checked in-process with main() (two subprocesses in all)."""

import subprocess
import sys
import textwrap

import pytest

from transformer_lib.check import COMPONENTS, main, run_checks

READER_FILE = '''
import math
import torch
import torch.nn as nn
from transformer_lib.attention import causal_mask                 # the book's: imported, so not graded

def my_attention(Q, K, V, mask=None):                           # correct, under the exercise's name
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1).nan_to_num(0.0) @ V

class LayerNorm(nn.Module):                                     # correct, the Annotated Transformer's names
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.a_2, self.b_2, self.eps = nn.Parameter(torch.ones(d_model)), nn.Parameter(torch.zeros(d_model)), eps
    def forward(self, x):
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return self.a_2 * (x - mean) / torch.sqrt(var + self.eps) + self.b_2

class MultiHeadAttention(nn.Module):                            # correct, other parameter names
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h, self.d_k = num_heads, d_model // num_heads
        self.linears = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(4))
    def forward(self, query, key, value, mask=None):
        B = query.size(0)
        Q, K, V = (lin(x).view(B, -1, self.h, self.d_k).transpose(1, 2)
                   for lin, x in zip(self.linears, (query, key, value)))
        out = my_attention(Q, K, V, mask)                       # (B, h, n_q, d_k)
        return self.linears[3](out.transpose(1, 2).reshape(B, -1, self.h * self.d_k))

class EncoderLayer(nn.Module):                                  # broken: no residual around self-attention
    def __init__(self, d_model, num_heads, d_ff, dropout=0.1):
        super().__init__()
        self.attn, self.ln_1 = MultiHeadAttention(d_model, num_heads), nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))
        self.ln_2 = nn.LayerNorm(d_model)
    def forward(self, x, mask=None):
        x = self.ln_1(self.attn(x, x, x, mask))
        return self.ln_2(x + self.mlp(x))

def sinusoidal_encoding(max_len, d_model):                      # broken: sin and cos swapped
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    angle = pos / 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = torch.cos(angle), torch.sin(angle)
    return pe

def feed_forward(x, W_1, b_1, W_2, b_2):                        # broken: b_1 forgotten
    return torch.relu(x @ W_1) @ W_2 + b_2

def helper_the_command_does_not_know(x):
    return x
'''


def write(tmp_path, text):
    path = tmp_path / "my_transformer.py"
    path.write_text(textwrap.dedent(text))
    return path


def test_correct_and_broken_components_in_a_subprocess(tmp_path):
    path = write(tmp_path, READER_FILE)
    result = subprocess.run([sys.executable, "-m", "transformer_lib.check", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert " ok " in lines["my_attention"] and "check_attention" in lines["my_attention"]
    assert " ok " in lines["LayerNorm"]
    assert " ok " in lines["MultiHeadAttention"] and "check_multi_head_attention" in lines["MultiHeadAttention"]
    assert "FAIL" in lines["EncoderLayer"] and "residual connection around self-attention" in lines["EncoderLayer"]
    assert "FAIL" in lines["sinusoidal_encoding"] and "sin and cos are swapped" in lines["sinusoidal_encoding"]
    assert "FAIL" in lines["feed_forward"] and "b_1" in lines["feed_forward"]
    assert "causal_mask" not in lines and "helper_the_command_does_not_know" not in result.stdout
    assert "3 of 6 components pass" in result.stdout


def test_all_correct_exits_0_and_unknown_or_broken_files_exit_2(tmp_path, capsys):
    assert main([str(write(tmp_path, READER_FILE.split("class EncoderLayer")[0]))]) == 0
    assert "3 of 3 components pass" in capsys.readouterr().out
    assert main([str(write(tmp_path, "import torch\nraise ValueError('my bug')\n"))]) == 2
    assert "ValueError: my bug" in capsys.readouterr().out
    assert main([str(write(tmp_path, "def my_own_thing():\n    pass\n"))]) == 2
    assert "no component" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:                           # a missing file is a usage error
        main([str(tmp_path / "nope.py")])
    assert exit_.value.code == 2 and "does not exist" in capsys.readouterr().err


def test_aliases_and_needed_partners():
    def my_split_heads(x, num_heads):
        B, n, d = x.shape
        return x.view(B, n, num_heads, d // num_heads).transpose(1, 2)

    def my_merge_heads(x):
        B, h, n, d_k = x.shape
        return x.transpose(1, 2).reshape(B, n, h * d_k)

    results = run_checks({"__name__": "reader", "my_split_heads": my_split_heads, "my_merge_heads": my_merge_heads})
    assert [(name, passed) for name, passed, _ in results] == [("my_split_heads", True)]
    name, passed, verdict = run_checks({"split_heads": my_split_heads})[0]
    assert not passed and "needs merge_heads too" in verdict


def test_help_lists_every_component_on_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "transformer_lib.check", "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    for name in COMPONENTS:
        assert sum(line.split()[:1] == [name] for line in lines) == 1, name
    for text in ("split_heads + merge_heads", "check_multi_head_attention", "check_encoder_layer_module",
                 "my_<name>", "my_attention = scaled_dot_product_attention"):
        assert text in result.stdout
    assert max(map(len, lines)) <= 120


def test_the_exercises_of_chapters_1_and_2():
    """Chapter 1's exercise 1 (the backward pass) and Chapter 2's exercise 1 (GPT-2's fused weights) are found under
    the exercises' names and graded; a slip is named."""
    import math

    import torch

    def my_attention_backward(Q, K, V, dO, diagonal_only=False):
        P = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1)), -1)
        dP = dO @ V.transpose(-2, -1)
        dS = P * dP if diagonal_only else P * (dP - (P * dP).sum(-1, keepdim=True))
        return dS @ K / math.sqrt(Q.size(-1)), dS.transpose(-2, -1) @ Q / math.sqrt(Q.size(-1)), P.transpose(-2, -1) @ dO

    def load_gpt2_attention(mha, c_attn_weight, c_attn_bias, c_proj_weight, c_proj_bias):
        d = mha.d_model
        with torch.no_grad():
            for i, W in enumerate((mha.W_q, mha.W_k, mha.W_v)):
                W.weight.copy_(c_attn_weight[:, i * d:(i + 1) * d].T)
                W.bias.copy_(c_attn_bias[i * d:(i + 1) * d])
            mha.W_o.weight.copy_(c_proj_weight.T)
            mha.W_o.bias.copy_(c_proj_bias)

    results = {name: (passed, verdict) for name, passed, verdict in run_checks({
        "my_attention_backward": my_attention_backward, "load_gpt2_attention": load_gpt2_attention,
        "attention_backward": lambda *x: my_attention_backward(*x, diagonal_only=True)})}
    assert results["my_attention_backward"][0] and "chapter 1, exercise 1" in results["my_attention_backward"][1]
    assert results["load_gpt2_attention"][0] and "chapter 2, exercise 1" in results["load_gpt2_attention"][1]
    assert not results["attention_backward"][0] and "diagonal" in results["attention_backward"][1]


def test_the_exercises_of_chapter_5():
    """Chapter 5's exercises 1 (LayerNorm's backward pass) and 2 (folding gamma and beta) are found under the
    exercises' names and graded; a slip is named."""
    import torch

    def layer_norm_backward(x, gamma, dy, eps=1e-5, mean_held=False):
        mean = x.mean(-1, keepdim=True)
        rstd = 1 / torch.sqrt((x - mean).pow(2).mean(-1, keepdim=True) + eps)
        x_hat, g = (x - mean) * rstd, gamma * dy
        through_mean = 0 if mean_held else g.mean(-1, keepdim=True)
        dx = rstd * (g - through_mean - x_hat * (g * x_hat).mean(-1, keepdim=True))
        return dx, (dy * x_hat).reshape(-1, x.size(-1)).sum(0), dy.reshape(-1, x.size(-1)).sum(0)

    results = {name: (passed, verdict) for name, passed, verdict in run_checks({
        "my_layer_norm_backward": layer_norm_backward,
        "fold_layer_norm": lambda gamma, beta, W, b: (W * gamma, b + W @ beta),
        "layer_norm_backward": lambda *x: layer_norm_backward(*x, mean_held=True)})}
    assert results["my_layer_norm_backward"][0] and "chapter 5, exercise 1" in results["my_layer_norm_backward"][1]
    assert results["fold_layer_norm"][0] and "chapter 5, exercise 2" in results["fold_layer_norm"][1]
    assert not results["layer_norm_backward"][0] and "through the mean" in results["layer_norm_backward"][1]


def test_the_exercises_of_chapters_3_and_4():
    """Chapter 3's exercises 1, 2 and 4 (pe_by_rotation with first_drift, smallest_base, rotate) and Chapter 4's
    exercise 1 (ffn_backward) are found under the exercises' names and graded; a slip is named."""
    import math

    import torch

    from transformer_lib.positional import sinusoidal_encoding

    def pe_by_rotation(max_len, d_model, dtype):
        omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
        c, s = omega.cos().to(dtype), omega.sin().to(dtype)
        a, b = torch.zeros(d_model // 2, dtype=dtype), torch.ones(d_model // 2, dtype=dtype)
        rows = []
        for _ in range(max_len):
            rows.append(torch.stack([a, b], -1).flatten())
            a, b = c * a + s * b, c * b - s * a
        return torch.stack(rows)

    def first_drift(table, tol):
        error = (table.double() - sinusoidal_encoding(len(table), table.size(1), dtype=torch.float64)).abs().amax(1)
        over = (error > tol).nonzero()
        return int(over[0]) if len(over) else None

    def rotate(x, positions):
        angle = positions[:, None].double() * 10000.0 ** (-torch.arange(0, x.size(-1), 2).double() / x.size(-1))
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([angle.cos() * a + angle.sin() * b, angle.cos() * b - angle.sin() * a], -1).flatten(-2)

    def ffn_backward(x, W_1, b_1, W_2, b_2, dy, mask=True):
        h = x @ W_1 + b_1
        dh = (dy @ W_2.T) * ((h > 0) if mask else 1)
        rows = lambda t: t.reshape(-1, t.size(-1))                          # noqa: E731
        return dh @ W_1.T, rows(x).T @ rows(dh), rows(dh).sum(0), rows(torch.relu(h)).T @ rows(dy), rows(dy).sum(0)

    results = {name: (passed, verdict) for name, passed, verdict in run_checks({
        "pe_by_rotation": pe_by_rotation, "first_drift": first_drift,
        "my_smallest_base": lambda n, d_model: ((n - 1) / math.pi) ** (d_model / (d_model - 2)),
        "rotate": rotate, "ffn_backward": lambda *inputs: ffn_backward(*inputs, mask=False)})}
    assert results["pe_by_rotation"][0] and "chapter 3, exercise 1" in results["pe_by_rotation"][1]
    assert results["my_smallest_base"][0] and "chapter 3, exercise 2" in results["my_smallest_base"][1]
    assert results["rotate"][0] and "chapter 3, exercise 4" in results["rotate"][1]
    assert not results["ffn_backward"][0] and "through the ReLU everywhere" in results["ffn_backward"][1]
