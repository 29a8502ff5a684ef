"""Tests for transformer_lib/training.py (Chapter 8): label smoothing, schedules, optimizer, loop, checkpoints."""

import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from transformer_lib.data import CharTokenizer, LengthGroupedSampler, TranslationDataset, collate
from transformer_lib.model import Transformer, TransformerConfig
from transformer_lib.training import (
    LabelSmoothingLoss,
    check_label_smoothing,
    evaluate_loss,
    load_checkpoint,
    make_optimizer,
    noam_lr,
    noam_scheduler,
    save_checkpoint,
    smoothed_targets,
    train,
    warmup_linear_scheduler,
)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3, 1.0])
@pytest.mark.parametrize("pad_id", [0, 2])
def test_label_smoothing_equals_torch(eps, pad_id):
    gen = torch.Generator().manual_seed(1)
    logits = 4 * torch.randn(3, 7, 11, generator=gen, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 11, (3, 7), generator=gen)
    target[:, 5:] = pad_id
    ours = LabelSmoothingLoss(eps, pad_id)(logits, target)
    ref = nn.CrossEntropyLoss(label_smoothing=eps, ignore_index=pad_id)(logits.reshape(-1, 11), target.reshape(-1))
    assert torch.allclose(ours, ref, rtol=0, atol=1e-12)
    g1, = torch.autograd.grad(ours, logits)
    g2, = torch.autograd.grad(ref, logits)
    assert torch.allclose(g1, g2, atol=1e-14)
    assert (g1[target == pad_id] == 0).all()                     # padding receives no gradient


def test_label_smoothing_is_the_expected_cross_entropy():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(20, 9, generator=gen, dtype=torch.float64)
    target = torch.randint(1, 9, (20,), generator=gen)
    q = smoothed_targets(target, 9, 0.1)
    assert torch.allclose(q.sum(1), torch.ones(20, dtype=torch.float64))
    assert torch.allclose(q[torch.arange(20), target], torch.full((20,), 0.9 + 0.1 / 9, dtype=torch.float64))
    manual = -(q * torch.log_softmax(logits, -1)).sum(1).mean()
    assert torch.allclose(LabelSmoothingLoss(0.1, 0)(logits, target), manual, atol=1e-12)
    # minimum at p = q, equal to the entropy of q
    floor = -(q[:1] * q[:1].log()).sum()
    assert torch.allclose(LabelSmoothingLoss(0.1, 0)(q[:1].log(), target[:1]), floor, atol=1e-12)


def test_label_smoothing_errors():
    with pytest.raises(ValueError, match="eps"):
        LabelSmoothingLoss(1.5)
    with pytest.raises(ValueError, match="leading shape"):
        LabelSmoothingLoss()(torch.randn(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def test_check_label_smoothing_accepts_and_rejects():
    def reference(logits, target, eps, pad_id):
        return LabelSmoothingLoss(eps, pad_id)(logits, target)
    check_label_smoothing(reference)

    def no_smoothing(logits, target, eps, pad_id):
        return LabelSmoothingLoss(0.0, pad_id)(logits, target)
    with pytest.raises(AssertionError, match="smoothing is missing"):
        check_label_smoothing(no_smoothing)

    def keeps_padding(logits, target, eps, pad_id):
        return nn.CrossEntropyLoss(label_smoothing=eps)(logits.reshape(-1, logits.size(-1)), target.reshape(-1))
    with pytest.raises(AssertionError, match="padding positions are not ignored"):
        check_label_smoothing(keeps_padding)

    def not_scalar(logits, target, eps, pad_id):
        return logits.sum(-1)
    with pytest.raises(AssertionError, match="scalar"):
        check_label_smoothing(not_scalar)


def test_noam_values():
    assert noam_lr(1, 512) == pytest.approx(1.7469e-7, abs=1e-11)
    assert noam_lr(4000, 512) == pytest.approx(6.9877e-4, abs=1e-8)
    assert noam_lr(100_000, 512) == pytest.approx(1.3975e-4, abs=1e-8)
    lrs = [noam_lr(s, 512) for s in range(1, 10_000)]
    assert max(lrs) == noam_lr(4000, 512)
    with pytest.raises(ValueError, match="step counts from 1"):
        noam_lr(0, 512)


def test_noam_scheduler_and_adam():
    opt = make_optimizer(nn.Linear(1, 1), lr=1.0)
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9
    sched = noam_scheduler(opt, d_model=64, warmup=100)
    for step in range(1, 301):
        assert opt.param_groups[0]["lr"] == pytest.approx(noam_lr(step, 64, 100), rel=1e-12)
        opt.step()
        sched.step()


def test_warmup_linear_scheduler():
    opt = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.5)
    sched = warmup_linear_scheduler(opt, total_steps=100, warmup_steps=10)
    lrs = []
    for _ in range(100):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.05) and lrs[9] == pytest.approx(0.5) and max(lrs) == pytest.approx(0.5)
    assert lrs[-1] == pytest.approx(0.0) and lrs[54] == pytest.approx(0.25)
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10], strict=False))
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:], strict=False))
    with pytest.raises(ValueError, match="warmup_steps"):
        warmup_linear_scheduler(opt, 10, 10)


