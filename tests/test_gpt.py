"""transformer_lib.gpt (Chapter 11): GPT against Hugging Face's GPT2LMHeadModel in float64, built from configs
only (never downloaded); causality and the KV cache; GPT-2's sizes and initialisation; the trigram baseline;
the training windows, the loss and the sliding-window NLL; the standard-library corpus and a BPE round trip;
switching attention heads off (ablate_heads)."""

import collections
import copy
import math
import random
import sysconfig
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import ATOL, DT, assert_download_fails, import_hf, max_diff, noisy, randomize

from transformer_lib.gpt import (
    GPT,
    HELDOUT_MODULES,
    TRAIN_MODULES,
    GPTConfig,
    TrigramLM,
    ablate_heads,
    lm_loss,
    load_hf_gpt2,
    random_windows,
    sequence_nll,
    stdlib_sources,
)
from transformer_lib.multi_head import attention_maps

V = 50                                           # vocabulary of the small models
PAD = 0


def small_config(**kw) -> GPTConfig:
    return GPTConfig(**{"vocab_size": V, "max_len": 32, "d_model": 32, "num_layers": 2, "num_heads": 4,
                        "d_ff": 64, **kw})


def random_gpt(seed=0, **kw) -> GPT:
    """A small GPT in float64, eval mode, with every parameter (LayerNorm gains and biases too) random."""
    return randomize(GPT(small_config(**kw)).double(), seed=seed, std=0.2).eval()


def token_ids(*shape, seed=0, low=0):
    return torch.randint(low, V, shape, generator=torch.Generator().manual_seed(seed))



# ---------------------------------------------------------------- no network, ever

pytestmark = pytest.mark.usefixtures("no_network")   # tests/conftest.py: any connection fails


def test_network_guard_makes_from_pretrained_fail(tmp_path):
    assert_download_fails("GPT2LMHeadModel", "gpt2", tmp_path)


# ---------------------------------------------------------------- equality with Hugging Face

def hf_config(**kw):
    transformers = import_hf("transformers")
    return transformers.GPT2Config(**{"vocab_size": V, "n_positions": 32, "n_embd": 32, "n_layer": 2,
                                      "n_head": 4, "bos_token_id": None, "eos_token_id": None,
                                      "attn_implementation": "eager", **kw})


def hf_pair(seed=0, **kw):
    transformers = import_hf("transformers")
    cfg = hf_config(**kw)
    hf = noisy(transformers.GPT2LMHeadModel(cfg), seed)
    ours = load_hf_gpt2(GPT(GPTConfig.from_hf(cfg)).double().eval(), hf)
    return ours, hf


