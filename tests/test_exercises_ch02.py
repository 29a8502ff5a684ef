"""The graders of Chapter 2's exercises (transformer_lib.exercises.multi_head): the reference answers pass, in
float64 and float32, and the typical wrong answers are caught with a message that names the mistake."""

import torch
import torch.nn as nn
from helpers import grader_row

from transformer_lib.attention import causal_mask, scaled_dot_product_attention
from transformer_lib.exercises.multi_head import (
    _gpt2_attention,
    check_gpt2_attention,
    check_heads_loop,
    check_kv_counts,
    check_min_mse,
    check_padding_fix,
)
from transformer_lib.multi_head import MultiHeadAttention

# --- exercise 2: check_heads_loop

def _loop(m, query, key, value, mask=None, dtype=torch.float64, bias=True, columns=False, order="concat",
          w_o=True, scale=None):
    heads = []
    for i in range(m.num_heads):
        rows = slice(i * m.d_k, (i + 1) * m.d_k)
        proj = []
        for W, x in ((m.W_q, query), (m.W_k, key), (m.W_v, value)):
            weight = W.weight.to(dtype)
            y = x.to(dtype) @ (weight[:, rows] if columns else weight[rows].T)
            proj.append(y + W.bias[rows].to(dtype) if bias else y)
        heads.append(scaled_dot_product_attention(*proj, None if mask is None else mask[:, 0], scale=scale)[0])
    if order == "reversed":
        heads = heads[::-1]
    concat = torch.stack(heads, -1).flatten(-2) if order == "interleaved" else torch.cat(heads, -1)
    return concat @ m.W_o.weight.to(dtype).T + m.W_o.bias.to(dtype) if w_o else concat


def heads_loop(m, query, key, value, mask=None):
    return _loop(m, query, key, value, mask), "the per-head outputs"        # a tuple is accepted


def heads_loop32(m, query, key, value, mask=None):
    return _loop(m, query, key, value, mask, dtype=torch.float32)


def forgotten_biases(m, query, key, value, mask=None):
    return _loop(m, query, key, value, mask, bias=False)


def columns_not_rows(m, query, key, value, mask=None):
    return _loop(m, query, key, value, mask, columns=True)


def heads_reversed(m, query, key, value, mask=None):
    return _loop(m, query, key, value, mask, order="reversed")


def heads_interleaved(m, query, key, value, mask=None):
    return _loop(m, query, key, value, mask, order="interleaved")


def missing_w_o(m, query, key, value, mask=None):
    return _loop(m, query, key, value, mask, w_o=False)


def scaled_by_d_model(m, query, key, value, mask=None):
    return _loop(m, query, key, value, mask, scale=m.d_model ** -0.5)


def mask_ignored(m, query, key, value, mask=None):
    return _loop(m, query, key, value, None)


# --- exercise 3: check_kv_counts

def kv_counts(d_model, num_heads, kv_heads):
    d_k = d_model // num_heads
    return 2 * (d_model * d_model + d_model) + 2 * (d_model * kv_heads * d_k + kv_heads * d_k), 2 * kv_heads * d_k


def kv_counts_from_modules(d_model, num_heads, kv_heads):
    d_k = d_model // num_heads
    layers = [nn.Linear(d_model, d_model), nn.Linear(d_model, kv_heads * d_k), nn.Linear(d_model, kv_heads * d_k),
              nn.Linear(d_model, d_model)]
    return float(sum(p.numel() for layer in layers for p in layer.parameters())), torch.tensor(2 * kv_heads * d_k)


def kv_heads_of_width_d_model(d_model, num_heads, kv_heads):
    return 2 * (d_model * d_model + d_model) * (1 + kv_heads), 2 * kv_heads * d_model


