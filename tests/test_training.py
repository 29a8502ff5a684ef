"""Tests for transformer_lib/training.py (Chapter 8): label smoothing, schedules, optimizer, loop, checkpoints."""

import dataclasses
import math

import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from transformer_lib.data import CharTokenizer, LengthGroupedSampler, TranslationDataset, collate
from transformer_lib.exercises.training import check_label_smoothing
from transformer_lib.model import Transformer, TransformerConfig
from transformer_lib.training import (
    CHECKSUM_KEY,
    LabelSmoothingLoss,
    TrainingDiverged,
    checkpoint_checksum,
    decay_groups,
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


def _loss_of(loss_fn):
    """A train() loss: loss_fn(logits, target) of a Batch, teacher forcing (Chapter 8's translation_loss)."""
    return lambda model, b: loss_fn(model(b.src, b.tgt_in, b.src_mask, b.tgt_mask), b.tgt_out)


@pytest.mark.parametrize("start_mode", ["train", "eval"])
def test_train_reduces_loss_is_deterministic_and_restores_the_mode(start_mode):
    tok, ds, loader = _reverse_task()
    results = []
    for _ in range(2):
        model = _tiny_model(len(tok)).train(start_mode == "train")
        loss_fn = LabelSmoothingLoss(label_smoothing=0.1, pad_id=tok.pad_id)
        opt = make_optimizer(model, lr=3e-3)
        sched = warmup_linear_scheduler(opt, 120, 10)
        before = evaluate_loss(model, loader, loss_fn)
        _, _, loader = _reverse_task()                      # fresh sampler: same batches both runs
        modes = []
        hist = train(model, _loss_of(loss_fn), loader, opt, sched, 120, eval_every=60, progress=False,
                     evaluate=lambda m, loader=loader, loss_fn=loss_fn: evaluate_loss(m, loader, loss_fn),
                     on_step=lambda step, h, modes=modes, model=model: modes.append(model.training))
        results.append(hist)
        assert len(hist["loss"]) == 120 and hist["eval_step"] == [60, 120] and not hist["stopped"]
        assert hist["eval"][-1] < 0.6 * before
        assert all(modes) and model.training == (start_mode == "train")   # trained in train mode, then restored
    assert results[0]["loss"] == results[1]["loss"]     # seeded: the same run twice


def test_train_equals_a_hand_written_loop():
    """The loop is the textbook one: forward, loss, zero_grad, backward, step, scheduler step (bit for bit)."""
    tok, _, _ = _reverse_task()
    loss_fn = LabelSmoothingLoss(0.1, tok.pad_id)
    runs = []
    for by_hand in (False, True):
        model = _tiny_model(len(tok))
        opt = make_optimizer(model, lr=3e-3)
        sched = warmup_linear_scheduler(opt, 12, 2)
        loader = _reverse_task()[2]
        if by_hand:
            losses, batches = [], iter(loader)
            for _ in range(12):
                b = next(batches)
                loss = _loss_of(loss_fn)(model, b)
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                losses.append(loss.item())
        else:
            losses = train(model, _loss_of(loss_fn), loader, opt, sched, 12, progress=False)["loss"]
        runs.append((losses, [p.detach().clone() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1], strict=True))


def test_train_records_the_value_of_a_pair_and_stops_on_request():
    model, loader, loss_fn, opt, sched = _setup()
    seen = []
    hist = train(model, lambda m, b: (_loss_of(loss_fn)(m, b), 42.0), loader, opt, sched, 10, progress=False,
                 on_step=lambda step, h: seen.append(step) or step == 4)
    assert hist["loss"] == [42.0] * 4 and seen == [1, 2, 3, 4] and hist["stopped"]


def test_train_stops_before_a_non_finite_update():
    model, loader, loss_fn, opt, sched = _setup()
    before = [p.detach().clone() for p in model.parameters()]
    calls = []

    def loss_of(m, b):
        calls.append(1)
        loss = _loss_of(loss_fn)(m, b)
        return loss * float("nan") if len(calls) == 3 else loss
    with pytest.raises(TrainingDiverged, match="loss is nan at step 3 of 10.*weights after step 2"):
        train(model, loss_of, loader, opt, sched, 10, progress=False)
    assert model.training and isinstance(TrainingDiverged("x"), ValueError)
    moved = [not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True)]
    assert any(moved)                                         # steps 1 and 2 were applied, step 3 was not
    assert sched.last_epoch == 2


def test_train_clips_the_gradient_norm():
    model, loader, loss_fn, _, _ = _setup()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    before = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    train(model, _loss_of(loss_fn), loader, opt, None, 1, clip_norm=1e-3, progress=False)
    after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert abs((after - before).norm().item() - 1e-3) < 1e-6      # SGD with lr 1 moves by the clipped gradient


def test_train_autocast_and_grad_scaler_on_the_cpu():
    model, loader, loss_fn, opt, sched = _setup()
    scaler = torch.amp.GradScaler("cpu")
    hist = train(model, _loss_of(loss_fn), loader, opt, sched, 3, autocast=torch.bfloat16, scaler=scaler,
                 progress=False)
    assert len(hist["loss"]) == 3 and all(map(math.isfinite, hist["loss"]))


