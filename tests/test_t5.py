"""transformer_lib.t5 (Chapter 12): RMSNorm, T5's relative position buckets and bias, T5's attention, and the whole
T5 against Hugging Face's T5ForConditionalGeneration in float64, built from configs only (never downloaded);
causality, padding, shift_right, the loss, greedy generation, loading, gradients, sizes; the buckets exercise."""

import dataclasses
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import ATOL, DT, assert_download_fails, import_hf, max_diff, noisy, randomize

from transformer_lib.bert import IGNORE_INDEX, token_cross_entropy
from transformer_lib.exercises.t5 import check_buckets
from transformer_lib.multi_head import attention_maps
from transformer_lib.t5 import (
    T5,
    RelativePositionBias,
    RMSNorm,
    T5Attention,
    T5Config,
    load_by_names,
    load_hf_t5,
    relative_position_bucket,
    shift_right,
    t5_generate,
)

V = 40                                           # vocabulary of the small models
PAD = 0


def small_config(**kw) -> T5Config:
    return T5Config(**{"vocab_size": V, "d_model": 16, "num_heads": 2, "d_ff": 32, "num_layers": 2,
                       "num_decoder_layers": 2, "num_buckets": 8, "max_distance": 12, "dropout": 0.0, **kw})


def random_t5(seed=0, **kw) -> T5:
    """A small T5 in float64, eval mode, with every parameter (RMSNorm gains and position tables too) random."""
    return randomize(T5(small_config(**kw)).double(), seed=seed, std=0.3).eval()


def token_ids(*shape, seed=0, low=2, high=V):
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed))



# ---------------------------------------------------------------- no network, ever

pytestmark = pytest.mark.usefixtures("no_network")   # tests/conftest.py: any connection fails


def test_network_guard_makes_from_pretrained_fail(tmp_path):
    assert_download_fails("T5ForConditionalGeneration", "t5-small", tmp_path)


# ---------------------------------------------------------------- RMSNorm

@pytest.mark.parametrize("shape", [(4, 7, 16), (16,), (3, 16)])
def test_rms_norm_equals_torch_rms_norm_in_float64(shape):
    g = torch.Generator().manual_seed(0)
    x = 3 * torch.randn(shape, generator=g, dtype=DT) + 1                  # a mean far from 0: not LayerNorm
    for eps in (1e-6, 0.5):
        ours = randomize(RMSNorm(16, eps).double(), seed=1)
        reference = nn.RMSNorm(16, eps=eps, dtype=DT)
        with torch.no_grad():
            reference.weight.copy_(ours.weight)
        out = ours(x)
        assert out.dtype == DT and out.shape == x.shape
        assert max_diff(out, reference(x)) < 1e-14
    assert max_diff(RMSNorm(16).double()(x), F.layer_norm(x, (16,))) > 0.1  # no mean is subtracted


def test_rms_norm_formula_by_hand():
    x = torch.tensor([[3.0, -4.0], [1.0, 1.0]], dtype=DT)                   # mean squares 12.5 and 1
    norm = RMSNorm(2, eps=1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([2.0, 0.5]))
    want = torch.tensor([[2 * 3 / 12.500001 ** 0.5, 0.5 * -4 / 12.500001 ** 0.5],
                         [2 / 1.000001 ** 0.5, 0.5 / 1.000001 ** 0.5]], dtype=DT)
    torch.testing.assert_close(norm(x), want, rtol=0, atol=1e-14)
    assert norm.weight.shape == (2,) and torch.equal(RMSNorm(5).weight, torch.ones(5))
    assert "eps" in repr(norm) and not any(n == "bias" for n, _ in norm.named_parameters())


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_rms_norm_statistic_in_float32_for_half_inputs(half):
    """The mean square of half-precision inputs is taken in float32; the output keeps the input's dtype."""
    g = torch.Generator().manual_seed(2)
    d = 256
    x32 = 1000 + 300 * torch.randn(6, d, generator=g)                     # x² > 65504: float16 squares overflow
    x = x32.to(half)
    norm = RMSNorm(d).to(half)
    with torch.no_grad():
        norm.weight.copy_((1 + 0.1 * torch.randn(d, generator=g)).to(half))
    out = norm(x)
    assert out.dtype == half
    z = x.float()
    want = (norm.weight.float() * z / torch.sqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6)).to(half)
    assert torch.equal(norm.formula(x), want)
    # forward's fused kernel: the same up to the last bit of the half type (where it rounds the product)
    assert torch.isfinite(out).all() and (out.float() - want.float()).abs().max() <= 2 * torch.finfo(half).eps * 2
    # the same formula with the statistic in the half type is visibly different: the test can tell them apart
    naive = (norm.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).to(half)
    assert not torch.equal(naive, want)
    torch.testing.assert_close(out.float(), nn.functional.rms_norm(z, (d,), norm.weight.float(), 1e-6),
                               atol=2e-2, rtol=1e-2)


def test_rms_norm_gradients_are_correct():
    norm = randomize(RMSNorm(5, eps=1e-3).double(), seed=3)
    x = torch.randn(2, 3, 5, dtype=DT, generator=torch.Generator().manual_seed(4), requires_grad=True)
    w = norm.weight.detach().clone().requires_grad_(True)
    fn = lambda x, w: torch.func.functional_call(norm, {"weight": w}, (x,))  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w))
    norm(x).sum().backward()
    assert x.grad is not None and norm.weight.grad is not None and norm.weight.grad.abs().sum() > 0


