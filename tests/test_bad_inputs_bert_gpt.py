"""Bad and edge-case inputs to Chapters 10 and 11's modules: bert, classifier, gpt, sampling (issue 26).

The same table pattern as tests/test_bad_inputs.py: each case is (id, call, expected), `expected` being
  err(names, phrase): a ValueError whose message names the user's argument (one of `names`) and matches
                      `phrase`, or
  OK:                 a valid edge case; the call asserts the documented result itself.
TENSOR_CASES take the floating dtype and run on float32 and float64; PLAIN_CASES take none.
Covered here: the caller's train/eval mode is restored (also on an error), eps that is inf or NaN, string
flags, float special ids, cls_id == pad_id, out-of-vocabulary ids, sampling at an infinite temperature with
top_k, one-token windows, a diverging or empty fit, length-0 inputs, and left-padded GPT rows.
"""

import functools
import math
import random

import pytest
import torch
import torch.nn as nn
from helpers import OK, err, hf, table_tests

import transformer_lib.bert as brt
import transformer_lib.classifier as clf
import transformer_lib.gpt as gpt_mod
import transformer_lib.sampling as smp
from transformer_lib.attention import causal_mask

D, H, FF, V, C = 8, 2, 16, 11, 3        # d_model, heads, d_ff, vocabulary, classes of the small models below
PAD = 0


INT, BOOL, VOCAB, INTEGER = r"int", r"True or False", r"vocab|outside", r"integer"
POSITIVE = r"\(0, inf\)|number"          # check_float for eps / lr: "must lie in (0, inf)" or "must be a number"


def ids(*shape, low=1, high=V, seed=0):
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed))


def rand(*shape, dt=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dt)


def shape_is(t, *shape):
    assert tuple(t.shape) == shape, f"shape {tuple(t.shape)}, expected {shape}"
    return t


def bert_config(**kw):
    return brt.BertConfig(**{"vocab_size": V, "d_model": D, "num_layers": 1, "num_heads": H, "d_ff": FF,
                             "max_len": 8, **kw})


def gpt(dt=torch.float64, seed=0, dropout=0.1):
    """A fresh tiny GPT (max_len 8) with weights of dtype dt, in eval mode."""
    torch.manual_seed(seed)
    config = gpt_mod.GPTConfig(vocab_size=V, max_len=8, d_model=D, num_layers=2, num_heads=H, d_ff=FF,
                               dropout=dropout)
    model = gpt_mod.GPT(config).to(dt).eval()
    with torch.no_grad():                                      # larger weights: positions matter visibly
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def classifier(dt=torch.float64, **kw):
    torch.manual_seed(0)
    return clf.SequenceClassifier(clf.ClassifierConfig(V, C, **{"d_model": D, "num_heads": H, "d_ff": FF, "num_layers": 1, **kw})).to(dt).eval()


@functools.cache
def shared_gpt(dt):
    return gpt(dt)


def failing_hook(*_):
    raise RuntimeError("boom")


def raises_inside(model):
    """model with a forward hook that raises: the call fails after it switched the mode."""
    return model.register_forward_hook(failing_hook)


# ------------------------------------------------------------------------- the caller's mode is restored
def mode_kept(run, model):
    """run(model) in train and in eval mode: the model comes back in the mode it went in."""
    for training in (True, False):
        model.train(training)
        run(model)
        assert model.training == training, f"mode {training} not restored"


def mode_kept_on_error(run, model):
    handle = raises_inside(model)
    try:
        model.train()
        with pytest.raises(RuntimeError, match="boom"):
            run(model)
        assert model.training, "train mode not restored after an exception"
    finally:
        handle.remove()


def generate_same_in_train_mode(dt):
    model, prompt = gpt(dt), ids(2, 3)
    want = smp.generate(model.eval(), prompt, 4, temperature=0)
    got = smp.generate(model.train(), prompt, 4, temperature=0)
    assert model.training and torch.equal(got, want)           # dropout off inside, train mode back after


def sequence_nll_same_in_train_mode(dt):
    model, x = gpt(dt), ids(12)
    want = gpt_mod.sequence_nll(model.eval(), x, 4)
    got = gpt_mod.sequence_nll(model.train(), x, 4)
    assert model.training and got == want


def predict_same_in_train_mode(dt):
    model, x = classifier(dt), ids(6, 5)
    want = clf.predict(model.eval(), x)
    got = clf.predict(model.train(), x)
    assert model.training and torch.equal(got, want)


def fit_run(model, steps=2, **kw):
    tokens, labels = ids(8, 5), torch.arange(8) % C
    return clf.fit(model, clf.classification_loss, clf.random_batches(tokens, labels, batch_size=4),
                   steps=steps, **{"progress": False, **kw})


def fit_evaluate_in_eval_mode(dt):
    model, seen = classifier(dt).train(), []
    fit_run(model, steps=3, evaluate=lambda m: seen.append(m.training) or 0.0, eval_every=1)
    assert seen == [False] * 3 and model.training


# ------------------------------------------------------------------------------------- sampling numerics
def draws(logits, n=300, **kw):
    g = torch.Generator().manual_seed(0)
    return torch.stack([smp.sample_next(logits, generator=g, **kw) for _ in range(n)], 1)   # (B, n)


def inf_temperature_respects_top_k(dt, k):
    logits = rand(3, V, dt=dt) * 3
    top = logits.topk(k, -1).indices
    out = draws(logits, temperature=math.inf, top_k=k)
    for b in range(3):
        assert set(out[b].tolist()) == set(top[b].tolist()), (out[b].unique(), top[b])   # all k, nothing else
    if k > 1:                                                   # uniform: each of k tokens about n / k times
        counts = torch.stack([(out == t[:, None]).sum(1) for t in top.T], 1)
        assert counts.min() > 300 / k * 0.6