def test_train_continues_from_start():
    """start > 0 continues a run: the step numbers, the scheduler and an iterator of batches pick up there."""
    tok, _, loader = _reverse_task(n=600)
    runs = []
    for parts in (((0, 30),), ((0, 10), (10, 30))):
        model = _tiny_model(len(tok))
        loss_fn = LabelSmoothingLoss(label_smoothing=0.1, pad_id=tok.pad_id)
        opt = make_optimizer(model, lr=3e-3)
        sched = warmup_linear_scheduler(opt, 30, 3)
        batches = iter(_reverse_task(n=600)[2])                  # a fresh sampler each run: the same batches
        losses, steps = [], []
        for start, stop in parts:
            losses += train(model, _loss_of(loss_fn), batches, opt, sched, stop, start=start, progress=False,
                            on_step=lambda step, h, steps=steps: steps.append(step))["loss"]
        runs.append((losses, [p.detach().clone() for p in model.parameters()]))
        assert steps == list(range(1, 31))
    assert len(loader) >= 30 and runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1], strict=True))


def test_train_runs_more_steps_than_one_epoch():
    model, loader, loss_fn, opt, _ = _setup()
    sched = warmup_linear_scheduler(opt, 50, 2)
    hist = train(model, _loss_of(loss_fn), loader, opt, sched, 2 * len(loader) + 1, progress=False)
    assert len(hist["loss"]) == 2 * len(loader) + 1 and hist["eval_step"] == []
    with pytest.raises(ValueError, match=f"^batches ran out after {len(loader)} batches, but this run takes"):
        train(model, _loss_of(loss_fn), iter(loader), opt, sched, len(loader) + 1, progress=False)


def test_checkpoint_round_trip(tmp_path):
    model = _tiny_model(12).eval()
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, model, chars=list("abcdefgh"), note="hello")
    restored, ckpt = load_checkpoint(path)
    assert ckpt["chars"] == list("abcdefgh") and ckpt["note"] == "hello"
    assert ckpt["model_class"] == "transformer_lib.model.Transformer"
    assert restored.config == model.config and not restored.training
    src, tgt = torch.randint(1, 12, (3, 7)), torch.randint(1, 12, (3, 5))
    with torch.no_grad():
        assert torch.equal(model(src, tgt), restored(src, tgt))
    assert restored.lm_head.weight is restored.src_embed.weight
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), restored.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2)


def test_a_flipped_bit_is_refused(tmp_path):
    """save_checkpoint stores a SHA-256 of the contents; load_checkpoint refuses a file that changed since."""
    model = _tiny_model(12)
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, model)
    state = torch.load(path, weights_only=True)
    state["state_dict"]["lm_head.weight"].view(torch.int32)[0, 0] ^= 1          # one bit of one weight
    torch.save(state, path)
    with pytest.raises(ValueError, match=r"is corrupt: the SHA-256 of its contents"):
        load_checkpoint(path)


def test_one_checkpoint_format_for_every_family(tmp_path):
    """load_checkpoint rebuilds any family from save_checkpoint's file and from Chapter 13's training state."""
    from transformer_lib.bert import BertConfig, BertModel
    from transformer_lib.distributed import TRAINING_STATE_KEYS, save_checkpoint_atomic, training_state
    from transformer_lib.gpt import GPT, GPTConfig
    from transformer_lib.t5 import T5, T5Config
    from transformer_lib.vit import ViT, ViTConfig

    torch.manual_seed(0)
    models = [GPT(GPTConfig(vocab_size=11, max_len=8, d_model=16, num_heads=2, d_ff=32, num_layers=1)),
              BertModel(BertConfig(vocab_size=13, d_model=16, num_heads=2, d_ff=32, num_layers=1, max_len=8)),
              T5(T5Config(vocab_size=13, d_model=16, num_heads=2, d_ff=32, num_layers=1, num_decoder_layers=1)),
              ViT(ViTConfig(image_size=8, patch_size=4, num_channels=1, num_classes=3, d_model=16, num_heads=2,
                            d_ff=32, num_layers=1))]
    for model in models:
        state = {}
        for how in ("save_checkpoint", "training_state"):
            path = tmp_path / f"{type(model).__name__}-{how}.pt"
            if how == "save_checkpoint":
                save_checkpoint(path, model)
            else:
                opt = make_optimizer(model)
                state = training_state(model, opt, warmup_linear_scheduler(opt, 10, 2), 3)
                save_checkpoint_atomic(path, state)
            restored, ckpt = load_checkpoint(path)
            assert type(restored) is type(model) and restored.config == model.config
            assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                         restored.state_dict().values(), strict=True))
        assert set(TRAINING_STATE_KEYS) <= set(state)


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
    for empty in ([], iter([])):
        with pytest.raises(ValueError, match="^batches must yield at least one batch, got none"):
            train(model, _loss_of(loss_fn), empty, opt, sched, 5, progress=False)


