"""Bad and edge-case inputs to Chapters 1-9's modules found by issue 26's probe: residual, data,
training and complexity.

Same pattern as tests/test_bad_inputs.py: each case is a row (id, call, expected), `expected` being
err(names, phrase) (a ValueError whose message names the user's argument and matches `phrase`) or OK (the call
asserts the documented result itself). TENSOR_CASES take the floating dtype and run on float32 and float64.

Documented results checked here:
- LabelSmoothingLoss: with label_smoothing > 0 a -inf logit of any class gives +inf (q gives every class
  mass label_smoothing / V, so the true cross-entropy is infinite, as nn.CrossEntropyLoss says); with
  label_smoothing = 0 a -inf non-target logit changes nothing (it gave nan: 0 * inf), a -inf target gives +inf.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import OK, err, table_tests

import transformer_lib.complexity as cx
import transformer_lib.data as data
import transformer_lib.multi_head as mh
import transformer_lib.residual as res
import transformer_lib.training as trn
from transformer_lib.model import TransformerConfig

D, H = 8, 2
PAD, BOS, EOS = 0, 1, 2
NAN, INF = float("nan"), float("inf")
INT = r"int"
BOOL = r"True or False"


def rand(*shape, dt=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dt)


def close(a, b):
    torch.testing.assert_close(a, b, equal_nan=True)


# ------------------------------------------------------------------------------------ LabelSmoothingLoss -inf
def logits_with(dt, where, value=-INF):
    logits = rand(3, 5, dt=dt)
    for r, c in where:
        logits[r, c] = value
    return logits


TARGET = torch.tensor([1, 2, 4])


def ls_zero_non_target_ninf(dt):
    """label_smoothing=0: a -inf non-target logit changes nothing (it gave nan); equals nn.CrossEntropyLoss."""
    logits = logits_with(dt, [(0, 3), (2, 0)]).requires_grad_()
    loss = trn.LabelSmoothingLoss(0.0, pad_id=PAD)(logits, TARGET)
    assert torch.isfinite(loss)
    close(loss, nn.CrossEntropyLoss(ignore_index=PAD)(logits, TARGET))
    loss.backward()
    assert torch.isfinite(logits.grad).all()


def ls_smoothing_non_target_ninf(dt):
    """label_smoothing > 0: q puts 0.1 / V on the -inf class, so the cross-entropy is +inf (documented)."""
    logits = logits_with(dt, [(0, 3)])
    loss = trn.LabelSmoothingLoss(0.1, pad_id=PAD)(logits, TARGET)
    assert loss == INF
    assert nn.CrossEntropyLoss(label_smoothing=0.1, ignore_index=PAD)(logits, TARGET) == INF


def ls_target_ninf(dt):
    """A -inf logit on the target itself: -log p(y) = +inf, never nan, for every label_smoothing."""
    for eps in (0.0, 0.1, 1.0):
        assert trn.LabelSmoothingLoss(eps, pad_id=PAD)(logits_with(dt, [(1, 2)]), TARGET) == INF, eps


def ls_padding_row_ignored(dt):
    """A padding position's logits are not read, even all -inf or nan."""
    logits = logits_with(dt, [(1, c) for c in range(5)], NAN)
    target = torch.tensor([1, PAD, 4])
    close(trn.LabelSmoothingLoss(0.1, pad_id=PAD)(logits, target),
          nn.CrossEntropyLoss(label_smoothing=0.1, ignore_index=PAD)(logits[[0, 2]], target[[0, 2]]))


def ls_one_matches_torch(dt):
    logits = rand(3, 5, dt=dt)
    close(trn.LabelSmoothingLoss(1.0, pad_id=PAD)(logits, TARGET),
          nn.CrossEntropyLoss(label_smoothing=1.0, ignore_index=PAD)(logits, TARGET))


