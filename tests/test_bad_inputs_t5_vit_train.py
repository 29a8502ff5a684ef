"""Bad and edge-case inputs to Chapters 12 and 13's modules: t5, vit, distributed and the train CLI (issue 26).

Same pattern as tests/test_bad_inputs.py: each case is a row (id, call, expected), `expected` being
err(names, phrase) (a ValueError whose message names the user's argument and matches `phrase`) or OK (the call
asserts the documented result itself). TENSOR_CASES take the floating dtype and run on float32 and float64.
The checks that need processes (the rendezvous timeout, a run killed with SIGKILL, the exit status of a run
whose loss becomes NaN) are separate tests below the tables.
"""

import functools
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.nn as nn
from helpers import OK, err, table_tests
from test_bad_inputs import t5_config, vit_config  # the same tiny models (D, H, FF, V as here)

import transformer_lib.distributed as dst
import transformer_lib.t5 as t5_mod
import transformer_lib.train as train_script
import transformer_lib.vit as vit_mod

D, H, FF, V = 8, 2, 16, 11
NOT_OURS = r"not a checkpoint written by transformer_lib"


def ids(*shape, low=3, high=V, seed=0):
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed))


def rand(*shape, dt=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dt)


@functools.cache
def _t5(dt, dropout):
    torch.manual_seed(0)
    return t5_mod.T5(t5_config(dropout=dropout)).to(dt)


def t5(dt, dropout=0.0, training=False):
    """A tiny T5 of dtype dt, in the mode asked for (built once per dtype and dropout)."""
    return _t5(dt, dropout).train(training)


def attn(dt):
    torch.manual_seed(0)
    return t5_mod.T5Attention(D, H, dropout=0.0).to(dt).eval()


# ------------------------------------------------------------------------------------------------------ t5
def generate_restores_mode(dt, training):
    model = t5(dt, dropout=0.3, training=training)
    t5_mod.t5_generate(model, ids(2, 4), 3)
    assert all(m.training == training for m in model.modules()), "t5_generate changed the caller's mode"


def generate_restores_mode_on_error(dt):
    model = t5(dt, dropout=0.3, training=True)
    with pytest.raises(ValueError, match="src"):
        t5_mod.t5_generate(model, ids(2, 4) + V, 3)          # fails inside, after the switch to eval
    assert all(m.training for m in model.modules()), "an error left the model in eval mode"


def generate_ignores_dropout(dt):
    """In training mode (dropout 0.3) the result equals eval mode's: t5_generate decodes without dropout."""
    src = ids(3, 5, seed=2)
    in_train = t5_mod.t5_generate(t5(dt, dropout=0.3, training=True), src, 6)
    in_eval = t5_mod.t5_generate(t5(dt, dropout=0.3, training=False), src, 6)
    assert torch.equal(in_train, in_eval)


def generate_at_most(dt):
    out = t5_mod.t5_generate(t5(dt), ids(2, 4), 7)
    assert out.shape[0] == 2 and 1 <= out.shape[1] <= 7 and out.dtype == torch.long


def bias_row_of_minus_inf(dt):
    """A query row whose position bias is -inf everywhere: zero weights and output, finite gradients."""
    a = attn(dt)
    x = rand(2, 3, D, dt=dt).requires_grad_()
    bias = torch.zeros(1, H, 3, 3, dtype=dt)
    bias[0, 1, 2] = float("-inf")                               # head 1, query 2: no key left
    out, w = a(x, x, x, bias, need_weights=True)
    assert not torch.isnan(out).any() and not torch.isnan(w).any(), "NaN from a -inf bias row"
    assert torch.equal(w[:, 1, 2], torch.zeros_like(w[:, 1, 2]))
    assert torch.allclose(w[:, 0].sum(-1), torch.ones(2, 3, dtype=dt))   # the other rows still sum to 1
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(p.grad).all() for p in a.parameters())
    a.zero_grad()


