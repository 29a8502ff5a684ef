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
from helpers import OK, err, hf, table_tests
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


# -------------------------------------------------------------------------- the Hugging Face bridges of t5, vit
def hf_t5(t, d_ff=FF):
    return t.T5ForConditionalGeneration(t.T5Config(
        vocab_size=V, d_model=D, d_kv=D // H, num_heads=H, d_ff=d_ff, num_layers=1, num_decoder_layers=1,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, feed_forward_proj="relu",
        tie_word_embeddings=True, attn_implementation="eager"))


# Their T5LayerNorm takes its statistic in float32 (and older releases their softmax): equal to ours within 1e-5
# in float64, where a wrong weight is off by far more (tests/test_t5.py gets 1e-10 by patching their norm).
HF_ATOL = 1e-5


def _hf_vit_config(t, num_labels=3):
    return t.ViTConfig(image_size=4, patch_size=2, num_channels=1, hidden_size=D, num_hidden_layers=1,
                       num_attention_heads=H, intermediate_size=FF, num_labels=num_labels)


def hf_vit(t):
    return t.ViTForImageClassification(_hf_vit_config(t))


def hf_gpt2(t):
    return t.GPT2LMHeadModel(t.GPT2Config(vocab_size=V, n_positions=8, n_embd=D, n_layer=1, n_head=H, n_inner=FF,
                                          bos_token_id=1, eos_token_id=2))


def perturbed(model, seed=1):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.double().eval()


def same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def vit(num_classes=3):
    torch.manual_seed(0)
    return vit_mod.ViT(vit_config(num_classes=num_classes)).double().eval()


def t5_hf_names_ok():
    """One entry per state_dict key; their layer.j of a block is our j-th residual."""
    model = t5(torch.float64)
    names = t5_mod.t5_hf_names(model)
    assert set(names) == set(model.state_dict())
    assert names["encoder.layers.0.feed_forward_residual.norm.weight"] == "encoder.block.0.layer.1.layer_norm.weight"
    assert names["decoder.layers.0.cross_attn.W_k.weight"] == "decoder.block.0.layer.1.EncDecAttention.k.weight"
    assert names["decoder.layers.0.feed_forward.linear2.weight"] == "decoder.block.0.layer.2.DenseReluDense.wo.weight"