# ------------------------------------------------------------------------------------------- the tables
TENSOR_CASES = [
    ("LabelSmoothingLoss/ok-ls0-non-target-ninf-finite", ls_zero_non_target_ninf, OK),
    ("LabelSmoothingLoss/ok-ls-non-target-ninf-is-inf", ls_smoothing_non_target_ninf, OK),
    ("LabelSmoothingLoss/ok-target-ninf-is-inf", ls_target_ninf, OK),
    ("LabelSmoothingLoss/ok-padding-row-not-read", ls_padding_row_ignored, OK),
    ("LabelSmoothingLoss/ok-ls1-matches-torch", ls_one_matches_torch, OK),
    ("LayerNorm/ok-eps-large-finite", lambda dt: torch.testing.assert_close(
        res.LayerNorm(D, eps=1e30).to(dt)(rand(2, D, dt=dt)), torch.zeros(2, D, dtype=dt), atol=1e-12, rtol=0), OK),
]


def collate_pairs(*pairs, pad_id=PAD):
    return data.collate([(torch.tensor(s), torch.tensor(t)) for s, t in pairs], pad_id=pad_id)


def collate_prepadded():
    """Padding added before collate (trailing pad_id) is fine: the masks hide exactly the padding."""
    b = collate_pairs(([5, 6, PAD, PAD], [BOS, 7, EOS, PAD]), ([8, 9, 10], [BOS, 7, 8, EOS]))
    assert b.src_mask[:, 0, 0].tolist() == [[True, True, False, False], [True, True, True, False]]
    assert b.tgt_mask[:, 0, 0].tolist() == [[True, True, True], [True, True, True]]


def collate_other_pad_id():
    """pad_id=4, an id no example uses: padding gets 4 and the masks hide exactly it."""
    b = collate_pairs(([5, 6], [BOS, 7, EOS]), ([8, 9, 10], [BOS, 7, 8, 9, EOS]), pad_id=4)
    assert b.src.tolist() == [[5, 6, 4], [8, 9, 10]]
    assert b.src_mask[:, 0, 0].tolist() == [[True, True, False], [True, True, True]]
    assert b.tgt_in.tolist() == [[BOS, 7, EOS, 4], [BOS, 7, 8, 9]]


def collate_tokenizer():
    tok = data.CharTokenizer("abcdefg")
    ex = [(torch.tensor(tok.encode("abc")), torch.tensor([tok.bos_id, *tok.encode("gfe"), tok.eos_id]))]
    b = data.collate(ex, pad_id=tok.pad_id)
    assert b.src_mask.all() and b.tgt_mask.all()


CFG = TransformerConfig(10, 10, d_model=8, num_heads=2, d_ff=16, num_encoder_layers=1, num_decoder_layers=1)
POSITIVE = r"finite numbers > 0"