def huge_temperature_respects_top_k(dt):
    logits = rand(3, V, dt=dt)
    assert torch.equal(draws(logits, 50, temperature=1e300, top_k=1), logits.argmax(-1, keepdim=True).expand(3, 50))


def banned_tokens_never_drawn(dt):
    logits = rand(2, V, dt=dt)
    logits[:, :5] = float("-inf")
    for temperature in (0.5, 1.0, math.inf):
        assert draws(logits, 100, temperature=temperature).min() >= 5


def temperature_one_unchanged_with_top_k(dt):
    """top_k now filters the logits before the temperature: at temperature 1 the draws are as before."""
    logits = rand(4, V, dt=dt)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    probs = smp.filter_logits(logits.float(), top_k=4).softmax(-1)
    want = torch.stack([torch.multinomial(probs, 1, generator=g1).squeeze(-1) for _ in range(20)])
    got = torch.stack([smp.sample_next(logits, top_k=4, generator=g2) for _ in range(20)])
    assert torch.equal(got, want)


# ------------------------------------------------------------------------------------------ fit stops
def diverging_loss(step_nan):
    calls = []

    def loss_fn(model, batch):
        calls.append(1)
        loss = clf.classification_loss(model, batch)
        return loss * float("nan") if len(calls) == step_nan else loss
    return loss_fn


def fit_stops_on_nan(dt):
    model = classifier(dt)
    with pytest.raises(ValueError, match=r"(?s)loss is nan at step 3 of 5"):
        clf.fit(model, diverging_loss(3), clf.random_batches(ids(8, 5), torch.arange(8) % C, batch_size=4),
                steps=5, progress=False)
    assert all(torch.isfinite(p).all() for p in model.parameters())   # the NaN step was not applied
    assert not model.training                                          # mode restored after the error


def fit_huge_lr_fails_loudly(dt):
    model = classifier(dt)
    with pytest.raises(ValueError, match=r"(?s)loss is (nan|inf) at step \d+.*learning rate"):
        fit_run(model, steps=50, lr=1e30)


# ------------------------------------------------------------------------------------- length-0 inputs
def bert_empty(dt, add_pooler):
    model = brt.BertModel(bert_config(), add_pooler=add_pooler).to(dt).eval()
    assert shape_is(model(torch.zeros(2, 0, dtype=torch.long)), 2, 0, D).dtype == dt


def mlm_empty(dt):
    shape_is(brt.BertForMaskedLM(bert_config()).to(dt).eval()(torch.zeros(2, 0, dtype=torch.long)), 2, 0, V)