def _reverse_task(n=200, seed=0):
    """A tiny copy-and-reverse task: 'abc' -> 'cba'."""
    gen = torch.Generator().manual_seed(seed)
    words = ["".join("abcdef"[int(i)] for i in torch.randint(0, 6, (int(torch.randint(2, 6, (1,), generator=gen)),),
                                                            generator=gen)) for _ in range(n)]
    pairs = [(w, w[::-1]) for w in words]
    tok = CharTokenizer("abcdef")
    ds = TranslationDataset(pairs, tok)
    loader = DataLoader(ds, batch_sampler=LengthGroupedSampler([len(s) for s, _ in ds], 16, seed=seed),
                        collate_fn=collate)
    return tok, ds, loader


def _tiny_model(vocab):
    torch.manual_seed(0)
    return Transformer(TransformerConfig(vocab, vocab, d_model=32, num_heads=4, d_ff=64, num_encoder_layers=1,
                                         num_decoder_layers=1, dropout=0.0, max_len=64))


def test_train_reduces_loss_and_is_deterministic():
    tok, ds, loader = _reverse_task()
    results = []
    for _ in range(2):
        model = _tiny_model(len(tok))
        loss_fn = LabelSmoothingLoss(0.1, tok.pad_id)
        opt = make_optimizer(model, lr=3e-3)
        sched = warmup_linear_scheduler(opt, 120, 10)
        before = evaluate_loss(model, loader, loss_fn)
        _, _, loader = _reverse_task()                      # fresh sampler: same batches both runs
        hist = train(model, loader, loss_fn, opt, sched, 120, valid_loader=loader, eval_every=60, progress=False)
        results.append(hist)
        assert len(hist["train_loss"]) == 120 and hist["valid_step"] == [60, 120]
        assert hist["valid_loss"][-1] < 0.6 * before
        assert not model.training
    assert results[0]["train_loss"] == results[1]["train_loss"]     # seeded: the same run twice


def test_checkpoint_round_trip(tmp_path):
    model = _tiny_model(12).eval()
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, model, chars=list("abcdefgh"), note="hello")
    restored, ckpt = load_checkpoint(path)
    assert ckpt["chars"] == list("abcdefgh") and ckpt["note"] == "hello"
    assert restored.config == model.config and not restored.training
    src, tgt = torch.randint(1, 12, (3, 7)), torch.randint(1, 12, (3, 5))
    with torch.no_grad():
        assert torch.equal(model(src, tgt), restored(src, tgt))
    assert restored.generator.weight is restored.src_embed.weight
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), restored.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2)
