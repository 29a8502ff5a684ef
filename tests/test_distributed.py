"""Tests of Chapter 13's library code: transformer_lib.distributed and the training script transformer_lib.train."""

import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from transformer_lib import train as train_script
from transformer_lib.distributed import (
    StepSampler,
    all_reduce_sum,
    global_token_count,
    load_training_state,
    restore_training_state,
    save_checkpoint_atomic,
    setup_distributed,
    token_mean_loss,
    training_state,
    unwrap,
)
from transformer_lib.model import Transformer, TransformerConfig
from transformer_lib.training import load_checkpoint, make_optimizer, warmup_linear_scheduler

# A tiny translator: a run of a few steps takes well under a second.
TINY = ["--d-model", "32", "--heads", "4", "--d-ff", "64", "--layers", "1", "--numbers", "600", "--valid", "50",
        "--no-progress"]


def _env():
    """The environment of a child process: one thread per process (two cores), no downloads."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _weights(path) -> dict:
    return torch.load(path, weights_only=True)["state_dict"]


def _tiny_parts(seed=0):
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig(12, 12, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1,
                                          num_decoder_layers=1, dropout=0.1, max_len=16)).double()
    optimizer = make_optimizer(model, lr=1e-2)
    return model, optimizer, warmup_linear_scheduler(optimizer, 10, 2)


def _step(model, optimizer, scheduler, seed=0):
    g = torch.Generator().manual_seed(seed)
    src, tgt = torch.randint(1, 12, (3, 5), generator=g), torch.randint(1, 12, (3, 6), generator=g)
    loss = F.cross_entropy(model(src, tgt[:, :-1]).flatten(0, 1), tgt[:, 1:].flatten())   # uses dropout
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()

# ----------------------------------------------------------------------------------------- process group


def test_setup_single_process(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    ctx = setup_distributed("cpu")
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.device, ctx.is_main) == (0, 1, 0, torch.device("cpu"), True)
    assert not torch.distributed.is_initialized()            # one process: no process group


def test_setup_refuses_bad_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="RANK must be < WORLD_SIZE=2"):
        setup_distributed("cpu")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ValueError, match="torchrun"):
        setup_distributed("cpu")
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE must be an int"):
        setup_distributed("cpu")

# ------------------------------------------------------------------------------------------ data order


def test_step_sampler_ranks_share_the_single_process_batch():
    n, B, steps = 103, 8, 30                                   # 12 steps per epoch: crosses two epochs
    one = StepSampler(n, B, seed=3)
    two = [StepSampler(n, B, rank=r, world_size=2, seed=3) for r in range(2)]
    four = [StepSampler(n, B, rank=r, world_size=4, seed=3) for r in range(4)]
    for step in range(steps):
        batch = one.indices(step)
        assert len(batch) == B and len(set(batch)) == B
        assert sorted(batch) == sorted(i for s in two for i in s.indices(step))
        assert sorted(batch) == sorted(i for s in four for i in s.indices(step))
    epoch0 = [i for step in range(len(one)) for i in one.indices(step)]
    assert len(set(epoch0)) == len(one) * B                   # no example twice in an epoch


def test_step_sampler_validates():
    with pytest.raises(ValueError, match="global_batch must be divisible by world_size=2"):
        StepSampler(10, 3, rank=0, world_size=2)
    with pytest.raises(ValueError, match="rank must be < world_size=2"):
        StepSampler(10, 4, rank=2, world_size=2)
    with pytest.raises(ValueError, match="global_batch must be <= num_examples=10"):
        StepSampler(10, 12)
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        StepSampler(10, 2).indices(-1)

# ------------------------------------------------------------------------------------ loss normalisation


def test_token_mean_loss_makes_the_ddp_average_exact():
    """Two 'ranks' with different numbers of real tokens: averaging their gradients (what DDP does) gives the
    full batch's token-mean gradient with token_mean_loss, and a wrong one with per-rank means."""
    torch.manual_seed(0)
    w = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    x, y = torch.randn(10, 5, dtype=torch.float64), torch.randint(0, 7, (10,))
    keep = torch.tensor([1, 1, 1, 1, 1, 1, 1, 0, 0, 0], dtype=torch.bool)   # False: a padding position
    halves = [slice(0, 3), slice(3, 10)]                  # rank 0: 3 real tokens; rank 1: 4 real + 3 padding

    def token_losses(part):
        return F.cross_entropy(x[part] @ w, y[part], reduction="none")[keep[part]]

    full = torch.autograd.grad(token_losses(slice(None)).mean(), w)[0]
    n_global = int(keep.sum())
    exact = sum(torch.autograd.grad(token_mean_loss(token_losses(h).sum(), n_global, 2), w)[0] for h in halves) / 2
    naive = sum(torch.autograd.grad(token_losses(h).mean(), w)[0] for h in halves) / 2
    assert torch.allclose(exact, full, rtol=0, atol=1e-14)
    assert not torch.allclose(naive, full, rtol=0, atol=1e-3)