def forgotten_biases_count(d_model, num_heads, kv_heads):
    params, cached = kv_counts(d_model, num_heads, kv_heads)
    return params - 2 * d_model - 2 * kv_heads * (d_model // num_heads), cached


def groups_as_kv_heads(d_model, num_heads, g):
    return kv_counts(d_model, num_heads, num_heads // g)


def only_keys_cached(d_model, num_heads, kv_heads):
    return kv_counts(d_model, num_heads, kv_heads)[0], kv_heads * (d_model // num_heads)


def all_heads_cached(d_model, num_heads, kv_heads):
    return kv_counts(d_model, num_heads, kv_heads)[0], 2 * d_model


def w_q_shrunk(d_model, num_heads, kv_heads):
    d_k = d_model // num_heads
    params, cached = kv_counts(d_model, num_heads, kv_heads)
    return params - (d_model - kv_heads * d_k) * (d_model + 1), cached


def kv_counts_from_library(d_model, num_heads, kv_heads):
    """The shortcut the exercise rules out: the chapter's MultiHeadAttention already has num_kv_heads."""
    mha = MultiHeadAttention(d_model, num_heads, num_kv_heads=kv_heads)
    return sum(p.numel() for p in mha.parameters()), 2 * kv_heads * (d_model // num_heads)


def kv_counts_from_library_caught(d_model, num_heads, kv_heads):
    """The same shortcut, with the refusal caught and the reference count returned: still refused."""
    try:
        MultiHeadAttention(d_model, num_heads, num_kv_heads=kv_heads)
    except AssertionError:
        pass
    return kv_counts(d_model, num_heads, kv_heads)


class MultiHeadAttention_cell(nn.Module):
    """The chapter defines MultiHeadAttention in a cell (a class apart from the library's, of the same name)."""
    def __init__(self, d_model, num_heads, num_kv_heads=None):
        super().__init__()
        d_k, kv = d_model // num_heads, num_kv_heads or num_heads
        self.W_q, self.W_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.W_k, self.W_v = nn.Linear(d_model, kv * d_k), nn.Linear(d_model, kv * d_k)


MultiHeadAttention_cell.__name__ = "MultiHeadAttention"


def kv_counts_from_chapter_cell(d_model, num_heads, kv_heads):
    mha = MultiHeadAttention_cell(d_model, num_heads, num_kv_heads=kv_heads)
    return sum(p.numel() for p in mha.parameters()), 2 * kv_heads * (d_model // num_heads)


def test_kv_counts_match_the_real_module():
    assert kv_counts(512, 8, 8)[0] == sum(p.numel() for p in MultiHeadAttention(512, 8).parameters())


# --- exercise 4: check_min_mse

def min_mse(alpha):
    norm = alpha ** 2 + (1 - alpha) ** 2
    return (1 - alpha) ** 2 / norm, alpha ** 2 / norm


def min_mse_sampled(alpha, samples=200_000, seed=0):     # least squares on samples, in float32
    u, v = torch.randn(2, samples, generator=torch.Generator().manual_seed(seed))
    blend = alpha * u + (1 - alpha) * v
    out = []
    for target in (u, v):
        s = (blend @ target) / (blend @ blend)
        out.append(((s * blend - target) ** 2).mean())
    return torch.stack(out)


# --- exercise 5 (bug hunt): check_padding_fix

class PaddedSelfAttention(MultiHeadAttention):      # the chapter's buggy class: the mask hides padding queries
    def forward(self, x, key_padding_mask=None, need_weights=False):
        Q, K, V = (self.split_heads(W(x)) for W in (self.W_q, self.W_k, self.W_v))
        scores = Q @ K.transpose(-2, -1) / self.d_k ** 0.5
        if key_padding_mask is not None:
            scores = scores.masked_fill(self._hide(key_padding_mask), -1e9)
        weights = self.dropout(scores.softmax(dim=-1))
        return self.W_o(self.merge_heads(weights @ V)), (weights if need_weights else None)

    def _hide(self, key_padding_mask):
        return key_padding_mask[:, None, :, None]


class FixedSelfAttention(PaddedSelfAttention):
    def _hide(self, key_padding_mask):
        return key_padding_mask[:, None, None, :]


class FixedWithModule(PaddedSelfAttention):     # the module's own forward with our mask convention
    def forward(self, x, key_padding_mask=None, need_weights=False):
        mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
        return MultiHeadAttention.forward(self, x, x, x, mask, need_weights=need_weights)


class FixedFloat32(FixedSelfAttention):
    def forward(self, x, key_padding_mask=None, need_weights=False):
        m = FixedSelfAttention(self.d_model, self.num_heads, dropout=0.0)
        m.load_state_dict({k: v.float() for k, v in self.state_dict().items()})
        return m(x.float(), key_padding_mask)[0]                         # a tensor, not a tuple, is accepted


class QueriesAndKeys(FixedWithModule):          # also hiding padding queries (all-False rows give zeros): fine
    def forward(self, x, key_padding_mask=None, need_weights=False):
        real = ~key_padding_mask
        return MultiHeadAttention.forward(self, x, x, x, real[:, None, :, None] & real[:, None, None, :],
                                          need_weights=need_weights)


class InvertedMask(FixedWithModule):
    def forward(self, x, key_padding_mask=None, need_weights=False):
        return MultiHeadAttention.forward(self, x, x, x, key_padding_mask[:, None, None, :], need_weights=need_weights)


class MaskDropped(FixedWithModule):
    def forward(self, x, key_padding_mask=None, need_weights=False):
        return MultiHeadAttention.forward(self, x, x, x, need_weights=need_weights)


class OtherLayout(nn.Module):                   # parameters under other names
    def __init__(self, d_model, num_heads, dropout=0.0):
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, num_heads, batch_first=True)


def test_graders_leave_the_global_random_state_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    check_heads_loop(heads_loop)
    check_padding_fix(FixedSelfAttention)
    assert torch.equal(before, torch.get_rng_state())


# --- exercise 1: check_gpt2_attention

def _load(mha, c_attn_weight, c_attn_bias, c_proj_weight, c_proj_bias, slip="", dtype=torch.float64):
    """GPT-2's Conv1D weights (in, out) into mha, with one optional slip."""
    d = mha.d_model
    mha.to(dtype)
    order = (1, 0, 2) if slip == "q and k swapped" else (0, 1, 2)
    with torch.no_grad():
        for i, W in zip(order, (mha.W_q, mha.W_k, mha.W_v), strict=True):
            block = c_attn_weight[:, i * d:(i + 1) * d].T
            if slip == "c_attn untransposed":
                block = block.T
            if slip == "reshaped":
                block = c_attn_weight.reshape(3 * d, d)[i * d:(i + 1) * d]
            W.weight.copy_(block)
            if slip != "biases left":
                W.bias.copy_(c_attn_bias[i * d:(i + 1) * d])
        mha.W_o.weight.copy_(c_proj_weight if slip == "c_proj untransposed" else c_proj_weight.T)
        mha.W_o.bias.copy_(c_proj_bias)


def load_gpt2_attention(*args):
    _load(*args)


def load_gpt2_attention32(*args):
    _load(*args, dtype=torch.float32)


def float32_rounded(mha, *weights):                              # a float64 module, float32-rounded weights
    _load(mha, *(w.float() for w in weights))


def c_attn_untransposed(*args):
    _load(*args, slip="c_attn untransposed")


def c_proj_untransposed(*args):
    _load(*args, slip="c_proj untransposed")


def q_and_k_swapped(*args):
    _load(*args, slip="q and k swapped")


def reshaped_not_transposed(*args):
    _load(*args, slip="reshaped")


def biases_left(*args):
    _load(*args, slip="biases left")


def test_gpt2_reference_is_gpt2():
    """The grader's reference, _gpt2_attention on the fused weights, equals Hugging Face's GPT2Attention (eager,
    float64) with the same weights, and a module loaded by the solution equals both."""
    from helpers import import_hf
    transformers = import_hf("transformers")
    config = transformers.GPT2Config(n_embd=12, n_head=3, n_positions=8, n_layer=1, attn_pdrop=0.0,
                                     resid_pdrop=0.0, attn_implementation="eager")
    torch.manual_seed(0)
    block = transformers.GPT2LMHeadModel(config).to(torch.float64).eval().transformer.h[0].attn
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(0.5 * torch.randn_like(p))
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    weights = (block.c_attn.weight, block.c_attn.bias, block.c_proj.weight, block.c_proj.bias)
    with torch.no_grad():
        blocked = torch.zeros(5, 5, dtype=torch.float64).masked_fill(~causal_mask(5), float("-inf"))
        theirs = block(x, attention_mask=blocked[None, None])[0]       # the model passes its causal mask in
        ours = _gpt2_attention(x, *weights, 3)
        mha = MultiHeadAttention(12, 3, dropout=0.0).to(torch.float64).eval()
        load_gpt2_attention(mha, *weights)
        mine = mha(x, x, x, causal_mask(5)[None, None])[0]
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)


GRADERS = [
    grader_row(check_gpt2_attention, correct=[load_gpt2_attention, load_gpt2_attention32], mistakes=[
        (c_attn_untransposed, "transpose of an nn.Linear weight"),
        (c_proj_untransposed, "transpose of an nn.Linear weight"),
        (q_and_k_swapped, "wrong order"),
        (reshaped_not_transposed, "a reshape only re-reads"),
        (biases_left, "W_q.bias, W_k.bias, W_v.bias still hold"),
        (float32_rounded, r"your weights \(or inputs\) went through float32: the difference is at float32's "
                          r"rounding.*\(first at \[.*: -?\d\.\d{10}, expected -?\d\.\d{10}; largest difference"),
    ], prints="computes GPT-2's attention"),
    grader_row(check_heads_loop, correct=[heads_loop, heads_loop32], mistakes=[
        (forgotten_biases, "biases of W_q, W_k, W_v are missing"),
        (columns_not_rows, "you sliced columns"),
        (heads_reversed, "reverse order"),
        (heads_interleaved, "interleaved feature by feature"),
        (missing_w_o, "W_o is missing"),
        (scaled_by_d_model, r"divided by sqrt\(d_model\)"),
        (mask_ignored, "the mask is ignored"),
        (lambda m, q, k, v, mask=None: _loop(m, q, k, v, mask)[:, :1], "output shape"),
    ]),
    grader_row(check_kv_counts, correct=[kv_counts, kv_counts_from_modules], mistakes=[
        (kv_heads_of_width_d_model, "counted K/V heads of width d_model"),
        (forgotten_biases_count, "biases are missing"),
        (groups_as_kv_heads, "group size g"),
        (only_keys_cached, "only the keys"),
        (all_heads_cached, "full multi-head attention's cache"),
        (w_q_shrunk, "shrank W_q too"),
        (kv_counts_from_library, "build the projections W_q, W_k, W_v, W_o yourself"),
        (kv_counts_from_library_caught, "builds the chapter's MultiHeadAttention"),
        (kv_counts_from_chapter_cell, "build the projections W_q, W_k, W_v, W_o yourself"),
        (lambda d_model, num_heads, kv_heads: 5, "must return two numbers"),
    ]),
    grader_row(check_min_mse, correct=[min_mse, min_mse_sampled] + [  # the exercise's 10,000 samples, any seed
        lambda a, seed=seed: min_mse_sampled(a, 10_000, seed) for seed in range(5)], mistakes=[
        (lambda a: min_mse_sampled(a, 1_000, 0), "too noisy"),          # 1,000 samples: 4.5 % spread
        (lambda a: min_mse(a)[::-1], "swapped"),
        (lambda a: (2 * (1 - a) ** 2, 2 * a ** 2), "s = 1"),
        (lambda a: (1 - a, a), "where their squares belong"),
        (lambda a: ((1 - a) ** 2, a ** 2), "normalisation is missing"),
        (lambda a: 0.5, "must return two numbers"),
    ], prints='right for all'),
    grader_row(check_padding_fix, correct=[FixedSelfAttention, FixedWithModule, FixedFloat32, QueriesAndKeys], mistakes=[
        (PaddedSelfAttention, "mask is applied to the queries, not the keys"),
        (InvertedMask, "the mask is inverted"),
        (MaskDropped, "the padding mask has no effect"),
        (OtherLayout, "must keep MultiHeadAttention's parameters"),
    ]),
]
