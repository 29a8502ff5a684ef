"""Tests for transformer_lib.multi_head (Chapter 2): equality with torch.nn.MultiheadAttention in float64,
the fast path, masks, shapes, gradients, FLOPs, the AttentionCache, every ValueError, and the exercise checker."""

import functools

import pytest
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

import transformer_lib.multi_head as mh
from transformer_lib.attention import causal_mask, padding_mask
from transformer_lib.decoder import DecoderLayer
from transformer_lib.exercises.multi_head import check_split_merge
from transformer_lib.multi_head import AttentionCache, MultiHeadAttention, copy_to_torch_mha, torch_attn_mask

F64 = dict(dtype=torch.float64)
B, N, D, H, NQ, NK = 3, 6, 32, 4, 4, 7
TOL = 1e-12


def make_pair(bias=True, seed=0):
    torch.manual_seed(seed)
    ours = MultiHeadAttention(D, H, bias=bias).to(**F64).eval()
    theirs = nn.MultiheadAttention(D, H, bias=bias, batch_first=True, **F64).eval()
    return ours, copy_to_torch_mha(ours, theirs)


def mask_cases():
    """name -> (query, key, value, our mask, nn.MultiheadAttention mask kwargs)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, N, D, generator=g, **F64)
    q = torch.randn(B, NQ, D, generator=g, **F64)
    mem = torch.randn(B, NK, D, generator=g, **F64)
    tokens = torch.tensor([[5, 3, 8, 2, 9, 4], [7, 1, 6, 0, 0, 0], [2, 2, 0, 0, 0, 0]])
    src = torch.tensor([[4, 4, 1, 9, 3, 0, 0], [8, 2, 5, 6, 7, 1, 3], [6, 0, 0, 0, 0, 0, 0]])
    per_head = torch.rand(B, H, NQ, NK, generator=g) < 0.5
    per_head[..., 0] = True
    causal, pad = causal_mask(N)[None, None], padding_mask(tokens, 0)
    return {
        "self-none": (x, x, x, None, {}),
        "self-causal": (x, x, x, causal, dict(attn_mask=~causal_mask(N))),
        "self-padding": (x, x, x, pad, dict(key_padding_mask=tokens == 0)),
        "self-causal-padding": (x, x, x, causal & pad, dict(attn_mask=~causal_mask(N), key_padding_mask=tokens == 0)),
        "self-causal-as-4d": (x, x, x, (causal & pad), dict(attn_mask=torch_attn_mask(causal & pad, B, H, N, N))),
        "cross-none": (q, mem, mem, None, {}),
        "cross-padding": (q, mem, mem, padding_mask(src, 0), dict(key_padding_mask=src == 0)),
        "cross-per-head": (q, mem, mem, per_head, dict(attn_mask=torch_attn_mask(per_head, B, H, NQ, NK))),
        "cross-distinct-kv": (q, mem, mem.flip(1), None, {}),
    }


CASES = mask_cases()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("name", list(CASES))
def test_equals_torch_multihead_attention(name, bias):
    ours, theirs = make_pair(bias)
    q, k, v, mask, kwargs = CASES[name]
    with torch.no_grad():
        out, w = ours(q, k, v, mask, need_weights=True)
        fast, none = ours(q, k, v, mask)
        ref, ref_w = theirs(q, k, v, need_weights=True, average_attn_weights=False, **kwargs)
    assert none is None
    assert out.shape == (q.size(0), q.size(1), D) and w.shape == (q.size(0), H, q.size(1), k.size(1))
    assert (out - ref).abs().max() < TOL
    assert (w - ref_w).abs().max() < TOL
    assert (fast - ref).abs().max() < TOL


def test_gradients_equal_torch():
    ours, theirs = make_pair()
    x, _, _, mask, kwargs = CASES["self-causal-padding"]
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    up = torch.randn_like(x)
    (ours(xa, xa, xa, mask)[0] * up).sum().backward()
    (theirs(xb, xb, xb, need_weights=False, **kwargs)[0] * up).sum().backward()
    assert (xa.grad - xb.grad).abs().max() < TOL
    stacked = torch.cat([ours.W_q.weight.grad, ours.W_k.weight.grad, ours.W_v.weight.grad])
    assert (stacked - theirs.in_proj_weight.grad).abs().max() < TOL
    stacked_b = torch.cat([ours.W_q.bias.grad, ours.W_k.bias.grad, ours.W_v.bias.grad])
    assert (stacked_b - theirs.in_proj_bias.grad).abs().max() < TOL
    assert (ours.W_o.weight.grad - theirs.out_proj.weight.grad).abs().max() < TOL


@pytest.mark.parametrize("need_weights", [True, False])
def test_gradcheck(need_weights):
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, dropout=0.0).to(**F64)
    x = torch.randn(2, 4, 8, **F64, requires_grad=True)
    m = torch.randn(2, 3, 8, **F64, requires_grad=True)
    mask = causal_mask(4)[None, None, :, :3]
    assert torch.autograd.gradcheck(lambda a, b: mha(a, b, b, mask, need_weights=need_weights)[0], (x, m))


def test_fully_masked_rows_give_bias_not_nan():
    ours, theirs = make_pair()
    x = CASES["self-none"][0][:1]
    left = torch.tensor([[0, 0, 4, 7, 1, 3]])
    mask = causal_mask(N) & padding_mask(left, 0)                   # (1, 1, N, N)
    with torch.no_grad():
        out, w = ours(x, x, x, mask, need_weights=True)
        fast, _ = ours(x, x, x, mask)
        ref, _ = theirs(x, x, x, attn_mask=~causal_mask(N), key_padding_mask=left == 0)
    assert torch.isfinite(out).all() and torch.isfinite(fast).all()
    assert torch.equal(w[0, :, :2], torch.zeros(H, 2, N, **F64))
    assert torch.allclose(out[0, :2], ours.W_o.bias.expand(2, -1), rtol=0, atol=TOL)
    assert (fast - out).abs().max() < TOL
    assert (out[0, 2:] - ref[0, 2:]).abs().max() < TOL           # (PyTorch's own rows 0, 1 are not our concern)


@pytest.mark.parametrize("need_weights", [True, False])
def test_causal_mask_blocks_the_future(need_weights):
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, H).to(**F64).eval()
    x = torch.randn(2, N, D, **F64)
    y = x.clone()
    y[:, 4:] = torch.randn(2, N - 4, D, **F64)        # change only the future of positions 0..3
    mask = causal_mask(N)[None, None]
    with torch.no_grad():
        a, b = mha(x, x, x, mask, need_weights)[0], mha(y, y, y, mask, need_weights)[0]
    assert torch.equal(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


@pytest.mark.parametrize("need_weights", [True, False])
def test_padding_mask_hides_padded_keys(need_weights):
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, H).to(**F64).eval()
    q = torch.randn(2, NQ, D, **F64)
    mem = torch.randn(2, NK, D, **F64)
    tokens = torch.tensor([[1, 2, 3, 4, 5, 0, 0], [1, 2, 3, 0, 0, 0, 0]])
    changed = mem.clone()
    changed[tokens == 0] = 100.0                       # garbage at the padded positions
    mask = padding_mask(tokens, 0)
    with torch.no_grad():
        a = mha(q, mem, mem, mask, need_weights)[0]
        b = mha(q, changed, changed, mask, need_weights)[0]
    assert (a - b).abs().max() < TOL


def test_split_heads_layout_and_merge_inverse():
    mha = MultiHeadAttention(12, 3)
    x = torch.randn(2, 5, 12)
    heads = mha.split_heads(x)
    assert heads.shape == (2, 3, 5, 4)
    for i in range(3):
        assert torch.equal(heads[:, i], x[..., 4 * i:4 * (i + 1)])   # head i = feature block i
    assert torch.equal(mha.merge_heads(heads), x)
    y = torch.randn(2, 3, 5, 4)                                      # contiguous (B, h, n, d_k) input
    assert torch.equal(mha.split_heads(mha.merge_heads(y)), y)


def test_attributes_and_parameter_count():
    mha = MultiHeadAttention(512, 8)
    assert (mha.d_model, mha.num_heads, mha.d_k) == (512, 8, 64)
    for lin in (mha.W_q, mha.W_k, mha.W_v, mha.W_o):
        assert isinstance(lin, nn.Linear) and lin.weight.shape == (512, 512)
    assert sum(p.numel() for p in mha.parameters()) == 1_050_624
    assert sum(p.numel() for p in MultiHeadAttention(512, 8, bias=False).parameters()) == 4 * 512**2


def test_flops_do_not_depend_on_heads():
    x = torch.randn(2, 16, 64)
    counts = []
    for h in (1, 4, 16):
        mha = MultiHeadAttention(64, h).eval()
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            mha(x, x, x, need_weights=True)
        counts.append(counter.get_total_flops())
    assert counts == [8 * 2 * 16 * 64**2 + 4 * 2 * 16**2 * 64] * 3


def test_dropout_only_in_training():
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, H, dropout=0.5).to(**F64)
    x = torch.randn(2, N, D, **F64)
    mha.eval()
    a, w = mha(x, x, x, need_weights=True)
    assert torch.allclose(a, mha(x, x, x)[0], rtol=0, atol=TOL)
    assert torch.allclose(w.sum(-1), torch.ones(2, H, N, **F64))
    mha.train()
    out_w, w_train = mha(x, x, x, need_weights=True)
    out_fast, _ = mha(x, x, x)
    assert not torch.allclose(out_w, a) and not torch.allclose(out_fast, a)
    assert (w_train == 0).any()                                     # some weights dropped ...
    kept = w_train != 0
    assert torch.allclose(w_train[kept], 2 * w[kept])               # ... the rest scaled by 1 / (1 - p)


def test_torch_attn_mask_layout():
    mask = torch.rand(2, 3, 4, 5) < 0.5
    out = torch_attn_mask(mask, 2, 3, 4, 5)
    assert out.shape == (6, 4, 5) and out.dtype == torch.bool
    assert torch.equal(out[1 * 3 + 2], ~mask[1, 2])                 # row b*h + i holds batch b, head i
    assert torch.equal(torch_attn_mask(causal_mask(4)[None, None], 2, 3, 4, 4)[5], ~causal_mask(4))


# ---- ValueError paths --------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, kwargs, match", [
    ((512, 6), {}, "divisible by num_heads=6"),
    ((0, 1), {}, "d_model must be an int >= 1, got 0"),
    ((8, 0), {}, "num_heads must be an int >= 1, got 0"),
    ((8.0, 2), {}, "d_model must be an int >= 1, got float 8.0"),
    ((8, True), {}, "num_heads must be an int >= 1, got bool True"),
    ((8, 2), {"dropout": 1.0}, r"dropout must lie in \[0, 1\), got 1.0"),
    ((8, 2), {"dropout": -0.1}, r"dropout must lie in \[0, 1\)"),
    ((8, 2), {"dropout": True}, "dropout must be a number, got bool"),
    ((8, 2), {"bias": "False"}, "bias must be True or False, got str"),
])
def test_constructor_errors(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(*args, **kwargs)


def _inputs():
    return torch.randn(2, 5, 32), torch.randn(2, 7, 32)


@pytest.mark.parametrize("call, match", [
    (lambda m, x, mem: m(torch.randn(2, 5, 48), mem, mem), r"query must be a tensor of shape \(B, n, d_model=32\)"),
    (lambda m, x, mem: m(x[0], mem, mem), r"query must be a tensor of shape .* got float32 tensor of shape \(5, 32\)"),
    (lambda m, x, mem: m(x, mem[..., :16], mem), r"key must be a tensor of shape"),
    (lambda m, x, mem: m(x, mem, [1, 2]), r"value must be a tensor of shape .* got list"),
    (lambda m, x, mem: m(x.double(), mem, mem), r"query is torch.float64 but W_q.weight is torch.float32"),
    (lambda m, x, mem: m(x, mem.double(), mem), r"key is torch.float64 but W_q.weight is torch.float32"),
    (lambda m, x, mem: m(x, mem, mem.half()), r"value is torch.float16 but W_q.weight is torch.float32"),
    (lambda m, x, mem: m(x.long(), mem, mem), r"query must be a floating-point tensor, got int64"),
    (lambda m, x, mem: m(x, mem, mem, need_weights="False"), "need_weights must be True or False"),
    (lambda m, x, mem: m(x, mem, mem[:, :6]), "key and value must have the same length n_k"),
    (lambda m, x, mem: m(x, mem[:1], mem[:1]), "same batch size B"),
    (lambda m, x, mem: m(x, mem, mem, torch.ones(2, 5, 7, dtype=torch.bool)), r"head axis: mask\[:, None\]"),
    (lambda m, x, mem: m(x, mem, mem, torch.ones(7, dtype=torch.bool)), r"mask of shape \(7,\) does not fit"),
    (lambda m, x, mem: m(x, mem, mem, causal_mask(5)[None, None]), r"\(1, 1, 5, 5\) does not fit .* \(2, 4, 5, 7\)"),
    (lambda m, x, mem: m(x, mem, mem, torch.ones(2, 3, 5, 7, dtype=torch.bool)), "does not fit"),
    (lambda m, x, mem: m(x, mem, mem, causal_mask(7)[None, None, :5]), None),      # the last n_q rows: fine
    (lambda m, x, mem: m(x, x, x, torch.ones(1, 1, 5, 5)), "mask must be a bool tensor"),
    (lambda m, x, mem: m(x, x, x, cache=[]), "cache must be an AttentionCache or None, got list"),
])
@pytest.mark.parametrize("need_weights", [True, False])
def test_forward_errors(call, match, need_weights):
    mha = functools.partial(MultiHeadAttention(32, 4), need_weights=need_weights)
    x, mem = _inputs()
    if match is None:
        assert call(mha, x, mem)[0].shape == (2, 5, 32)
        return
    with pytest.raises(ValueError, match=match):
        call(mha, x, mem)


def test_copy_to_torch_mha_errors():
    mha = MultiHeadAttention(32, 4)
    with pytest.raises(ValueError, match="must be an nn.MultiheadAttention"):
        copy_to_torch_mha(mha, nn.Linear(32, 32))
    with pytest.raises(ValueError, match="num_heads=4"):
        copy_to_torch_mha(mha, nn.MultiheadAttention(32, 8, batch_first=True))
    with pytest.raises(ValueError, match="kdim = vdim"):
        copy_to_torch_mha(mha, nn.MultiheadAttention(32, 4, kdim=16, vdim=16, batch_first=True))
    with pytest.raises(ValueError, match="bias"):
        copy_to_torch_mha(mha, nn.MultiheadAttention(32, 4, bias=False, batch_first=True))


def test_torch_attn_mask_errors():
    with pytest.raises(ValueError, match="bool tensor"):
        torch_attn_mask(torch.ones(1, 1, 4, 5), 2, 3, 4, 5)
    with pytest.raises(ValueError, match="does not fit"):
        torch_attn_mask(torch.ones(1, 1, 4, 6, dtype=torch.bool), 2, 3, 4, 5)
    with pytest.raises(ValueError, match=r"mask\[None, None\]"):      # the rank rule: no 2-D masks either
        torch_attn_mask(torch.ones(4, 5, dtype=torch.bool), 2, 3, 4, 5)


# ---- masks: the rank rule and fully masked rows ------------------------------------------------------------
@pytest.mark.parametrize("need_weights", [True, False])
def test_rank_rule_rejects_a_padding_mask_when_batch_equals_n_q(need_weights):
    """A (B, S) padding mask would broadcast as (n_q, n_k) when B == n_q, mixing rows. It must be rejected,
    while its (B, 1, 1, S) form is accepted and hides the padded keys."""
    mha = MultiHeadAttention(D, H).to(**F64).eval()
    B_, S = 3, 5
    q, mem = torch.randn(B_, B_, D, **F64), torch.randn(B_, S, D, **F64)        # n_q == B
    tokens = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 0, 0, 0], [1, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match=r"mask of shape \(3, 5\) does not fit .*padding_mask\(tokens, pad_id\)"):
        mha(q, mem, mem, tokens != 0, need_weights=need_weights)
    _, w = mha(q, mem, mem, padding_mask(tokens, 0), need_weights=True)
    assert (w[1, ..., 2:] == 0).all() and (w[2, ..., 1:] == 0).all() and (w[0] > 0).all()


@pytest.mark.parametrize("need_weights", [True, False])
def test_fully_masked_rows_are_zero_before_w_o_on_both_paths(need_weights):
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, H).to(**F64).eval()
    x = torch.randn(2, N, D, **F64)
    mask = torch.ones(2, 1, N, N, dtype=torch.bool)
    mask[1, 0, 3] = False                                          # query 3 of sequence 1 sees nothing
    with torch.no_grad():
        out, w = mha(x, x, x, mask, need_weights=need_weights)
    assert torch.isfinite(out).all()
    assert torch.equal(out[1, 3], mha.W_o.bias.detach())           # zero heads, then W_o's bias
    if need_weights:
        assert torch.equal(w[1, :, 3], torch.zeros(H, N, **F64))
    x.requires_grad_(True)
    mha(x, x, x, mask, need_weights=need_weights)[0].sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("need_weights", [True, False])
def test_empty_batch(need_weights):
    mha = MultiHeadAttention(D, H).eval()
    out, w = mha(torch.randn(0, 3, D), torch.randn(0, 5, D), torch.randn(0, 5, D), need_weights=need_weights)
    assert out.shape == (0, 3, D)
    assert w is None if not need_weights else w.shape == (0, H, 3, 5)


def test_default_dropout_is_the_papers_0_1_and_acts_in_training_only():
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, H).to(**F64)                       # no dropout argument
    x = torch.randn(8, 16, D, **F64)
    _, w = mha(x, x, x, need_weights=True)                         # a new module is in training mode
    dropped = (w == 0).double().mean().item()
    assert 0.08 < dropped < 0.12
    _, w_eval = mha.eval()(x, x, x, need_weights=True)
    assert (w_eval > 0).all()


# ---- the cache -----------------------------------------------------------------------------------------------
def _step_by_step(mha, x, memory=None, need_weights=False):
    """Feed x one position at a time through a fresh cache; return the concatenated outputs and the cache."""
    cache = AttentionCache(static=memory is not None)
    outs = []
    for t in range(x.size(1)):
        x_t = x[:, t:t + 1]
        kv = x_t if memory is None else memory
        outs.append(mha(x_t, kv, kv, need_weights=need_weights, cache=cache)[0])
    return torch.cat(outs, dim=1), cache


@pytest.mark.parametrize("need_weights", [True, False])
def test_cache_incremental_equals_full_causal_attention(need_weights):
    torch.manual_seed(1)
    mha = MultiHeadAttention(D, H).to(**F64).eval()
    x = torch.randn(3, 9, D, **F64)
    with torch.no_grad():
        full, _ = mha(x, x, x, causal_mask(9)[None, None], need_weights=need_weights)
        steps, cache = _step_by_step(mha, x, need_weights=need_weights)
    assert len(cache) == 9 and cache.k.shape == cache.v.shape == (3, H, 9, D // H)
    assert (steps - full).abs().max() < 1e-12
    # and without the causal mask the full output differs: the test can tell the two apart
    assert (steps - mha(x, x, x)[0]).abs().max() > 1e-3


def test_cache_blocks_of_several_positions_with_an_offset_causal_mask():
    torch.manual_seed(2)
    mha = MultiHeadAttention(D, H).to(**F64).eval()
    x = torch.randn(2, 7, D, **F64)
    mask = causal_mask(7)[None, None]
    with torch.no_grad():
        full, _ = mha(x, x, x, mask)
        cache = AttentionCache()
        a, _ = mha(x[:, :3], x[:, :3], x[:, :3], mask[..., :3, :3], cache=cache)
        b, _ = mha(x[:, 3:], x[:, 3:], x[:, 3:], mask[..., 3:, :], cache=cache)      # n_k = 3 + 4
    assert (torch.cat([a, b], dim=1) - full).abs().max() < 1e-12
    with pytest.raises(ValueError, match=r"\(1, 1, 1, 2\) does not fit .* \(2, 4, 1, 8\)"):
        mha(x[:, :1], x[:, :1], x[:, :1], mask[..., :1, :2], cache=cache)           # n_k must count the cache
    assert len(cache) == 7                                                           # the failed call left it alone


@pytest.mark.parametrize("need_weights", [True, False])
def test_static_cache_projects_the_memory_once_and_reuses_it(need_weights):
    torch.manual_seed(3)
    mha = MultiHeadAttention(D, H).to(**F64).eval()
    x, memory = torch.randn(2, 5, D, **F64), torch.randn(2, 8, D, **F64)
    calls = []
    hook = mha.W_k.register_forward_hook(lambda mod, args, out: calls.append(args[0].shape[1]))
    with torch.no_grad():
        steps, cache = _step_by_step(mha, x, memory, need_weights)
        k_first = cache.k
        again, _ = mha(x[:, :1], None, None, cache=cache)                            # key/value not read any more
    hook.remove()
    assert calls == [8] and cache.k is k_first and len(cache) == 8
    with torch.no_grad():
        assert (steps - mha(x, memory, memory)[0]).abs().max() < 1e-12
        assert (again - steps[:, :1]).abs().max() < 1e-12


def test_cache_reorder_keeps_and_duplicates_rows():
    torch.manual_seed(4)
    mha = MultiHeadAttention(D, H).to(**F64).eval()
    x, memory = torch.randn(3, 6, D, **F64), torch.randn(3, 4, D, **F64)
    index = torch.tensor([2, 2, 0, 1])
    with torch.no_grad():
        full, _ = mha(x, x, x, causal_mask(6)[None, None])
        full_cross, _ = mha(x, memory, memory)
        self_cache, cross_cache = AttentionCache(), AttentionCache(static=True)
        mha(x[:, :4], x[:, :4], x[:, :4], causal_mask(4)[None, None], cache=self_cache)
        mha(x[:, :4], memory, memory, cache=cross_cache)
        for c in (self_cache, cross_cache):
            c.reorder(index)
        assert len(self_cache) == 4 and self_cache.k.size(0) == 4
        x4 = x[index, 4:5]
        out, _ = mha(x4, x4, x4, cache=self_cache)
        cross, _ = mha(x4, None, None, cache=cross_cache)
    assert (out - full[index, 4:5]).abs().max() < 1e-12
    assert (cross - full_cross[index, 4:5]).abs().max() < 1e-12
    empty = AttentionCache()
    empty.reorder(index)                                       # nothing cached yet: nothing to do
    assert len(empty) == 0


def test_cache_errors():
    mha = MultiHeadAttention(D, H).eval()
    cache = AttentionCache()
    x = torch.randn(2, 3, D)
    mha(x, x, x, causal_mask(3)[None, None], cache=cache)
    with pytest.raises(ValueError, match=r"cache holds 2 batch rows but query has B=3.*reorder"):
        mha(torch.randn(3, 1, D), torch.randn(3, 1, D), torch.randn(3, 1, D), cache=cache)
    with pytest.raises(ValueError, match="mask must be a bool tensor"):   # a 0/1 float mask is not a bias
        mha(x[:, :1], x[:, :1], x[:, :1], torch.ones(1, 1, 1, 4), cache=cache)
    assert len(cache) == 3
    with pytest.raises(ValueError, match="static must be True or False, got str"):
        AttentionCache(static="False")
    with pytest.raises(ValueError, match="key must be a tensor"):       # an empty static cache needs the memory
        mha(x, None, None, cache=AttentionCache(static=True))


# ---- the exercise checker ----------------------------------------------------------------------------------
def good_split(x, h):
    B, n, d = x.shape
    return x.view(B, n, h, d // h).transpose(1, 2)


def good_merge(x):
    B, h, n, d_k = x.shape
    return x.transpose(1, 2).reshape(B, n, h * d_k)


def test_checker_accepts_correct_and_module_methods(capsys):
    check_split_merge(good_split, good_merge)
    check_split_merge(lambda x, h: MultiHeadAttention(x.size(-1), h).split_heads(x),
                      lambda x: MultiHeadAttention(x.size(1) * x.size(3), x.size(1)).merge_heads(x))
    assert "check_split_merge: correct" in capsys.readouterr().out


@pytest.mark.parametrize("split, merge, match", [
    (lambda x, h: x.view(x.size(0), x.size(1), h, -1), good_merge, r"that is \(B, n, h, d_k\); swap"),
    (lambda x, h: x.view(x.size(0), h, x.size(1), -1), good_merge, "reshaped straight to"),
    (lambda x, h: x.view(x.size(0), x.size(1), -1, h).permute(0, 3, 1, 2), good_merge, "heads interleaved"),
    (lambda x, h: good_split(x, h) * 1.5, good_merge, r"head \d+, position \d+, feature \d+"),
    (lambda x, h: good_split(x, h).tolist(), good_merge, "must return a tensor"),
    (good_split, lambda x: x.reshape(x.size(0), x.size(2), -1), "straight to \\(B, n, d_model\\)"),
    (good_split, lambda x: x.permute(0, 2, 3, 1).reshape(x.size(0), x.size(2), -1), "heads interleaved"),
    (good_split, lambda x: x.transpose(1, 2), r"that is \(B, n, h, d_k\); flatten"),
    (good_split, lambda x: x.transpose(1, 2).view(x.size(0), x.size(2), -1), "not contiguous"),
    (good_split, lambda x: good_merge(x) + 1, r"output\[\d+, \d+, \d+\] should be"),
])
def test_checker_diagnoses_bugs(split, merge, match):
    with pytest.raises(AssertionError, match=match):
        check_split_merge(split, merge)


# --- is_causal: the causal mask as a flag (issue 23), handed to PyTorch's fused kernel where it applies

def _causal_cases():
    torch.manual_seed(3)
    mha = MultiHeadAttention(16, 4, dropout=0.0).double().eval()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    pad = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    pad[1, ..., 4:] = False
    return mha, x, pad


def test_is_causal_equals_the_explicit_causal_mask():
    mha, x, pad = _causal_cases()
    causal = causal_mask(6)[None, None]
    with torch.no_grad():
        assert torch.equal(mha(x, x, x, is_causal=True)[0], mha(x, x, x, causal)[0])              # fused flag
        assert torch.equal(mha(x, x, x, pad, is_causal=True)[0], mha(x, x, x, pad & causal)[0])  # AND-ed
        out, weights = mha(x, x, x, need_weights=True, is_causal=True)                           # Chapter 1's path
        assert torch.equal(weights.triu(1), torch.zeros_like(weights)) and torch.allclose(out, mha(x, x, x, causal)[0])
        cache = AttentionCache()                                   # cached positions: n_q != n_k, offset n_k - n_q
        mha(x[:, :4], x[:, :4], x[:, :4], cache=cache, is_causal=True)
        step = mha(x[:, 4:], x[:, 4:], x[:, 4:], cache=cache, is_causal=True)[0]
        assert torch.allclose(step, mha(x, x, x, causal)[0][:, 4:], atol=1e-12)


def test_is_causal_reaches_pytorchs_kernel_as_a_flag(monkeypatch):
    """Without a mask, bias or cache the fused kernel gets is_causal=True and no mask tensor (flash on a GPU);
    with a padding mask it gets one combined mask tensor."""
    import transformer_lib.multi_head as mh
    mha, x, pad = _causal_cases()
    calls = []
    real = mh.F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append((kwargs.get("attn_mask"), kwargs.get("is_causal")))
        return real(*args, **kwargs)
    monkeypatch.setattr(mh.F, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        mha(x, x, x, is_causal=True)
        mha(x, x, x, pad, is_causal=True)
    assert calls[0] == (None, True)
    assert calls[1][1] is False and torch.equal(calls[1][0], pad & causal_mask(6)[None, None])


def test_the_decoder_passes_its_causal_mask_as_a_flag(monkeypatch):
    torch.manual_seed(4)
    layer = DecoderLayer(16, 4, 32, dropout=0.0, cross_attention=False).double().eval()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        expected = layer(x, tgt_mask=torch.ones(1, 1, 1, 5, dtype=torch.bool))   # a mask tensor: the old path
    flags = []
    real = mh.F.scaled_dot_product_attention
    monkeypatch.setattr(mh.F, "scaled_dot_product_attention",
                        lambda *a, **k: flags.append(k.get("is_causal")) or real(*a, **k))
    with torch.no_grad():
        assert torch.equal(layer(x), expected)
    assert flags == [True]


def test_is_causal_must_be_a_bool():
    mha, x, _ = _causal_cases()
    with pytest.raises(ValueError, match="is_causal"):
        mha(x, x, x, is_causal="yes")


@pytest.mark.parametrize("need_weights", [False, True])
def test_padding_holding_nan_or_inf_cannot_change_the_real_positions(need_weights):
    """Issue 26: masked means it cannot matter, on both paths (PyTorch's fused kernel and Chapter 1's function):
    NaN and inf in the padding vectors change neither the real positions' outputs nor their gradients."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, dropout=0.0).double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    mask = padding_mask(torch.tensor([[1, 2, 3, 0, 0], [1, 2, 3, 4, 0]]), pad_id=0)     # (B, 1, 1, 5)
    bad = x.clone()
    bad[0, 3], bad[0, 4], bad[1, 4] = float("inf"), float("nan"), -float("inf")
    real = mask[:, 0, 0]                                                                # (B, 5)
    out = mha(x, x, x, mask, need_weights=need_weights)[0]
    assert torch.equal(out[real], mha(bad, bad, bad, mask, need_weights=need_weights)[0][real])
    # gradients: the padding enters as keys and values (a NaN *query* row is not masked: its own output is NaN,
    # and its backward reaches every key, as in PyTorch's kernels)
    query = x.clone().requires_grad_(True)
    bad.requires_grad_(True)
    mha(query, bad, bad, mask, need_weights=need_weights)[0].sum().backward()
    assert torch.isfinite(query.grad).all() and torch.isfinite(bad.grad[real]).all()