def shifted_ce(logits, ids):
    """Next-token cross-entropy: position t predicts ids[:, t + 1]."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def test_from_hf_reads_every_size():
    cfg = GPTConfig.from_hf(hf_config(n_inner=48, layer_norm_epsilon=1e-6, resid_pdrop=0.2, embd_pdrop=0.2,
                                      attn_pdrop=0.2))
    assert cfg == GPTConfig(vocab_size=V, max_len=32, d_model=32, num_layers=2, num_heads=4, d_ff=48,
                            dropout=0.2, eps=1e-6)
    assert GPTConfig.from_hf(hf_config()).d_ff == 4 * 32                    # n_inner=None: 4 d_model
    assert GPTConfig.from_hf(hf_config(activation_function="gelu_pytorch_tanh")).d_ff == 128


def test_gpt_equals_hugging_face():
    ours, hf = hf_pair(seed=1)
    ids = token_ids(3, 12, seed=2)
    with torch.no_grad():
        logits = ours(ids)
        out = hf(input_ids=ids, labels=ids)
    assert logits.dtype == DT and logits.shape == (3, 12, V)
    assert max_diff(logits, out.logits) < 1e-10
    assert abs(shifted_ce(logits, ids).item() - shifted_ce(out.logits, ids).item()) < 1e-10
    assert abs(shifted_ce(logits, ids).item() - out.loss.item()) < 1e-6       # HF's loss runs in float32
    assert lm_loss(ours, (ids,)).item() == pytest.approx(out.loss.item(), abs=1e-6)


def test_gpt_equals_hugging_face_with_padding_at_the_end():
    """Right padding: HF with attention_mask zeros at the end of a row, ours with the same (B, 1, 1, T) mask."""
    ours, hf = hf_pair(seed=3)
    ids = token_ids(3, 10, seed=4, low=1)
    ids[1, 6:] = PAD
    ids[2, 3:] = PAD
    real = ids != PAD
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=real.long()).logits
        got = ours(ids, real[:, None, None, :])
        unmasked = ours(ids)
    assert max_diff(got[real], want[real]) < 1e-10
    # Causality already hides padding that comes after every real token: the mask changes nothing there ...
    assert max_diff(unmasked[real], got[real]) < ATOL
    # ... and it does matter at the padded positions, where both models drop the padded keys alike.
    assert max_diff(got[~real], want[~real]) < 1e-10
    assert max_diff(unmasked[~real], got[~real]) > 1e-3


# ---------------------------------------------------------------- load_hf_gpt2

def test_load_hf_gpt2_copies_the_weights_and_transposes_conv1d():
    ours, hf = hf_pair(seed=5)
    h = hf.transformer.h[1]
    d = 32
    W = h.attn.c_attn.weight                                                 # Conv1D: (in, out) = (d, 3d)
    torch.testing.assert_close(ours.blocks[1].self_attn.W_k.weight, W[:, d:2 * d].T, rtol=0, atol=0)
    torch.testing.assert_close(ours.blocks[1].self_attn.W_v.bias, h.attn.c_attn.bias[2 * d:], rtol=0, atol=0)
    torch.testing.assert_close(ours.blocks[1].feed_forward.linear2.weight, h.mlp.c_proj.weight.T, rtol=0, atol=0)
    torch.testing.assert_close(ours.token.weight, hf.transformer.wte.weight, rtol=0, atol=0)


def test_load_hf_gpt2_refuses_a_model_that_is_not_a_gpt():
    with pytest.raises(ValueError, match=r"model must be a GPT"):
        load_hf_gpt2(nn.Linear(2, 2), None)


@pytest.mark.parametrize("field, value", [("n_embd", 16), ("vocab_size", V + 10), ("n_inner", 48),
                                          ("n_positions", 16)])
def test_load_hf_gpt2_refuses_other_sizes(field, value):
    transformers = import_hf("transformers")
    hf = transformers.GPT2LMHeadModel(hf_config(**{field: value}))
    with pytest.raises(ValueError, match=r"hf_model's .* has shape"):
        load_hf_gpt2(GPT(GPTConfig.from_hf(hf_config())), hf)


def test_load_hf_gpt2_refuses_more_layers_than_ours():
    transformers = import_hf("transformers")
    with pytest.raises(ValueError, match="hf_model"):
        load_hf_gpt2(GPT(GPTConfig.from_hf(hf_config())), transformers.GPT2LMHeadModel(hf_config(n_layer=3)))


def test_load_hf_gpt2_refuses_fewer_layers_than_ours():
    transformers = import_hf("transformers")
    with pytest.raises(ValueError, match="hf_model"):
        load_hf_gpt2(GPT(GPTConfig.from_hf(hf_config(n_layer=3))), transformers.GPT2LMHeadModel(hf_config()))


def test_load_hf_gpt2_refuses_a_gpt2_model_without_lm_head():
    transformers = import_hf("transformers")
    with pytest.raises(ValueError, match="hf_model"):
        load_hf_gpt2(GPT(GPTConfig.from_hf(hf_config())), transformers.GPT2Model(hf_config()))


def test_from_hf_refuses_what_we_do_not_implement():
    with pytest.raises(ValueError, match="activation_function"):
        GPTConfig.from_hf(hf_config(activation_function="relu"))
    with pytest.raises(ValueError, match="activation_function"):
        GPTConfig.from_hf(hf_config(activation_function="gelu"))              # the exact (erf) GELU
    with pytest.raises(ValueError, match="dropout"):
        GPTConfig.from_hf(hf_config(resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.2))
    with pytest.raises(ValueError, match="dropout"):
        GPTConfig.from_hf(hf_config(resid_pdrop=0.0, embd_pdrop=0.1, attn_pdrop=0.1))


# ---------------------------------------------------------------- causality

def test_later_tokens_never_change_earlier_logits():
    model = random_gpt(seed=6)
    ids = token_ids(2, 12, seed=7)
    g = torch.Generator().manual_seed(8)
    with torch.no_grad():
        base = model(ids)
        for i in range(12):
            changed = ids.clone()
            changed[:, i + 1:] = torch.randint(0, V, (2, 11 - i), generator=g)
            out = model(changed)
            assert torch.equal(out[:, :i + 1], base[:, :i + 1]), i          # exactly, bit for bit
            if i < 11:
                assert max_diff(out[:, i + 1:], base[:, i + 1:]) > 1e-6, i  # the change is seen after i


def test_an_all_true_mask_cannot_undo_the_causal_mask():
    model = random_gpt(seed=9)
    ids = token_ids(2, 9, seed=10)
    with torch.no_grad():
        base = model(ids)
        for mask in (torch.ones(1, 1, 1, 9, dtype=torch.bool), torch.ones(2, 4, 9, 9, dtype=torch.bool)):
            assert torch.equal(model(ids, mask), base)
        with attention_maps(model) as maps:
            model(ids)
    assert len(maps) == len(model.blocks)
    for weights in maps.values():                                            # (B, h, T, T): no weight above
        assert weights.shape == (2, 4, 9, 9)
        assert torch.all(weights.triu(1) == 0)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 9, dtype=DT), rtol=0, atol=ATOL)


# ---------------------------------------------------------------- the KV cache

@pytest.mark.parametrize("chunk", [1, 3])
def test_kv_cache_gives_the_full_call_logits(chunk):
    model = random_gpt(seed=11)
    ids = token_ids(2, 14, seed=12)
    cache = model.new_cache()
    assert len(cache) == 2 and all(len(c[0]) == 0 and c[1] is None for c in cache)
    with torch.no_grad():
        full = model(ids)
        parts = [model(ids[:, s:s + chunk], cache=cache) for s in range(0, 14, chunk)]
    assert all(len(c[0]) == 14 for c in cache)
    assert max_diff(torch.cat(parts, dim=1), full) < ATOL


def test_kv_cache_refuses_positions_past_max_len():
    model = random_gpt(seed=13)
    cache = model.new_cache()
    with torch.no_grad():
        model(token_ids(1, 30, seed=14), cache=cache)
        model(token_ids(1, 2, seed=15), cache=cache)                          # 32 = max_len: fits
        with pytest.raises(ValueError, match=r"(?s)(?=.*\btokens\b)(?=.*max_len=32)"):
            model(token_ids(1, 1, seed=16), cache=cache)
    with pytest.raises(ValueError, match=r"(?s)(?=.*\btokens\b)(?=.*max_len=32)"):
        model(token_ids(1, 33, seed=17))                                     # without a cache too


def test_a_cache_from_elsewhere_is_refused():
    model = random_gpt(seed=18)
    ids = token_ids(1, 3, seed=19)
    with pytest.raises(ValueError, match=r"\bcache\b.*new_cache"):
        model(ids, cache=model.new_cache()[:1])                              # one layer short
    with pytest.raises(ValueError, match=r"\bcache\b"):
        model(ids, cache=random_gpt(seed=18, num_layers=3).new_cache())
    with pytest.raises(ValueError, match=r"\bcache\b"):
        model(ids, cache=tuple(model.new_cache()))                           # not the list new_cache() gives


# ---------------------------------------------------------------- sizes, initialisation, training behaviour

def test_gpt2_small_has_124m_parameters():
    with torch.device("meta"):                                              # shapes only: no 500 MB of weights
        model = GPT(GPTConfig())
    assert sum(p.numel() for p in model.parameters()) == 124_439_808       # the output layer is the embedding
    assert not any("lm_head" in n or "output" in n for n, _ in model.named_parameters())


def test_output_layer_is_tied_to_the_token_embedding():
    model = random_gpt(seed=20)
    ids = torch.tensor([[3, 4, 6]])                                          # no 5: the hidden states stay put
    with torch.no_grad():
        before = model(ids)
        model.token.weight[5] += torch.randn(32, dtype=DT)
        after = model(ids)
    assert max_diff(before[..., 5], after[..., 5]) > 1e-3
    torch.testing.assert_close(before[..., :5], after[..., :5], rtol=0, atol=0)


def test_gpt2_initialisation():
    torch.manual_seed(0)
    L = 4
    model = GPT(small_config(num_layers=L))
    params = dict(model.named_parameters())
    scaled = torch.cat([p.flatten() for n, p in params.items() if n.endswith(("W_o.weight", "linear2.weight"))])
    plain = torch.cat([p.flatten() for n, p in params.items()
                       if n.endswith(("W_q.weight", "W_k.weight", "W_v.weight", "linear1.weight"))
                       or n in ("token.weight", "position.weight")])
    assert scaled.numel() == L * (32 * 32 + 32 * 64)
    assert scaled.std().item() == pytest.approx(0.02 / math.sqrt(2 * L), rel=0.05)
    assert plain.std().item() == pytest.approx(0.02, rel=0.05)
    assert abs(scaled.mean().item()) < 0.001 and abs(plain.mean().item()) < 0.001
    biases = [n for n in params if n.endswith("bias") and "norm" not in n]
    assert len(biases) == L * 6                                               # q, k, v, o, linear1, linear2
    for name in biases:
        assert torch.all(params[name] == 0), name
    for name, p in params.items():
        if "norm" in name:                                                   # LayerNorm: gain 1, bias 0
            assert torch.all(p == (1.0 if name.endswith("weight") else 0.0)), name
    assert all(ln.eps == 1e-5 for ln in model.modules() if type(ln).__name__ == "LayerNorm")


def test_eps_reaches_every_layer_norm():
    model = GPT(small_config(eps=1e-3))
    norms = [m for m in model.modules() if type(m).__name__ == "LayerNorm"]
    assert len(norms) == 2 * 2 + 1 and all(m.eps == 1e-3 for m in norms)


def test_gradients_reach_every_parameter():
    torch.manual_seed(0)
    model = GPT(small_config(dropout=0.0))
    loss = lm_loss(model, (token_ids(3, 10, seed=21),))
    loss.backward()
    params = dict(model.named_parameters())
    assert len(params) == 4 + 2 * 16                                         # embeddings, final norm, 2 blocks
    for name, p in params.items():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name
    assert torch.all(model.position.weight.grad[9:] == 0)                   # positions past T = 9 are unused
    assert torch.all(model.position.weight.grad[:9].abs().sum(-1) > 0)


def test_dropout_only_in_training():
    model = random_gpt(seed=22, dropout=0.3)
    ids = token_ids(2, 8, seed=23)
    model.train()
    assert max_diff(model(ids), model(ids)) > 1e-6
    model.eval()
    torch.testing.assert_close(model(ids), model(ids), rtol=0, atol=0)
    no_dropout = random_gpt(seed=22, dropout=0.0).train()                    # same weights, p = 0
    torch.testing.assert_close(no_dropout(ids), model(ids), rtol=0, atol=0)


@pytest.mark.parametrize("kwargs, names", [
    (dict(d_model=30, num_heads=4), r"d_model|num_heads"),
    (dict(num_layers=0), r"num_layers"),
    (dict(vocab_size=True), r"vocab_size"),
    (dict(dropout=1.0), r"dropout"),
    (dict(eps=0.0), r"eps"),
    (dict(max_len=0), r"max_len"),
])
def test_config_value_errors_name_the_field(kwargs, names):
    with pytest.raises(ValueError, match=rf"\b({names})\b"):
        small_config(**kwargs)


def test_gpt_refuses_a_config_that_is_not_a_gpt_config():
    with pytest.raises(ValueError, match="config must be a GPTConfig"):
        GPT({"vocab_size": V})


def test_forward_value_errors():
    model = random_gpt(seed=24)
    ids = token_ids(2, 5, seed=25)
    with pytest.raises(ValueError, match=r"tokens .*outside"):
        model(ids + V)
    with pytest.raises(ValueError, match=r"\btokens\b"):
        model(ids.double())
    with pytest.raises(ValueError, match=r"\bmask\b.*bool"):
        model(ids, torch.ones(2, 1, 1, 5))
    with pytest.raises(ValueError, match=r"\bmask\b.*padding_mask"):
        model(ids, ids != PAD)                                               # a (B, T) mask: no axes added


# ---------------------------------------------------------------- stdlib_sources

def test_stdlib_sources_reads_the_real_files():
    root = Path(sysconfig.get_paths()["stdlib"])
    got = stdlib_sources(["ast.py", "json/decoder.py"])
    assert list(got) == ["ast.py", "json/decoder.py"]
    assert got["ast.py"] == (root / "ast.py").read_text(encoding="utf-8")
    assert "class JSONDecoder" in got["json/decoder.py"]


def test_stdlib_sources_skips_missing_modules(tmp_path):
    assert list(stdlib_sources(["no_such_module_xyz.py", "ast.py"])) == ["ast.py"]
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("x = 1\n", encoding="utf-8")
    assert stdlib_sources(["pkg/m.py", "ast.py"], stdlib=tmp_path) == {"pkg/m.py": "x = 1\n"}


def test_stdlib_sources_value_errors(tmp_path):
    with pytest.raises(ValueError, match=r"\bmodules must be a list"):
        stdlib_sources("ast.py")
    with pytest.raises(ValueError, match=r"(?s)no_such_module_xyz\.py.*was found"):
        stdlib_sources(["no_such_module_xyz.py"])
    with pytest.raises(ValueError, match="was found"):
        stdlib_sources(["ast.py"], stdlib=tmp_path)


def test_train_and_heldout_modules_are_disjoint_and_present():
    assert not set(TRAIN_MODULES) & set(HELDOUT_MODULES)
    assert len(set(TRAIN_MODULES)) == len(TRAIN_MODULES) and len(set(HELDOUT_MODULES)) == len(HELDOUT_MODULES)
    held = stdlib_sources(HELDOUT_MODULES)
    assert len(held) >= len(HELDOUT_MODULES) - 2                              # a Python version may lack a few


def test_byte_level_bpe_round_trips_heldout_modules():
    tokenizers = import_hf("tokenizers")
    tok = tokenizers.ByteLevelBPETokenizer()
    tok.train_from_iterator(list(stdlib_sources(TRAIN_MODULES[:4]).values()), vocab_size=300,
                            show_progress=False)
    assert tok.get_vocab_size() == 300
    held = stdlib_sources(HELDOUT_MODULES)
    for name, text in held.items():
        ids = tok.encode(text).ids
        assert len(ids) < len(text.encode("utf-8")), name                    # the merges compress
        assert tok.decode(ids) == text, name


# ---------------------------------------------------------------- TrigramLM

# A tiny handmade corpus over 6 ids: "0 1 2" recurs, 3 and 4 are rarer, 5 never occurs.
CORPUS = torch.tensor([0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 4, 1, 2, 0, 1, 3, 2, 0, 1, 2, 4, 4, 0, 1, 2])
V6 = 6


@pytest.fixture(scope="module")
def trigram():
    return TrigramLM(CORPUS, V6)


@pytest.mark.parametrize("context", [(), (1,), (5,), (0, 1), (2, 1), (5, 1), (5, 5)],
                         ids=["unigram", "seen-b", "unseen-b", "seen-ab", "unseen-ab", "unseen-a", "unseen-both"])
def test_trigram_probabilities_sum_to_one(trigram, context):
    a, b = (None, None) if not context else ((None,) + context)[-2:]
    total = sum(trigram.prob(c, b, a) for c in range(V6))
    assert abs(total - 1) < 1e-9
    assert all(trigram.prob(c, b, a) > 0 for c in range(V6))                 # smoothing: nothing impossible


def test_trigram_prefers_seen_continuations(trigram):
    assert trigram.prob(2, 1, 0) > 0.5                                       # "0 1" is always followed by 2
    assert trigram.prob(2, 1, 0) > trigram.prob(3, 1, 0) > trigram.prob(5, 1, 0)
    assert trigram.prob(0, 2, 1) > trigram.prob(5, 2, 1)
    assert trigram.prob(5) < trigram.prob(0)                                 # the add-one unigram
    assert trigram.prob(5) == pytest.approx(1 / (len(CORPUS) + V6))


def test_trigram_formula_by_hand():
    """p(c | a b) = max(n(abc) - D, 0) / n(ab.) + D N1(ab.) / n(ab.) p(c | b), down to add-one."""
    lm = TrigramLM(torch.tensor([0, 1, 0, 1, 1]), 3, discount=0.5)
    uni = {c: (n + 1) / (5 + 3) for c, n in {0: 2, 1: 3, 2: 0}.items()}
    # bigrams after 1: (1,0), (1,1): n(1.) = 2, N1 = 2; trigrams after (0,1): (0,1,0), (0,1,1): n = 2, N1 = 2
    bi = {c: max({0: 1, 1: 1}.get(c, 0) - 0.5, 0) / 2 + 0.5 * 2 / 2 * uni[c] for c in range(3)}
    tri = {c: max({0: 1, 1: 1}.get(c, 0) - 0.5, 0) / 2 + 0.5 * 2 / 2 * bi[c] for c in range(3)}
    for c in range(3):
        assert lm.prob(c) == pytest.approx(uni[c], abs=1e-15)
        assert lm.prob(c, 1) == pytest.approx(bi[c], abs=1e-15)
        assert lm.prob(c, 1, 0) == pytest.approx(tri[c], abs=1e-15)


def test_trigram_nll_is_minus_sum_log_prob(trigram):
    seq = torch.tensor([0, 1, 2, 5, 3, 1, 2])
    t = seq.tolist()
    want = -(math.log(trigram.prob(t[0])) + math.log(trigram.prob(t[1], t[0]))
             + sum(math.log(trigram.prob(t[i], t[i - 1], t[i - 2])) for i in range(2, len(t))))
    assert abs(trigram.nll(seq) - want) < 1e-12
    assert trigram.nll(torch.tensor([0, 1, 2])) < trigram.nll(torch.tensor([0, 1, 5]))


def test_trigram_sample_is_reproducible(trigram):
    a = trigram.sample([0, 1], 50, random.Random(3))
    b = trigram.sample([0, 1], 50, random.Random(3))
    c = trigram.sample([0, 1], 50, random.Random(4))
    assert a == b and a != c
    assert len(a) == 50 and all(isinstance(x, int) and 0 <= x < V6 for x in a)


@pytest.mark.parametrize("prompt", [[0, 1], [2, 0], [2, 1], [5, 1], [5], []],
                         ids=["seen-ab", "seen-ab-2", "unseen-ab", "unseen-a", "unseen-b", "no-context"])
def test_trigram_sample_follows_prob(trigram, prompt):
    rng, n = random.Random(5), 20_000
    counts = collections.Counter(trigram.sample(prompt, 1, rng)[0] for _ in range(n))
    a, b = ([None, None] + prompt)[-2:]
    errors = [abs(counts[c] / n - trigram.prob(c, b, a)) for c in range(V6)]
    assert max(errors) < 0.015, errors                                       # about 4 standard errors


# ---------------------------------------------------------------- random_windows, lm_loss

def test_random_windows_are_contiguous_slices():
    ids = token_ids(40, seed=26)
    batches = random_windows(ids, 7, 5, seed=1)
    for _ in range(3):
        (x,) = next(batches)
        assert x.shape == (5, 8) and x.dtype == ids.dtype
        for row in x:
            assert any(torch.equal(row, ids[s:s + 8]) for s in range(len(ids) - 7)), row
    ramp = next(random_windows(torch.arange(100), 9, 64, seed=2))[0]         # distinct ids: the start is row[0]
    assert torch.equal(ramp, ramp[:, :1] + torch.arange(10))
    assert len(ramp[:, 0].unique()) > 20                                     # the starts vary


def test_random_windows_are_reproducible():
    ids = torch.arange(200)
    a, b, c = (random_windows(ids, 5, 4, seed=s) for s in (3, 3, 4))
    for _ in range(3):
        x, y, z = next(a)[0], next(b)[0], next(c)[0]
        assert torch.equal(x, y)
        assert not torch.equal(x, z)


def test_random_windows_can_reach_the_last_token():
    ids = torch.arange(7)                                                     # windows of 5: starts 0, 1, 2
    starts = next(random_windows(ids, 4, 500, seed=0))[0][:, 0]
    assert set(starts.tolist()) == {0, 1, 2}


def test_random_windows_value_errors():
    with pytest.raises(ValueError, match=r"\bids must be a 1-D tensor longer than context \+ 1 = 8"):
        next(random_windows(torch.arange(8), 7, 2))
    with pytest.raises(ValueError, match=r"\bids\b"):
        next(random_windows(torch.arange(40).view(4, 10), 3, 2))
    with pytest.raises(ValueError, match=r"\bcontext\b"):
        next(random_windows(torch.arange(40), 0, 2))
    with pytest.raises(ValueError, match=r"\bbatch_size\b"):
        next(random_windows(torch.arange(40), 3, 0))


def test_lm_loss_is_the_shifted_cross_entropy():
    model = random_gpt(seed=27)
    x = token_ids(3, 9, seed=28)
    logits = model(x[:, :-1])
    want = sum(-logits[b, t].log_softmax(-1)[x[b, t + 1]] for b in range(3) for t in range(8)) / 24
    assert abs(lm_loss(model, (x,)).item() - want.item()) < ATOL
    other = x.clone()
    other[:, -1] = (other[:, -1] + 1) % V                                    # the last token is a target only
    assert abs(lm_loss(model, (other,)).item() - want.item()) > 1e-6


# ---------------------------------------------------------------- sequence_nll

def manual_nll(model, ids, context):
    """The sliding windows one token at a time: token i is scored by the first window s = 0, stride, 2 stride,
    ... whose targets s + 1 .. s + context contain it, from the tokens ids[s:i]."""
    stride, total = context // 2, 0.0
    for i in range(1, len(ids)):
        s = max(0, -(-(i - context) // stride)) * stride
        assert s < i <= s + context and (s == 0 or i - s > stride)          # at least context/2 before it
        total -= model(ids[None, s:i])[0, -1].log_softmax(-1)[ids[i]].item()
    return total


def test_sequence_nll_with_a_long_context_is_the_full_nll():
    model = random_gpt(seed=29)
    ids = token_ids(20, seed=30)
    with torch.no_grad():
        want = F.cross_entropy(model(ids[None, :-1])[0], ids[1:], reduction="sum").item()
    for context in (19, 20, 32, None):                                       # None: max_len = 32
        assert sequence_nll(model, ids, context) == pytest.approx(want, rel=1e-6)   # scored in float32


@pytest.mark.parametrize("context", [2, 3, 5, 8, 11])
def test_sequence_nll_scores_every_token_once(context):
    model = random_gpt(seed=31)
    ids = token_ids(23, seed=32)
    with torch.no_grad():
        want = manual_nll(model, ids, context)
    assert sequence_nll(model, ids, context) == pytest.approx(want, rel=1e-6)


class Bigram(nn.Module):
    """Predictions that depend on the previous token only (or on nothing): every window scores alike."""

    def __init__(self, unigram=False):
        super().__init__()
        self.config = GPTConfig(vocab_size=V, max_len=32, d_model=4, num_layers=1, num_heads=1, d_ff=4)
        g = torch.Generator().manual_seed(33)
        self.table = nn.Parameter(torch.randn(V, V, generator=g, dtype=DT))
        self.unigram = unigram

    def forward(self, tokens):
        return self.table[torch.zeros_like(tokens) if self.unigram else tokens]     # (B, T, V)


@pytest.mark.parametrize("unigram", [True, False], ids=["context-free", "bigram"])
def test_sequence_nll_of_a_short_memory_model_does_not_depend_on_context(unigram):
    model = Bigram(unigram)
    ids = token_ids(30, seed=34)
    logp = model.table.detach().log_softmax(-1)
    want = -sum(logp[0 if unigram else ids[i - 1], ids[i]].item() for i in range(1, 30))
    for context in (2, 3, 4, 7, 16, 29, None):
        assert sequence_nll(model, ids, context) == pytest.approx(want, rel=1e-6), context


def test_sequence_nll_edge_cases_and_errors():
    model = random_gpt(seed=35)
    assert sequence_nll(model, token_ids(1, seed=36), 4) == 0.0              # nothing to score
    two = token_ids(2, seed=37)
    with torch.no_grad():
        want = -model(two[None, :1])[0, 0].log_softmax(-1)[two[1]].item()
    assert sequence_nll(model, two, 4) == pytest.approx(want, rel=1e-6)
    with pytest.raises(ValueError, match=r"\bids must be a 1-D tensor"):
        sequence_nll(model, token_ids(2, 5, seed=38), 4)
    with pytest.raises(ValueError, match=r"\bcontext\b"):
        sequence_nll(model, token_ids(9, seed=39), 1)


def test_sequence_nll_refuses_context_zero():
    with pytest.raises(ValueError, match=r"\bcontext\b"):
        sequence_nll(random_gpt(seed=40), token_ids(9, seed=41), 0)


# ---------------------------------------------------------------- ablate_heads (the induction test)

def no_hooks(model) -> bool:
    return not any(m._forward_pre_hooks for m in model.modules())


def test_ablating_nothing_leaves_the_logits_bit_identical():
    model = random_gpt(seed=42)
    ids = token_ids(2, 10, seed=43)
    with torch.no_grad():
        base = model(ids)
        for heads in ({}, {0: []}, {0: [], 1: ()}):
            with ablate_heads(model, heads) as same:
                assert same is model
                assert torch.equal(model(ids), base), heads
    assert no_hooks(model)


def test_ablating_every_head_of_a_layer_equals_a_zero_w_o_with_its_bias_kept():
    model = random_gpt(seed=44)
    ids = token_ids(2, 10, seed=45)
    zeroed = copy.deepcopy(model)
    with torch.no_grad():
        zeroed.blocks[1].self_attn.W_o.weight.zero_()              # the bias stays: it belongs to no head
        with ablate_heads(model, {1: [0, 1, 2, 3]}):
            ablated = model(ids)
        assert max_diff(ablated, zeroed(ids)) < ATOL
        assert max_diff(ablated, model(ids)) > 1e-3                # the ablation does change the logits
        bare = copy.deepcopy(zeroed)
        bare.blocks[1].self_attn.W_o.bias.zero_()                  # and the bias does matter
        assert max_diff(ablated, bare(ids)) > 1e-3
    assert no_hooks(model)


@pytest.mark.parametrize("layer, heads", [(0, [2]), (1, [0, 3]), (1, range(1, 3))])
def test_ablating_heads_zeroes_their_d_k_columns_of_w_o(layer, heads):
    model = random_gpt(seed=46)
    ids = token_ids(3, 12, seed=47)
    d_k = model.config.d_model // model.config.num_heads
    cut = copy.deepcopy(model)
    with torch.no_grad():
        for h in heads:
            cut.blocks[layer].self_attn.W_o.weight[:, h * d_k:(h + 1) * d_k] = 0.0
        with ablate_heads(model, {layer: heads}):
            ablated = model(ids)
        assert max_diff(ablated, cut(ids)) < ATOL
        other = copy.deepcopy(model)                               # another head's columns give another model
        h = next(i for i in range(4) if i not in heads)
        other.blocks[layer].self_attn.W_o.weight[:, h * d_k:(h + 1) * d_k] = 0.0
        assert max_diff(ablated, other(ids)) > 1e-3


def test_ablate_heads_in_two_layers_and_with_the_kv_cache():
    model = random_gpt(seed=48)
    ids = token_ids(2, 9, seed=49)
    with torch.no_grad(), ablate_heads(model, {0: [1], 1: [2, 3]}):
        full = model(ids)
        cache = model.new_cache()
        steps = torch.cat([model(ids[:, t:t + 1], cache=cache) for t in range(9)], dim=1)
    assert max_diff(steps, full) < ATOL
    assert no_hooks(model)


def test_ablate_heads_removes_its_hooks_on_an_exception():
    model = random_gpt(seed=50)
    ids = token_ids(2, 6, seed=51)
    with torch.no_grad():
        base = model(ids)
        with pytest.raises(RuntimeError, match="inside the block"), ablate_heads(model, {0: [0, 1], 1: [3]}):
            assert not no_hooks(model)
            raise RuntimeError("inside the block")
        assert no_hooks(model)
        assert torch.equal(model(ids), base)


def test_ablate_heads_switches_off_a_bert_readers_heads_too():
    """Chapter 15 ablates the heads of a BERT inside its QA head: layers are the self-attention layers in
    model.modules() order, and a head off equals its d_k columns of W_o zeroed."""
    from transformer_lib.bert import BertConfig, BertForQuestionAnswering
    torch.manual_seed(52)
    reader = BertForQuestionAnswering(BertConfig(vocab_size=13, max_len=12, d_model=16, num_layers=2, num_heads=4,
                                                 d_ff=32, dropout=0.0)).double().eval()
    ids = torch.randint(1, 13, (2, 7))
    cut = copy.deepcopy(reader)
    with torch.no_grad():
        cut.bert.encoder.layers[1].self_attn.W_o.weight[:, 2 * 4:3 * 4] = 0.0
        with ablate_heads(reader, {1: [2]}):
            ablated = reader(ids)
        want = cut(ids)
    assert max_diff(ablated, want) < ATOL                          # start and end logits (B, S, 2)
    assert max_diff(ablated, reader(ids)) > 1e-6                   # the head mattered
    assert no_hooks(reader)
    with pytest.raises(ValueError, match=r"\bheads: every layer must be an int in \[0, num_layers\) = \[0, 2\)"):
        ablate_heads(reader, {2: [0]}).__enter__()


@pytest.mark.parametrize("model, heads, name", [
    (nn.Linear(2, 2), {0: [0]}, r"\bmodel must be a model with self-attention layers"),
    (None, {0: [0]}, r"\bmodel must be a model with self-attention layers"),
    ("gpt", [(0, 0)], r"\bheads must be a dict"),
    ("gpt", {0: 1}, r"\bheads\[0\] must be a list"),
    ("gpt", {0: "01"}, r"\bheads\[0\] must be a list"),
    ("gpt", {0: [4]}, r"\bheads\[0\] must be a list of ints in \[0, num_heads\) = \[0, 4\)"),
    ("gpt", {1: [-1]}, r"\bheads\[1\] must be"),
    ("gpt", {0: [True]}, r"\bheads\[0\] must be"),
    ("gpt", {0: [1.0]}, r"\bheads\[0\] must be"),
    ("gpt", {2: [0]}, r"\bheads: every layer must be an int in \[0, num_layers\) = \[0, 2\)"),
    ("gpt", {-1: [0]}, r"\bheads: every layer"),
    ("gpt", {True: [0]}, r"\bheads: every layer"),
    ("gpt", {"0": [0]}, r"\bheads: every layer"),
])
def test_ablate_heads_value_errors_name_the_argument(model, heads, name):
    gpt = random_gpt(seed=52)
    model = gpt if model == "gpt" else model
    with pytest.raises(ValueError, match=name), ablate_heads(model, heads):
        pass
    assert no_hooks(gpt)


def test_ablate_heads_checks_everything_before_adding_a_hook():
    gpt = random_gpt(seed=53)
    with pytest.raises(ValueError, match=r"heads\[1\]"), ablate_heads(gpt, {0: [0], 1: [9]}):
        pass
    assert no_hooks(gpt)