def classifier_empty(dt, pooling):
    model = classifier(dt, pooling=pooling)
    out = model(torch.zeros(2, 0, dtype=torch.long))
    assert torch.isfinite(shape_is(out, 2, C)).all()
    if pooling != "cls":                                         # no real token: pools to zeros -> the bias
        torch.testing.assert_close(out, model.head.bias.expand(2, C), rtol=0, atol=0)
    else:                                                        # [CLS] alone: the same as a row of padding
        torch.testing.assert_close(out, model(torch.zeros(2, 3, dtype=torch.long)), rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------- left-padded GPT rows
def left_padded_positions(keep):
    return (keep.long().cumsum(-1) - 1).clamp(min=0)


def gpt_left_padding_equals_alone(dt):
    model, tol = gpt(dt), (1e-12 if dt == torch.float64 else 1e-5)
    rows = [ids(5, seed=1), ids(3, seed=2), ids(1, seed=3)]
    T = 5
    batch = torch.stack([torch.cat([torch.full((T - len(r),), PAD), r]) for r in rows])
    keep = torch.stack([torch.arange(T) >= T - len(r) for r in rows])
    with torch.no_grad():
        together = model(batch, keep[:, None, None, :], position_ids=left_padded_positions(keep))
        unshifted = model(batch, keep[:, None, None, :])
        for i, r in enumerate(rows):
            alone = model(r[None])[0]
            assert (together[i, T - len(r):] - alone).abs().max() < tol
        assert (unshifted[1, 2:] - model(rows[1][None])[0]).abs().max() > 1e-3   # without positions: shifted


def gpt_left_padding_with_cache(dt):
    """Incremental decoding of a left-padded batch, positions from the growing key mask, equals each row alone."""
    model, tol = gpt(dt), (1e-12 if dt == torch.float64 else 1e-5)
    r0, r1 = ids(5, seed=4), ids(2, seed=5)
    batch = torch.stack([r0, torch.cat([torch.full((3,), PAD), r1])])
    keep = torch.tensor([[True] * 5, [False] * 3 + [True] * 2])
    cache = model.new_cache()
    with torch.no_grad():
        out = [model(batch[:, :3], keep[:, None, None, :3], cache=cache, position_ids=left_padded_positions(keep[:, :3]))]
        for j in (3, 4):
            out.append(model(batch[:, j:j + 1], keep[:, None, None, :j + 1], cache=cache,
                             position_ids=left_padded_positions(keep[:, :j + 1])[:, -1:]))
        out = torch.cat(out, 1)
        assert (out[0] - model(r0[None])[0]).abs().max() < tol
        assert (out[1, 3:] - model(r1[None])[0]).abs().max() < tol


def generate_left_padded_equals_alone(dt, use_cache):
    model = gpt(dt)
    rows = [ids(4, seed=6), ids(2, seed=7), ids(1, seed=8)]
    batch = torch.stack([torch.cat([torch.full((4 - len(r),), PAD), r]) for r in rows])
    keep = batch != PAD
    together = smp.generate(model, batch, 4, temperature=0, use_cache=use_cache, prompt_mask=keep)
    for i, r in enumerate(rows):
        assert torch.equal(together[i], smp.generate(model, r[None], 4, temperature=0)[0]), i


TENSOR_CASES = [
    # --- the caller's mode (one rule: eval inside, the previous mode restored on exit, also on an error)
    ("generate/mode-kept", lambda dt: mode_kept(lambda m: smp.generate(m, ids(2, 3), 2), gpt(dt)), OK),
    ("generate/mode-kept-on-error", lambda dt: mode_kept_on_error(lambda m: smp.generate(m, ids(2, 3), 2), gpt(dt)), OK),
    ("generate/no-dropout-in-train-mode", generate_same_in_train_mode, OK),
    ("sequence_nll/mode-kept", lambda dt: mode_kept(lambda m: gpt_mod.sequence_nll(m, ids(10), 4), gpt(dt)), OK),
    ("sequence_nll/mode-kept-on-error", lambda dt: mode_kept_on_error(lambda m: gpt_mod.sequence_nll(m, ids(10), 4), gpt(dt)), OK),
    ("sequence_nll/no-dropout-in-train-mode", sequence_nll_same_in_train_mode, OK),
    ("predict/mode-kept", lambda dt: mode_kept(lambda m: clf.predict(m, ids(4, 5)), classifier(dt)), OK),
    ("predict/mode-kept-on-error", lambda dt: mode_kept_on_error(lambda m: clf.predict(m, ids(4, 5)), classifier(dt)), OK),
    ("predict/no-dropout-in-train-mode", predict_same_in_train_mode, OK),
    ("fit/mode-kept", lambda dt: mode_kept(fit_run, classifier(dt)), OK),
    ("fit/mode-kept-on-error", lambda dt: mode_kept_on_error(fit_run, classifier(dt)), OK),
    ("fit/evaluate-in-eval-mode", fit_evaluate_in_eval_mode, OK),
    # --- fit stops when the loss is not finite
    ("fit/nan-loss-stops", fit_stops_on_nan, OK),
    ("fit/lr=1e30-fails-loudly", fit_huge_lr_fails_loudly, OK),
    # --- sampling at extreme temperatures
    ("sample_next/temperature=inf-top_k=1", lambda dt: inf_temperature_respects_top_k(dt, 1), OK),
    ("sample_next/temperature=inf-top_k=3", lambda dt: inf_temperature_respects_top_k(dt, 3), OK),
    ("sample_next/temperature=1e300-top_k=1", huge_temperature_respects_top_k, OK),
    ("sample_next/banned-tokens-never-drawn", banned_tokens_never_drawn, OK),
    ("sample_next/temperature=1-top_k-unchanged", temperature_one_unchanged_with_top_k, OK),
    ("sample_next/temperature=nan", lambda dt: smp.sample_next(rand(2, V, dt=dt), temperature=math.nan), err("temperature", r"\[0")),
    ("sample_next/nan-logits", lambda dt: smp.sample_next(rand(2, V, dt=dt).index_fill(1, torch.tensor([3]), math.nan)), err("logits", "NaN")),
    ("sample_next/+inf-logit", lambda dt: smp.sample_next(rand(2, V, dt=dt).index_fill(1, torch.tensor([3]), math.inf)), err("logits", r"\+inf")),
    ("sample_next/all-inf-row", lambda dt: smp.sample_next(torch.full((2, V), -math.inf, dtype=dt)), err("logits", "finite")),
    ("sample_next/1d-logits", lambda dt: smp.sample_next(rand(V, dt=dt)), err("logits", r"\(B, V\)")),
    ("sample_next/ok-greedy-ignores-filters", lambda dt: None if torch.equal(smp.sample_next(rand(2, V, dt=dt), temperature=0, top_k=1, top_p=0.1), rand(2, V, dt=dt).argmax(-1)) else pytest.fail("argmax"), OK),
    # --- length 0
    ("BertModel.pooler_output/S=0", lambda dt: brt.BertModel(bert_config()).to(dt).pooler_output(torch.zeros(2, 0, D, dtype=dt)), err("hidden", "S=0")),
    ("BertClassifier/S=0", lambda dt: brt.BertClassifier(bert_config(), 2).to(dt).eval()(torch.zeros(2, 0, dtype=torch.long)), err("tokens", "S=0")),
    ("BertModel/ok-S=0-without-pooler", lambda dt: bert_empty(dt, False), OK),
    ("BertModel/ok-S=0-with-pooler", lambda dt: bert_empty(dt, True), OK),
    ("BertModel.pooler_output/no-pooler", lambda dt: brt.BertModel(bert_config(), add_pooler=False).to(dt).pooler_output(rand(2, 3, D, dt=dt)), err("pooler", "add_pooler=False")),
    ("BertForMaskedLM/ok-S=0", mlm_empty, OK),
    ("SequenceClassifier/ok-S=0-cls", lambda dt: classifier_empty(dt, "cls"), OK),
    ("SequenceClassifier/ok-S=0-mean", lambda dt: classifier_empty(dt, "mean"), OK),
    ("SequenceClassifier/ok-S=0-max", lambda dt: classifier_empty(dt, "max"), OK),
    ("pool/cls-S=0", lambda dt: clf.pool(rand(2, 0, D, dt=dt), torch.zeros(2, 0, dtype=torch.bool), "cls"), err("hidden", "S=0")),
    ("generate/empty-prompt", lambda dt: smp.generate(shared_gpt(dt), torch.zeros(1, 0, dtype=torch.long), 2), err("prompt", "T=0")),
    ("generate/ok-empty-batch", lambda dt: shape_is(smp.generate(shared_gpt(dt), torch.zeros(0, 3, dtype=torch.long), 2), 0, 2), OK),
    # --- left padding: position_ids and generate(prompt_mask=...)
    ("GPT/ok-left-padded-row-equals-alone", gpt_left_padding_equals_alone, OK),
    ("GPT/ok-left-padded-cache-equals-alone", gpt_left_padding_with_cache, OK),
    ("generate/ok-left-padded-equals-alone-cache", lambda dt: generate_left_padded_equals_alone(dt, True), OK),
    ("generate/ok-left-padded-equals-alone-recompute", lambda dt: generate_left_padded_equals_alone(dt, False), OK),
    ("GPT/position_ids-float", lambda dt: shared_gpt(dt)(ids(2, 3), position_ids=torch.zeros(2, 3)), err("position_ids", "integer")),
    ("GPT/position_ids-wrong-shape", lambda dt: shared_gpt(dt)(ids(2, 3), position_ids=torch.zeros(2, 4, dtype=torch.long)), err("position_ids", "shape")),
    ("GPT/position_ids-1d", lambda dt: shared_gpt(dt)(ids(2, 3), position_ids=torch.arange(3)), err("position_ids", "shape")),
    ("GPT/position_ids>=max_len", lambda dt: shared_gpt(dt)(ids(2, 3), position_ids=torch.tensor([[0, 1, 8]])), err("position_ids", "max_len")),
    ("GPT/position_ids<0", lambda dt: shared_gpt(dt)(ids(2, 3), position_ids=torch.tensor([[-1, 0, 1]])), err("position_ids", "max_len")),
    ("GPT/ok-position_ids-default", lambda dt: torch.testing.assert_close(shared_gpt(dt)(ids(2, 3), position_ids=torch.arange(3)[None]), shared_gpt(dt)(ids(2, 3)), rtol=0, atol=0), OK),
    ("generate/prompt_mask-not-bool", lambda dt: smp.generate(shared_gpt(dt), ids(2, 3), 2, prompt_mask=torch.ones(2, 3)), err("prompt_mask", "bool")),
    ("generate/prompt_mask-wrong-shape", lambda dt: smp.generate(shared_gpt(dt), ids(2, 3), 2, prompt_mask=torch.ones(2, 4, dtype=torch.bool)), err("prompt_mask", "shape")),
    ("generate/prompt_mask-right-padded", lambda dt: smp.generate(shared_gpt(dt), ids(2, 3), 2, prompt_mask=torch.tensor([[True, True, True], [True, True, False]])), err("prompt_mask", "left")),
    # --- string flags
    ("generate/use_cache-str", lambda dt: smp.generate(shared_gpt(dt), ids(2, 3), 2, use_cache="False"), err("use_cache", BOOL)),
    ("generate/use_cache-int", lambda dt: smp.generate(shared_gpt(dt), ids(2, 3), 2, use_cache=0), err("use_cache", BOOL)),
    # --- ids out of range, named by the caller's argument
    ("generate/prompt-id>=V", lambda dt: smp.generate(shared_gpt(dt), ids(2, 3) + V, 2), err("prompt", VOCAB)),
    ("sequence_nll/ids>=V", lambda dt: gpt_mod.sequence_nll(shared_gpt(dt), ids(6) + V, 4), err("ids", VOCAB)),
    ("token_cross_entropy/labels-out-of-range", lambda dt: brt.token_cross_entropy(rand(2, 3, V, dt=dt), torch.full((2, 3), V)), err("labels", "IGNORE_INDEX")),
    ("token_cross_entropy/float-labels", lambda dt: brt.token_cross_entropy(rand(2, 3, V, dt=dt), torch.zeros(2, 3, dtype=dt)), err("labels", INTEGER)),
    ("predict/float-tokens", lambda dt: clf.predict(classifier(dt), torch.ones(2, 3, dtype=dt)), err("tokens", INTEGER)),
]


def trigram():
    return gpt_mod.TrigramLM(ids(50, low=0), V)


def trigram_ok():
    model = trigram()
    out = model.sample([1, 2], 5, random.Random(0))
    assert len(out) == 5 and all(0 <= c < V for c in out)
    assert math.isfinite(model.nll(ids(10, low=0)))


def lm_loss_two_tokens():
    loss = gpt_mod.lm_loss(shared_gpt(torch.float64), (ids(2, 2),))
    assert loss.dim() == 0 and torch.isfinite(loss)


def fit_batches_run_out():
    batches = iter([(ids(4, 5), torch.arange(4) % C)])
    clf.fit(classifier(), clf.classification_loss, batches, steps=3, progress=False)


def special_ids_ok():
    x = ids(4, 9, low=0)
    inputs, labels = brt.mask_tokens(x, 2, V, special_ids=[0, 1], mask_prob=1.0, generator=torch.Generator().manual_seed(0))
    chosen = labels != brt.IGNORE_INDEX
    assert not chosen[(x == 0) | (x == 1) | (x == 2)].any() and chosen[x > 2].all()
    brt.mask_tokens(x, 2, V, special_ids=range(2))


PLAIN_CASES = [
    # --- eps: finite and > 0
    *[(f"{cls.__name__}/eps={v!r}", functools.partial(lambda cls, v: cls(eps=v), cls, v), err("eps", POSITIVE))
      for cls in (brt.BertConfig, gpt_mod.GPTConfig) for v in (math.inf, math.nan, 0.0, -1e-5, "1e-5", True)],
    ("BertConfig/ok-eps", lambda: None if brt.BertConfig(eps=1e-12).eps == 1e-12 else pytest.fail("eps"), OK),
    # --- string flags
    ("BertModel/add_pooler-str", lambda: brt.BertModel(bert_config(), add_pooler="no"), err("add_pooler", BOOL)),
    ("BertModel/add_pooler-int", lambda: brt.BertModel(bert_config(), add_pooler=0), err("add_pooler", BOOL)),
    ("fit/progress-str", lambda: fit_run(classifier(), progress="no"), err("progress", BOOL)),
    # --- special ids
    ("mask_tokens/special_ids-float", lambda: brt.mask_tokens(ids(2, 3), 2, V, special_ids=(0, 2.7)), err("special_ids", INT)),
    ("mask_tokens/special_ids-bool", lambda: brt.mask_tokens(ids(2, 3), 2, V, special_ids=(0, True)), err("special_ids", INT)),
    ("mask_tokens/special_ids-bare-int", lambda: brt.mask_tokens(ids(2, 3), 2, V, special_ids=0), err("special_ids", "list")),
    ("mask_tokens/special_ids-str", lambda: brt.mask_tokens(ids(2, 3), 2, V, special_ids="01"), err("special_ids", "list")),
    ("mask_tokens/special_ids>=V", lambda: brt.mask_tokens(ids(2, 3), 2, V, special_ids=(0, V)), err("special_ids", "vocab_size")),
    ("mask_tokens/special_ids<0", lambda: brt.mask_tokens(ids(2, 3), 2, V, special_ids=(-1,)), err("special_ids", "vocab_size")),
    ("mask_tokens/vocab_size-str", lambda: brt.mask_tokens(ids(2, 3), 2, "11"), err("vocab_size", INT)),
    ("mask_tokens/ok-special-never-chosen", special_ids_ok, OK),
    # --- [CLS] cannot be padding
    ("SequenceClassifier/cls_id==pad_id", lambda: clf.SequenceClassifier(clf.ClassifierConfig(V, C, d_model=D, num_heads=H, d_ff=FF, cls_id=0, pad_id=0)), err("cls_id", "pad_id")),
    ("SequenceClassifier/cls_id==pad_id=3", lambda: clf.SequenceClassifier(clf.ClassifierConfig(V, C, d_model=D, num_heads=H, d_ff=FF, cls_id=3, pad_id=3)), err("cls_id", "padding")),
    ("SequenceClassifier/ok-cls_id==pad_id-mean", lambda: clf.SequenceClassifier(clf.ClassifierConfig(V, C, d_model=D, num_heads=H, d_ff=FF, pooling="mean", cls_id=0, pad_id=0)), OK),
    # --- TrigramLM
    ("TrigramLM/ids>=V", lambda: gpt_mod.TrigramLM(ids(20) + V, V), err("tokens", VOCAB)),
    ("TrigramLM/negative-ids", lambda: gpt_mod.TrigramLM(ids(20) - V, V), err("tokens", VOCAB)),
    ("TrigramLM/list-tokens", lambda: gpt_mod.TrigramLM([1, 2, 3], V), err("tokens", "tensor")),
    ("TrigramLM/float-tokens", lambda: gpt_mod.TrigramLM(torch.ones(5), V), err("tokens", INTEGER)),
    ("TrigramLM.nll/ids>=V", lambda: trigram().nll(ids(5) + V), err("tokens", VOCAB)),
    ("TrigramLM.sample/prompt-id>=V", lambda: trigram().sample([1, V], 3, random.Random(0)), err("prompt", "vocab_size")),
    ("TrigramLM.sample/prompt-str", lambda: trigram().sample("ab", 3, random.Random(0)), err("prompt", "list")),
    ("TrigramLM.sample/rng-None", lambda: trigram().sample([1], 3, None), err("rng", "Random")),
    ("TrigramLM/ok", trigram_ok, OK),
    # --- lm_loss, random_windows, random_batches
    ("lm_loss/one-token-windows", lambda: gpt_mod.lm_loss(shared_gpt(torch.float64), (ids(2, 1),)), err("batch", "at least 2")),
    ("lm_loss/float-windows", lambda: gpt_mod.lm_loss(shared_gpt(torch.float64), (torch.ones(2, 3),)), err("batch", INTEGER)),
    ("lm_loss/bare-tensor", lambda: gpt_mod.lm_loss(shared_gpt(torch.float64), ids(2, 3)), err("batch", "tuple")),
    ("lm_loss/ok-two-tokens", lm_loss_two_tokens, OK),
    ("random_windows/float-ids", lambda: next(gpt_mod.random_windows(torch.ones(20), 4, 2)), err("ids", INTEGER)),
    ("random_windows/list-ids", lambda: next(gpt_mod.random_windows(list(range(20)), 4, 2)), err("ids", "tensor")),
    ("random_batches/no-tensors", lambda: next(clf.random_batches()), err("tensors", "one or more")),
    ("random_batches/list", lambda: next(clf.random_batches([1, 2, 3])), err("tensors", "tensor")),
    ("random_batches/float-tokens", lambda: next(clf.random_batches(torch.ones(4, 3))), err("tensors", INTEGER)),
    # --- fit: lr, betas, weight_decay, loader, loss_fn, model
    *[(f"fit/lr={v!r}", functools.partial(lambda v: fit_run(classifier(), lr=v), v), err("lr", POSITIVE))
      for v in (math.inf, math.nan, 0.0, -1.0, "1e-3", True)],
    ("fit/weight_decay=inf", lambda: fit_run(classifier(), weight_decay=math.inf), err("weight_decay", r"\[0")),
    ("fit/betas-scalar", lambda: fit_run(classifier(), betas=0.9), err("betas", "pair")),
    ("fit/betas>=1", lambda: fit_run(classifier(), betas=(0.9, 1.0)), err("betas", r"\[0, 1\)")),
    ("fit/empty-loader", lambda: clf.fit(classifier(), clf.classification_loss, iter([]), steps=2, progress=False), err("batches", r"at least one batch")),
    ("fit/empty-list", lambda: clf.fit(classifier(), clf.classification_loss, [], steps=2, progress=False), err("batches", r"at least one batch")),
    ("fit/loader-runs-out", fit_batches_run_out, err("batches", r"ran out after 1 batches.*takes 3 steps")),
    ("fit/batches-not-iterable", lambda: clf.fit(classifier(), clf.classification_loss, 5, steps=2, progress=False), err("batches", "iterator")),
    ("fit/loss_fn-not-callable", lambda: clf.fit(classifier(), "ce", iter([]), steps=2, progress=False), err("loss_fn", "function")),
    ("fit/evaluate-not-callable", lambda: fit_run(classifier(), evaluate=0.5), err("evaluate", "function")),
    ("fit/loss-not-scalar", lambda: clf.fit(classifier(), lambda m, b: m(b[0]), clf.random_batches(ids(4, 3), batch_size=2), steps=2, progress=False), err("loss_fn", "scalar")),
    ("fit/model-without-parameters", lambda: fit_run(nn.ReLU()), err("model", "parameters")),
    ("fit/model-not-module", lambda: fit_run("model"), err("model", "nn.Module")),
    ("predict/model-not-module", lambda: clf.predict(None, ids(2, 3)), err("model", "nn.Module")),
    ("predict/1d-tokens", lambda: clf.predict(classifier(), ids(5)), err("tokens", "shape")),
    ("sequence_nll/not-a-gpt", lambda: gpt_mod.sequence_nll(classifier(), ids(6), 4), err("model", "GPT")),
    ("generate/not-a-gpt", lambda: smp.generate(classifier(), ids(2, 3), 2), err("model", "GPT")),
]


# ------------------------------------- BertEmbeddings, init_bert_weights, gpt_block and the Hugging Face bridges
def bert_embeddings_sum(dt):
    """token + position + segment vectors, then LayerNorm (eval: no dropout); segment_ids=None is segment A."""
    torch.manual_seed(0)
    e = brt.BertEmbeddings(bert_config()).to(dt).eval()
    t, seg = ids(2, 5), torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]])
    out = e(t, seg)
    assert out.dtype == dt and out.shape == (2, 5, D)
    torch.testing.assert_close(out, e.norm(e.token.weight[t] + e.position.weight[:5] + e.segment.weight[seg]))
    torch.testing.assert_close(e(t), e(t, torch.zeros_like(t)), rtol=0, atol=0)