def test_cached_decoding_with_nan_in_the_padded_memory_equals_finite_padding():
    """Issue 26 on the KV-cache path: the memory's padded keys are zeroed once, when the static cache is filled
    (the cached tensors are not copied again at every step), and self-attention zeroes only its new keys."""
    torch.manual_seed(0)
    self_attn, cross_attn = (MultiHeadAttention(8, 2, dropout=0.0).double().eval() for _ in range(2))
    memory = torch.randn(2, 5, 8, dtype=torch.float64)
    src_mask = padding_mask(torch.tensor([[1, 2, 3, 0, 0], [1, 2, 3, 4, 0]]), pad_id=0)   # (B, 1, 1, S)
    bad = memory.clone()
    bad[0, 3:], bad[1, 4] = float("nan"), float("inf")
    y = torch.randn(2, 4, 8, dtype=torch.float64)

    def decode(memory):
        caches, outs = (AttentionCache(), AttentionCache(static=True)), []
        for t in range(y.size(1)):
            h = self_attn(y[:, t:t + 1], y[:, t:t + 1], y[:, t:t + 1], None, cache=caches[0])[0]
            outs.append(cross_attn(h, memory, memory, src_mask, cache=caches[1])[0])
        return torch.cat(outs, 1), caches[1]

    clean, _ = decode(memory)
    dirty, cache = decode(bad)
    assert torch.equal(clean, dirty) and torch.isfinite(cache.k).all() and torch.isfinite(cache.v).all()