PLAIN_CASES = [
    # --- LayerNorm eps
    ("LayerNorm/eps=inf", lambda: res.LayerNorm(D, eps=INF), err("eps", r"\(0, inf\)")),
    ("LayerNorm/eps=-inf", lambda: res.LayerNorm(D, eps=-INF), err("eps", r"\(0, inf\)")),
    ("LayerNorm/eps=nan", lambda: res.LayerNorm(D, eps=NAN), err("eps", r"\(0, inf\)")),
    ("LayerNorm/eps=0", lambda: res.LayerNorm(D, eps=0.0), err("eps", r"\(0, inf\)")),
    ("LayerNorm/eps=-1", lambda: res.LayerNorm(D, eps=-1.0), err("eps", r"\(0, inf\)")),

    # --- collate: pad_id must not be a real token
    ("collate/pad_id-real-src-token", lambda: collate_pairs(([5, 4, 6], [BOS, 7, EOS]), pad_id=4), err("pad_id", "real token.*source")),
    ("collate/pad_id-real-tgt-token", lambda: collate_pairs(([5, 6], [BOS, 4, 7, EOS]), pad_id=4), err("pad_id", "real token.*target")),
    ("collate/pad_id-real-token-2nd-example", lambda: collate_pairs(([5], [BOS, 7, EOS]), ([4, 6], [BOS, EOS]), pad_id=4), err("pad_id", "example 1")),
    ("collate/pad_id-before-eos", lambda: collate_pairs(([5, 6], [BOS, 7, 4, EOS]), pad_id=4), err("pad_id", "real token")),
    ("collate/pad_id-is-bos", lambda: collate_pairs(([5, 6], [BOS, 7, EOS]), pad_id=BOS), err("pad_id", "BOS")),
    ("collate/ok-prepadded", collate_prepadded, OK),
    ("collate/ok-other-pad_id", collate_other_pad_id, OK),
    ("collate/ok-tokenizer-pad_id", collate_tokenizer, OK),

    # --- complexity: sizes are ints >= 1 (widths) or >= 0 (counts of rows, positions, batch)
    ("mha_params/d_model=-8", lambda: cx.mha_params(-8), err("d_model", INT)),
    ("mha_params/d_model=0", lambda: cx.mha_params(0), err("d_model", INT)),
    ("mha_params/d_model-float", lambda: cx.mha_params(8.5), err("d_model", INT)),
    ("mha_params/bias-str", lambda: cx.mha_params(8, bias="no"), err("bias", BOOL)),
    ("mha_params/ok", lambda: None if cx.mha_params(8) == sum(p.numel() for p in mh.MultiHeadAttention(8, 2).parameters()) else pytest.fail("count"), OK),
    ("ffn_params/d_ff=-1", lambda: cx.ffn_params(8, -1), err("d_ff", INT)),
    ("ffn_params/d_model-float", lambda: cx.ffn_params(8.0, 16), err("d_model", INT)),
    ("layer_norm_params/d_model=-1", lambda: cx.layer_norm_params(-1), err("d_model", INT)),
    ("layer_norm_params/d_model-bool", lambda: cx.layer_norm_params(True), err("d_model", INT)),
    ("linear_flops/tokens=-1", lambda: cx.linear_flops(-1, 8, 8), err("tokens", INT)),
    ("linear_flops/tokens-float", lambda: cx.linear_flops(2.5, 8, 8), err("tokens", INT)),
    ("linear_flops/d_in=0", lambda: cx.linear_flops(4, 0, 8), err("d_in", INT)),
    ("linear_flops/d_out=-8", lambda: cx.linear_flops(4, 8, -8), err("d_out", INT)),
    ("linear_flops/ok-tokens=0", lambda: None if cx.linear_flops(0, 8, 8) == 0 else pytest.fail("0 tokens"), OK),
    ("attention_flops/batch=-1", lambda: cx.attention_flops(-1, 4, 4, 8), err("batch", INT)),
    ("attention_flops/n_q-float", lambda: cx.attention_flops(1, 4.0, 4, 8), err("n_q", INT)),
    ("attention_flops/n_k=-4", lambda: cx.attention_flops(1, 4, -4, 8), err("n_k", INT)),
    ("attention_flops/d_model=0", lambda: cx.attention_flops(1, 4, 4, 0), err("d_model", INT)),
    ("mha_flops/n_q=-2", lambda: cx.mha_flops(1, -2, 4, 8), err("n_q", INT)),
    ("mha_flops/d_model-float", lambda: cx.mha_flops(1, 2, 4, 8.0), err("d_model", INT)),
    ("mha_flops/ok-empty-batch", lambda: None if cx.mha_flops(0, 4, 4, 8) == 0 else pytest.fail("B = 0"), OK),
    ("ffn_flops/tokens=-3", lambda: cx.ffn_flops(-3, 8, 16), err("tokens", INT)),
    ("ffn_flops/d_ff=0", lambda: cx.ffn_flops(3, 8, 0), err("d_ff", INT)),
    ("transformer_flops/backward-str", lambda: cx.transformer_flops(CFG, 1, 3, 3, backward="no"), err("backward", BOOL)),
    ("transformer_flops/fused-str", lambda: cx.transformer_flops(CFG, 1, 3, 3, backward=True, fused="False"), err("fused", BOOL)),
    ("transformer_flops/tgt_len=-1", lambda: cx.transformer_flops(CFG, 1, 3, -1), err("tgt_len", INT)),
    ("transformer_flops/batch-float", lambda: cx.transformer_flops(CFG, 1.5, 3, 3), err("batch", INT)),
    ("explicit_attention_saved_bytes/n_q=-1", lambda: cx.explicit_attention_saved_bytes(2, -1, 4, 8), err("n_q", INT)),
    ("explicit_attention_saved_bytes/d_k=0", lambda: cx.explicit_attention_saved_bytes(2, 4, 4, 0), err("d_k", INT)),
    ("explicit_attention_saved_bytes/element_size=0", lambda: cx.explicit_attention_saved_bytes(2, 4, 4, 8, element_size=0), err("element_size", INT)),
    ("explicit_attention_saved_bytes/masked-str", lambda: cx.explicit_attention_saved_bytes(2, 4, 4, 8, masked="yes"), err("masked", BOOL)),
    ("explicit_attention_saved_bytes/batch_heads-float", lambda: cx.explicit_attention_saved_bytes(2.0, 4, 4, 8), err("batch_heads", INT)),
    ("fused_attention_saved_bytes/n_k=-1", lambda: cx.fused_attention_saved_bytes(2, 4, -1, 8), err("n_k", INT)),
    ("fused_attention_saved_bytes/element_size-float", lambda: cx.fused_attention_saved_bytes(2, 4, 4, 8, element_size=4.0), err("element_size", INT)),
    ("fused_attention_saved_bytes/ok-zero-heads", lambda: None if cx.fused_attention_saved_bytes(0, 4, 4, 8) == 0 else pytest.fail("0"), OK),
    ("saved_tensor_bytes/exclude-not-tensors", lambda: cx.saved_tensor_bytes(lambda: None, exclude=[1, 2]), err("exclude", "tensors")),
    ("saved_tensor_bytes/ok-exclude-one-tensor", lambda: None if cx.saved_tensor_bytes(lambda: (w := torch.ones(3, requires_grad=True)) * w, exclude=torch.ones(1)) == 12 else pytest.fail("bytes"), OK),
    ("loglog_slope/nan-x", lambda: cx.loglog_slope([1, NAN, 4], [1, 2, 3]), err("xs", POSITIVE)),
    ("loglog_slope/inf-y", lambda: cx.loglog_slope([1, 2, 4], [1, INF, 3]), err("ys", POSITIVE)),
    ("loglog_slope/nan-y", lambda: cx.loglog_slope([1, 2, 4], [1, 2, NAN]), err("ys", POSITIVE)),
    ("loglog_slope/negative-x", lambda: cx.loglog_slope([-1, 2], [1, 2]), err("xs", POSITIVE)),
    ("loglog_slope/zero-y", lambda: cx.loglog_slope([1, 2], [0, 2]), err("ys", POSITIVE)),
    ("loglog_slope/str", lambda: cx.loglog_slope(["1", "2"], [1, 2]), err("xs", POSITIVE)),
    ("loglog_slope/bool", lambda: cx.loglog_slope([1, 2], [True, 2]), err("ys", POSITIVE)),
    ("loglog_slope/none", lambda: cx.loglog_slope([1, 2], [None, 2]), err("ys", POSITIVE)),
    ("loglog_slope/one-distinct-x", lambda: cx.loglog_slope([2, 2], [1, 2]), err("xs", "two different")),
    ("loglog_slope/ok-numpy", lambda: None if math.isclose(cx.loglog_slope(np.array([1.0, 2.0, 4.0]), np.array([3, 12, 48])), 2.0) else pytest.fail("slope"), OK),
]