def init_bert_weights_ok():
    """N(0, std^2) weights, zero biases, a zero padding row; std=0 gives zeros; a module without weights is left alone."""
    torch.manual_seed(0)
    emb, lin = nn.Embedding(300, 300, padding_idx=3), nn.Linear(300, 300)
    for m in (emb, lin, nn.ReLU()):
        assert brt.init_bert_weights(m) is None
    assert emb.weight[3].eq(0).all() and lin.bias.eq(0).all()
    assert abs(lin.weight.std().item() - 0.02) < 1e-3 and abs(emb.weight[4:].std().item() - 0.02) < 1e-3
    brt.init_bert_weights(lin, std=0.0)
    assert lin.weight.eq(0).all()


def bert_hf_names_ok():
    """One entry per state_dict key; BertForMaskedLM's body under 'bert.', its head under 'cls.predictions.'."""
    body = brt.BertModel(bert_config())
    names = brt.bert_hf_names(body)
    assert set(names) == set(body.state_dict())
    assert names["embeddings.token.weight"] == "embeddings.word_embeddings.weight"
    assert names["encoder.layers.0.self_attn.W_q.bias"] == "encoder.layer.0.attention.self.query.bias"
    assert "pooler.weight" not in brt.bert_hf_names(brt.BertModel(bert_config(), add_pooler=False))
    mlm = brt.BertForMaskedLM(bert_config())
    names = brt.bert_hf_names(mlm)
    assert set(names) == set(mlm.state_dict())
    assert all(v.startswith(("bert.", "cls.predictions.")) for v in names.values())


