"""Tests for transformer_lib/training.py (Chapter 8): label smoothing, schedules, optimizer, loop, checkpoints."""

import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from transformer_lib.data import CharTokenizer, LengthGroupedSampler, TranslationDataset, collate
from transformer_lib.exercises.training import check_label_smoothing
from transformer_lib.model import Transformer, TransformerConfig
from transformer_lib.training import (
    LabelSmoothingLoss,
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


@pytest.mark.parametrize("ls", [0.0, 0.1, 0.3, 1.0])
@pytest.mark.parametrize("pad_id", [0, 2])
def test_label_smoothing_equals_torch(ls, pad_id):
    gen = torch.Generator().manual_seed(1)
    logits = 4 * torch.randn(3, 7, 11, generator=gen, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 11, (3, 7), generator=gen)
    target[:, 5:] = pad_id
    ours = LabelSmoothingLoss(label_smoothing=ls, pad_id=pad_id)(logits, target)
    ref = nn.CrossEntropyLoss(label_smoothing=ls, ignore_index=pad_id)(logits.reshape(-1, 11), target.reshape(-1))
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


def test_label_smoothing_defaults_and_edge_cases():
    loss = LabelSmoothingLoss()
    assert (loss.label_smoothing, loss.pad_id) == (0.1, 0)
    logits = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    everything_padding = torch.zeros(2, 3, dtype=torch.long)
    value = loss(logits, everything_padding)                    # nothing to learn: 0, not nan
    assert value.item() == 0.0
    value.backward()
    assert (logits.grad == 0).all()
    empty = loss(torch.randn(0, 3, 5), torch.zeros(0, 3, dtype=torch.long))
    assert empty.item() == 0.0
    # ids other than pad_id must lie in [0, V); pad_id itself may lie anywhere in [0, V) (checked above)
    assert torch.isfinite(LabelSmoothingLoss(pad_id=4)(logits, torch.full((2, 3), 4)))


@pytest.mark.parametrize("kwargs, name", [({"label_smoothing": 1.5}, "label_smoothing"),
                                          ({"label_smoothing": -0.1}, "label_smoothing"),
                                          ({"label_smoothing": float("nan")}, "label_smoothing"),
                                          ({"label_smoothing": True}, "label_smoothing"),
                                          ({"pad_id": True}, "pad_id"), ({"pad_id": -1}, "pad_id"),
                                          ({"pad_id": 0.0}, "pad_id")])
def test_label_smoothing_constructor_errors(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name} must"):
        LabelSmoothingLoss(**kwargs)
    with pytest.raises(TypeError):
        LabelSmoothingLoss(eps=0.1)                              # the old name is gone: eps is LayerNorm's


def test_label_smoothing_forward_errors():
    loss = LabelSmoothingLoss()
    with pytest.raises(ValueError, match="leading shape"):
        loss(torch.randn(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^target holds ids outside \[0, 4\]"):
        loss(torch.randn(2, 3, 5), torch.tensor([[1, 2, 5], [0, 0, 0]]))      # 5 >= V
    with pytest.raises(ValueError, match=r"^target holds ids outside \[0, 4\]"):
        loss(torch.randn(2, 3, 5), torch.tensor([[1, 2, -3], [0, 0, 0]]))     # negative
    with pytest.raises(ValueError, match="^target must be an integer tensor"):
        loss(torch.randn(2, 3, 5), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="^logits must be a floating-point tensor"):
        loss(torch.zeros(2, 3, 5, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="^logits must be"):
        loss([[0.1, 0.2]], torch.zeros(1, dtype=torch.long))


def test_smoothed_targets_errors():
    assert smoothed_targets(torch.tensor([1, 2]), 4, label_smoothing=0.0).tolist() == [[0, 1, 0, 0], [0, 0, 1, 0]]
    with pytest.raises(ValueError, match=r"^target holds ids from 0 to 4, outside \[0, 3\]"):
        smoothed_targets(torch.tensor([0, 4]), 4)
    with pytest.raises(ValueError, match="^target holds ids"):
        smoothed_targets(torch.tensor([-1]), 4)
    with pytest.raises(ValueError, match="^label_smoothing must lie in"):
        smoothed_targets(torch.tensor([0]), 4, label_smoothing=2.0)
    with pytest.raises(ValueError, match="^vocab_size must be an int"):
        smoothed_targets(torch.tensor([0]), True)
    with pytest.raises(ValueError, match="^target must be an integer tensor"):
        smoothed_targets(torch.tensor([0.0]), 4)


def test_check_label_smoothing_accepts_and_rejects():
    def reference(logits, target, label_smoothing, pad_id):
        return LabelSmoothingLoss(label_smoothing, pad_id)(logits, target)
    check_label_smoothing(reference)

    def no_smoothing(logits, target, label_smoothing, pad_id):
        return LabelSmoothingLoss(0.0, pad_id)(logits, target)
    with pytest.raises(AssertionError, match="smoothing is missing"):
        check_label_smoothing(no_smoothing)

    def keeps_padding(logits, target, label_smoothing, pad_id):
        return nn.CrossEntropyLoss(label_smoothing=label_smoothing)(logits.reshape(-1, logits.size(-1)),
                                                                    target.reshape(-1))
    with pytest.raises(AssertionError, match="padding positions are not ignored"):
        check_label_smoothing(keeps_padding)

    def wrong_classes_only(logits, target, label_smoothing, pad_id):
        V = logits.size(-1)
        q = torch.full_like(logits, label_smoothing / (V - 1)).scatter_(-1, target[..., None], 1 - label_smoothing)
        return -(q * torch.log_softmax(logits, -1)).sum(-1)[target != pad_id].mean()
    with pytest.raises(AssertionError, match="V - 1 wrong classes"):
        check_label_smoothing(wrong_classes_only)

    def not_scalar(logits, target, label_smoothing, pad_id):
        return logits.sum(-1)
    with pytest.raises(AssertionError, match="scalar"):
        check_label_smoothing(not_scalar)


def test_noam_values():
    assert noam_lr(1, 512) == pytest.approx(1.7469e-7, abs=1e-11)
    assert noam_lr(4000, 512) == pytest.approx(6.9877e-4, abs=1e-8)
    assert noam_lr(100_000, 512) == pytest.approx(1.3975e-4, abs=1e-8)
    lrs = [noam_lr(s, 512) for s in range(1, 10_000)]
    assert max(lrs) == noam_lr(4000, 512)
    for args, name in (((0, 512), "step"), ((1.5, 512), "step"), ((True, 512), "step"), ((10, 0), "d_model"),
                       ((10, -512), "d_model"), ((10, 512, 0), "warmup"), ((10, 512, -4000), "warmup"),
                       ((10, 512, 4000.0), "warmup")):
        with pytest.raises(ValueError, match=f"^{name} must be an int >= 1"):
            noam_lr(*args)                       # never a complex number or a ZeroDivisionError


def test_noam_scheduler_and_adam():
    opt = make_optimizer(nn.Linear(1, 1), lr=1.0)
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9
    sched = noam_scheduler(opt, d_model=64, warmup=100)
    for step in range(1, 301):
        assert opt.param_groups[0]["lr"] == pytest.approx(noam_lr(step, 64, 100), rel=1e-12)
        opt.step()
        sched.step()
    with pytest.raises(ValueError, match="^warmup must be an int >= 1"):
        noam_scheduler(opt, d_model=64, warmup=0)             # at construction, not at the first step
    with pytest.raises(ValueError, match="^optimizer must be a torch.optim.Optimizer"):
        noam_scheduler(nn.Linear(1, 1), d_model=64)
    for lr in (0.0, -1e-3, float("inf"), True):
        with pytest.raises(ValueError, match="^lr must"):
            make_optimizer(nn.Linear(1, 1), lr=lr)


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
    with pytest.raises(ValueError, match="^warmup_steps must be < total_steps"):
        warmup_linear_scheduler(opt, 10, 10)
    for args, name in (((10, 0), "warmup_steps"), ((10, True), "warmup_steps"), ((0, 1), "total_steps"),
                       ((10.0, 2), "total_steps")):
        with pytest.raises(ValueError, match=f"^{name} must be an int"):
            warmup_linear_scheduler(opt, *args)
    with pytest.raises(ValueError, match="^optimizer must be"):
        warmup_linear_scheduler(None, 10, 2)


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
        loss_fn = LabelSmoothingLoss(label_smoothing=0.1, pad_id=tok.pad_id)
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


def _setup():
    tok, ds, loader = _reverse_task(n=20)
    model = _tiny_model(len(tok))
    loss_fn = LabelSmoothingLoss(label_smoothing=0.1, pad_id=tok.pad_id)
    opt = make_optimizer(model, lr=1e-3)
    return model, loader, loss_fn, opt, warmup_linear_scheduler(opt, 10, 2)


def test_train_and_evaluate_reject_empty_loaders():
    model, loader, loss_fn, opt, sched = _setup()
    with pytest.raises(ValueError, match="^loader must yield at least one batch"):
        evaluate_loss(model, [], loss_fn)
    with pytest.raises(ValueError, match="^loader must yield at least one batch .* only padding"):
        only_padding = collate([(torch.tensor([4, 2]), torch.tensor([1, 2]))])
        only_padding.tgt_out.fill_(0)
        evaluate_loss(model, [only_padding], loss_fn)
    with pytest.raises(ValueError, match="^loader must yield at least one batch"):
        train(model, [], loss_fn, opt, sched, 5, progress=False)
    with pytest.raises(ValueError, match="^valid_loader must yield at least one batch"):
        train(model, loader, loss_fn, opt, sched, 5, valid_loader=[], progress=False)
    with pytest.raises(ValueError, match="^valid_loader must yield at least one batch"):
        train(model, loader, loss_fn, opt, sched, 5, valid_loader=iter([]), eval_every=1, progress=False)


@pytest.mark.parametrize("kwargs, name", [({"steps": 0}, "steps"), ({"steps": True}, "steps"),
                                          ({"steps": 2.0}, "steps"), ({"eval_every": 0}, "eval_every"),
                                          ({"eval_every": -5}, "eval_every"), ({"progress": "no"}, "progress")])
def test_train_argument_errors(kwargs, name):
    model, loader, loss_fn, opt, sched = _setup()
    args = {"steps": 3, "valid_loader": loader, "eval_every": 2, "progress": False, **kwargs}
    with pytest.raises(ValueError, match=f"^{name} must be"):
        train(model, loader, loss_fn, opt, sched, **args)


def test_train_runs_more_steps_than_one_epoch():
    model, loader, loss_fn, opt, _ = _setup()
    sched = warmup_linear_scheduler(opt, 50, 2)
    hist = train(model, loader, loss_fn, opt, sched, 2 * len(loader) + 1, progress=False)
    assert len(hist["train_loss"]) == 2 * len(loader) + 1 and hist["valid_step"] == []


def test_load_checkpoint_errors(tmp_path):
    model = _tiny_model(12)
    for name, content, missing in (("no_config.pt", {"state_dict": model.state_dict()}, "config"),
                                   ("no_weights.pt", {"config": {"src_vocab_size": 12}}, "state_dict"),
                                   ("a_list.pt", [1, 2], "config")):
        path = tmp_path / name
        torch.save(content, path)
        with pytest.raises(ValueError, match=rf"checkpoint .*{name}.* has no '{missing}' entry"):
            load_checkpoint(path)
    with pytest.raises(ValueError, match="^model must be a Transformer"):
        save_checkpoint(tmp_path / "x.pt", nn.Linear(2, 2))


def test_train_in_slices_on_one_iterator_equals_one_call():
    """Chapter 8 trains in slices (to write checkpoints): an iterator continues where the last call stopped."""
    tok, _, loader = _reverse_task(n=600)
    runs = []
    for slices in ((30,), (10, 20)):
        model = _tiny_model(len(tok))
        loss_fn = LabelSmoothingLoss(label_smoothing=0.1, pad_id=tok.pad_id)
        opt = make_optimizer(model, lr=3e-3)
        sched = warmup_linear_scheduler(opt, 30, 3)
        batches = iter(_reverse_task(n=600)[2])                  # a fresh sampler each run: the same batches
        losses = []
        for steps in slices:
            losses += train(model, batches, loss_fn, opt, sched, steps, progress=False)["train_loss"]
        runs.append((losses, [p.detach().clone() for p in model.parameters()]))
    assert len(loader) >= 30 and runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1], strict=True))