def bias_all_minus_inf(dt):
    a = attn(dt)
    x = rand(2, 3, D, dt=dt)
    out, w = a(x, x, x, torch.full((1, H, 3, 3), float("-inf"), dtype=dt), need_weights=True)
    assert torch.equal(w, torch.zeros_like(w)) and torch.equal(out, torch.zeros_like(out))


def bias_row_and_mask(dt):
    """A -inf bias on some keys and a mask on the others: every key of the row is gone -> zeros."""
    a = attn(dt)
    x = rand(2, 4, D, dt=dt)
    bias = torch.zeros(1, H, 4, 4, dtype=dt)
    bias[..., :2] = float("-inf")
    mask = torch.ones(2, 1, 1, 4, dtype=torch.bool)
    mask[0, ..., 2:] = False
    out, w = a(x, x, x, bias, mask, need_weights=True)
    assert torch.equal(w[0], torch.zeros_like(w[0])) and torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.allclose(w[1].sum(-1), torch.ones(H, 4, dtype=dt))


def masked_weights_unchanged(dt):
    """The usual case is untouched: with a mask and a finite bias, weights = softmax over the allowed keys."""
    a = attn(dt)
    x, bias = rand(2, 4, D, dt=dt), rand(1, H, 4, 4, dt=dt, seed=1)
    mask = torch.tensor([True, True, False, True])[None, None, None].expand(2, 1, 1, 4)
    _, w = a(x, x, x, bias, mask, need_weights=True)
    Q, K = a.split_heads(a.W_q(x)), a.split_heads(a.W_k(x))
    ref = torch.softmax((Q @ K.transpose(-2, -1) + bias).masked_fill(~mask, float("-inf")), -1)
    torch.testing.assert_close(w, ref)


# ----------------------------------------------------------------------------------------------- checkpoints
def _parts(dt=torch.float64, optimizer="adam", seed=0):
    torch.manual_seed(seed)
    model = nn.Linear(4, 3).to(dt)
    opt = (torch.optim.Adam(model.parameters(), lr=1e-2) if optimizer == "adam"
           else torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9))
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    model(torch.ones(2, 4, dtype=dt)).sum().backward()
    opt.step()
    scheduler.step()
    return model, opt, scheduler


def _write(tmp_path, dt=torch.float64, name="ckpt.pt", **kw):
    model, opt, scheduler = _parts(dt, **kw)
    path = tmp_path / name
    dst.save_checkpoint_atomic(path, dst.training_state(model, opt, scheduler, 1))
    return path, model


def _load_bytes(tmp_path, blob: bytes):
    path = tmp_path / "bad.pt"
    path.write_bytes(blob)
    return dst.load_training_state(path)


def _must_refuse(call, phrase):
    """A ValueError matching phrase, and never PyTorch's advice to turn weights_only off."""
    with pytest.raises(ValueError, match=phrase) as info:
        call()
    assert "weights_only=False" not in str(info.value)
    shown = info.value.__cause__ or (None if info.value.__suppress_context__ else info.value.__context__)
    assert shown is None, f"PyTorch's error is chained: {shown!r}"


def round_trip(dt, tmp_path):
    path, model = _write(tmp_path, dt)
    state = dst.load_training_state(path)
    assert dst.CHECKSUM_KEY not in state                            # verified and removed
    assert torch.equal(state["state_dict"]["weight"], model.weight.detach()) and state["state_dict"]["weight"].dtype == dt
    raw = torch.load(path, weights_only=True)                       # a plain torch file, readable without us
    assert raw[dst.CHECKSUM_KEY] == dst.checkpoint_checksum(state)


def flipped_bit(dt, tmp_path):
    path, model = _write(tmp_path, dt)
    data = bytearray(path.read_bytes())
    at = bytes(data).find(model.weight.detach().numpy().tobytes())
    assert at > 0
    data[at + 3] ^= 0x04                                            # one bit of one weight
    path.write_bytes(bytes(data))
    assert torch.load(path, weights_only=True)["state_dict"]["weight"].ne(model.weight.detach()).sum() == 1
    _must_refuse(lambda: dst.load_training_state(path), r"corrupt.*SHA-256")


