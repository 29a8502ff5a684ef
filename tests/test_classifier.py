"""transformer_lib.classifier (Chapter 10): the sequence data, pooling, the encoder-only classifier, its
training loop, and the pooling exercise's checker."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from helpers import randomize

from transformer_lib.classifier import (
    CLASSES,
    CLS_ID,
    MASK_ID,
    NUM_LEVELS,
    PAD_ID,
    POOLINGS,
    VOCAB_SIZE,
    ClassifierConfig,
    SequenceClassifier,
    classification_loss,
    fit,
    make_sequences,
    pool,
    predict,
    random_batches,
)
from transformer_lib.exercises.classifier import check_pooling
from transformer_lib.multi_head import attention_maps

DT = torch.float64
ATOL = 1e-12


# ---------------------------------------------------------------- make_sequences

@pytest.fixture(scope="module")
def data():
    return make_sequences(40, seed=3)


def test_constants():
    assert (PAD_ID, CLS_ID, MASK_ID) == (0, 1, 2) and VOCAB_SIZE == NUM_LEVELS + 3 == 35
    assert len(CLASSES) == 6 and len(set(CLASSES)) == 6 and POOLINGS == ("cls", "mean", "max")


def test_make_sequences_shapes_balance_and_determinism(data):
    tokens, labels = data
    assert tokens.shape == (240, 32) and labels.shape == (240,)
    assert tokens.dtype == labels.dtype == torch.long
    assert torch.equal(torch.bincount(labels, minlength=6), torch.full((6,), 40))
    again = make_sequences(40, seed=3)
    assert torch.equal(again[0], tokens) and torch.equal(again[1], labels)
    other = make_sequences(40, seed=4)
    assert not torch.equal(other[0], tokens)
    assert not torch.equal(labels[:40], labels.sort().values[:40])       # shuffled, not class by class


def test_make_sequences_lengths_and_padding():
    tokens, _ = make_sequences(30, seed=5, min_len=10, max_len=20)
    assert tokens.shape[1] == 20
    real = tokens != PAD_ID
    lengths = real.sum(1)
    assert lengths.min() == 10 and lengths.max() == 20                  # both ends occur among 180 rows
    assert torch.equal(real, torch.arange(20) < lengths[:, None])       # padding only at the end
    assert tokens[real].min() >= 3 and tokens[real].max() < VOCAB_SIZE  # no special token inside
    assert tokens[real].min() == 3 and tokens[real].max() == VOCAB_SIZE - 1


def period(v):
    """The smallest p in 2..4 with v[i] == v[i + p] for every i, or None."""
    return next((p for p in (2, 3, 4) if torch.equal(v[p:], v[:-p])), None)


def follows_rule(name, v):
    """v: the values 1..NUM_LEVELS of one sequence (padding removed)."""
    distinct = len(v.unique()) == len(v)
    spread = int(v.max() - v.min())
    up, down = bool((v.diff() > 0).all()), bool((v.diff() < 0).all())
    if name == "low":
        return bool(((v >= 1) & (v <= 12)).all())
    if name == "high":
        return bool(((v >= NUM_LEVELS - 11) & (v <= NUM_LEVELS)).all())
    if name == "rising":
        return up and distinct and spread >= 16
    if name == "falling":
        return down and distinct and spread >= 16
    if name == "shuffled":
        return distinct and not up and not down and spread >= 16
    p = period(v)                                                      # motif
    return p is not None and len(v[:p].unique()) == p and spread >= 12


def test_make_sequences_every_row_follows_its_class_rule(data):
    tokens, labels = data
    for row, label in zip(tokens, labels.tolist(), strict=True):
        v = row[row != PAD_ID] - MASK_ID
        assert follows_rule(CLASSES[label], v), (CLASSES[label], v.tolist())
    # the rules tell the classes apart: no row of another class passes the rule of "rising" / "motif"
    for row, label in zip(tokens, labels.tolist(), strict=True):
        v = row[row != PAD_ID] - MASK_ID
        for name in ("rising", "falling", "shuffled", "motif"):
            if name != CLASSES[label]:
                assert not follows_rule(name, v), (name, CLASSES[label], v.tolist())


def test_rising_falling_shuffled_share_their_values_distribution():
    tokens, labels = make_sequences(100, seed=6)
    means = {}
    for name in ("rising", "falling", "shuffled"):
        rows = tokens[labels == CLASSES.index(name)]
        means[name] = rows[rows != PAD_ID].double().mean().item()
    assert max(means.values()) - min(means.values()) < 1.0


@pytest.mark.parametrize("kwargs, name", [
    (dict(n_per_class=0), "n_per_class"),
    (dict(n_per_class=True), "n_per_class"),
    (dict(n_per_class=2, max_len=33), "max_len"),
    (dict(n_per_class=2, min_len=10, max_len=9), "max_len"),
    (dict(n_per_class=2, min_len=3), "min_len"),
    (dict(n_per_class=2, seed=-1), "seed"),
])
def test_make_sequences_value_errors(kwargs, name):
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        make_sequences(**kwargs)


# ---------------------------------------------------------------- pool

def random_padded(B=6, S=7, d=5, seed=0, empty_row=False):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, S, d, generator=g, dtype=DT)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0], lengths[1] = S, 1
    if empty_row:
        lengths[-1] = 0
    keep = torch.arange(S) < lengths[:, None]
    return hidden, keep


def test_pool_formulas():
    hidden, keep = random_padded(seed=1)
    assert not keep.all()
    torch.testing.assert_close(pool(hidden, keep, "cls"), hidden[:, 0], rtol=0, atol=0)
    for b in range(hidden.size(0)):
        real = hidden[b, keep[b]]                                       # (n, d)
        torch.testing.assert_close(pool(hidden, keep, "mean")[b], real.sum(0) / len(real), rtol=0, atol=ATOL)
        torch.testing.assert_close(pool(hidden, keep, "max")[b], real.max(0).values, rtol=0, atol=0)
    assert pool(hidden, keep).shape == (6, 5)
    torch.testing.assert_close(pool(hidden, keep), pool(hidden, keep, "mean"), rtol=0, atol=0)   # default


@pytest.mark.parametrize("method", POOLINGS)
def test_pool_ignores_the_values_at_padding(method):
    hidden, keep = random_padded(seed=2)
    loud = hidden.clone()
    loud[~keep] = 1e6 * (1 + torch.rand(int((~keep).sum()), 5, dtype=DT))
    torch.testing.assert_close(pool(loud, keep, method), pool(hidden, keep, method), rtol=0, atol=0)
    if method != "cls":
        assert (pool(loud, torch.ones_like(keep), method) - pool(hidden, keep, method)).abs().max() > 1e3


@pytest.mark.parametrize("method", ["mean", "max"])
def test_pool_of_an_empty_row_is_zeros(method):
    hidden, keep = random_padded(seed=3, empty_row=True)
    hidden[-1] = -5.0                                                   # max would give -5 or -inf
    out = pool(hidden, keep, method)
    assert not out.isnan().any()
    assert torch.equal(out[-1], torch.zeros(5, dtype=DT))
    torch.testing.assert_close(out[:-1], pool(hidden[:-1], keep[:-1], method), rtol=0, atol=0)


def test_pool_value_errors():
    hidden, keep = random_padded()
    with pytest.raises(ValueError, match=r"keep must be a bool tensor"):
        pool(hidden, keep.long(), "mean")
    with pytest.raises(ValueError, match=r"keep must be a bool tensor of shape \(B, S\) = \(6, 7\)"):
        pool(hidden, keep[:, :5], "mean")
    with pytest.raises(ValueError, match=r"\bkeep\b"):
        pool(hidden, keep[None], "mean")
    with pytest.raises(ValueError, match=r"method must be one of 'cls', 'mean', 'max', got 'sum'"):
        pool(hidden, keep, "sum")
    with pytest.raises(ValueError, match=r"\bhidden\b"):
        pool(hidden[0], keep, "mean")
    with pytest.raises(ValueError, match=r"\bhidden\b"):
        pool(keep[..., None], keep, "mean")                             # bool hidden states


# ---------------------------------------------------------------- SequenceClassifier

def classifier(pooling, positional=True, seed=0, dropout=0.0, num_classes=4):
    torch.manual_seed(seed)
    model = SequenceClassifier(ClassifierConfig(VOCAB_SIZE, num_classes, d_model=16, num_heads=2, d_ff=32, num_layers=2,
                               pooling=pooling, positional=positional, dropout=dropout, max_len=32))
    return randomize(model.double(), seed, std=0.3).eval()


def padded_tokens(B=5, S=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, VOCAB_SIZE, (B, S), generator=g)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S
    tokens[torch.arange(S) >= lengths[:, None]] = PAD_ID
    return tokens, lengths


@pytest.mark.parametrize("pooling", POOLINGS)
def test_classifier_batch_equals_sequences_alone(pooling):
    model = classifier(pooling, seed=1)
    tokens, lengths = padded_tokens(seed=2)
    assert lengths.min() < tokens.size(1)
    with torch.no_grad():
        logits = model(tokens)
        assert logits.shape == (5, 4) and logits.dtype == DT
        for b, n in enumerate(lengths.tolist()):
            torch.testing.assert_close(logits[b], model(tokens[b:b + 1, :n])[0], rtol=0, atol=ATOL)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_classifier_without_positions_sees_a_bag_of_tokens(pooling):
    tokens, lengths = padded_tokens(seed=3)
    g = torch.Generator().manual_seed(4)
    for positional in (False, True):
        model = classifier(pooling, positional=positional, seed=5)
        with torch.no_grad():
            logits = model(tokens)
            shuffled = tokens.clone()
            for b, n in enumerate(lengths.tolist()):
                shuffled[b, :n] = tokens[b, torch.randperm(n, generator=g)]
            b = 0                                                       # the full row: permuted for sure
            assert not torch.equal(shuffled[b], tokens[b])
            diff = (model(shuffled) - logits).abs()
        if positional:
            assert diff[b].max() > 1e-6                                 # order matters with the encoding
        else:
            assert diff.max() < ATOL


@pytest.mark.parametrize("pooling", POOLINGS)
def test_classifier_gradients_reach_every_parameter(pooling):
    torch.manual_seed(6)
    model = SequenceClassifier(ClassifierConfig(VOCAB_SIZE, 3, d_model=16, num_heads=2, d_ff=32, num_layers=2, pooling=pooling))
    tokens, _ = padded_tokens(seed=7)
    F.cross_entropy(model(tokens), torch.tensor([0, 1, 2, 0, 1])).backward()
    params = dict(model.named_parameters())
    assert len(params) > 10
    for name, p in params.items():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name                            # as a whole
    assert torch.all(model.embed.weight.grad[PAD_ID] == 0)              # the padding row: none, by design


def test_cls_pooling_prepends_one_token():
    tokens, _ = padded_tokens(B=3, S=6, seed=8)
    for pooling, width in (("cls", 7), ("mean", 6), ("max", 6)):
        model = classifier(pooling, seed=9)
        with attention_maps(model) as maps:
            model(tokens)
        weights = list(maps.values())
        assert len(weights) == 2
        assert weights[0].shape == (3, 2, width, width)
        if pooling == "cls":                                            # [CLS] is a real key for everyone
            assert torch.all(weights[0][..., 0] > 0)


def test_classifier_uses_the_cls_token_id():
    model = classifier("cls", seed=10)
    tokens, _ = padded_tokens(B=2, S=5, seed=11)
    with torch.no_grad():
        a = model(tokens)
        model.cls_id = 3                                                # another id in front: other logits
        assert (model(tokens) - a).abs().max() > 1e-6


def test_classifier_dropout_only_in_training():
    model = classifier("mean", seed=12, dropout=0.3)
    tokens, _ = padded_tokens(seed=13)
    model.train()
    assert (model(tokens) - model(tokens)).abs().max() > 1e-6
    model.eval()
    torch.testing.assert_close(model(tokens), model(tokens), rtol=0, atol=0)


@pytest.mark.parametrize("kwargs, name", [
    (dict(pooling="last"), "pooling"),
    (dict(pooling=None), "pooling"),
    (dict(num_classes=1), "num_classes"),
    (dict(positional="yes"), "positional"),
    (dict(pad_id=-1), "pad_id"),
])
def test_classifier_constructor_value_errors(kwargs, name):
    args = dict(vocab_size=VOCAB_SIZE, num_classes=3, d_model=16, num_heads=2, d_ff=32) | kwargs
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        SequenceClassifier(ClassifierConfig(**args))


def test_classifier_forward_value_errors():
    model = classifier("cls")
    with pytest.raises(ValueError, match=r"tokens .*outside the vocabulary"):
        model(torch.full((2, 4), VOCAB_SIZE))
    with pytest.raises(ValueError, match=r"tokens .*outside the vocabulary"):
        model(torch.full((2, 4), -1))
    with pytest.raises(ValueError, match=r"\btokens\b"):
        model(torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"\btokens\b"):
        model(torch.ones(4, dtype=torch.long))


# ---------------------------------------------------------------- random_batches

def test_random_batches_epochs_without_replacement():
    tokens, labels = make_sequences(5, seed=7)                          # N = 30
    rows = torch.arange(30)
    batches = random_batches(tokens, labels, rows, batch_size=8, seed=1)
    taken = list(itertools.islice(batches, 12))                         # three epochs of 30 // 8 = 3, and more
    for epoch in range(3):
        seen = torch.cat([b[2] for b in taken[3 * epoch:3 * epoch + 3]])
        assert len(seen) == 24 and len(seen.unique()) == 24           # distinct rows within an epoch
    assert not torch.equal(torch.cat([b[2] for b in taken[:3]]), torch.cat([b[2] for b in taken[3:6]]))
    for x, y, r in taken:
        assert x.shape[0] == y.shape[0] == r.shape[0] == 8
        assert torch.equal(y, labels[r])                                # the tensors stay aligned
        width = int((tokens[r] != PAD_ID).sum(1).max())
        assert x.shape[1] == width                                      # all-padding columns cut
        assert torch.equal(x, tokens[r, :width])


def test_random_batches_seeded_and_small_sets():
    tokens, labels = make_sequences(2, seed=8)                          # N = 12
    a = [b[1] for b in itertools.islice(random_batches(tokens, labels, batch_size=4, seed=3), 6)]
    b = [b[1] for b in itertools.islice(random_batches(tokens, labels, batch_size=4, seed=3), 6)]
    c = [b[1] for b in itertools.islice(random_batches(tokens, labels, batch_size=4, seed=4), 6)]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))
    whole = next(random_batches(tokens, torch.arange(12), batch_size=50))   # batch larger than the data
    assert sorted(whole[1].tolist()) == list(range(12))
    padding_only = torch.zeros(3, 4, dtype=torch.long)
    assert next(random_batches(padding_only, batch_size=2))[0].shape == (2, 1)   # never zero columns


def test_random_batches_value_errors():
    tokens, labels = make_sequences(1)
    with pytest.raises(ValueError, match="first axis"):
        next(random_batches(tokens, labels[:-1]))
    with pytest.raises(ValueError, match="first axis"):
        next(random_batches(tokens[:0]))
    with pytest.raises(ValueError, match="batch_size"):
        next(random_batches(tokens, batch_size=0))
    with pytest.raises(ValueError, match="seed"):
        next(random_batches(tokens, seed=-1))


# ---------------------------------------------------------------- fit and predict

def test_fit_reduces_the_loss_and_predict():
    tokens, labels = make_sequences(50, seed=9)
    torch.manual_seed(0)
    model = SequenceClassifier(ClassifierConfig(VOCAB_SIZE, len(CLASSES), d_model=16, num_heads=2, d_ff=32, num_layers=1,
                               pooling="mean"))
    history = fit(model, classification_loss, random_batches(tokens, labels, batch_size=32, seed=0), steps=60,
                  lr=5e-3, progress=False)
    assert set(history) == {"loss", "lr", "eval_step", "eval", "seconds", "stopped", "optimizer"} and history["seconds"] > 0
    assert history["eval_step"] == history["eval"] == []                  # no evaluate given
    losses = history["loss"]
    assert len(losses) == 60 and all(isinstance(v, float) for v in losses)
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10 - 0.1
    assert model.training                                               # fit leaves the mode it was given
    predicted = predict(model, tokens, batch_size=64)
    assert predicted.shape == (300,) and predicted.dtype == torch.long and predicted.device.type == "cpu"
    assert predicted.min() >= 0 and predicted.max() < len(CLASSES)
    assert model.training                                               # predict restores the caller's mode
    with torch.no_grad():
        torch.testing.assert_close(predicted, model.eval()(tokens).argmax(-1), rtol=0, atol=0)
    assert predict(model, tokens[:5]).shape == (5,) and not model.training
    assert (predicted == labels).double().mean() > 1 / len(CLASSES)      # better than chance already
    assert predict(model, tokens[:0]).shape == (0,)


def test_fit_evaluates_every_eval_every_steps_and_clips():
    tokens, labels = make_sequences(20, seed=9)
    torch.manual_seed(0)
    model = SequenceClassifier(ClassifierConfig(VOCAB_SIZE, len(CLASSES), d_model=16, num_heads=2, d_ff=32, num_layers=1))
    seen = []

    def evaluate(m):
        seen.append((m.training, torch.is_grad_enabled()))
        return float(len(seen))
    history = fit(model, classification_loss, random_batches(tokens, labels, batch_size=16), steps=25,
                  evaluate=evaluate, eval_every=10, clip_norm=1e-3, progress=False)
    assert history["eval_step"] == [10, 20, 25] and history["eval"] == [1.0, 2.0, 3.0]
    assert seen == [(False, False)] * 3                                   # eval mode, no gradients
    with pytest.raises(ValueError, match="clip_norm"):
        fit(model, classification_loss, random_batches(tokens, labels), steps=2, clip_norm=0.0, progress=False)


def test_fit_clip_norm_bounds_the_gradient(monkeypatch):
    """The gradient the optimizer steps with has global norm <= clip_norm, even for a loss scaled by 1e6."""
    tokens, labels = make_sequences(20, seed=9)
    torch.manual_seed(0)
    model = SequenceClassifier(ClassifierConfig(VOCAB_SIZE, len(CLASSES), d_model=16, num_heads=2, d_ff=32, num_layers=1))
    norms, step = [], torch.optim.AdamW.step

    def spy(self, *args, **kwargs):
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        norms.append(torch.sqrt(sum(g.pow(2).sum() for g in grads)).item())
        return step(self, *args, **kwargs)
    monkeypatch.setattr(torch.optim.AdamW, "step", spy)
    fit(model, lambda m, batch: 1e6 * classification_loss(m, batch), random_batches(tokens, labels, batch_size=16),
        steps=3, clip_norm=0.5, progress=False)
    assert len(norms) == 3 and all(n <= 0.5 + 1e-4 for n in norms)


def test_fit_value_errors():
    model = SequenceClassifier(ClassifierConfig(VOCAB_SIZE, 2, d_model=16, num_heads=2, d_ff=32, num_layers=1))
    tokens, labels = make_sequences(1)
    batches = random_batches(tokens, labels % 2)
    with pytest.raises(ValueError, match=r"\bsteps\b"):
        fit(model, classification_loss, batches, steps=1, progress=False)
    with pytest.raises(ValueError, match=r"\blr\b"):
        fit(model, classification_loss, batches, steps=2, lr=0.0, progress=False)
    with pytest.raises(ValueError, match=r"\bprogress\b"):
        fit(model, classification_loss, batches, steps=2, progress="no")


# ---------------------------------------------------------------- the exercise checker

def test_check_pooling_accepts_the_reference(capsys):
    check_pooling(pool)
    assert "check_pooling: correct" in capsys.readouterr().out


def mean_over_all(hidden, keep, method):
    return hidden.mean(1) if method == "mean" else pool(hidden, keep, method)


def mean_over_s(hidden, keep, method):
    return (hidden * keep[..., None]).sum(1) / hidden.size(1) if method == "mean" else pool(hidden, keep, method)


def max_over_all(hidden, keep, method):
    return hidden.amax(1) if method == "max" else pool(hidden, keep, method)


def mean_nan_when_empty(hidden, keep, method):
    real = keep[..., None]
    return (hidden * real).sum(1) / real.sum(1) if method == "mean" else pool(hidden, keep, method)


def max_minus_inf_when_empty(hidden, keep, method):
    return hidden.masked_fill(~keep[..., None], float("-inf")).amax(1) if method == "max" else pool(hidden, keep, method)


@pytest.mark.parametrize("fn, message", [
    (mean_over_all, r"mean on hidden .*: the mask is ignored"),
    (mean_over_s, r"mean on hidden .*: padding counted"),
    (max_over_all, r"max on hidden .*: the mask is ignored"),
    (mean_nan_when_empty, r"mean on hidden .* with an empty row: a sequence with no real token must pool to zeros"),
    (max_minus_inf_when_empty, r"max on hidden .* with an empty row: a sequence with no real token must pool to zeros"),
    (lambda hidden, keep, method: hidden, r"output shape \(4, 5, 5\), expected \(B, d\)"),
    (lambda hidden, keep, method: pool(hidden, keep, method).tolist(), "return a tensor"),
    (lambda hidden, keep, method: pool(hidden, keep, method) + 1e-3, "differs from the masked formula by up to"),
])
def test_check_pooling_names_the_mistake(fn, message, capsys):
    with pytest.raises(AssertionError, match=message):
        check_pooling(fn)
    assert "correct" not in capsys.readouterr().out