def gpt2_hf_names_ok():
    """One entry per state_dict key; W_q, W_k, W_v are the three slices of c_attn, Conv1D weights transposed."""
    model = gpt()
    names = gpt_mod.gpt2_hf_names(model)
    assert set(names) == set(model.state_dict())
    assert names["token.weight"] == "transformer.wte.weight"
    k = names["blocks.1.self_attn.W_k.weight"]
    assert (k.key, k.part, k.axis, k.transposed) == ("transformer.h.1.attn.c_attn.weight", (1, 3), 1, True)


def gpt_block_ok(dt):
    """Pre-norm, GPT-2's epsilon, no cross-attention, tanh GELU; under the causal mask a later token changes
    nothing before it."""
    config = gpt_mod.GPTConfig(vocab_size=V, max_len=8, d_model=D, num_layers=1, num_heads=H, d_ff=FF, dropout=0.0,
                               eps=1e-3)
    torch.manual_seed(0)
    block = gpt_mod.gpt_block(config).to(dt).eval()
    assert block.cross_attn is None and block.self_attn_residual.norm.eps == 1e-3
    x = rand(1, 4, D, dt=dt)
    y = x.clone()
    y[:, 3] += 1.0
    mask = causal_mask(4)[None, None]
    a, b = block(x, tgt_mask=mask), block(y, tgt_mask=mask)
    torch.testing.assert_close(a[:, :3], b[:, :3], rtol=0, atol=0)
    assert not torch.equal(a[:, 3], b[:, 3])
    with torch.no_grad():                                        # pre-norm: x + attn(norm(x)) + ffn(norm(.))
        h = x + block.self_attn(*[block.self_attn_residual.norm(x)] * 3, mask)[0]
        want = h + block.feed_forward(block.feed_forward_residual.norm(h))
    torch.testing.assert_close(a, want)