def checksum_sensitive(dt, tmp_path):
    model, opt, scheduler = _parts(dt)
    state = dst.training_state(model, opt, scheduler, 1)
    before = dst.checkpoint_checksum(state)
    assert before == dst.checkpoint_checksum(dict(reversed(list(state.items()))))   # order of entries: no matter
    w = state["state_dict"]["weight"].clone()
    w.view(-1)[0] = torch.nextafter(w.view(-1)[0], torch.tensor(float("inf"), dtype=dt))   # one ulp
    assert dst.checkpoint_checksum({**state, "state_dict": {**state["state_dict"], "weight": w}}) != before
    assert dst.checkpoint_checksum({**state, "step": 2}) != before
    assert dst.checkpoint_checksum({**state, "state_dict": {**state["state_dict"], "weight": state["state_dict"]["weight"].float()
                                                        if dt == torch.float64 else state["state_dict"]["weight"].double()}}) != before


def truncated(dt, tmp_path):
    path, _ = _write(tmp_path, dt)
    blob = path.read_bytes()
    for cut in (len(blob) // 2, len(blob) - 30, 100):
        _must_refuse(lambda cut=cut: _load_bytes(tmp_path, blob[:cut]), rf"{NOT_OURS}.*truncated or corrupt")


def sgd_into_adam(dt, tmp_path):
    path, _ = _write(tmp_path, dt, optimizer="sgd")
    state = dst.load_training_state(path)
    model, adam, scheduler = _parts(dt, seed=1)
    before = model.weight.detach().clone()
    with pytest.raises(ValueError, match=r"(?s)optimizer.*SGD.*Adam"):
        dst.restore_training_state(state, model, adam, scheduler)
    assert torch.equal(model.weight, before), "a refused state must not be half loaded"


def other_model(dt, tmp_path):
    path, _ = _write(tmp_path, dt)
    state = dst.load_training_state(path)
    with pytest.raises(ValueError, match=r"(?s)state\['state_dict'\].*does not fit"):
        dst.restore_training_state(state, nn.Linear(5, 3).to(dt))
    with pytest.raises(ValueError, match=r"(?s)state\['state_dict'\].*does not fit"):
        dst.restore_training_state(state, nn.Sequential(nn.Linear(4, 3)).to(dt))


def tensor_case_with_tmp(fn):
    """Adapt fn(dt, tmp_path) to the table's fn(dt) with a fresh temporary directory."""
    def call(dt):
        import tempfile
        from pathlib import Path
        with tempfile.TemporaryDirectory() as d:
            fn(dt, Path(d))
    return call


TENSOR_CASES = [
    # --- t5_generate: max_new_tokens bounded, the caller's mode restored
    ("t5_generate/max_new_tokens=10**6", lambda dt: t5_mod.t5_generate(t5(dt), ids(2, 4), 10**6), err("max_new_tokens", r"at most T5_MAX_NEW_TOKENS = 512")),
    ("t5_generate/max_new_tokens=513", lambda dt: t5_mod.t5_generate(t5(dt), ids(2, 4), t5_mod.T5_MAX_NEW_TOKENS + 1), err("max_new_tokens", "at most")),
    ("t5_generate/max_new_tokens-float", lambda dt: t5_mod.t5_generate(t5(dt), ids(2, 4), 3.0), err("max_new_tokens", "int")),
    ("t5_generate/max_new_tokens-bool", lambda dt: t5_mod.t5_generate(t5(dt), ids(2, 4), True), err("max_new_tokens", "int")),
    ("t5_generate/max_new_tokens-negative", lambda dt: t5_mod.t5_generate(t5(dt), ids(2, 4), -1), err("max_new_tokens", "int")),
    ("t5_generate/model-not-t5", lambda dt: t5_mod.t5_generate(nn.Linear(2, 2).to(dt), ids(2, 4), 3), err("model", "T5")),
    ("t5_generate/ok-at-most-max_new_tokens", generate_at_most, OK),
    ("t5_generate/ok-restores-train-mode", lambda dt: generate_restores_mode(dt, True), OK),
    ("t5_generate/ok-restores-eval-mode", lambda dt: generate_restores_mode(dt, False), OK),
    ("t5_generate/ok-restores-mode-on-error", generate_restores_mode_on_error, OK),
    ("t5_generate/ok-no-dropout-while-decoding", generate_ignores_dropout, OK),
    # --- T5Attention: a row with no key left gives zeros, never NaN
    ("t5_attn/ok-minus-inf-bias-row", bias_row_of_minus_inf, OK),
    ("t5_attn/ok-minus-inf-bias-everywhere", bias_all_minus_inf, OK),
    ("t5_attn/ok-minus-inf-bias-and-mask", bias_row_and_mask, OK),
    ("t5_attn/ok-masked-softmax-unchanged", masked_weights_unchanged, OK),
    # --- checkpoints: a checksum, clear errors for files that are not ours
    ("checkpoint/ok-round-trip", tensor_case_with_tmp(round_trip), OK),
    ("checkpoint/ok-checksum-sees-one-ulp", tensor_case_with_tmp(checksum_sensitive), OK),
    ("checkpoint/flipped-bit", tensor_case_with_tmp(flipped_bit), OK),
    ("checkpoint/truncated", tensor_case_with_tmp(truncated), OK),
    ("restore/sgd-state-into-adam", tensor_case_with_tmp(sgd_into_adam), OK),
    ("restore/other-model", tensor_case_with_tmp(other_model), OK),
]


# ------------------------------------------------------------------------------------------- plain cases
def in_tmp(fn):
    def call():
        import tempfile
        from pathlib import Path
        with tempfile.TemporaryDirectory() as d:
            return fn(Path(d))
    return call


def scheduler_mismatch(tmp_path):
    path, _ = _write(tmp_path)
    state = dst.load_training_state(path)
    model, opt, _ = _parts()
    step_lr = torch.optim.lr_scheduler.StepLR(opt, 10)
    dst.restore_training_state(state, model, opt, step_lr)


def pickled_object(tmp_path):
    model, opt, scheduler = _parts()
    torch.save({**dst.training_state(model, opt, scheduler, 0), "extra": nn.Linear(2, 2)}, tmp_path / "code.pt")
    _must_refuse(lambda: dst.load_training_state(tmp_path / "code.pt"), rf"{NOT_OURS}")


def plain_torch_save(tmp_path):
    model, opt, scheduler = _parts()
    torch.save(dst.training_state(model, opt, scheduler, 0), tmp_path / "plain.pt")
    dst.load_training_state(tmp_path / "plain.pt")


def not_a_dict(tmp_path):
    torch.save([torch.ones(2)], tmp_path / "list.pt")
    dst.load_training_state(tmp_path / "list.pt")


def rank_missing(tmp_path):
    path, _ = _write(tmp_path)
    model, opt, scheduler = _parts()
    dst.restore_training_state(dst.load_training_state(path), model, opt, scheduler, rank=3)


PLAIN_CASES = [
    # --- T5Config, ViTConfig
    ("T5Config/pad_id==eos_id", lambda: t5_config(pad_id=1, eos_id=1), err("pad_id|eos_id", "must differ")),
    ("T5Config/pad_id==eos_id-default-eos", lambda: t5_config(pad_id=1), err("pad_id|eos_id", "must differ")),
    ("T5Config/ok-pad-and-eos-differ", lambda: None if t5_config(pad_id=2, eos_id=3).eos_id == 3 else pytest.fail("eos_id"), OK),
    ("T5Config/from_hf-pad==eos", lambda: t5_mod.T5Config.from_hf(__import__("types").SimpleNamespace(
        vocab_size=V, d_model=D, d_kv=D // H, num_heads=H, d_ff=FF, num_layers=1, num_decoder_layers=1,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.1, layer_norm_epsilon=1e-6,
        pad_token_id=1, eos_token_id=1, feed_forward_proj="relu", tie_word_embeddings=True)), err("pad_id|eos_id", "must differ")),
    ("ViTConfig/num_classes=1", lambda: vit_config(num_classes=1), err("num_classes", r">= 2")),
    ("ViTConfig/num_classes=-1", lambda: vit_config(num_classes=-1), err("num_classes", "int")),
    ("ViTConfig/ok-num_classes=2", lambda: None if vit_mod.ViT(vit_config(num_classes=2))(torch.zeros(1, 1, 4, 4)).shape == (1, 2) else pytest.fail("shape"), OK),
    ("ViTConfig/ok-num_classes=0-no-head", lambda: None if vit_mod.ViT(vit_config(num_classes=0)).head is None else pytest.fail("head"), OK),
    # --- setup_distributed: timeout
    ("setup_distributed/timeout=0", lambda: dst.setup_distributed("cpu", timeout=0), err("timeout", r"\(0, ")),
    ("setup_distributed/timeout-negative", lambda: dst.setup_distributed("cpu", timeout=-5), err("timeout", r"\(0, ")),
    ("setup_distributed/timeout-nan", lambda: dst.setup_distributed("cpu", timeout=float("nan")), err("timeout", r"\(0, ")),
    ("setup_distributed/timeout-inf", lambda: dst.setup_distributed("cpu", timeout=float("inf")), err("timeout", r"\(0, ")),
    ("setup_distributed/timeout-str", lambda: dst.setup_distributed("cpu", timeout="3"), err("timeout", "number")),
    # --- checkpoints
    ("load/empty-file", in_tmp(lambda p: _must_refuse(lambda: _load_bytes(p, b""), rf"{NOT_OURS}.*truncated or corrupt")), OK),
    ("load/random-bytes", in_tmp(lambda p: _must_refuse(lambda: _load_bytes(p, os.urandom(4096)), rf"{NOT_OURS}.*truncated or corrupt")), OK),
    ("load/text-file", in_tmp(lambda p: _must_refuse(lambda: _load_bytes(p, b"step = 3\n"), rf"{NOT_OURS}")), OK),
    ("load/pickled-object", in_tmp(pickled_object), OK),
    ("load/plain-torch-save-no-checksum", in_tmp(plain_torch_save), err("checksum", rf"{NOT_OURS}.*save_checkpoint_atomic")),
    ("load/not-a-dict", in_tmp(not_a_dict), err("dict", NOT_OURS)),
    ("load/directory", in_tmp(lambda p: dst.load_training_state(p)), err("path", "directory")),
    ("load/missing-file", in_tmp(lambda p: dst.load_training_state(p / "nope.pt")), err("path", "not an existing file")),
    ("load/path-int", lambda: dst.load_training_state(3), err("path", "str")),
    ("load/map_location-bogus", in_tmp(lambda p: dst.load_training_state(_write(p)[0], map_location="gpu7")), err("map_location", "device")),
    ("load/missing-entries", in_tmp(lambda p: (dst.save_checkpoint_atomic(p / "w.pt", {"model": {}}), dst.load_training_state(p / "w.pt"))), err("entries", "lacks")),
    ("save/path-is-directory", in_tmp(lambda p: dst.save_checkpoint_atomic(p, {"step": 1})), err("path", "directory")),
    ("save/missing-directory", in_tmp(lambda p: dst.save_checkpoint_atomic(p / "no" / "x.pt", {"step": 1})), err("path", "existing directory")),
    ("checksum/not-a-dict", lambda: dst.checkpoint_checksum([1, 2]), err("state", "dict")),
    ("restore/scheduler-class", in_tmp(scheduler_mismatch), err("scheduler", r"LambdaLR.*StepLR")),
    ("restore/restore_rng-str", in_tmp(lambda p: dst.restore_training_state(dst.load_training_state(_write(p)[0]), _parts()[0], restore_rng="no")), err("restore_rng", "True or False")),
    ("restore/rank-without-generators", in_tmp(rank_missing), err("rank", "none for rank 3")),
    ("restore/model-not-state_dict", lambda: dst.restore_training_state({**dst.training_state(*_parts(), 0), "state_dict": [1]}, _parts()[0]), err("state_dict", "state_dict")),
]


def _no_distributed_environment(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", dst.TIMEOUT_VARIABLE):
        monkeypatch.delenv(name, raising=False)


test_case_ids_unique, test_tensor_case, test_plain_case = table_tests(TENSOR_CASES, PLAIN_CASES,
                                                                      before=_no_distributed_environment)


def test_timeout_from_the_environment(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for text in ("soon", "0", "-1", "nan"):
        monkeypatch.setenv(dst.TIMEOUT_VARIABLE, text)
        with pytest.raises(ValueError, match=dst.TIMEOUT_VARIABLE):
            dst.setup_distributed("cpu")
    monkeypatch.setenv(dst.TIMEOUT_VARIABLE, "2.5")
    assert dst.setup_distributed("cpu").world_size == 1          # one process: nothing to wait for


# ------------------------------------------------------------------------------- processes: the rendezvous
def _env(**extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **extra}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TORCHELASTIC_USE_AGENT_STORE"):
        if name not in extra:
            env.pop(name, None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SETUP = ("import time; from transformer_lib.distributed import setup_distributed\n"
         "t = time.perf_counter()\n"
         "try:\n"
         "    setup_distributed('cpu')\n"
         "except ValueError as e:\n"
         "    print('ValueError:', e, '| after', round(time.perf_counter() - t, 1), 's')\n")


def test_missing_rank_fails_within_the_timeout():
    """WORLD_SIZE=2 but only rank 0 (and, separately, only rank 2 of 3) is started: with a 3 s timeout each
    gives a ValueError naming the missing rank within seconds, not PyTorch's 30 minutes."""
    def start(world, rank, via_env=True):
        env = _env(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(_free_port()), TRANSFORMER_LIB_DIST_TIMEOUT="3")
        return subprocess.Popen([sys.executable, "-c", SETUP], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    t0 = time.perf_counter()
    alone0, alone2 = start(2, 0), start(3, 2)
    out0, _ = alone0.communicate(timeout=120)
    out2, _ = alone2.communicate(timeout=120)
    assert time.perf_counter() - t0 < 90
    assert "ValueError: WORLD_SIZE=2, but only 1 of the 2 processes joined" in out0, out0
    assert "rank 1 did not arrive" in out0 and "within 3 s" in out0 and "TRANSFORMER_LIB_DIST_TIMEOUT" in out0
    assert "ValueError: rank 2 of WORLD_SIZE=3 could not join" in out2 and "rank 0 did not arrive" in out2, out2
    for out in (out0, out2):
        seconds = float(out.rsplit("after", 1)[1].split()[0])
        assert seconds < 30, out


# ----------------------------------------------------------------------------------------- the train CLI
TINY = ["--d-model", "8", "--heads", "2", "--d-ff", "16", "--layers", "1", "--numbers", "200", "--valid", "20",
        "--batch-size", "8", "--no-progress", "--device", "cpu"]


def _usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        train_script.parse_args(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--lr", "inf"], "--lr must be a finite number > 0, got inf"),
    (["--lr", "nan"], "--lr must be a finite number > 0, got nan"),
    (["--clip-norm", "inf"], "--clip-norm must be a finite number >= 0"),
    (["--clip-norm", "nan"], "--clip-norm must be a finite number >= 0"),
    (["--dropout", "nan"], "--dropout must be in [0, 1)"),
    (["--label-smoothing", "nan"], "--label-smoothing must be in [0, 1]"),
    (["--task", "gpt", "--text-chars", "10"], "--text-chars 10 gives 10 characters, 0 training windows"),
    (["--task", "gpt", "--text-chars", "600", "--context", "64", "--batch-size", "16"], "--text-chars 600"),
])
def test_cli_values_argparse_accepts_are_usage_errors(argv, message, capsys):
    assert message in _usage_error([*TINY, *argv], capsys)


def test_cli_paths_are_checked_before_training(tmp_path, capsys):
    assert f"--checkpoint {tmp_path} is a directory" in _usage_error([*TINY, "--checkpoint", str(tmp_path)], capsys)
    assert f"--out {tmp_path} is a directory" in _usage_error([*TINY, "--out", str(tmp_path)], capsys)
    missing = tmp_path / "no" / "ckpt.pt"
    assert "does not exist" in _usage_error([*TINY, "--checkpoint", str(missing)], capsys)
    same = str(tmp_path / "x.pt")
    assert "must be different files" in _usage_error([*TINY, "--checkpoint", same, "--out", same], capsys)


def test_cli_resume_from_another_run_is_a_usage_error(tmp_path, capsys):
    ckpt = tmp_path / "run.pt"
    train_script.main([*TINY, "--steps", "3", "--dtype", "float64", "--checkpoint", str(ckpt)])
    capsys.readouterr()
    err = _usage_error([*TINY, "--steps", "3", "--dtype", "float64", "--checkpoint", str(ckpt), "--resume",
                        "--lr", "1e-3", "--d-model", "16"], capsys)
    assert "--resume" in err and "--lr 0.002 (now 0.001)" in err and "--d-model 8 (now 16)" in err
    junk = tmp_path / "junk.pt"
    junk.write_bytes(os.urandom(2000))
    err = _usage_error([*TINY, "--steps", "3", "--checkpoint", str(junk), "--resume"], capsys)
    assert "--resume" in err and NOT_OURS in err and "weights_only=False" not in err


def test_cli_stops_when_the_loss_is_not_finite(tmp_path):
    """--lr 1e30 drives the loss to NaN: main raises TrainingDiverged before that step's update and writes no
    --out; the command exits with status 1 and a one-line error (no traceback)."""
    out = tmp_path / "out.pt"
    with pytest.raises(train_script.TrainingDiverged, match=r"loss is (nan|inf).*--lr 1e\+30"):
        train_script.main([*TINY, "--steps", "3", "--lr", "1e30", "--out", str(out)])
    assert not out.exists()
    done = subprocess.run([sys.executable, "-m", "transformer_lib.train", *TINY, "--steps", "3", "--lr", "1e30"],
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert "error: the loss is" in done.stderr and "Traceback" not in done.stderr


def test_sigkilled_run_resumes_exactly(tmp_path):
    """A real process killed with SIGKILL right after its first checkpoint, resumed from that file: the same
    weights and losses as an uninterrupted run, bit for bit (float64, dropout 0.1, one thread everywhere)."""
    args = [*TINY, "--steps", "150", "--dropout", "0.1", "--dtype", "float64", "--threads", "1"]
    ckpt = tmp_path / "run.ckpt"
    process = subprocess.Popen([sys.executable, "-m", "transformer_lib.train", *args, "--checkpoint", str(ckpt),
                                "--checkpoint-every", "5"], env=_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not ckpt.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        process.send_signal(signal.SIGKILL)                       # no clean-up, no last save
    finally:
        process.kill()
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL, stderr[-2000:]
    killed_at = dst.load_training_state(ckpt)["step"]
    assert 5 <= killed_at < 150

    threads = torch.get_num_threads()
    try:
        full = train_script.main([*args, "--out", str(tmp_path / "full.pt")])
        resumed = train_script.main([*args, "--checkpoint", str(ckpt), "--resume", "--out", str(tmp_path / "resumed.pt")])
    finally:
        torch.set_num_threads(threads)
    assert resumed["resumed_from"] == killed_at and resumed["loss"] == full["loss"]
    a = dst.load_training_state(tmp_path / "full.pt", required=("state_dict",))["state_dict"]
    b = dst.load_training_state(tmp_path / "resumed.pt", required=("state_dict",))["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