def to_hf_t5_ok():
    """to_hf_t5 writes ours into theirs in place and returns it: loading it back gives our weights, its logits
    equal ours."""
    theirs = hf(hf_t5)
    ours = perturbed(t5_mod.T5(t5_mod.T5Config.from_hf(theirs.config)))
    assert t5_mod.to_hf_t5(ours, theirs) is theirs
    same_state(t5_mod.load_hf_t5(t5_mod.T5(t5_mod.T5Config.from_hf(theirs.config)).double(), theirs), ours)
    src, tgt = ids(2, 5), ids(2, 4, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(theirs(input_ids=src, decoder_input_ids=tgt).logits, ours(src, tgt), rtol=0, atol=HF_ATOL)


def vit_hf_names_ok():
    """One entry per state_dict key; a classifier's body under 'vit.', its head 'classifier'; the patch
    embedding is their Conv2d weight, reshaped."""
    theirs, ours = hf(hf_vit), vit()
    names = vit_mod.vit_hf_names(ours, theirs)
    assert set(names) == set(ours.state_dict())
    assert names["head.weight"] == "classifier.weight" and names["cls_token"] == "vit.embeddings.cls_token"
    patch = names["patch_embedding.weight"]
    assert patch.key == "vit.embeddings.patch_embeddings.projection.weight" and patch.reshaped
    body = vit_mod.vit_hf_names(vit(num_classes=0), hf(lambda t: t.ViTModel(_hf_vit_config(t), add_pooling_layer=False)))
    assert body["cls_token"] == "embeddings.cls_token" and "head.weight" not in body


def to_hf_vit_ok():
    theirs = hf(hf_vit)
    ours = perturbed(vit_mod.ViT(vit_mod.ViTConfig.from_hf(theirs.config, 3)))
    assert vit_mod.to_hf_vit(ours, theirs) is theirs
    same_state(vit_mod.load_hf_vit(vit_mod.ViT(vit_mod.ViTConfig.from_hf(theirs.config, 3)).double(), theirs), ours)
    images = rand(2, 1, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(theirs(pixel_values=images).logits, ours(images), rtol=0, atol=HF_ATOL)


# ------------------------------------------------------------------------------- distributed, single process
def step_sampler_split():
    """Two ranks read, between them, exactly the batch one process reads at each step, across epochs; an epoch
    of one process reads every example once."""
    one = dst.StepSampler(12, 4, seed=3)
    two = [dst.StepSampler(12, 4, rank=r, world_size=2, seed=3) for r in range(2)]
    assert len(one) == len(two[0]) == 3 and two[0].local_batch == 2
    for step in range(7):                                        # steps 3..5: epoch 1, step 6: epoch 2
        assert sorted(two[0].indices(step) + two[1].indices(step)) == sorted(one.indices(step)), step
    assert sorted(sum((one.indices(j) for j in range(3)), [])) == list(range(12))
    assert one.indices(3) != one.indices(0) or one.indices(4) != one.indices(1)   # a new epoch: a new order


def step_sampler_drops_partial():
    """10 examples, global batch 4: two steps per epoch, the 2 left over are dropped."""
    sampler = dst.StepSampler(10, 4)
    assert len(sampler) == 2 and len(set(sampler.indices(0) + sampler.indices(1))) == 8


def draws():
    import random

    import numpy as np
    return torch.rand(3), random.random(), float(np.random.rand())


def set_rng_state_restores():
    state = dst.rng_state()
    first = draws()
    draws()
    assert dst.set_rng_state(state) is None
    again = draws()
    assert torch.equal(first[0], again[0]) and first[1:] == again[1:]


def set_rng_state_after_save(tmp_path):
    """rng_state() survives torch.save / torch.load(weights_only=True) and restores the same draws."""
    torch.save(dst.rng_state(), tmp_path / "rng.pt")
    first = draws()
    dst.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    again = draws()
    assert torch.equal(first[0], again[0]) and first[1:] == again[1:]


def set_rng_state_atomic():
    """A state whose NumPy part is broken sets no generator at all (it used to set torch's and Python's first)."""
    good = dst.rng_state()
    torch.manual_seed(123)
    before = torch.get_rng_state()
    with pytest.raises(ValueError, match=r"state\['numpy'\]"):
        dst.set_rng_state({**good, "numpy": {**good["numpy"], "key": good["numpy"]["key"][:10]}})
    assert torch.equal(torch.get_rng_state(), before), "the torch generator was set by a refused state"


def broken_rng(part, value):
    return lambda: dst.set_rng_state({**dst.rng_state(), part: value})


def all_rng_states_ok():
    states = dst.all_rng_states()
    assert isinstance(states, list) and len(states) == 1
    assert set(states[0]) == {"torch", "cuda", "python", "numpy"}
    first = draws()
    dst.set_rng_state(states[0])
    assert torch.equal(draws()[0], first[0])


def single_process_helpers():
    """Without a process group: nothing to leave, not distributed, nothing to wait for."""
    import torch.distributed as dist
    assert dst.cleanup_distributed() is None and dst.cleanup_distributed() is None     # twice: still safe
    assert dst.is_distributed() is False and dst.barrier() is None
    assert not dist.is_initialized()


def unwrap_ok():
    model = nn.Linear(2, 2)
    assert dst.unwrap(model) is model
    seq = nn.Sequential(model)
    assert dst.unwrap(seq) is seq                                 # only DistributedDataParallel is unwrapped


def token_mean_loss_ok(dt):
    """loss_sum * world_size / n_global, in loss_sum's dtype, with the gradient flowing through."""
    loss_sum = torch.tensor(6.0, dtype=dt, requires_grad=True)
    out = dst.token_mean_loss(loss_sum, 4, world_size=2)
    assert out.dtype == dt and out.item() == 3.0
    out.backward()
    assert loss_sum.grad.item() == 0.5


# --------------------------------------------------------------------------------------------- build_parser
def parser_refuses(argv, phrase):
    """argparse's usage error: exit status 2 and a message naming the option."""
    import contextlib
    import io
    import re
    text = io.StringIO()
    with contextlib.redirect_stderr(text), pytest.raises(SystemExit) as exit_:
        train_script.build_parser().parse_args(argv)
    assert exit_.value.code == 2 and re.search(phrase, text.getvalue()), text.getvalue()


def build_parser_defaults():
    """Every RUN_ARGUMENTS entry is an option (--batch-size for batch_size), with the documented defaults."""
    import argparse
    parser = train_script.build_parser()
    assert isinstance(parser, argparse.ArgumentParser) and parser.prog == "python -m transformer_lib.train"
    a = parser.parse_args([])
    assert set(train_script.RUN_ARGUMENTS) <= set(vars(a))
    options = {o for action in parser._actions for o in action.option_strings}
    assert {f"--{n.replace('_', '-')}" for n in train_script.RUN_ARGUMENTS} <= options
    assert (a.task, a.steps, a.batch_size, a.lr, a.warmup, a.dtype, a.precision, a.checkpoint, a.resume) == (
        "translate", 300, 64, 2e-3, None, "float32", "fp32", None, False)
    b = parser.parse_args(["--task", "gpt", "--batch-size", "8", "--resume", "--checkpoint", "x.pt"])
    assert (b.task, b.batch_size, b.resume, b.checkpoint) == ("gpt", 8, True, "x.pt")


TENSOR_CASES += [
    ("token_mean_loss/ok", token_mean_loss_ok, OK),
    ("token_mean_loss/int-loss_sum", lambda dt: dst.token_mean_loss(torch.tensor(3), 2), err("loss_sum", "floating-point scalar")),
    ("token_mean_loss/1d-loss_sum", lambda dt: dst.token_mean_loss(rand(3, dt=dt), 2), err("loss_sum", "scalar")),
]

PLAIN_CASES += [
    # --- t5_hf_names, to_hf_t5
    ("t5_hf_names/model-Linear", lambda: t5_mod.t5_hf_names(nn.Linear(2, 2)), err("model", "T5")),
    ("t5_hf_names/model-ViT", lambda: t5_mod.t5_hf_names(vit()), err("model", "T5")),
    ("t5_hf_names/model-None", lambda: t5_mod.t5_hf_names(None), err("model", "T5")),
    ("t5_hf_names/ok", t5_hf_names_ok, OK),
    ("to_hf_t5/model-ViT", lambda: t5_mod.to_hf_t5(vit(), t5(torch.float64)), err("model", "T5")),
    ("to_hf_t5/hf_model-str", lambda: t5_mod.to_hf_t5(t5(torch.float64), "t5-small"), err("hf_model", "T5ForConditionalGeneration")),
    ("to_hf_t5/hf_model-None", lambda: t5_mod.to_hf_t5(t5(torch.float64), None), err("hf_model", "T5ForConditionalGeneration")),
    ("to_hf_t5/hf_model-our-T5", lambda: t5_mod.to_hf_t5(t5(torch.float64), t5(torch.float64)), err("hf_model", "T5ForConditionalGeneration")),
    ("to_hf_t5/hf_model-GPT2LMHeadModel", lambda: t5_mod.to_hf_t5(t5(torch.float64), hf(hf_gpt2)), err("hf_model", "T5ForConditionalGeneration.*got GPT2LMHeadModel")),
    ("to_hf_t5/hf_model-ViT", lambda: t5_mod.to_hf_t5(t5(torch.float64), hf(hf_vit)), err("hf_model", "T5ForConditionalGeneration")),
    ("to_hf_t5/other-d_ff", lambda: t5_mod.to_hf_t5(t5(torch.float64), hf(functools.partial(hf_t5, d_ff=2 * FF))), err("hf_model", "shape.*T5Config.from_hf")),
    ("to_hf_t5/ok", to_hf_t5_ok, OK),
    # --- vit_hf_names, to_hf_vit
    ("vit_hf_names/model-T5", lambda: vit_mod.vit_hf_names(t5(torch.float64), hf(hf_vit)), err("model", "ViT")),
    ("vit_hf_names/model-None", lambda: vit_mod.vit_hf_names(None, nn.Linear(2, 2)), err("model", "ViT")),
    ("vit_hf_names/hf_model-str", lambda: vit_mod.vit_hf_names(vit(), "google/vit-base"), err("hf_model", "nn.Module")),
    ("vit_hf_names/ViTModel-into-classifier", lambda: vit_mod.vit_hf_names(vit(), hf(lambda t: t.ViTModel(_hf_vit_config(t)))), err("num_classes", "ViTModel")),
    ("vit_hf_names/classifier-into-no-head", lambda: vit_mod.vit_hf_names(vit(num_classes=0), hf(hf_vit)), err("num_classes", "ViTForImageClassification")),
    ("vit_hf_names/ok", vit_hf_names_ok, OK),
    ("to_hf_vit/model-T5", lambda: vit_mod.to_hf_vit(t5(torch.float64), hf(hf_vit)), err("model", "ViT")),
    ("to_hf_vit/hf_model-None", lambda: vit_mod.to_hf_vit(vit(), None), err("hf_model", "nn.Module")),
    ("to_hf_vit/hf_model-T5", lambda: vit_mod.to_hf_vit(vit(), hf(hf_t5)), err("num_classes", "ViTForImageClassification")),
    ("to_hf_vit/other-num_labels", lambda: vit_mod.to_hf_vit(vit(num_classes=3), hf(lambda t: t.ViTForImageClassification(_hf_vit_config(t, num_labels=4)))), err("hf_model", "shape")),
    ("to_hf_vit/ok", to_hf_vit_ok, OK),
    # --- DistributedContext
    ("DistributedContext/rank-str", lambda: dst.DistributedContext("0", 1, 0, torch.device("cpu")), err("rank", "int")),
    ("DistributedContext/rank-bool", lambda: dst.DistributedContext(False, 1, 0, torch.device("cpu")), err("rank", "int")),
    ("DistributedContext/rank>=world_size", lambda: dst.DistributedContext(2, 2, 0, torch.device("cpu")), err("rank", "world_size=2")),
    ("DistributedContext/world_size=0", lambda: dst.DistributedContext(0, 0, 0, torch.device("cpu")), err("world_size", "int >= 1")),
    ("DistributedContext/local_rank=-1", lambda: dst.DistributedContext(0, 1, -1, torch.device("cpu")), err("local_rank", "int >= 0")),
    ("DistributedContext/device-str", lambda: dst.DistributedContext(0, 1, 0, "cpu"), err("device", "torch.device")),
    ("DistributedContext/ok", lambda: None if (dst.DistributedContext(0, 2, 0, torch.device("cpu")).is_main, dst.DistributedContext(1, 2, 1, torch.device("cpu")).is_main) == (True, False) else pytest.fail("is_main"), OK),
    ("DistributedContext/ok-from-setup", lambda: None if dst.setup_distributed("cpu") == dst.DistributedContext(0, 1, 0, torch.device("cpu")) else pytest.fail("context"), OK),
    # --- cleanup_distributed, is_distributed, barrier
    ("cleanup_distributed/ok-single-process", single_process_helpers, OK),
    ("is_distributed/ok-single-process", lambda: None if dst.is_distributed() is False else pytest.fail("distributed"), OK),
    ("barrier/ok-single-process", lambda: None if dst.barrier() is None else pytest.fail("barrier"), OK),
    # --- StepSampler
    ("StepSampler/global_batch-not-divisible", lambda: dst.StepSampler(10, 5, 0, 2), err("global_batch", "divisible by world_size=2")),
    ("StepSampler/rank>=world_size", lambda: dst.StepSampler(10, 4, 2, 2), err("rank", "< world_size=2")),
    ("StepSampler/rank=-1", lambda: dst.StepSampler(10, 4, -1, 2), err("rank", "int >= 0")),
    ("StepSampler/world_size=0", lambda: dst.StepSampler(10, 4, 0, 0), err("world_size", "int >= 1")),
    ("StepSampler/world_size-float", lambda: dst.StepSampler(10, 4, 0, 2.0), err("world_size", "int")),
    ("StepSampler/num_examples-bool", lambda: dst.StepSampler(True, 1), err("num_examples", "int")),
    ("StepSampler/num_examples=0", lambda: dst.StepSampler(0, 1), err("num_examples", "int >= 1")),
    ("StepSampler/global_batch=0", lambda: dst.StepSampler(10, 0), err("global_batch", "int >= 1")),
    ("StepSampler/global_batch>num_examples", lambda: dst.StepSampler(3, 4), err("global_batch", "num_examples=3")),
    ("StepSampler/seed=-1", lambda: dst.StepSampler(10, 4, seed=-1), err("seed", "int >= 0")),
    ("StepSampler/seed-float", lambda: dst.StepSampler(10, 4, seed=0.5), err("seed", "int")),
    ("StepSampler.indices/step=-1", lambda: dst.StepSampler(10, 4).indices(-1), err("step", "int >= 0")),
    ("StepSampler.indices/step-float", lambda: dst.StepSampler(10, 4).indices(1.0), err("step", "int")),
    ("StepSampler/ok-ranks-split-the-batch", step_sampler_split, OK),
    ("StepSampler/ok-partial-batch-dropped", step_sampler_drops_partial, OK),
    # --- all_reduce_sum, global_token_count, token_mean_loss
    ("all_reduce_sum/values-str", lambda: dst.all_reduce_sum("12"), err("values", "list of numbers")),
    ("all_reduce_sum/values-None", lambda: dst.all_reduce_sum(None), err("values", "list of numbers")),
    ("all_reduce_sum/values-int", lambda: dst.all_reduce_sum(3), err("values", "list of numbers")),
    ("all_reduce_sum/bool-value", lambda: dst.all_reduce_sum([1, True]), err("values", "index 1")),
    ("all_reduce_sum/tensor-value", lambda: dst.all_reduce_sum([torch.tensor(1.0)]), err("values", "numbers")),
    ("all_reduce_sum/str-value", lambda: dst.all_reduce_sum(["1"]), err("values", "numbers")),
    ("all_reduce_sum/ok-single-process", lambda: None if dst.all_reduce_sum((3, 2.5)) == [3.0, 2.5] and dst.all_reduce_sum([]) == [] else pytest.fail("sums"), OK),
    ("global_token_count/n_local=-1", lambda: dst.global_token_count(-1), err("n_local", "int >= 0")),
    ("global_token_count/n_local-float", lambda: dst.global_token_count(3.0), err("n_local", "int")),
    ("global_token_count/n_local-bool", lambda: dst.global_token_count(True), err("n_local", "int")),
    ("global_token_count/ok", lambda: None if (dst.global_token_count(7), dst.global_token_count(0)) == (7, 0) and type(dst.global_token_count(7)) is int else pytest.fail("count"), OK),
    ("token_mean_loss/loss_sum-float", lambda: dst.token_mean_loss(3.0, 1), err("loss_sum", "tensor")),
    ("token_mean_loss/n_global=0", lambda: dst.token_mean_loss(torch.tensor(3.0), 0), err("n_global", "int >= 1")),
    ("token_mean_loss/n_global-float", lambda: dst.token_mean_loss(torch.tensor(3.0), 2.0), err("n_global", "int")),
    ("token_mean_loss/world_size=0", lambda: dst.token_mean_loss(torch.tensor(3.0), 1, 0), err("world_size", "int >= 1")),
    # --- rng_state, set_rng_state, all_rng_states
    ("rng_state/ok-restores-draws", set_rng_state_restores, OK),
    ("rng_state/ok-after-weights_only-load", in_tmp(set_rng_state_after_save), OK),
    ("set_rng_state/None", lambda: dst.set_rng_state(None), err("state", "rng_state")),
    ("set_rng_state/list-of-states", lambda: dst.set_rng_state(dst.all_rng_states()), err("state", "dict from rng_state")),
    ("set_rng_state/missing-key", lambda: dst.set_rng_state({k: v for k, v in dst.rng_state().items() if k != "numpy"}), err("state", "'numpy'")),
    ("set_rng_state/torch-int", broken_rng("torch", 1), err("state", r"'torch'.*uint8")),
    ("set_rng_state/torch-float-tensor", broken_rng("torch", torch.zeros(5)), err("state", r"'torch'.*uint8")),
    ("set_rng_state/cuda-int", broken_rng("cuda", 5), err("state", r"'cuda'.*list")),
    ("set_rng_state/python-empty", broken_rng("python", {}), err("state", r"'python'.*version")),
    ("set_rng_state/python-short-state", lambda: dst.set_rng_state({**(s := dst.rng_state()), "python": {**s["python"], "state": s["python"]["state"][:5]}}), err("state", r"'python'.*625")),
    ("set_rng_state/numpy-empty", broken_rng("numpy", {}), err("state", r"'numpy'.*bit_generator")),
    ("set_rng_state/ok-bad-state-sets-nothing", set_rng_state_atomic, OK),
    ("all_rng_states/ok-single-process", all_rng_states_ok, OK),
    # --- unwrap
    ("unwrap/model-str", lambda: dst.unwrap("model"), err("model", "nn.Module")),
    ("unwrap/model-None", lambda: dst.unwrap(None), err("model", "nn.Module")),
    ("unwrap/model-state_dict", lambda: dst.unwrap(nn.Linear(2, 2).state_dict()), err("model", "nn.Module")),
    ("unwrap/ok-plain-module", unwrap_ok, OK),
    # --- build_parser (parse_args checks the values; argparse the types and choices)
    ("build_parser/ok-defaults-and-run-arguments", build_parser_defaults, OK),
    ("build_parser/steps-not-int", lambda: parser_refuses(["--steps", "3.5"], r"--steps: invalid int value"), OK),
    ("build_parser/lr-not-number", lambda: parser_refuses(["--lr", "fast"], r"--lr: invalid float value"), OK),
    ("build_parser/task-unknown", lambda: parser_refuses(["--task", "bert"], r"--task: invalid choice"), OK),
    ("build_parser/dtype-unknown", lambda: parser_refuses(["--dtype", "float16"], r"--dtype: invalid choice"), OK),
    ("build_parser/precision-unknown", lambda: parser_refuses(["--precision", "fp8"], r"--precision: invalid choice"), OK),
    ("build_parser/unknown-option", lambda: parser_refuses(["--epochs", "3"], r"unrecognized arguments: --epochs"), OK),
    ("build_parser/resume-takes-no-value", lambda: parser_refuses(["--resume", "yes"], r"unrecognized arguments: yes"), OK),
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


@pytest.mark.processes
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


@pytest.mark.processes
@pytest.mark.in_chapter13
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