def test_reductions_in_one_process():
    assert global_token_count(17) == 17
    assert all_reduce_sum([3, 2.5]) == [3.0, 2.5]
    with pytest.raises(ValueError, match="n_local must be an int >= 0"):
        global_token_count(-1)
    with pytest.raises(ValueError, match="loss_sum must be a floating-point scalar"):
        token_mean_loss(torch.ones(3), 3)
    with pytest.raises(ValueError, match="n_global must be an int >= 1"):
        token_mean_loss(torch.tensor(1.0), 0)

# --------------------------------------------------------------------------------------- checkpoints


def test_checkpoint_round_trip(tmp_path):
    model, optimizer, scheduler = _tiny_parts()
    for i in range(3):
        _step(model, optimizer, scheduler, seed=i)
    path = tmp_path / "state.pt"
    save_checkpoint_atomic(path, training_state(model, optimizer, scheduler, 3, history=[1.5, 1.25]))
    after_save = (torch.rand(3), random.random(), np.random.rand())
    _step(model, optimizer, scheduler, seed=3)               # the run goes on ...

    state = load_training_state(path)                         # ... and a fresh process resumes at step 3
    model2, optimizer2, scheduler2 = _tiny_parts(seed=1)      # other initial weights: all overwritten
    assert restore_training_state(state, model2, optimizer2, scheduler2) == 3
    assert state["history"] == [1.5, 1.25]
    again = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(again[0], after_save[0]) and again[1:] == after_save[1:]   # all three generators
    _step(model2, optimizer2, scheduler2, seed=3)            # the same step, with the same dropout masks
    for (k, a), b in zip(model.state_dict().items(), model2.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    assert scheduler2.get_last_lr() == scheduler.get_last_lr()
    moments, moments2 = optimizer.state_dict()["state"], optimizer2.state_dict()["state"]
    assert all(torch.equal(moments[i][k], moments2[i][k]) for i in moments for k in moments[i])


def test_training_state_is_plain_data(tmp_path):
    """torch.load(weights_only=True) reads it: no ndarray, no pickled class (NumPy's state becomes a tensor)."""
    model, optimizer, scheduler = _tiny_parts()
    ddp_like = torch.nn.Module()                              # unwrap() only strips a real DDP wrapper
    assert unwrap(model) is model and unwrap(ddp_like) is ddp_like
    torch.save(training_state(model, optimizer, scheduler, 0), tmp_path / "a.pt")
    state = torch.load(tmp_path / "a.pt", weights_only=True)
    assert isinstance(state["rng"][0]["numpy"]["key"], torch.Tensor)


class _NotAllowed:
    pass


def test_load_refuses_pickled_objects_and_missing_entries(tmp_path):
    model, optimizer, scheduler = _tiny_parts()
    state = training_state(model, optimizer, scheduler, 0)
    torch.save({**state, "extra": _NotAllowed()}, tmp_path / "code.pt")
    with pytest.raises(ValueError, match="not a checkpoint written by transformer_lib"):   # never "weights_only=False"
        load_training_state(tmp_path / "code.pt")
    save_checkpoint_atomic(tmp_path / "weights.pt", {"model": state["state_dict"]})
    with pytest.raises(ValueError, match="lacks the entries"):
        load_training_state(tmp_path / "weights.pt")
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        training_state(model, optimizer, scheduler, -1)
    with pytest.raises(ValueError, match="optimizer must be a torch.optim.Optimizer"):
        training_state(model, "adam", scheduler, 0)


def test_atomic_save_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    save_checkpoint_atomic(path, {"step": 1, "w": torch.ones(3)})
    real_save = torch.save

    def crash_midway(obj, f, *args, **kwargs):               # write half a file, then die
        f.write(b"PK\x03\x04 half a zip archive")
        raise OSError("disk full")
    monkeypatch.setattr(torch, "save", crash_midway)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint_atomic(path, {"step": 2, "w": torch.zeros(3)})
    monkeypatch.setattr(torch, "save", real_save)
    old = torch.load(path, weights_only=True)
    assert old["step"] == 1 and torch.equal(old["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]        # no temporary file left behind
    with pytest.raises(ValueError, match="existing directory"):
        save_checkpoint_atomic(tmp_path / "missing" / "x.pt", {})
    with pytest.raises(ValueError, match="state must be a dict"):
        save_checkpoint_atomic(path, [1, 2])

# ------------------------------------------------------------------------------------------ the script


def test_entry_point_help_and_bad_arguments():
    help_ = subprocess.run([sys.executable, "-m", "transformer_lib.train", "--help"], capture_output=True,
                           text=True, env=_env(), timeout=120)
    assert help_.returncode == 0 and "--task" in help_.stdout and "--resume" in help_.stdout
    bad = subprocess.run([sys.executable, "-m", "transformer_lib.train", "--steps", "1"], capture_output=True,
                         text=True, env=_env(), timeout=120)
    assert bad.returncode == 2 and "--steps must be >= 2, got 1" in bad.stderr


@pytest.mark.parametrize("argv, message", [
    (["--precision", "fp16", "--device", "cpu"], "--precision fp16 needs a CUDA GPU"),
    (["--precision", "bf16", "--dtype", "float64"], "needs --dtype float32"),
    (["--d-model", "30", "--heads", "4"], "--d-model must be even and divisible by --heads"),
    (["--resume"], "--resume needs --checkpoint PATH"),
    (["--stop-after", "10", "--steps", "10"], "--stop-after must be in [1, --steps)"),
    (["--task", "bert"], "invalid choice: 'bert'"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        train_script.parse_args(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_global_batch_must_split_over_the_processes(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit):
        train_script.parse_args(["--batch-size", "15"])
    assert "--batch-size 15 must be divisible by the number of processes (2)" in capsys.readouterr().err


def test_notebook_cell_does_not_run_main():
    """Executed as a notebook cell, __name__ is "__main__" but there is no __file__: main() must not run
    (it would parse the kernel's own command line and exit)."""
    source = Path(train_script.__file__).read_text(encoding="utf-8")
    namespace = {"__name__": "__main__", "__package__": "transformer_lib"}
    exec(compile(source, "<notebook cell>", "exec"), namespace)
    assert callable(namespace["main"])


def test_bf16_runs_on_cpu_and_gpt_task_trains(tmp_path):
    bf16 = train_script.main([*TINY, "--steps", "4", "--batch-size", "8", "--precision", "bf16", "--device", "cpu"])
    assert len(bf16["loss"]) == 4 and all(np.isfinite(bf16["loss"])) and np.isfinite(bf16["valid_loss"])
    gpt = train_script.main(["--task", "gpt", "--steps", "4", "--batch-size", "8", "--d-model", "32", "--layers", "1",
                             "--d-ff", "64", "--context", "32", "--text-chars", "20000", "--valid", "4",
                             "--no-progress", "--device", "cpu", "--out", str(tmp_path / "gpt.pt"),
                             "--checkpoint", str(tmp_path / "state.pt")])
    assert len(gpt["loss"]) == 4 and gpt["loss"][-1] < gpt["loss"][0]
    # one checkpoint format: Chapter 8's load_checkpoint reads the --out file and the --checkpoint training state
    out, state = load_checkpoint(tmp_path / "gpt.pt"), load_checkpoint(tmp_path / "state.pt")
    assert out[1]["task"] == "gpt" and out[1]["chars"] and state[1]["step"] == 4
    for model, _ in (out, state):
        assert type(model).__name__ == "GPT" and model.config.d_model == 32
    assert all(torch.equal(a, b) for a, b in zip(out[0].state_dict().values(), state[0].state_dict().values(),
                                                 strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 autocast with a GradScaler needs a GPU")
def test_fp16_with_grad_scaler_on_gpu():
    out = train_script.main([*TINY, "--steps", "4", "--batch-size", "8", "--precision", "fp16", "--device", "cuda"])
    assert all(np.isfinite(out["loss"]))


def test_killed_run_resumes_exactly(tmp_path):
    """Stop after step 5 (as if killed: the last checkpoint is step 3's), resume: the weights and every step's
    loss equal those of an uninterrupted run, bit for bit. Dropout 0.1: the saved generators matter."""
    args = [*TINY, "--steps", "8", "--batch-size", "8", "--dropout", "0.1", "--checkpoint-every", "3", "--device", "cpu"]
    full = train_script.main([*args, "--checkpoint", str(tmp_path / "a.pt"), "--out", str(tmp_path / "a_out.pt")])
    killed = train_script.main([*args, "--checkpoint", str(tmp_path / "b.pt"), "--stop-after", "5"])
    assert killed["stopped"] and load_training_state(tmp_path / "b.pt")["step"] == 3
    resumed = train_script.main([*args, "--checkpoint", str(tmp_path / "b.pt"), "--resume",
                                 "--out", str(tmp_path / "b_out.pt")])
    assert resumed["resumed_from"] == 3 and resumed["loss"] == full["loss"]
    a, b = _weights(tmp_path / "a_out.pt"), _weights(tmp_path / "b_out.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(SystemExit):                                # a different run refuses to resume: usage error
        train_script.main([*args, "--checkpoint", str(tmp_path / "b.pt"), "--resume", "--lr", "1e-3"])


@pytest.mark.processes
@pytest.mark.in_chapter13
def test_two_processes_equal_one(tmp_path):
    """torchrun with 2 gloo processes, each with half of the global batch of 8, ends with the weights of one
    process (float64, dropout 0): DDP's gradient average with token_mean_loss is the full batch's gradient."""
    args = [*TINY, "--steps", "6", "--batch-size", "8", "--dtype", "float64", "--device", "cpu"]
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(_free_port()), "-m", "transformer_lib.train", *args, "--out", str(tmp_path / "ddp.pt")],
                         capture_output=True, text=True, env=_env(), timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "on 2 process(es)" in ddp.stdout
    single = train_script.main([*args, "--out", str(tmp_path / "one.pt")])
    a, b = _weights(tmp_path / "ddp.pt"), _weights(tmp_path / "one.pt")
    diff = {k: (a[k] - b[k]).abs().max().item() for k in a}
    assert max(diff.values()) < 1e-10, diff
    # All but the key biases agree to rounding. A key bias adds the same number q . b_k to all of a query's
    # scores, which softmax ignores: its gradient is 0 in exact arithmetic, rounding noise (~1e-17) in each
    # run, and Adam's step lr * g / (sqrt(v) + eps) multiplies that noise by lr / eps = 2e6.
    assert max(d for k, d in diff.items() if not k.endswith("W_k.bias")) < 1e-13, diff
    assert single["loss"][-1] < single["loss"][0]                    # it did train