def test_rms_norm_refuses_bad_inputs():
    norm = RMSNorm(4)
    with pytest.raises(ValueError, match=r"\bx\b.*d_model=4"):
        norm(torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"\bx\b.*floating"):
        norm(torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\bx\b.*float64"):
        norm(torch.randn(2, 4, dtype=DT))
    with pytest.raises(ValueError, match=r"\beps\b"):
        RMSNorm(4, eps=0.0)


# ---------------------------------------------------------------- relative_position_bucket

SIZES = [(32, 128), (16, 64), (8, 20), (64, 512), (4, 9), (12, 100)]


@pytest.mark.parametrize("bidirectional", [True, False], ids=["encoder", "decoder"])
@pytest.mark.parametrize("num_buckets, max_distance", SIZES)
def test_relative_position_bucket_equals_transformers(bidirectional, num_buckets, max_distance):
    import_hf("transformers")
    from transformers.models.t5.modeling_t5 import T5Attention as HFT5Attention
    offsets = torch.arange(-1000, 1001)
    ours = relative_position_bucket(offsets, bidirectional, num_buckets, max_distance)
    theirs = HFT5Attention._relative_position_bucket(offsets, bidirectional, num_buckets, max_distance)
    assert ours.dtype == torch.long and ours.shape == offsets.shape
    assert torch.equal(ours, theirs)
    assert ours.min() >= 0 and ours.max() == num_buckets - 1                # every bucket is in range, the last used
    grid = offsets.view(3, 23, 29)                                          # any shape, element by element
    assert torch.equal(relative_position_bucket(grid, bidirectional, num_buckets, max_distance), ours.view(3, 23, 29))


def test_relative_position_bucket_values_by_hand():
    b = lambda o, bi=True: relative_position_bucket(torch.tensor(o), bi).tolist()  # noqa: E731 - 32, 128
    assert b([0, -1, -7, 1, 7]) == [0, 1, 7, 17, 23]                         # exact: one bucket per distance
    assert b([-128, -1000, 128, 1000]) == [15, 15, 31, 31]                  # far away: the last bucket per side
    assert b([5, 0, 1000, -15, -16, -127, -128], False) == [0, 0, 0, 15, 16, 31, 31]  # the decoder: the past only
    assert b([-8, -9, -11, -12, -15, -16]) == [8, 8, 8, 9, 9, 10]            # log-spaced buckets widen:
    assert b([-20, -64, -100]) == [10, 14, 15]                             # 8 + ⌊8 log(d/8) / log 16⌋
    int32 = relative_position_bucket(torch.tensor([-3, 3], dtype=torch.int32))
    assert int32.tolist() == [3, 19]


@pytest.mark.parametrize("num_buckets, max_distance", SIZES)
def test_relative_position_bucket_is_monotone_in_distance(num_buckets, max_distance):
    d = torch.arange(0, 600)
    for bidirectional in (True, False):
        past = relative_position_bucket(-d, bidirectional, num_buckets, max_distance)
        assert torch.all(past[1:] >= past[:-1]) and past[0] == 0
        if bidirectional:
            future = relative_position_bucket(d[1:], True, num_buckets, max_distance)
            assert torch.all(future[1:] >= future[:-1])
            assert torch.all(future >= num_buckets // 2) and torch.all(past < num_buckets // 2)
            assert torch.equal(future - num_buckets // 2, past[1:])            # the same widths on either side


# ---------------------------------------------------------------- RelativePositionBias

@pytest.mark.parametrize("bidirectional", [True, False], ids=["encoder", "decoder"])
def test_relative_position_bias_is_the_table_at_each_bucket(bidirectional):
    h, n_q, n_k = 3, 5, 7
    bias = randomize(RelativePositionBias(h, bidirectional, num_buckets=8, max_distance=6).double(), seed=5)
    out = bias(n_q, n_k)
    assert out.shape == (1, h, n_q, n_k) and out.dtype == DT
    table = bias.table.weight
    for i in range(n_q):
        for j in range(n_k):
            bucket = relative_position_bucket(torch.tensor(j - i), bidirectional, 8, 6)
            assert torch.equal(out[0, :, i, j], table[bucket]), (i, j)
    assert not torch.equal(out[0, 0], out[0, 1])                            # one table column per head
    assert torch.equal(bias.buckets(n_q, n_k), relative_position_bucket(
        torch.arange(n_k)[None] - torch.arange(n_q)[:, None], bidirectional, 8, 6))


@pytest.mark.parametrize("bidirectional", [True, False], ids=["encoder", "decoder"])
def test_relative_position_bias_offset_is_the_query_position(bidirectional):
    bias = randomize(RelativePositionBias(2, bidirectional, num_buckets=16, max_distance=20).double(), seed=6)
    for t, n_q, n_k in ((3, 1, 4), (5, 2, 9), (0, 4, 4), (30, 3, 40)):
        full = bias(t + n_q, n_k)
        assert torch.equal(bias(n_q, n_k, offset=t), full[:, :, t:]), (t, n_q, n_k)
    assert not torch.equal(bias(1, 9, offset=4), bias(1, 9))               # the offset matters


# ---------------------------------------------------------------- T5Attention

def manual_t5_attention(attn, q, kv, bias, mask):
    """softmax(Q Kᵀ + bias) V per head, then W_o, with explicit loops: no 1/√d_k anywhere."""
    B, n_q, d = q.shape
    h, d_k = attn.num_heads, d // attn.num_heads
    Wq, Wk, Wv, Wo = (W.weight for W in (attn.W_q, attn.W_k, attn.W_v, attn.W_o))
    heads, weights = [], torch.zeros(B, h, n_q, kv.size(1), dtype=q.dtype)
    for i in range(h):
        rows = slice(i * d_k, (i + 1) * d_k)
        Q, K, Vh = q @ Wq[rows].T, kv @ Wk[rows].T, kv @ Wv[rows].T
        scores = Q @ K.transpose(1, 2) + (bias[:, i] if bias is not None else 0)
        scores = scores.masked_fill(~mask[:, 0], float("-inf")) if mask is not None else scores
        w = torch.nan_to_num(torch.softmax(scores, -1), nan=0.0)
        weights[:, i] = w
        heads.append(w @ Vh)
    return torch.cat(heads, -1) @ Wo.T, weights


def test_t5_attention_is_softmax_of_scores_plus_bias_without_scaling():
    attn = randomize(T5Attention(12, 3, dropout=0.0).double(), seed=7).eval()
    assert all(W.bias is None for W in (attn.W_q, attn.W_k, attn.W_v, attn.W_o))
    g = torch.Generator().manual_seed(8)
    q, kv = torch.randn(2, 4, 12, generator=g, dtype=DT), torch.randn(2, 6, 12, generator=g, dtype=DT)
    bias = torch.randn(1, 3, 4, 6, generator=g, dtype=DT)
    mask = torch.rand(2, 1, 4, 6, generator=g) > 0.3
    mask[..., 0] = True
    for b, m in ((bias, mask), (None, None), (bias, None), (None, mask)):
        out, weights = attn(q, kv, kv, b, m, need_weights=True)
        want_out, want_weights = manual_t5_attention(attn, q, kv, b, m)
        assert max_diff(out, want_out) < ATOL and max_diff(weights, want_weights) < ATOL
    out, weights = attn(q, kv, kv, bias)
    assert weights is None and max_diff(out, manual_t5_attention(attn, q, kv, bias, None)[0]) < ATOL
    # dividing by √d_k (as Chapter 2 does) gives other weights: the test would notice
    Q, K = attn.split_heads(attn.W_q(q)), attn.split_heads(attn.W_k(kv))
    scaled = torch.softmax(Q @ K.transpose(-2, -1) / 2.0 + bias, -1)
    assert max_diff(attn(q, kv, kv, bias, need_weights=True)[1], scaled) > 1e-3


def test_t5_attention_broadcasts_a_per_batch_bias():
    attn = randomize(T5Attention(8, 2, dropout=0.0).double(), seed=9).eval()
    g = torch.Generator().manual_seed(10)
    x, bias = torch.randn(3, 5, 8, generator=g, dtype=DT), torch.randn(3, 1, 5, 5, generator=g, dtype=DT)
    out = attn(x, x, x, bias)[0]
    for b in range(3):
        assert max_diff(out[b:b + 1], attn(x[b:b + 1], x[b:b + 1], x[b:b + 1], bias[b:b + 1])[0]) < ATOL


def test_t5_attention_fully_masked_row_gives_zeros_not_nan():
    attn = randomize(T5Attention(8, 2, dropout=0.0).double(), seed=11).eval()
    x = torch.randn(2, 3, 8, dtype=DT, generator=torch.Generator().manual_seed(12))
    bias = torch.randn(1, 2, 3, 3, dtype=DT, generator=torch.Generator().manual_seed(13))
    mask = torch.ones(2, 1, 3, 3, dtype=torch.bool)
    mask[1, 0, 2] = False                                                   # query 2 of row 1 sees no key
    out, weights = attn(x, x, x, bias, mask, need_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert torch.equal(out[1, 2], torch.zeros(8, dtype=DT))                 # no bias in W_o: exactly 0
    assert torch.equal(weights[1, :, 2], torch.zeros(2, 3, dtype=DT))
    torch.testing.assert_close(weights[0].sum(-1), torch.ones(2, 3, dtype=DT))


def test_t5_attention_refuses_a_bias_of_the_wrong_shape():
    attn = T5Attention(8, 2)
    x = torch.randn(2, 3, 8)
    with pytest.raises(ValueError, match=r"\bposition_bias\b.*shape"):
        attn(x, x, x, torch.zeros(1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"\bposition_bias\b.*shape"):
        attn(x, x, x, torch.zeros(1, 3, 3, 3))                             # 3 heads for 2
    with pytest.raises(ValueError, match=r"\bposition_bias\b"):
        attn(x, x, x, torch.zeros(2, 3, 3))
    with pytest.raises(ValueError, match=r"\bposition_bias\b.*floating"):
        attn(x, x, x, torch.zeros(1, 2, 3, 3, dtype=torch.long))


def test_t5_attention_refuses_a_bias_of_another_dtype():
    attn = T5Attention(8, 2)
    x = torch.randn(2, 3, 8)
    with pytest.raises(ValueError, match=r"\bposition_bias\b"):
        attn(x, x, x, torch.zeros(1, 2, 3, 3, dtype=DT))


# ---------------------------------------------------------------- equality with Hugging Face

def hf_config(**kw):
    transformers = import_hf("transformers")
    return transformers.T5Config(**{"vocab_size": 64, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2,
                                    "num_decoder_layers": 3, "num_heads": 4, "relative_attention_num_buckets": 8,
                                    "relative_attention_max_distance": 20, "dropout_rate": 0.0,
                                    "decoder_start_token_id": 0, "attn_implementation": "eager", **kw})


def hf_pair(seed=0, **kw):
    transformers = import_hf("transformers")
    cfg = hf_config(**kw)
    hf = noisy(transformers.T5ForConditionalGeneration(cfg), seed)
    ours = load_hf_t5(T5(T5Config.from_hf(cfg)).double().eval(), hf)
    return ours, hf


def rms_norm_in_input_dtype(self, hidden_states):
    """Hugging Face's T5LayerNorm.forward without its .to(torch.float32): the statistic in float64."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def statistic_in_float64(hf):
    from transformers.models.t5.modeling_t5 import T5LayerNorm
    norms = [m for m in hf.modules() if isinstance(m, T5LayerNorm)]
    assert len(norms) == 2 * hf.config.num_layers + 3 * hf.config.num_decoder_layers + 2   # and both final norms
    for module in norms:
        module.forward = types.MethodType(rms_norm_in_input_dtype, module)  # this instance only
    return hf


def hf_tolerance():
    """How close float64 can get to Hugging Face's T5. Before transformers 5.15 its attention took the softmax in
    float32 (`softmax(scores.float()).type_as(scores)`), which no patch of ours can undo: against those releases
    (the floor, `make test-floor`) the models agree to about 5e-7, not 1e-15. A wrong weight or mask is off by
    far more than either bound."""
    from packaging.version import Version

    old = Version(import_hf("transformers").__version__) < Version("5.15")
    return 1e-5 if old else 1e-10


def seq2seq_batch(seed, V=64, S=25, T=22):
    """Sources longer than max_distance = 20, padded (id 0) at the end of two rows; labels with -100."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(2, V, (3, S), generator=g)
    src[0, 17:] = PAD
    src[1, 4:] = PAD
    labels = torch.randint(2, V, (3, T), generator=g)
    labels[0, 2 * T // 3:] = IGNORE_INDEX
    labels[2, T // 2] = IGNORE_INDEX
    return src, labels


def test_from_hf_reads_every_size():
    cfg = T5Config.from_hf(hf_config(layer_norm_epsilon=1e-5, dropout_rate=0.2, pad_token_id=3, eos_token_id=4))
    assert cfg == T5Config(vocab_size=64, d_model=32, num_heads=4, d_ff=64, num_layers=2, num_decoder_layers=3,
                           num_buckets=8, max_distance=20, dropout=0.2, eps=1e-5, pad_id=3, eos_id=4)
    assert T5Config.from_hf(hf_config(num_decoder_layers=None)).num_decoder_layers == 2   # default: symmetric


def test_t5_equals_hugging_face_with_padding_and_ignored_labels():
    ours, hf = hf_pair(seed=1)
    assert torch.equal(hf.lm_head.weight, hf.shared.weight)                # noisy() kept the tie
    src, labels = seq2seq_batch(seed=2)
    real = src != PAD

    def compare():
        with torch.no_grad():
            ref = hf(input_ids=src, attention_mask=real.long(), labels=labels)
            logits = ours(src, shift_right(labels))
        assert logits.dtype == DT and logits.shape == (3, 22, 64)
        return max_diff(logits, ref.logits), abs(token_cross_entropy(logits, labels).item() - ref.loss.item())

    tol = hf_tolerance()
    as_shipped = compare()                                                  # their statistic in float32
    assert as_shipped[0] < 1e-5 and as_shipped[1] < 1e-5
    statistic_in_float64(hf)
    diff_logits, diff_loss = compare()
    assert diff_logits < tol and diff_loss < tol
    if tol < 1e-5:
        assert as_shipped[0] > 1e3 * diff_logits                           # the float32 statistic was the gap
    with torch.no_grad():                                                   # the encoders agree too
        memory, mask = ours.encode(src), ours.make_src_mask(src)
        want = hf.encoder(input_ids=src, attention_mask=real.long()).last_hidden_state
        assert max_diff(memory[real], want[real]) < tol
        assert mask.shape == (3, 1, 1, 25) and torch.equal(mask[:, 0, 0], real)
        unmasked = hf(input_ids=src, labels=labels).logits                 # and the padding does matter
    assert max_diff(ours(src, shift_right(labels)), unmasked) > 1e-3


def test_t5_with_equal_stacks_equals_hugging_face_decoder_start_and_sizes():
    ours, hf = hf_pair(seed=3, num_decoder_layers=2)
    statistic_in_float64(hf)
    src, labels = seq2seq_batch(seed=4, S=9, T=6)
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=(src != PAD).long(), decoder_input_ids=shift_right(labels)).logits
        assert torch.equal(hf._shift_right(labels), shift_right(labels))   # their shift is ours
        assert max_diff(ours(src, shift_right(labels)), ref) < hf_tolerance()
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())


def test_load_hf_t5_copies_the_weights_by_name():
    ours, hf = hf_pair(seed=5)
    block = hf.decoder.block[2]
    pairs = [(ours.decoder.layers[2].cross_attn.W_k.weight, block.layer[1].EncDecAttention.k.weight),
             (ours.decoder.layers[2].cross_attn_residual.norm.weight, block.layer[1].layer_norm.weight),
             (ours.decoder.layers[2].feed_forward.linear2.weight, block.layer[2].DenseReluDense.wo.weight),
             (ours.encoder.layers[1].self_attn.W_q.weight, hf.encoder.block[1].layer[0].SelfAttention.q.weight),
             (ours.encoder_bias.table.weight,
              hf.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight),
             (ours.decoder_bias.table.weight,
              hf.decoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight),
             (ours.decoder.norm.weight, hf.decoder.final_layer_norm.weight),
             (ours.shared.weight, hf.shared.weight)]
    for a, b in pairs:
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(ours.encoder_bias.table.weight, ours.decoder_bias.table.weight)


def test_load_hf_t5_refuses_other_models():
    transformers = import_hf("transformers")
    ours = T5(T5Config.from_hf(hf_config()))
    with pytest.raises(ValueError, match=r"model must be a T5"):
        load_hf_t5(nn.Linear(2, 2), transformers.T5ForConditionalGeneration(hf_config()))
    for hf_class in (transformers.T5Model, transformers.T5EncoderModel):    # no lm_head
        with pytest.raises(ValueError, match=r"hf_model must be a T5ForConditionalGeneration.*tied"):
            load_hf_t5(ours, hf_class(hf_config()))
    untied = transformers.T5ForConditionalGeneration(hf_config())
    untied.lm_head.weight = nn.Parameter(untied.shared.weight.detach() + 1.0)
    with pytest.raises(ValueError, match=r"lm_head is tied to shared"):
        load_hf_t5(ours, untied)


@pytest.mark.parametrize("field, value, phrase", [
    ("d_ff", 48, r"has shape"),
    ("vocab_size", 65, r"has shape"),
    ("relative_attention_num_buckets", 16, r"has shape"),
    ("num_layers", 3, r"has weights our T5 has no place for"),
    ("num_decoder_layers", 2, r"hf_model has no"),
])
def test_load_hf_t5_refuses_other_sizes(field, value, phrase):
    transformers = import_hf("transformers")
    hf = transformers.T5ForConditionalGeneration(hf_config(**{field: value}))
    with pytest.raises(ValueError, match=rf"(?s){phrase}.*T5Config\.from_hf"):
        load_hf_t5(T5(T5Config.from_hf(hf_config())), hf)


def test_from_hf_refuses_what_we_do_not_implement():
    with pytest.raises(ValueError, match=r"d_kv \* num_heads must equal d_model"):
        T5Config.from_hf(hf_config(d_kv=16))
    with pytest.raises(ValueError, match=r"feed_forward_proj must be 'relu'.*gated-gelu"):
        T5Config.from_hf(hf_config(feed_forward_proj="gated-gelu"))
    with pytest.raises(ValueError, match=r"feed_forward_proj"):
        T5Config.from_hf(hf_config(feed_forward_proj="gelu"))
    with pytest.raises(ValueError, match=r"tie the output layer"):
        T5Config.from_hf(hf_config(tie_word_embeddings=False))             # T5 v1.1: no d^-1/2 rescaling


# ---------------------------------------------------------------- load_by_names

class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 3)


def test_load_by_names_copies_and_checks_every_name():
    theirs = {"x.w": torch.ones(3, 2), "x.b": torch.arange(3.0), "pooler.w": torch.ones(1)}
    names = {"a.weight": "x.w", "a.bias": "x.b"}
    model = load_by_names(Tiny(), theirs, names, "HINT", ignore=("pooler",))
    assert torch.equal(model.a.weight, torch.ones(3, 2)) and torch.equal(model.a.bias, torch.arange(3.0))
    with pytest.raises(ValueError, match=r"no Hugging Face name for our \['a.bias'\]: HINT"):
        load_by_names(Tiny(), theirs, {"a.weight": "x.w"}, "HINT", ignore=("pooler",))
    with pytest.raises(ValueError, match=r"hf_model has no 'x.c' for our 'a.bias': HINT"):
        load_by_names(Tiny(), theirs, {"a.weight": "x.w", "a.bias": "x.c"}, "HINT")
    with pytest.raises(ValueError, match=r"'x.w' has shape \(2, 3\), our 'a.weight' \(3, 2\): HINT"):
        load_by_names(Tiny(), {**theirs, "x.w": torch.ones(2, 3)}, names, "HINT", ignore=("pooler",))
    with pytest.raises(ValueError, match=r"no place for, e.g. \['pooler.w'\]: HINT"):
        load_by_names(Tiny(), theirs, names, "HINT")                       # not ignored: refused


# ---------------------------------------------------------------- causality and padding

def test_later_decoder_tokens_never_change_earlier_logits():
    model = random_t5(seed=6)
    src, tgt = token_ids(2, 7, seed=7), token_ids(2, 10, seed=8, low=0)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        base = model(src, tgt)
        for i in range(10):
            changed = tgt.clone()
            changed[:, i + 1:] = torch.randint(0, V, (2, 9 - i), generator=g)
            out = model(src, changed)
            assert max_diff(out[:, :i + 1], base[:, :i + 1]) < ATOL, i
            if i < 9:
                assert max_diff(out[:, i + 1:], base[:, i + 1:]) > 1e-6, i  # the change is seen after i


def test_a_decoder_mask_cannot_undo_the_causal_mask():
    model = random_t5(seed=10)
    src, tgt = token_ids(2, 6, seed=11), token_ids(2, 5, seed=12)
    with torch.no_grad():
        base = model(src, tgt)
        assert torch.equal(model(src, tgt, tgt_mask=torch.ones(2, 1, 5, 5, dtype=torch.bool)), base)
        with attention_maps(model) as maps:
            model(src, tgt)
    for i in range(len(model.decoder.layers)):
        assert maps[f"decoder.layers.{i}.self_attn"].shape == (2, 2, 5, 5)
        assert torch.all(maps[f"decoder.layers.{i}.self_attn"].triu(1) == 0)
        assert maps[f"decoder.layers.{i}.cross_attn"].shape == (2, 2, 5, 6)
    padded = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    padded[1, ..., 3:] = False                                              # a decoder padding mask is applied
    with torch.no_grad():
        out = model(src, tgt, tgt_mask=padded)
    assert max_diff(out[0], base[0]) < ATOL and max_diff(out[1, :3], base[1, :3]) < ATOL
    assert max_diff(out[1, 3:], base[1, 3:]) > 1e-6


def test_extra_padding_in_the_source_changes_nothing():
    model = random_t5(seed=13)
    src, tgt = token_ids(3, 8, seed=14), token_ids(3, 5, seed=15)
    src[1, 5:] = PAD
    src[2, 2:] = PAD
    real = src != PAD
    with torch.no_grad():
        logits = model(src, tgt)
        memory = model.encode(src)
        for extra in (1, 4, 30):                                            # past max_distance too
            longer = torch.cat([src, torch.full((3, extra), PAD)], dim=1)
            assert max_diff(model(longer, tgt), logits) < ATOL, extra
            assert max_diff(model.encode(longer)[:, :8][real], memory[real]) < ATOL, extra
        attend_all = model(src, tgt, src_mask=torch.ones(1, 1, 1, 8, dtype=torch.bool))
    assert max_diff(attend_all[0], logits[0]) < ATOL                        # row 0 has no padding
    assert max_diff(attend_all[1:], logits[1:]) > 1e-6                      # the padding mask does matter


def test_the_encoder_sees_the_whole_source_and_the_position_bias():
    model = random_t5(seed=16)
    src, tgt = token_ids(1, 6, seed=17), token_ids(1, 4, seed=18)
    with torch.no_grad():
        memory = model.encode(src)
        changed = src.clone()
        changed[0, 5] = 2 + (src[0, 5] - 1) % (V - 2)
        assert torch.all((model.encode(changed)[0, :5] - memory[0, :5]).abs().amax(-1) > 1e-6)   # bidirectional
        model.encoder_bias.table.weight.zero_()
        assert max_diff(model.encode(src), memory) > 1e-6                # the bias is used
        model.decoder_bias.table.weight.zero_()
        assert torch.isfinite(model(src, tgt)).all()


# ---------------------------------------------------------------- shift_right, token_cross_entropy

def test_shift_right():
    labels = torch.tensor([[5, 6, 7, 8], [9, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX], [4, 3, IGNORE_INDEX, 2]])
    before = labels.clone()
    assert shift_right(labels).tolist() == [[0, 5, 6, 7], [0, 9, 0, 0], [0, 4, 3, 0]]
    assert shift_right(labels, start_id=2, pad_id=3).tolist() == [[2, 5, 6, 7], [2, 9, 3, 3], [2, 4, 3, 3]]
    assert torch.equal(labels, before)                                      # the input is not modified
    assert shift_right(torch.tensor([[7]])).tolist() == [[0]]
    assert shift_right(labels.int()).dtype == torch.int32
    with pytest.raises(ValueError, match=r"\blabels\b"):
        shift_right(torch.tensor([5, 6]))
    with pytest.raises(ValueError, match=r"\blabels\b.*integer"):
        shift_right(torch.ones(2, 3))


def test_seq2seq_loss_ignores_minus_100():
    g = torch.Generator().manual_seed(19)
    logits = torch.randn(3, 4, 7, generator=g, dtype=DT)
    labels = torch.randint(0, 7, (3, 4), generator=g)
    labels[0, 2:] = IGNORE_INDEX
    labels[2, 0] = IGNORE_INDEX
    keep = labels != IGNORE_INDEX
    want = -logits.log_softmax(-1)[keep].gather(-1, labels[keep][:, None]).mean()
    loss = token_cross_entropy(logits, labels)
    assert abs(loss.item() - want.item()) < ATOL and loss.dtype == DT
    changed = logits.clone()
    changed[~keep] = 100 * torch.randn(int((~keep).sum()), 7, generator=g, dtype=DT)
    assert abs(token_cross_entropy(changed, labels).item() - loss.item()) < ATOL   # ignored positions do not count
    changed[0, 0, 1] += 3.0
    assert abs(token_cross_entropy(changed, labels).item() - loss.item()) > 1e-3
    with pytest.raises(ValueError, match=r"\blabels\b.*shape"):
        token_cross_entropy(logits, labels[:, :3])
    with pytest.raises(ValueError, match=r"\blogits\b"):
        token_cross_entropy(logits[0], labels[0])


# ---------------------------------------------------------------- t5_generate

def unconstrained_greedy(model, src, steps):
    """Argmax decoding one step at a time through model.forward, from pad_id, never stopping."""
    out = torch.full((src.size(0), 1), model.config.pad_id)
    with torch.no_grad():
        for _ in range(steps):
            out = torch.cat([out, model(src, out)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return out[:, 1:]


def generating_model():
    """A tiny random T5 (V = 12) whose greedy outputs vary: some tokens come early, some late, some never."""
    model = randomize(T5(small_config(vocab_size=12, num_layers=1)).double(), seed=1, std=0.5).eval()
    src = torch.randint(2, 12, (4, 7), generator=torch.Generator().manual_seed(7))
    src[3, 5:] = PAD
    return model, src


def with_eos(model, eos_id):
    model.config = dataclasses.replace(model.config, eos_id=eos_id)
    return model


def test_t5_generate_is_argmax_decoding_step_by_step():
    model, src = generating_model()
    free = unconstrained_greedy(model, src, 10)
    eos = next(e for e in range(2, 12) if not (free == e).any())            # an eos never produced
    out = t5_generate(with_eos(model, eos), src, 10)
    assert out.dtype == torch.long and torch.equal(out, free)
    assert len(free.unique()) > 2                                           # not a trivial constant sequence
    mask = (src != PAD)[:, None, None, :].clone()
    mask[0, ..., 4:] = False                                                # an explicit mask is used
    masked = t5_generate(model, src, 10, src_mask=mask)
    assert torch.equal(masked[1:], free[1:]) and not torch.equal(masked[0], free[0])


def test_t5_generate_stops_at_eos_and_pads_after_it():
    model, src = generating_model()
    free = unconstrained_greedy(model, src, 10)
    for eos in range(2, 12):
        hit = free == eos
        first = torch.where(hit.any(1), hit.float().argmax(1), torch.full((4,), 10))
        out = t5_generate(with_eos(model, eos), src, 10)
        length = int(first.max()) + 1 if bool(hit.any(1).all()) else 10
        assert out.shape == (4, min(length, 10)), eos
        for b in range(4):
            n = min(int(first[b]) + 1, out.size(1))
            assert torch.equal(out[b, :n], free[b, :n]), (eos, b)           # argmax up to and including eos
            assert torch.all(out[b, n:] == PAD), (eos, b)                   # pad_id after it
    # the scenarios above must include a row that stops while others go on, and an early stop of the batch
    firsts = {eos: [(free[b] == eos).nonzero()[0].item() if (free[b] == eos).any() else None for b in range(4)]
              for eos in range(2, 12)}
    assert any(None in f and any(x is not None and x < 8 for x in f) for f in firsts.values())
    assert any(None not in f and max(f) < 9 for f in firsts.values())


def test_t5_generate_early_stop_shape():
    model, src = generating_model()
    free = unconstrained_greedy(model, src[:1], 6)
    k = int((free[0] != free[0, 0]).float().argmax())                       # the first new token ...
    assert 0 < k < 5
    out = t5_generate(with_eos(model, int(free[0, k])), src[:1], 6)         # ... made the eos
    assert out.tolist() == [free[0, :k + 1].tolist()]                       # stopped right after it
    assert t5_generate(model, src[:1], 1).tolist() == [free[0, :1].tolist()]
    assert not model.training


# ---------------------------------------------------------------- sizes, initialisation, gradients, errors

def test_t5_small_has_60m_parameters():
    with torch.device("meta"):                                              # shapes only
        model = T5(T5Config())
    assert sum(p.numel() for p in model.parameters()) == 60_506_624
    assert not any("lm_head" in n or "output" in n for n, _ in model.named_parameters())
    assert all(p.bias is None for p in model.modules() if isinstance(p, nn.Linear))


def test_output_layer_is_tied_to_the_shared_embedding():
    model = random_t5(seed=20)
    src, tgt = token_ids(1, 4, seed=21, low=6), token_ids(1, 3, seed=22, low=6)
    with torch.no_grad():
        before = model(src, tgt)
        model.shared.weight[5] += 1.0                                       # id 5 is in no input
        after = model(src, tgt)
    assert max_diff(before[..., 5], after[..., 5]) > 1e-3
    torch.testing.assert_close(before[..., :5], after[..., :5], rtol=0, atol=0)
    seen = []
    hook = model.decoder.norm.register_forward_hook(lambda module, args, out: seen.append(out))
    with torch.no_grad():
        logits = model(src, tgt)
    hook.remove()
    assert max_diff(logits, seen[0] * 16 ** -0.5 @ model.shared.weight.T) < ATOL   # d^-1/2, then Eᵀ


def test_t5_initialisation():
    torch.manual_seed(0)
    d, h, d_ff = 64, 4, 256
    model = T5(T5Config(vocab_size=500, d_model=d, num_heads=h, d_ff=d_ff, num_layers=2, num_decoder_layers=2))
    params = dict(model.named_parameters())

    def std(suffix):
        return torch.cat([p.flatten() for n, p in params.items() if n.endswith(suffix)]).std().item()
    assert std("shared.weight") == pytest.approx(1.0, rel=0.05)
    assert std("W_q.weight") == pytest.approx((d * d // h) ** -0.5, rel=0.05)
    for suffix in ("W_k.weight", "W_v.weight", "W_o.weight", "linear1.weight"):
        assert std(suffix) == pytest.approx(d ** -0.5, rel=0.05), suffix
    assert std("linear2.weight") == pytest.approx(d_ff ** -0.5, rel=0.05)
    for name, p in params.items():
        if "norm" in name:
            assert torch.all(p == 1.0), name
    assert all(m.eps == 1e-6 for m in model.modules() if isinstance(m, RMSNorm))


def test_t5_initialisation_of_the_position_tables():
    torch.manual_seed(0)
    d = 64
    model = T5(T5Config(vocab_size=500, d_model=d, num_heads=4, d_ff=256, num_layers=2, num_decoder_layers=2))
    tables = torch.cat([model.encoder_bias.table.weight.flatten(), model.decoder_bias.table.weight.flatten()])
    assert tables.numel() == 2 * 32 * 4
    assert tables.std().item() == pytest.approx(d ** -0.5, rel=0.2)        # as documented, and as transformers does


def test_gradients_reach_every_parameter():
    torch.manual_seed(0)
    model = T5(small_config())
    src, labels = token_ids(3, 9, seed=23), token_ids(3, 6, seed=24)
    src[1, 6:] = PAD
    labels[2, 4:] = IGNORE_INDEX
    token_cross_entropy(model(src, shift_right(labels)), labels).backward()
    params = dict(model.named_parameters())
    assert len(params) == 5 + 2 * 8 + 2 * 13                               # shared, 2 tables, 2 norms; blocks
    for name, p in params.items():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name


def test_dropout_only_in_training():
    model = random_t5(seed=25, dropout=0.3)
    src, tgt = token_ids(2, 6, seed=26), token_ids(2, 4, seed=27)
    model.train()
    assert max_diff(model(src, tgt), model(src, tgt)) > 1e-6
    model.eval()
    torch.testing.assert_close(model(src, tgt), model(src, tgt), rtol=0, atol=0)


@pytest.mark.parametrize("kwargs, names", [
    (dict(d_model=15), r"d_model|num_heads"),
    (dict(num_layers=0), r"num_layers"),
    (dict(num_decoder_layers=True), r"num_decoder_layers"),
    (dict(num_buckets=3), r"num_buckets"),
    (dict(max_distance=1), r"max_distance"),
    (dict(dropout=1.0), r"dropout"),
    (dict(eps=0.0), r"eps"),
    (dict(pad_id=V), r"pad_id"),
    (dict(eos_id=-1), r"eos_id"),
])
def test_config_value_errors_name_the_field(kwargs, names):
    with pytest.raises(ValueError, match=rf"\b({names})\b"):
        small_config(**kwargs)


def test_forward_value_errors():
    model = random_t5(seed=28)
    src, tgt = token_ids(2, 5, seed=29), token_ids(2, 4, seed=30)
    with pytest.raises(ValueError, match=r"config must be a T5Config"):
        T5({"vocab_size": V})
    with pytest.raises(ValueError, match=r"src .*outside"):
        model(src + V, tgt)
    with pytest.raises(ValueError, match=r"tgt .*outside"):
        model(src, tgt + V)
    with pytest.raises(ValueError, match=r"\bsrc\b.*integer"):
        model(src.double(), tgt)
    with pytest.raises(ValueError, match=r"tgt must have the batch size"):
        model(src, tgt[:1])
    with pytest.raises(ValueError, match=r"\btgt_mask\b.*bool"):
        model(src, tgt, tgt_mask=torch.ones(2, 1, 4, 4))
    with pytest.raises(ValueError, match=r"\btgt_mask\b.*padding_mask"):
        model(src, tgt, tgt_mask=tgt != PAD)
    with pytest.raises(ValueError, match=r"\bsrc_mask\b.*bool"):
        model(src, tgt, src_mask=torch.ones(2, 1, 1, 5))
    with pytest.raises(ValueError, match=r"\bmemory\b"):
        model.decoder.layers[0](torch.zeros(2, 3, 16, dtype=DT))              # a decoder layer needs the memory
    with pytest.raises(ValueError, match=r"\bmax_new_tokens\b"):
        t5_generate(model, src, 0)


# ---------------------------------------------------------------- exercise: check_buckets

def test_check_buckets_accepts_the_library_function(capsys):
    check_buckets(relative_position_bucket)
    assert "correct" in capsys.readouterr().out


def ignores_direction(relative_position, bidirectional, num_buckets, max_distance):
    return relative_position_bucket(-relative_position.abs(), bidirectional, num_buckets, max_distance)


def no_cap(relative_position, bidirectional, num_buckets, max_distance):
    """Everything right but the clamp to the last bucket of a half."""
    import math
    n = num_buckets // 2 if bidirectional else num_buckets
    first = torch.where(relative_position > 0, n, 0) if bidirectional else torch.zeros_like(relative_position)
    distance = relative_position.abs() if bidirectional else (-relative_position).clamp(min=0)
    exact = n // 2
    far = exact + (torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact)
                   * (n - exact)).long()
    return first + torch.where(distance < exact, distance, far)


def test_check_buckets_rejects_wrong_functions():
    with pytest.raises(AssertionError, match=r"bidirectional=True.*offset 1 got bucket 1, expected 17.*upper half"):
        check_buckets(ignores_direction)
    with pytest.raises(AssertionError, match=r"capped at the last bucket"):
        check_buckets(no_cap)
    with pytest.raises(AssertionError, match=r"one bucket per offset"):
        check_buckets(lambda rp, bi, nb, md: relative_position_bucket(rp, bi, nb, md)[:-1])
    with pytest.raises(AssertionError, match=r"bidirectional=False"):     # right for the encoder only
        check_buckets(lambda rp, bi, nb, md: relative_position_bucket(rp, True, nb, md))


# ---------------------------------------------------------------- edge cases found while writing these tests

def test_max_distance_must_exceed_the_exact_buckets():
    with pytest.raises(ValueError, match=r"\bmax_distance\b"):
        relative_position_bucket(torch.tensor([8, -8, 20]), True, 32, 8)       # 0/0 in the log scale otherwise
    with pytest.raises(ValueError, match=r"\bmax_distance\b"):
        RelativePositionBias(4, bidirectional=False, num_buckets=32, max_distance=16)
    with pytest.raises(ValueError, match=r"\bmax_distance\b"):
        T5Config(vocab_size=50, d_model=16, num_heads=2, d_ff=32, num_layers=1, num_decoder_layers=1,
                 num_buckets=32, max_distance=16)
    assert relative_position_bucket(torch.tensor([100]), True, 32, 9).item() == 31   # just above: fine


def test_relative_position_bucket_refuses_float_offsets():
    with pytest.raises(ValueError, match=r"relative_position must be an integer tensor of offsets"):
        relative_position_bucket(torch.tensor([1.0, 2.0]))


def test_seq2seq_loss_edge_cases():
    logits = torch.randn(2, 3, 5, requires_grad=True)
    zero = token_cross_entropy(logits, torch.full((2, 3), IGNORE_INDEX))
    assert zero.item() == 0.0
    zero.backward()                                                            # a graph, zero gradients
    assert torch.equal(logits.grad, torch.zeros_like(logits))
    with pytest.raises(ValueError, match=r"labels must hold token ids in \[0, 4\]"):
        token_cross_entropy(logits, torch.tensor([[0, 1, 5], [0, 0, 0]]))
    with pytest.raises(ValueError, match=r"\blabels\b"):
        token_cross_entropy(logits, torch.zeros(2, 3))


def test_empty_sequences_name_the_argument():
    model = T5(small_config())
    with pytest.raises(ValueError, match=r"src must hold at least one position"):
        model(torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"tgt must hold at least one position"):
        model(torch.ones(2, 3, dtype=torch.long), torch.zeros(2, 0, dtype=torch.long))


# ---------------------------------------------------------------- incremental decoding (Chapter 7's cache)

@pytest.mark.parametrize("chunk", [1, 3])
def test_t5_decode_with_a_cache_equals_the_full_decode(chunk):
    model = random_t5(seed=21).eval()
    src, tgt = token_ids(2, 6, seed=22), token_ids(2, 7, seed=23)
    with torch.no_grad():
        memory, mask = model.encode(src), model.make_src_mask(src)
        full = model.decode(tgt, memory, mask)
        cache = model.new_cache()
        parts = [model.decode(tgt[:, s:s + chunk], memory, mask, cache=cache) for s in range(0, 7, chunk)]
    assert len(cache[0][0]) == 7
    assert max_diff(torch.cat(parts, 1), full) < ATOL


def test_t5_generate_with_and_without_the_cache_gives_the_same_tokens():
    model = random_t5(seed=24)
    src = token_ids(3, 5, seed=25)
    cached = t5_generate(model, src, 20)
    assert cached.size(1) >= 2 and torch.equal(cached, t5_generate(model, src, 20, use_cache=False))


def test_t5_has_the_transformers_encode_decode_generator_api():
    """As Chapter 7's Transformer: encode -> memory, decode -> hidden states, generator(hidden) -> logits."""
    model = random_t5(seed=21)
    src, tgt = token_ids(2, 6, seed=22), token_ids(2, 4, seed=23)
    src[1, 4:] = model.config.pad_id
    with torch.no_grad():
        memory = model.encode(src)
        mask = model.make_src_mask(src)
        assert isinstance(memory, torch.Tensor) and memory.shape == (2, 6, model.config.d_model)
        assert mask.shape == (2, 1, 1, 6) and torch.equal(mask[:, 0, 0], src != model.config.pad_id)
        hidden = model.decode(tgt, memory, mask)
        assert hidden.shape == (2, 4, model.config.d_model)
        assert torch.equal(model.lm_head(hidden), model(src, tgt))
        with pytest.raises(ValueError, match="src_mask is required"):                      # no silent 'no mask'
            model.decode(tgt, memory, None)