# ------------------------------------------------- complexity: transformer_params, count_flops, median_time
def params_equal_model(tgt_vocab=10, **kw):
    """transformer_params(config) == the parameters of Transformer(config): tied or not, with or without final norms."""
    from transformer_lib.model import Transformer
    config = TransformerConfig(10, tgt_vocab, d_model=8, num_heads=2, d_ff=16, num_encoder_layers=2, num_decoder_layers=1, **kw)
    want = sum(p.numel() for p in Transformer(config).parameters())
    assert cx.transformer_params(config) == want, (kw, cx.transformer_params(config), want)


def count_flops_products(dt):
    """Two flops per multiply-add: (4, 5) @ (5, 3) is 120, a Linear(8, 16) on 3 rows 768 (its bias is not
    counted), and a function without products 0."""
    assert cx.count_flops(torch.matmul, rand(4, 5, dt=dt), rand(5, 3, dt=dt)) == 2 * 4 * 5 * 3
    assert cx.count_flops(nn.Linear(8, 16).to(dt), rand(3, 8, dt=dt)) == 2 * 3 * 8 * 16
    assert cx.count_flops(torch.relu, rand(3, 8, dt=dt)) == 0
    assert cx.count_flops(lambda x, *, y: x @ y, rand(2, 3, dt=dt), y=rand(3, 2, dt=dt)) == 2 * 2 * 3 * 2