def _hf_bert_config(t):
    return t.BertConfig(vocab_size=V, hidden_size=D, num_hidden_layers=1, num_attention_heads=H, intermediate_size=FF,
                        max_position_embeddings=8, attn_implementation="eager")


def _hf_gpt2_config(t, n_embd=D):
    return t.GPT2Config(vocab_size=V, n_positions=8, n_embd=n_embd, n_layer=1, n_head=H, n_inner=FF, bos_token_id=1,
                        eos_token_id=2, attn_implementation="eager")


def hf_bert(t):
    return t.BertModel(_hf_bert_config(t))


def hf_bert_mlm(t):
    return t.BertForMaskedLM(_hf_bert_config(t))


def hf_gpt2(t):
    return t.GPT2LMHeadModel(_hf_gpt2_config(t))


def same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def to_hf_bert_ok(cls):
    """to_hf_bert writes ours into theirs in place and returns it: loading it back gives our weights, and a
    BertModel's hidden states equal ours."""
    theirs = hf(hf_bert if cls is brt.BertModel else hf_bert_mlm)
    torch.manual_seed(1)
    ours = cls(brt.BertConfig.from_hf(theirs.config)).double().eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.1 * torch.randn_like(p))
    assert brt.to_hf_bert(ours, theirs) is theirs
    same_state(brt.load_hf_bert(cls(brt.BertConfig.from_hf(theirs.config)).double(), theirs), ours)
    if cls is brt.BertModel:
        x = ids(2, 5)
        with torch.no_grad():
            torch.testing.assert_close(theirs(input_ids=x).last_hidden_state, ours(x), rtol=0, atol=1e-10)