@pytest.mark.parametrize("kwargs, name", [({"steps": 0}, "steps"), ({"steps": True}, "steps"),
                                          ({"steps": 2.0}, "steps"), ({"eval_every": 0}, "eval_every"),
                                          ({"eval_every": -5}, "eval_every"), ({"progress": "no"}, "progress"),
                                          ({"start": -1}, "start"), ({"start": 3}, "start"),
                                          ({"clip_norm": 0.0}, "clip_norm"), ({"clip_norm": math.nan}, "clip_norm"),
                                          ({"autocast": torch.float64}, "autocast"), ({"autocast": "bf16"}, "autocast"),
                                          ({"evaluate": 1.0}, "evaluate"), ({"on_step": "print"}, "on_step"),
                                          ({"loss_fn": None}, "loss_fn"), ({"batches": 5}, "batches"),
                                          ({"optimizer": None}, "optimizer"), ({"scheduler": "linear"}, "scheduler"),
                                          ({"model": "gpt"}, "model"), ({"model": nn.ReLU()}, "model")])
def test_train_argument_errors(kwargs, name):
    model, loader, loss_fn, opt, sched = _setup()
    args = {"model": model, "loss_fn": _loss_of(loss_fn), "batches": loader, "optimizer": opt, "scheduler": sched,
            "steps": 3, "eval_every": 2, "progress": False, **kwargs}
    with pytest.raises(ValueError, match=f"^{name} must "):
        train(**args)


def test_train_rejects_a_loss_that_is_not_a_scalar():
    model, loader, loss_fn, opt, sched = _setup()
    for bad in (lambda m, b: 1.0, lambda m, b: torch.ones(2, requires_grad=True), lambda m, b: None):
        with pytest.raises(ValueError, match="^loss_fn must return a scalar loss tensor"):
            train(model, bad, loader, opt, sched, 2, progress=False)
    assert model.training


def test_load_checkpoint_errors(tmp_path):
    model = _tiny_model(12)
    good = {"model_class": "transformer_lib.model.Transformer", "config_class": "transformer_lib.model.TransformerConfig",
            "config": dataclasses.asdict(model.config), "state_dict": model.state_dict()}
    cases = [("no_config.pt", {k: v for k, v in good.items() if k != "config"}, "has no 'config' entry"),
             ("no_weights.pt", {k: v for k, v in good.items() if k != "state_dict"}, "has no 'state_dict' entry"),
             ("no_class.pt", {k: v for k, v in good.items() if k != "model_class"}, "has no 'model_class' entry"),
             ("a_list.pt", [1, 2], "holds list .*, not a dict"),
             ("foreign.pt", {**good, "model_class": "os.system"}, "'model_class' must name a class of transformer_lib"),
             ("unknown.pt", {**good, "model_class": "transformer_lib.model.Nope"}, "does not have")]
    for name, content, message in cases:
        path = tmp_path / name
        sealed = {**content, CHECKSUM_KEY: checkpoint_checksum(content)} if isinstance(content, dict) else content
        torch.save(sealed, path)
        with pytest.raises(ValueError, match=message):
            load_checkpoint(path)
    torch.save(good, tmp_path / "unsealed.pt")                           # plain torch.save: no checksum
    with pytest.raises(ValueError, match="not a checkpoint written by transformer_lib: it has no checksum"):
        load_checkpoint(tmp_path / "unsealed.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"not a checkpoint written by transformer_lib \(truncated or corrupt\?\)"):
        load_checkpoint(tmp_path / "junk.pt")
    with pytest.raises(ValueError, match="^model must be a transformer_lib model built from a dataclass config"):
        save_checkpoint(tmp_path / "x.pt", nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"^extra entries must not replace the checkpoint's own, got \['config'\]"):
        save_checkpoint(tmp_path / "x.pt", model, config={})


def test_decay_groups_decay_only_the_weight_matrices():
    from transformer_lib.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=11, max_len=8, d_model=16, num_heads=2, d_ff=32, num_layers=2))
    decay, rest = decay_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and rest["weight_decay"] == 0.0
    assert len(decay["params"]) + len(rest["params"]) == len(list(model.parameters()))   # each once
    decayed = {names[id(p)] for p in decay["params"]}
    assert decayed and all(n.endswith(".weight") and "norm" not in n and "embed" not in n for n in decayed)
    assert {n for n in names.values() if n.endswith("bias")} <= {names[id(p)] for p in rest["params"]}
    assert all(p is not model.token.weight for p in decay["params"])         # the tied output layer = embedding
    # AdamW with a zero gradient: the decayed weights shrink, the rest stay put
    opt = torch.optim.AdamW(decay_groups(model, 0.5), lr=0.1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) == (n not in decayed), n
    with pytest.raises(ValueError, match="^weight_decay must"):
        decay_groups(model, -0.1)
    with pytest.raises(ValueError, match="^model must be an nn.Module"):
        decay_groups([], 0.1)