def median_time_calls():
    """fn runs warmup + repeats times; the result is the median of the timed calls, a float >= 0."""
    calls = []
    t = cx.median_time(lambda: calls.append(1), repeats=3, warmup=2)
    assert len(calls) == 5 and isinstance(t, float) and t >= 0


def median_time_is_median():
    """With a clock that gives the three timed calls 1, 5 and 2 seconds, the median is 2 (not the mean)."""
    ticks = iter([0.0, 1.0, 10.0, 15.0, 20.0, 22.0])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cx.time, "perf_counter", lambda: next(ticks))
        assert cx.median_time(lambda: None, repeats=3, warmup=0) == 2.0


TENSOR_CASES += [
    ("count_flops/ok-products-counted", count_flops_products, OK),
]

PLAIN_CASES += [
    ("transformer_params/config-None", lambda: cx.transformer_params(None), err("config", "TransformerConfig")),
    ("transformer_params/config-dict", lambda: cx.transformer_params({"d_model": 8}), err("config", "TransformerConfig")),
    ("transformer_params/config-model", lambda: cx.transformer_params(nn.Linear(2, 2)), err("config", "TransformerConfig")),
    ("transformer_params/ok-tied", lambda: params_equal_model(), OK),
    ("transformer_params/ok-untied", lambda: params_equal_model(12, tie_embeddings=False), OK),
    ("transformer_params/ok-no-final-norm", lambda: params_equal_model(final_norm=False), OK),
    ("transformer_params/ok-base-closed-form", lambda: None if cx.transformer_params(TransformerConfig(37000, 37000, d_model=512, num_heads=8, d_ff=2048)) == 63_084_544 else pytest.fail("base"), OK),
    ("count_flops/fn-int", lambda: cx.count_flops(3), err("fn", "callable")),
    ("count_flops/fn-tensor", lambda: cx.count_flops(torch.ones(2, 2), torch.ones(2, 2)), err("fn", "callable")),
    ("count_flops/fn-None", lambda: cx.count_flops(None), err("fn", "callable")),
    ("median_time/fn-str", lambda: cx.median_time("f"), err("fn", "callable")),
    ("median_time/repeats=0", lambda: cx.median_time(lambda: None, repeats=0), err("repeats", INT)),
    ("median_time/repeats=-1", lambda: cx.median_time(lambda: None, repeats=-1), err("repeats", INT)),
    ("median_time/repeats-bool", lambda: cx.median_time(lambda: None, repeats=True), err("repeats", INT)),
    ("median_time/repeats-float", lambda: cx.median_time(lambda: None, repeats=3.0), err("repeats", INT)),
    ("median_time/warmup=-1", lambda: cx.median_time(lambda: None, warmup=-1), err("warmup", INT)),
    ("median_time/warmup-float", lambda: cx.median_time(lambda: None, warmup=0.5), err("warmup", INT)),
    ("median_time/ok-calls-counted", median_time_calls, OK),
    ("median_time/ok-median-not-mean", median_time_is_median, OK),
    ("median_time/ok-warmup=0", lambda: None if cx.median_time(lambda: None, repeats=1, warmup=0) >= 0 else pytest.fail("time"), OK),
]


test_case_ids_unique, test_tensor_case, test_plain_case = table_tests(TENSOR_CASES, PLAIN_CASES)