def to_hf_gpt2_ok():
    """to_hf_gpt2 returns hf_model with our weights, its lm_head still tied to wte, and its logits equal ours."""
    theirs = hf(hf_gpt2)
    torch.manual_seed(1)
    ours = gpt_mod.GPT(gpt_mod.GPTConfig.from_hf(theirs.config)).double().eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.1 * torch.randn_like(p))
    assert gpt_mod.to_hf_gpt2(ours, theirs) is theirs
    assert theirs.lm_head.weight.data_ptr() == theirs.transformer.wte.weight.data_ptr()
    x = ids(2, 6)
    with torch.no_grad():
        torch.testing.assert_close(theirs(input_ids=x).logits, ours(x), rtol=0, atol=1e-10)


def bert(cls=brt.BertModel, **kw):
    return cls(bert_config(**kw)).eval()


TENSOR_CASES += [
    ("BertEmbeddings/ok-sum-of-three-tables", bert_embeddings_sum, OK),
    ("BertEmbeddings/float-tokens", lambda dt: brt.BertEmbeddings(bert_config())(torch.ones(2, 3, dtype=dt)), err("tokens", INTEGER)),
    ("BertEmbeddings/float-segment_ids", lambda dt: brt.BertEmbeddings(bert_config())(ids(2, 3), torch.zeros(2, 3, dtype=dt)), err("segment_ids", INTEGER)),
    ("BertEmbeddings/ok-S=0", lambda dt: shape_is(brt.BertEmbeddings(bert_config()).to(dt)(torch.zeros(2, 0, dtype=torch.long)), 2, 0, D), OK),
    ("gpt_block/ok-pre-norm-causal", gpt_block_ok, OK),
]

PLAIN_CASES += [
    # --- BertEmbeddings
    ("BertEmbeddings/config-dict", lambda: brt.BertEmbeddings({"d_model": D}), err("config", "BertConfig")),
    ("BertEmbeddings/config-None", lambda: brt.BertEmbeddings(None), err("config", "BertConfig")),
    ("BertEmbeddings/config-GPTConfig", lambda: brt.BertEmbeddings(gpt_mod.GPTConfig(vocab_size=V, max_len=8, d_model=D, num_layers=1, num_heads=H, d_ff=FF)), err("config", "BertConfig")),
    ("BertEmbeddings/tokens-1d", lambda: brt.BertEmbeddings(bert_config())(ids(5)), err("tokens", "shape")),
    ("BertEmbeddings/tokens-list", lambda: brt.BertEmbeddings(bert_config())([[1, 2]]), err("tokens", "tensor")),
    ("BertEmbeddings/S>max_len", lambda: brt.BertEmbeddings(bert_config())(ids(1, 9)), err("tokens", "max_len=8")),
    ("BertEmbeddings/tokens>=V", lambda: brt.BertEmbeddings(bert_config())(ids(2, 3) + V), err("tokens", VOCAB)),
    ("BertEmbeddings/tokens<0", lambda: brt.BertEmbeddings(bert_config())(-ids(2, 3)), err("tokens", VOCAB)),
    ("BertEmbeddings/segment_ids>=type_vocab_size", lambda: brt.BertEmbeddings(bert_config())(ids(2, 3), torch.full((2, 3), 2)), err("segment_ids", VOCAB)),
    ("BertEmbeddings/segment_ids-wrong-shape", lambda: brt.BertEmbeddings(bert_config())(ids(2, 3), torch.zeros(2, 4, dtype=torch.long)), err("segment_ids", "shape")),
    ("BertEmbeddings/segment_ids-list", lambda: brt.BertEmbeddings(bert_config())(ids(2, 3), [[0, 0, 0]] * 2), err("segment_ids", "shape")),
    # --- init_bert_weights
    ("init_bert_weights/module-str", lambda: brt.init_bert_weights("linear"), err("module", "nn.Module")),
    ("init_bert_weights/module-tensor", lambda: brt.init_bert_weights(torch.ones(2, 2)), err("module", "nn.Module")),
    *[(f"init_bert_weights/std={v!r}", functools.partial(lambda v: brt.init_bert_weights(nn.Linear(2, 2), std=v), v), err("std", r"\[0, inf\)|number"))
      for v in (-0.02, math.nan, math.inf, "0.02", True, None)],
    ("init_bert_weights/ok", init_bert_weights_ok, OK),
    # --- bert_hf_names, to_hf_bert
    ("bert_hf_names/model-GPT", lambda: brt.bert_hf_names(shared_gpt(torch.float64)), err("model", "BertModel, BertForMaskedLM or BertForQuestionAnswering")),
    ("bert_hf_names/model-BertClassifier", lambda: brt.bert_hf_names(brt.BertClassifier(bert_config(), 2)), err("model", "BertModel, BertForMaskedLM or BertForQuestionAnswering")),
    ("bert_hf_names/model-None", lambda: brt.bert_hf_names(None), err("model", "BertModel")),
    ("bert_hf_names/ok", bert_hf_names_ok, OK),
    ("to_hf_bert/model-GPT", lambda: brt.to_hf_bert(shared_gpt(torch.float64), bert()), err("model", "BertModel, BertForMaskedLM or BertForQuestionAnswering")),
    ("to_hf_bert/hf_model-str", lambda: brt.to_hf_bert(bert(), "bert-base-uncased"), err("hf_model", "nn.Module")),
    ("to_hf_bert/hf_model-None", lambda: brt.to_hf_bert(bert(), None), err("hf_model", "nn.Module")),
    ("to_hf_bert/hf_model-our-GPT", lambda: brt.to_hf_bert(bert(), shared_gpt(torch.float64)), err("hf_model", "word_embeddings.*BertConfig.from_hf")),
    ("to_hf_bert/hf_model-GPT2", lambda: brt.to_hf_bert(bert(), hf(hf_gpt2)), err("hf_model", "word_embeddings.*BertConfig.from_hf")),
    ("to_hf_bert/mlm-into-BertModel", lambda: brt.to_hf_bert(brt.BertForMaskedLM(brt.BertConfig.from_hf(hf(hf_bert).config)).double(), hf(hf_bert)), err("hf_model", "BertConfig.from_hf")),
    ("to_hf_bert/other-sizes", lambda: brt.to_hf_bert(bert(d_ff=2 * FF).double(), hf(hf_bert)), err("hf_model", "shape")),
    ("to_hf_bert/ok-BertModel", lambda: to_hf_bert_ok(brt.BertModel), OK),
    ("to_hf_bert/ok-BertForMaskedLM", lambda: to_hf_bert_ok(brt.BertForMaskedLM), OK),
    # --- gpt_block, gpt2_hf_names, to_hf_gpt2
    ("gpt_block/config-dict", lambda: gpt_mod.gpt_block({"d_model": D, "num_heads": H}), err("config", "GPTConfig")),
    ("gpt_block/config-BertConfig", lambda: gpt_mod.gpt_block(bert_config()), err("config", "GPTConfig")),
    ("gpt_block/config-None", lambda: gpt_mod.gpt_block(None), err("config", "GPTConfig")),
    ("gpt2_hf_names/model-BertModel", lambda: gpt_mod.gpt2_hf_names(bert()), err("model", "GPT")),
    ("gpt2_hf_names/model-None", lambda: gpt_mod.gpt2_hf_names(None), err("model", "GPT")),
    ("gpt2_hf_names/ok", gpt2_hf_names_ok, OK),
    ("to_hf_gpt2/model-BertModel", lambda: gpt_mod.to_hf_gpt2(bert(), shared_gpt(torch.float64)), err("model", "GPT")),
    ("to_hf_gpt2/hf_model-str", lambda: gpt_mod.to_hf_gpt2(shared_gpt(torch.float64), "gpt2"), err("hf_model", "nn.Module")),
    ("to_hf_gpt2/hf_model-our-BertModel", lambda: gpt_mod.to_hf_gpt2(shared_gpt(torch.float64), bert()), err("hf_model", "transformer.wte.*GPTConfig.from_hf")),
    ("to_hf_gpt2/hf_model-BertModel", lambda: gpt_mod.to_hf_gpt2(gpt(), hf(hf_bert)), err("hf_model", "transformer.wte.*GPTConfig.from_hf")),
    ("to_hf_gpt2/hf_model-GPT2Model-no-head", lambda: gpt_mod.to_hf_gpt2(gpt(), hf(lambda t: t.GPT2Model(_hf_gpt2_config(t)))), err("hf_model", "transformer.wte")),
    ("to_hf_gpt2/other-width", lambda: gpt_mod.to_hf_gpt2(gpt(), hf(lambda t: t.GPT2LMHeadModel(_hf_gpt2_config(t, n_embd=2 * D)))), err("hf_model", "shape")),
    ("to_hf_gpt2/ok", to_hf_gpt2_ok, OK),
]


test_case_ids_unique, test_tensor_case, test_plain_case = table_tests(TENSOR_CASES, PLAIN_CASES)
