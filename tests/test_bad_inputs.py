"""Bad and edge-case inputs to every public function and class of transformer_lib (issue 8).

Each case is one row of a table: (id, call, expected). `expected` is either
  err(names, phrase): the call raises a ValueError whose message names the user's argument (one of `names`,
                      a regex alternation such as "src|tgt") and contains `phrase` (a regex), or
  OK:                 the call is a valid edge case; it runs the library and asserts the documented result
                      itself (empty batch B = 0, length-0 sequences, a fully padded query row gives zeros,
                      never NaN, the decoder never sees the future, ...).
Calls in TENSOR_CASES take the floating dtype and run on float32 and float64; PLAIN_CASES take none.
The graders in transformer_lib.exercises are not covered here (their own tests cover them).
"""

import functools
import inspect
import math
import os
import tempfile
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import OK, err, run_case

import transformer_lib.attention as att
import transformer_lib.bert as brt
import transformer_lib.classifier as clf
import transformer_lib.data as data
import transformer_lib.decoder as dec
import transformer_lib.decoding as dcd
import transformer_lib.encoder as enc
import transformer_lib.feed_forward as ffn
import transformer_lib.gpt as gpt_mod
import transformer_lib.model as mdl
import transformer_lib.multi_head as mh
import transformer_lib.positional as pos
import transformer_lib.residual as res
import transformer_lib.sampling as smp
import transformer_lib.t5 as t5_mod
import transformer_lib.training as trn
import transformer_lib.utils as utl
import transformer_lib.vit as vit_mod

# ---------------------------------------------------------------------------------------------------- helpers
D, H, FF, V = 8, 2, 16, 11              # d_model, heads, d_ff, vocabulary of the small models below
PAD, BOS, EOS = 0, 1, 2


INT = r"int"                             # what check_int says: "must be an int >= 1"
PROB = r"\[0, 1\)"                       # check_probability: "must lie in [0, 1)"
BOOL = r"True or False"                  # check_bool
FLOAT = r"float"                         # a floating-point tensor was expected / a dtype is named
INTEGER = r"integer"                     # an integer tensor of token ids was expected
BOOLMASK = r"bool"                       # masks are bool, True = may attend
ALL5 = torch.ones(2, 1, 1, 5, dtype=torch.bool)    # a src_mask that attends to every position of a 5-token source
FIT = r"does not fit|shape|axes"         # a mask or tensor of the wrong shape
PADHINT = r"padding_mask"                # a 2-D (B, S) padding mask given to a module: points to padding_mask()
VOCAB = r"vocab|outside"                 # token id out of range
EMPTY = r"empty|at least one|no batch"   # an empty loader / list


def other(dt):
    """The other floating dtype: float64 input to a float32 module and vice versa."""
    return torch.float64 if dt == torch.float32 else torch.float32


def rand(*shape, dt=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dt)


def ids(*shape, low=3, high=V, seed=0):
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed))


def zeros_not_nan(t):
    assert not torch.isnan(t).any(), "NaN in the output"
    assert torch.equal(t, torch.zeros_like(t)), f"expected zeros, got {t}"


def finite(t):
    assert torch.isfinite(t).all(), "NaN or inf in the output"
    return t


def shape_is(t, *shape):
    assert tuple(t.shape) == shape, f"shape {tuple(t.shape)}, expected {shape}"
    return t


def default_of(fn, name):
    return inspect.signature(fn).parameters[name].default


@functools.cache
def _module(kind, dt):
    torch.manual_seed(0)
    m = {
        "mha": lambda: mh.MultiHeadAttention(D, H),
        "mha_nobias": lambda: mh.MultiHeadAttention(D, H, bias=False),
        "ffn": lambda: ffn.PositionwiseFeedForward(D, FF),
        "ln": lambda: res.LayerNorm(D),
        "sub": lambda: res.SublayerConnection(D),
        "enc_layer": lambda: enc.EncoderLayer(D, H, FF),
        "encoder": lambda: enc.Encoder(2, D, H, FF),
        "dec_layer": lambda: dec.DecoderLayer(D, H, FF),
        "decoder": lambda: dec.Decoder(2, D, H, FF),
        "pe": lambda: pos.PositionalEncoding(D, max_len=20),
        "emb": lambda: pos.TokenEmbedding(V, D),
        "model": lambda: mdl.Transformer(mdl.TransformerConfig(V, V, d_model=D, num_heads=H, d_ff=FF,
                                                               num_encoder_layers=2, num_decoder_layers=2,
                                                               max_len=64)),
        "rms": lambda: t5_mod.RMSNorm(D),
        "t5_attn": lambda: t5_mod.T5Attention(D, H),
        "t5": lambda: t5_mod.T5(t5_config()),
        "vit": lambda: vit_mod.ViT(vit_config()),
    }[kind]()
    return m.to(dt).eval()


def t5_config(**kw):
    """A tiny T5 (Chapter 12): one layer per stack, 8 buckets."""
    return t5_mod.T5Config(**{"vocab_size": V, "d_model": D, "num_heads": H, "d_ff": FF, "num_layers": 1,
                              "num_decoder_layers": 1, "num_buckets": 8, "max_distance": 16, **kw})


def vit_config(**kw):
    """A tiny ViT (Chapter 12): 4×4 one-channel images, four 2×2 patches, 3 classes."""
    return vit_mod.ViTConfig(**{"image_size": 4, "patch_size": 2, "num_channels": 1, "d_model": D, "num_layers": 1,
                                "num_heads": H, "d_ff": FF, "num_classes": 3, **kw})


def hf_t5_config(**kw):
    """What T5Config.from_hf reads from a transformers.T5Config, without importing transformers."""
    return types.SimpleNamespace(**{"vocab_size": V, "d_model": D, "d_kv": D // H, "num_heads": H, "d_ff": FF,
                                    "num_layers": 1, "num_decoder_layers": 1, "relative_attention_num_buckets": 8,
                                    "relative_attention_max_distance": 16, "dropout_rate": 0.1,
                                    "layer_norm_epsilon": 1e-6, "pad_token_id": 0, "eos_token_id": 1,
                                    "feed_forward_proj": "relu", "tie_word_embeddings": True, **kw})


def hf_vit_config(**kw):
    """What ViTConfig.from_hf reads from a transformers.ViTConfig, without importing transformers."""
    return types.SimpleNamespace(**{"image_size": 4, "patch_size": 2, "num_channels": 1, "hidden_size": D,
                                    "num_hidden_layers": 1, "num_attention_heads": H, "intermediate_size": FF,
                                    "hidden_act": "gelu", "qkv_bias": True, "hidden_dropout_prob": 0.0,
                                    "attention_probs_dropout_prob": 0.0, "layer_norm_eps": 1e-12, **kw})


def M(kind, dt=torch.float32):
    """A small module of each kind, in eval mode, with weights of dtype dt (built once per dtype)."""
    return _module(kind, dt)


def tok():
    return data.CharTokenizer("abcdefg")     # 4 special ids + 7 characters = V


def loss_fn(**kw):
    return trn.LabelSmoothingLoss(**kw)


def batch():
    return data.collate([(ids(4), torch.tensor([BOS, 5, 6, EOS])), (ids(3, seed=1), torch.tensor([BOS, 7, EOS]))])


def optimizer():
    return trn.make_optimizer(M("model"))


def small_config(**kw):
    return mdl.TransformerConfig(**{"src_vocab_size": V, "tgt_vocab_size": V, "d_model": D, "num_heads": H, "d_ff": FF,
                                    "num_encoder_layers": 1, "num_decoder_layers": 1, "max_len": 16, **kw})


def translator_call(**kw):
    args = {"config": small_config(), "tokenizer": tok(), "pairs": [("abc", "gfe"), ("da", "ad"), ("b", "b")],
            "steps": 4, "batch_size": 2, **kw}
    return trn.train_translator(args.pop("config"), args.pop("tokenizer"), args.pop("pairs"), args.pop("steps"), **args)


def check_translator():
    """Four steps: one loss per step, the model returned in eval mode, and the same seed gives the same run."""
    model, history = translator_call()
    again, history_again = translator_call()
    assert len(history["loss"]) == 4 and not model.training
    assert history["loss"] == history_again["loss"]
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters(), strict=True))


def check_shuffle(dt):
    """Shuffling by a permutation and then by its inverse gives the images back; patch i comes from patch order[i]."""
    images, order = t(dt, 2, 3, 4, 6), torch.tensor([4, 0, 5, 2, 1, 3])
    shuffled = vit_mod.shuffle_patches(images, order, 2)
    assert torch.equal(vit_mod.patchify(shuffled, 2)[:, 1], vit_mod.patchify(images, 2)[:, 0])
    assert torch.equal(vit_mod.shuffle_patches(shuffled, order.argsort(), 2), images)


def tmp_checkpoint(content):
    """Save `content` (a dict with its checksum, as save_checkpoint would) in a temporary file and call
    load_checkpoint on it."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "ckpt.pt")
        if isinstance(content, dict):
            content = {**content, trn.CHECKSUM_KEY: trn.checkpoint_checksum(content)}
        torch.save(content, path)
        return trn.load_checkpoint(path)


# ------------------------------------------------------------------------------------- valid edge-case checks
def sdpa_fully_masked_row(dt):
    Q, K, Vv = rand(2, 3, 4, dt=dt), rand(2, 5, 4, dt=dt, seed=1), rand(2, 5, 6, dt=dt, seed=2)
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    mask[0, 1] = False
    out, w = att.scaled_dot_product_attention(Q, K, Vv, mask)
    zeros_not_nan(out[0, 1])
    zeros_not_nan(w[0, 1])
    finite(out)


def sdpa_matches_softmax(dt):
    Q, K, Vv = rand(2, 3, 4, dt=dt), rand(2, 5, 4, dt=dt, seed=1), rand(2, 5, 6, dt=dt, seed=2)
    out, w = att.scaled_dot_product_attention(Q, K, Vv, torch.ones(1, 3, 5, dtype=torch.bool))
    ref = torch.softmax(Q @ K.transpose(-2, -1) / 2.0, -1)
    torch.testing.assert_close(w, ref)
    torch.testing.assert_close(out, ref @ Vv)


def mha_fully_masked_row(dt, need_weights):
    mask = torch.ones(2, 1, 3, 5, dtype=torch.bool)
    mask[1, 0, 2] = False
    out, w = M("mha_nobias", dt)(rand(2, 3, D, dt=dt), rand(2, 5, D, dt=dt), rand(2, 5, D, dt=dt), mask,
                                 need_weights=need_weights)
    zeros_not_nan(out[1, 2])
    finite(out)
    if need_weights:
        zeros_not_nan(w[1, :, 2])


def mha_cache_matches_full(dt):
    mha = M("mha", dt)
    x = rand(2, 4, D, dt=dt)
    full, _ = mha(x, x, x, att.causal_mask(4)[None, None])
    cache = mh.AttentionCache()
    assert len(cache) == 0
    steps = [mha(x[:, i:i + 1], x[:, i:i + 1], x[:, i:i + 1], cache=cache)[0] for i in range(4)]
    assert len(cache) == 4
    torch.testing.assert_close(torch.cat(steps, 1), full)


def filled_cache(dt, n=2):
    """An AttentionCache after one call with a batch of n rows (B = n, t = 3)."""
    cache = mh.AttentionCache()
    x = rand(n, 3, D, dt=dt)
    M("mha", dt)(x, x, x, cache=cache)
    return cache


def cache_reorder_matches(dt):
    """reorder(index) keeps/duplicates batch rows: the same as filling a cache from the reordered inputs."""
    mha, x, y, index = M("mha", dt), rand(2, 3, D, dt=dt), rand(3, 1, D, dt=dt, seed=5), torch.tensor([1, 1, 0])
    reordered, fresh = mh.AttentionCache(), mh.AttentionCache()
    mha(x, x, x, cache=reordered)
    reordered.reorder(index)
    mha(x[index], x[index], x[index], cache=fresh)
    assert len(reordered) == len(fresh) == 3
    torch.testing.assert_close(mha(y, y, y, cache=reordered)[0], mha(y, y, y, cache=fresh)[0])


def decode_cache_matches_full(dt):
    model, src, tgt = M("model", dt), ids(2, 5), ids(2, 4)
    memory, mask = model.encode(src), model.make_src_mask(src)
    cache = model.decoder.new_cache()
    steps = torch.cat([model.decode(tgt[:, i:i + 1], memory, mask, cache=cache) for i in range(4)], 1)
    torch.testing.assert_close(steps, model.decode(tgt, memory, mask))


def layer_norm_half(dt):
    """float16/bfloat16 with |x - mean| > 256 (dt only selects which half type): close to nn.LayerNorm."""
    half, tol = (torch.float16, 4e-3) if dt == torch.float32 else (torch.bfloat16, 3e-2)
    x = (torch.linspace(-1000, 1000, 4 * D).view(4, D) + 300 * rand(4, D, dt=torch.float32)).to(half)
    ours, ref = res.LayerNorm(D).to(half), nn.LayerNorm(D).to(half)
    with torch.no_grad():
        for p, q in ((ours.weight, ref.weight), (ours.bias, ref.bias)):
            p.copy_(1 + rand(D, dt=torch.float32, seed=3).to(half))
            q.copy_(p)
    out = ours(x)
    assert out.dtype == half, out.dtype
    torch.testing.assert_close(out.float(), ref(x).float(), atol=tol, rtol=tol)


def layer_norm_constant_row(dt):
    ln = M("ln", dt)
    out = ln(torch.full((2, D), 3.0, dtype=dt))
    torch.testing.assert_close(out, ln.bias.expand(2, D).detach())


def no_future(dt, where):
    """Changing target token j leaves every output at positions < j bit-identical (tgt_mask=None or padding)."""
    model = M("model", dt)
    src, tgt = ids(2, 5), ids(2, 6, seed=1)
    memory = model.encode(src)

    def run(t):
        if where == "forward":
            return model(src, t)
        if where == "forward_padding_mask":
            return model(src, t, tgt_mask=att.padding_mask(t, PAD))
        if where == "decode":
            return model.decode(t, memory, model.make_src_mask(src))
        x = rand(2, 6, D, dt=dt) + model.tgt_embed(t).detach()   # the layer and the stack see embeddings
        layer = M("dec_layer", dt) if where == "layer" else M("decoder", dt)
        return layer(x, memory[:, :, :D].detach())
    with torch.no_grad():
        base = run(tgt)
        for j in range(1, 6):
            changed = tgt.clone()
            changed[:, j] = 3 + (changed[:, j] - 3 + 1) % (V - 3)
            out = run(changed)
            assert torch.equal(out[:, :j], base[:, :j]), f"position < {j} sees token {j} ({where})"
            assert not torch.equal(out[:, j:], base[:, j:])


def decodes_in_eval_mode(decode, dt):
    """A model left in training mode is decoded in eval mode and given back in training mode (one rule)."""
    model = M("model", dt)
    expected = decode(model.eval(), ids(2, 4), bos_id=BOS, eos_id=EOS)
    got = decode(model.train(), ids(2, 4), bos_id=BOS, eos_id=EOS)
    restored = model.training
    model.eval()
    assert restored and all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def layer_maps(name, dt, shapes, *args):
    """attention_maps hands back a layer's weights (named as in the layer) and stores nothing on it."""
    layer = M(name, dt)
    with mh.attention_maps(layer) as maps:
        layer(*args)
    assert {k: tuple(v.shape) for k, v in maps.items()} == shapes
    assert not any(isinstance(v, torch.Tensor) and v.dim() == 4 for m in layer.modules() for v in vars(m).values())


def model_attention_weights(dt):
    model = M("model", dt)
    with mh.attention_maps(model) as maps:
        model(ids(2, 5), ids(2, 4))
    w = {kind: [v for k, v in maps.items() if k.startswith(stack) and k.endswith(attn)]
         for kind, stack, attn in (("encoder", "encoder", "self_attn"), ("decoder_self", "decoder", "self_attn"),
                                   ("decoder_cross", "decoder", "cross_attn"))}
    assert [tuple(t.shape) for t in w["encoder"]] == [(2, H, 5, 5)] * 2
    assert [tuple(t.shape) for t in w["decoder_self"]] == [(2, H, 4, 4)] * 2
    assert [tuple(t.shape) for t in w["decoder_cross"]] == [(2, H, 4, 5)] * 2
    for t in w["decoder_self"]:                                           # causal: nothing above the diagonal
        assert torch.equal(t.triu(1), torch.zeros_like(t))


def model_fully_padded_source(dt):
    src = ids(2, 5)
    src[1] = PAD
    finite(M("model", dt)(src, ids(2, 4), src_mask=att.padding_mask(src, PAD)))


def greedy_result(dt, use_cache):
    model, src = M("model", dt), ids(3, 4)
    tokens, scores = dcd.greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_new_tokens=5, use_cache=use_cache)
    assert tokens.dtype == torch.long and tokens.size(0) == 3 and 1 <= tokens.size(1) <= 5
    assert scores.dtype == torch.float64 and scores.shape == (3,)
    torch.testing.assert_close(scores, dcd.sequence_scores(model, src, None, tokens, bos_id=BOS, eos_id=EOS),
                               atol=1e-4, rtol=1e-4)
    return tokens


def greedy_cache_equals_recompute(dt):
    assert torch.equal(greedy_result(dt, True), greedy_result(dt, False))


def beam_one_is_greedy(dt):
    model, src = M("model", dt), ids(3, 4)
    g, _ = dcd.greedy_decode(model, src, bos_id=BOS, eos_id=EOS, max_new_tokens=5)
    b, s = dcd.beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=1, max_new_tokens=5)
    assert s.dtype == torch.float64 and s.shape == (3,)
    n = max(g.size(1), b.size(1))
    pad = lambda t: F.pad(t, (0, n - t.size(1)), value=PAD)  # noqa: E731
    assert torch.equal(pad(g), pad(b))


def empty_decode(dt, fn, **kw):
    tokens, scores = fn(M("model", dt), torch.zeros(0, 4, dtype=torch.long), bos_id=BOS, eos_id=EOS,
                        max_new_tokens=3, **kw)
    assert tokens.dtype == torch.long and tokens.dim() == 2 and tokens.size(0) == 0
    assert scores.dtype == torch.float64 and scores.shape == (0,)


def kv_cache_matches_decode(dt):
    model, src, tgt = M("model", dt), ids(2, 5), ids(2, 4)
    memory, mask = model.encode(src), model.make_src_mask(src)
    cache = dcd.KVCache(model, memory, mask)
    steps = torch.stack([cache.step(tgt[:, i]) for i in range(4)], 1)
    torch.testing.assert_close(steps, model.lm_head(model.decode(tgt, memory, mask)))


def checkpoint_round_trip():
    model = M("model")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "ckpt.pt")
        trn.save_checkpoint(path, model, note="x")
        loaded, ckpt = trn.load_checkpoint(path)
    src, tgt = ids(2, 5), ids(2, 4)
    assert ckpt["note"] == "x" and not loaded.training
    assert torch.equal(loaded(src, tgt), model(src, tgt))


def label_smoothing_matches_torch(dt):
    logits, target = rand(2, 5, V, dt=dt), ids(2, 5, low=0)
    got = loss_fn(label_smoothing=0.2, pad_id=PAD)(logits, target)
    want = F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), label_smoothing=0.2, ignore_index=PAD)
    torch.testing.assert_close(got, want)


def rms_half(dt):
    """float16/bfloat16 with |x| ~ 1000 (dt only selects which half type): x² overflows float16, yet the statistic
    in float32 keeps RMSNorm finite and close to F.rms_norm."""
    half, tol = (torch.float16, 4e-3) if dt == torch.float32 else (torch.bfloat16, 3e-2)
    x = (1000 + 300 * rand(4, D, dt=torch.float32)).to(half)
    norm = t5_mod.RMSNorm(D).to(half)
    out = norm(x)
    assert out.dtype == half, out.dtype
    torch.testing.assert_close(out.float(), F.rms_norm(x.float(), (D,), eps=1e-6), atol=tol, rtol=tol)


def t5_attention_fully_masked_row(dt):
    x, bias = rand(2, 3, D, dt=dt), rand(1, H, 3, 3, dt=dt, seed=1)
    mask = torch.ones(2, 1, 3, 3, dtype=torch.bool)
    mask[1, 0, 2] = False
    out, w = M("t5_attn", dt)(x, x, x, bias, mask, need_weights=True)
    zeros_not_nan(out[1, 2])
    zeros_not_nan(w[1, :, 2])
    finite(out)


def t5_attention_unscaled(dt):
    """weights = softmax(Q Kᵀ + bias): no division by √d_k."""
    attn, x, bias = M("t5_attn", dt), rand(2, 3, D, dt=dt), rand(1, H, 3, 3, dt=dt, seed=1)
    _, w = attn(x, x, x, bias, need_weights=True)
    Q, K = attn.split_heads(attn.W_q(x)), attn.split_heads(attn.W_k(x))
    torch.testing.assert_close(w, torch.softmax(Q @ K.transpose(-2, -1) + bias, -1))


def t5_no_future(dt):
    """Changing decoder token j leaves every logit at positions < j bit-identical."""
    model, src, tgt = M("t5", dt), ids(2, 5), ids(2, 6, seed=1)
    with torch.no_grad():
        base = model(src, tgt)
        for j in range(1, 6):
            changed = tgt.clone()
            changed[:, j] = 3 + (changed[:, j] - 3 + 1) % (V - 3)
            out = model(src, changed)
            assert torch.equal(out[:, :j], base[:, :j]), f"position < {j} sees token {j}"
            assert not torch.equal(out[:, j:], base[:, j:])


def t5_attention_weights(dt):
    model = M("t5", dt)
    with mh.attention_maps(model) as maps:
        model(ids(2, 5), ids(2, 4))
    shape_is(maps["encoder.layers.0.self_attn"], 2, H, 5, 5)
    shape_is(maps["decoder.layers.0.cross_attn"], 2, H, 4, 5)
    w = shape_is(maps["decoder.layers.0.self_attn"], 2, H, 4, 4)
    assert torch.equal(w.triu(1), torch.zeros_like(w))                    # causal: nothing above the diagonal


def t5_fully_padded_source(dt):
    src = ids(2, 5)
    src[1] = PAD
    finite(M("t5", dt)(src, ids(2, 4)))


def t5_generate_result(dt):
    out = t5_mod.t5_generate(M("t5", dt), ids(3, 4), 5)
    assert out.dtype == torch.long and out.size(0) == 3 and 1 <= out.size(1) <= 5
    for row in out:                                                        # pad_id after eos_id only
        eos = (row == M("t5", dt).config.eos_id).nonzero()
        if len(eos):
            assert torch.all(row[int(eos[0]) + 1:] == PAD)


def seq2seq_loss_matches_torch(dt):
    logits, labels = rand(2, 5, V, dt=dt), ids(2, 5, low=0)
    labels[0, 3:] = brt.IGNORE_INDEX
    want = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(brt.token_cross_entropy(logits, labels), want)


def vit_attention_rows(dt):
    model = M("vit", dt)
    with mh.attention_maps(model) as maps:
        model.features(rand(2, 1, 4, 4, dt=dt))
    for w in maps.values():
        shape_is(w, 2, H, 5, 5)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, H, 5, dtype=dt))


def image_batch_shapes(dt):
    x, y = next(vit_mod.image_batches(rand(7, 1, 4, 4, dt=dt), torch.arange(7), batch_size=3, max_shift=1))
    shape_is(x, 3, 1, 4, 4)
    shape_is(y, 3)
    assert x.dtype == dt and len(y.unique()) == 3


def t(dt, *shape, seed=0):
    return rand(*shape, dt=dt, seed=seed)


def bmask(*shape, value=True):
    return torch.full(shape, value, dtype=torch.bool)


# ------------------------------------------------------------------------------------------ the tensor cases
# (id, call(dt), expected); each runs on float32 and float64.
TENSOR_CASES = [
    # --- attention.scaled_dot_product_attention(Q, K, V, mask)
    ("sdpa/Q-not-tensor", lambda dt: att.scaled_dot_product_attention([[1.0]], t(dt, 1, 2), t(dt, 1, 2)), err("Q", "tensor")),
    ("sdpa/Q-1d", lambda dt: att.scaled_dot_product_attention(t(dt, 4), t(dt, 3, 4), t(dt, 3, 4)), err("Q", FIT)),
    ("sdpa/dk-mismatch", lambda dt: att.scaled_dot_product_attention(t(dt, 2, 3, 4), t(dt, 2, 5, 3), t(dt, 2, 5, 4)), err("K", "d_k")),
    ("sdpa/nk-mismatch", lambda dt: att.scaled_dot_product_attention(t(dt, 2, 3, 4), t(dt, 2, 5, 4), t(dt, 2, 6, 4)), err("V", "n_k")),
    ("sdpa/batch-mismatch", lambda dt: att.scaled_dot_product_attention(t(dt, 2, 3, 4), t(dt, 3, 5, 4), t(dt, 3, 5, 4)), err("K|Q", "broadcast|batch")),
    ("sdpa/int-Q", lambda dt: att.scaled_dot_product_attention(torch.ones(2, 3, 4, dtype=torch.long), t(dt, 2, 5, 4), t(dt, 2, 5, 4)), err("Q", FLOAT)),
    ("sdpa/int-K", lambda dt: att.scaled_dot_product_attention(t(dt, 2, 3, 4), torch.ones(2, 5, 4, dtype=torch.long), t(dt, 2, 5, 4)), err("K", FLOAT)),
    ("sdpa/int-V", lambda dt: att.scaled_dot_product_attention(t(dt, 2, 3, 4), t(dt, 2, 5, 4), torch.ones(2, 5, 4, dtype=torch.int32)), err("V", FLOAT)),
    ("sdpa/mixed-K", lambda dt: att.scaled_dot_product_attention(t(dt, 2, 3, 4), t(other(dt), 2, 5, 4), t(dt, 2, 5, 4)), err("K", FLOAT)),
    ("sdpa/mixed-V", lambda dt: att.scaled_dot_product_attention(t(dt, 2, 3, 4), t(dt, 2, 5, 4), t(other(dt), 2, 5, 4)), err("V", FLOAT)),
    ("sdpa/d_k=0", lambda dt: att.scaled_dot_product_attention(t(dt, 2, 3, 0), t(dt, 2, 5, 0), t(dt, 2, 5, 4)), err("Q", "d_k")),
    ("sdpa/float-mask", lambda dt: att.scaled_dot_product_attention(t(dt, 2, 3, 4), t(dt, 2, 5, 4), t(dt, 2, 5, 4), torch.ones(2, 3, 5, dtype=dt)), err("mask", BOOLMASK)),
    ("sdpa/int-mask", lambda dt: att.scaled_dot_product_attention(t(dt, 2, 3, 4), t(dt, 2, 5, 4), t(dt, 2, 5, 4), torch.ones(2, 3, 5, dtype=torch.long)), err("mask", BOOLMASK)),
    ("sdpa/list-mask", lambda dt: att.scaled_dot_product_attention(t(dt, 2, 3, 4), t(dt, 2, 5, 4), t(dt, 2, 5, 4), [[True] * 5] * 3), err("mask", BOOLMASK)),
    ("sdpa/padding-mask-rank", lambda dt: att.scaled_dot_product_attention(t(dt, 3, 3, 4), t(dt, 3, 5, 4), t(dt, 3, 5, 4), bmask(3, 5)), err("mask", FIT)),
    ("sdpa/mask-wrong-nk", lambda dt: att.scaled_dot_product_attention(t(dt, 2, 3, 4), t(dt, 2, 5, 4), t(dt, 2, 5, 4), bmask(2, 3, 4)), err("mask", FIT)),
    ("sdpa/mask-too-many-axes", lambda dt: att.scaled_dot_product_attention(t(dt, 2, 3, 4), t(dt, 2, 5, 4), t(dt, 2, 5, 4), bmask(1, 2, 3, 5)), err("mask", FIT)),
    ("sdpa/ok-fully-masked-row", sdpa_fully_masked_row, OK),
    ("sdpa/ok-values", sdpa_matches_softmax, OK),
    ("sdpa/ok-empty-batch", lambda dt: shape_is(att.scaled_dot_product_attention(t(dt, 0, 3, 4), t(dt, 0, 5, 4), t(dt, 0, 5, 6))[0], 0, 3, 6), OK),
    ("sdpa/ok-empty-batch-masked", lambda dt: shape_is(att.scaled_dot_product_attention(t(dt, 0, 3, 4), t(dt, 0, 5, 4), t(dt, 0, 5, 6), bmask(0, 3, 5))[0], 0, 3, 6), OK),
    ("sdpa/ok-no-queries", lambda dt: shape_is(att.scaled_dot_product_attention(t(dt, 2, 0, 4), t(dt, 2, 5, 4), t(dt, 2, 5, 6))[0], 2, 0, 6), OK),
    ("sdpa/ok-2d-causal", lambda dt: finite(shape_is(att.scaled_dot_product_attention(t(dt, 4, 4), t(dt, 4, 4), t(dt, 4, 3), att.causal_mask(4))[0], 4, 3)), OK),
    ("sdpa/ok-dtype-kept", lambda dt: None if att.scaled_dot_product_attention(t(dt, 2, 3, 4), t(dt, 2, 5, 4), t(dt, 2, 5, 4))[0].dtype == dt else pytest.fail("dtype"), OK),

    # --- multi_head.MultiHeadAttention.forward(query, key, value, mask, need_weights, cache)
    ("mha/query-2d", lambda dt: M("mha", dt)(t(dt, 3, D), t(dt, 2, 3, D), t(dt, 2, 3, D)), err("query", FIT)),
    ("mha/key-wrong-d", lambda dt: M("mha", dt)(t(dt, 2, 3, D), t(dt, 2, 3, D + 1), t(dt, 2, 3, D)), err("key", "d_model")),
    ("mha/value-wrong-len", lambda dt: M("mha", dt)(t(dt, 2, 3, D), t(dt, 2, 4, D), t(dt, 2, 5, D)), err("value|key", "n_k|length")),
    ("mha/batch-mismatch", lambda dt: M("mha", dt)(t(dt, 2, 3, D), t(dt, 3, 4, D), t(dt, 3, 4, D)), err("query|key", "batch")),
    ("mha/int-query", lambda dt: M("mha", dt)(torch.ones(2, 3, D, dtype=torch.long), t(dt, 2, 3, D), t(dt, 2, 3, D)), err("query", FLOAT)),
    ("mha/int-value", lambda dt: M("mha", dt)(t(dt, 2, 3, D), t(dt, 2, 3, D), torch.ones(2, 3, D, dtype=torch.long)), err("value", FLOAT)),
    ("mha/mixed-query", lambda dt: M("mha", dt)(t(other(dt), 2, 3, D), t(dt, 2, 3, D), t(dt, 2, 3, D)), err("query", FLOAT)),
    ("mha/mixed-key", lambda dt: M("mha", dt)(t(dt, 2, 3, D), t(other(dt), 2, 3, D), t(dt, 2, 3, D)), err("key", FLOAT)),
    ("mha/padding-mask-B==n_q", lambda dt: M("mha", dt)(t(dt, 3, 3, D), t(dt, 3, 5, D), t(dt, 3, 5, D), bmask(3, 5)), err("mask", PADHINT)),
    ("mha/padding-mask-B!=n_q", lambda dt: M("mha", dt)(t(dt, 2, 3, D), t(dt, 2, 5, D), t(dt, 2, 5, D), bmask(2, 5)), err("mask", PADHINT)),
    ("mha/square-2d-mask", lambda dt: M("mha", dt)(t(dt, 2, 4, D), t(dt, 2, 4, D), t(dt, 2, 4, D), att.causal_mask(4)), err("mask", FIT)),
    ("mha/3d-mask", lambda dt: M("mha", dt)(t(dt, 2, 3, D), t(dt, 2, 5, D), t(dt, 2, 5, D), bmask(2, 3, 5)), err("mask", FIT)),
    ("mha/mask-wrong-nk", lambda dt: M("mha", dt)(t(dt, 2, 3, D), t(dt, 2, 5, D), t(dt, 2, 5, D), bmask(2, 1, 1, 4)), err("mask", FIT)),
    ("mha/float-mask", lambda dt: M("mha", dt)(t(dt, 2, 3, D), t(dt, 2, 5, D), t(dt, 2, 5, D), torch.ones(2, 1, 1, 5, dtype=dt)), err("mask", BOOLMASK)),
    ("mha/need_weights-str", lambda dt: M("mha", dt)(t(dt, 2, 3, D), t(dt, 2, 3, D), t(dt, 2, 3, D), need_weights="yes"), err("need_weights", BOOL)),
    ("mha/cache-2d-mask", lambda dt: M("mha", dt)(t(dt, 2, 1, D), t(dt, 2, 1, D), t(dt, 2, 1, D), bmask(2, 1), cache=mh.AttentionCache()), err("mask", FIT)),
    ("mha/cache-not-AttentionCache", lambda dt: M("mha", dt)(t(dt, 2, 1, D), t(dt, 2, 1, D), t(dt, 2, 1, D), cache={}), err("cache", "AttentionCache")),
    ("mha/cache-batch-changed", lambda dt: M("mha", dt)(t(dt, 3, 1, D), t(dt, 3, 1, D), t(dt, 3, 1, D), cache=filled_cache(dt)), err("cache", "reorder")),
    ("mha/static-cache-empty-key", lambda dt: M("mha", dt)(t(dt, 2, 1, D), None, None, cache=mh.AttentionCache(static=True)), err("key", "tensor")),
    ("AttentionCache/reorder-out-of-range", lambda dt: filled_cache(dt).reorder(torch.tensor([0, 5])), err("index", r"\[0|range|batch")),
    ("AttentionCache/reorder-float-index", lambda dt: filled_cache(dt).reorder(torch.tensor([0.0, 1.0])), err("index", INTEGER)),
    ("AttentionCache/ok-reorder", cache_reorder_matches, OK),
    ("mha/ok-fully-masked-row", lambda dt: mha_fully_masked_row(dt, False), OK),
    ("mha/ok-fully-masked-row-weights", lambda dt: mha_fully_masked_row(dt, True), OK),
    ("mha/ok-empty-batch", lambda dt: shape_is(M("mha", dt)(t(dt, 0, 3, D), t(dt, 0, 5, D), t(dt, 0, 5, D))[0], 0, 3, D), OK),
    ("mha/ok-empty-batch-weights", lambda dt: shape_is(M("mha", dt)(t(dt, 0, 3, D), t(dt, 0, 5, D), t(dt, 0, 5, D), need_weights=True)[1], 0, H, 3, 5), OK),
    ("mha/ok-no-queries", lambda dt: shape_is(M("mha", dt)(t(dt, 2, 0, D), t(dt, 2, 5, D), t(dt, 2, 5, D))[0], 2, 0, D), OK),
    ("mha/ok-weights-none", lambda dt: None if M("mha", dt)(t(dt, 2, 3, D), t(dt, 2, 3, D), t(dt, 2, 3, D))[1] is None else pytest.fail("weights"), OK),
    ("mha/ok-weights-shape", lambda dt: shape_is(M("mha", dt)(t(dt, 2, 3, D), t(dt, 2, 5, D), t(dt, 2, 5, D), bmask(2, 1, 1, 5), need_weights=True)[1], 2, H, 3, 5), OK),
    ("mha/ok-cache-equals-full", mha_cache_matches_full, OK),

    # --- positional
    ("sinusoid/ok-dtype", lambda dt: None if (pe := pos.sinusoidal_encoding(6, D, dtype=dt)).dtype == dt and torch.equal(pe[0, 1::2], torch.ones(D // 2, dtype=dt)) else pytest.fail("table"), OK),
    ("emb/float-tokens", lambda dt: M("emb", dt)(torch.ones(2, 3, dtype=dt)), err("tokens", INTEGER)),
    ("emb/ok-empty-batch", lambda dt: shape_is(M("emb", dt)(torch.zeros(0, 3, dtype=torch.long)), 0, 3, D), OK),
    ("emb/ok-length-0", lambda dt: shape_is(M("emb", dt)(torch.zeros(2, 0, dtype=torch.long)), 2, 0, D), OK),
    ("pe/x-2d", lambda dt: M("pe", dt)(t(dt, 3, D)), err("x", FIT)),
    ("pe/x-wrong-d", lambda dt: M("pe", dt)(t(dt, 2, 3, D + 2)), err("x", "d_model")),
    ("pe/int-x", lambda dt: M("pe", dt)(torch.ones(2, 3, D, dtype=torch.long)), err("x", FLOAT)),
    ("pe/start-negative", lambda dt: M("pe", dt)(t(dt, 2, 3, D), start=-1), err("start", INT)),
    ("pe/start-bool", lambda dt: M("pe", dt)(t(dt, 2, 3, D), start=True), err("start", INT)),
    ("pe/too-long", lambda dt: M("pe", dt)(t(dt, 2, 21, D)), err("max_len", "fit")),
    ("pe/start-too-far", lambda dt: M("pe", dt)(t(dt, 2, 3, D), start=19), err("max_len", "fit")),
    ("pe/ok-empty-batch", lambda dt: shape_is(M("pe", dt)(t(dt, 0, 3, D)), 0, 3, D), OK),
    ("pe/ok-length-0", lambda dt: shape_is(M("pe", dt)(t(dt, 2, 0, D)), 2, 0, D), OK),
    ("pe/ok-dtype-kept", lambda dt: None if M("pe", dt)(t(dt, 2, 3, D)).dtype == dt else pytest.fail("dtype"), OK),

    # --- feed_forward.PositionwiseFeedForward.forward(x)
    ("ffn/x-wrong-d", lambda dt: M("ffn", dt)(t(dt, 2, 3, D + 1)), err("x", "d_model")),
    ("ffn/x-not-tensor", lambda dt: M("ffn", dt)([1.0] * D), err("x", "tensor|shape")),
    ("ffn/int-x", lambda dt: M("ffn", dt)(torch.ones(2, 3, D, dtype=torch.long)), err("x", FLOAT)),
    ("ffn/mixed-x", lambda dt: M("ffn", dt)(t(other(dt), 2, 3, D)), err("x", FLOAT)),
    ("ffn/ok-empty-batch", lambda dt: shape_is(M("ffn", dt)(t(dt, 0, 3, D)), 0, 3, D), OK),
    ("ffn/ok-length-0", lambda dt: shape_is(M("ffn", dt)(t(dt, 2, 0, D)), 2, 0, D), OK),

    # --- residual.LayerNorm / SublayerConnection
    ("ln/x-wrong-d", lambda dt: M("ln", dt)(t(dt, 2, D - 1)), err("x", "d_model")),
    ("ln/int-x", lambda dt: M("ln", dt)(torch.ones(2, D, dtype=torch.long)), err("x", FLOAT)),
    ("ln/mixed-x", lambda dt: M("ln", dt)(t(other(dt), 2, D)), err("x", FLOAT)),
    ("ln/ok-half-large-spread", layer_norm_half, OK),
    ("ln/ok-constant-row", layer_norm_constant_row, OK),
    ("ln/ok-empty-batch", lambda dt: shape_is(M("ln", dt)(t(dt, 0, D)), 0, D), OK),
    ("ln/ok-matches-torch", lambda dt: torch.testing.assert_close(M("ln", dt)(t(dt, 3, D) * 100), F.layer_norm(t(dt, 3, D) * 100, (D,))), OK),
    ("sub/sublayer-not-callable", lambda dt: M("sub", dt)(t(dt, 2, 3, D), "relu"), err("sublayer", "callable")),
    ("sub/x-wrong-d", lambda dt: M("sub", dt)(t(dt, 2, 3, D + 1), torch.relu), err("x", "d_model")),
    ("sub/sublayer-returns-tuple", lambda dt: M("sub", dt)(t(dt, 2, 3, D), lambda y: (y, None)), err("sublayer", "tensor|shape")),
    ("sub/mixed-x", lambda dt: M("sub", dt)(t(other(dt), 2, 3, D), torch.relu), err("x", FLOAT)),
    ("sub/ok-empty-batch", lambda dt: shape_is(M("sub", dt)(t(dt, 0, 3, D), torch.relu), 0, 3, D), OK),

    # --- encoder.EncoderLayer / Encoder .forward(x, src_mask, need_weights)
    ("enc_layer/x-wrong-d", lambda dt: M("enc_layer", dt)(t(dt, 2, 3, D + 2)), err("x", "d_model")),
    ("enc_layer/int-x", lambda dt: M("enc_layer", dt)(torch.ones(2, 3, D, dtype=torch.long)), err("x", FLOAT)),
    ("enc_layer/mixed-x", lambda dt: M("enc_layer", dt)(t(other(dt), 2, 3, D)), err("x", FLOAT)),
    ("enc_layer/padding-mask-B==S", lambda dt: M("enc_layer", dt)(t(dt, 3, 3, D), bmask(3, 3)), err("src_mask", PADHINT)),
    ("enc_layer/float-mask", lambda dt: M("enc_layer", dt)(t(dt, 2, 3, D), torch.ones(2, 1, 1, 3, dtype=dt)), err("src_mask", BOOLMASK)),
    ("enc_layer/ok-empty-batch", lambda dt: shape_is(M("enc_layer", dt)(t(dt, 0, 3, D)), 0, 3, D), OK),
    ("enc_layer/ok-weights", lambda dt: layer_maps("enc_layer", dt, {"self_attn": (2, H, 3, 3)}, t(dt, 2, 3, D)), OK),
    ("attention_maps/not-module", lambda dt: mh.attention_maps("model").__enter__(), err("model", "nn.Module")),
    ("attention_maps/no-attention", lambda dt: mh.attention_maps(nn.Linear(2, 2)).__enter__(), err("model", "MultiHeadAttention")),
    ("encoder/x-wrong-d", lambda dt: M("encoder", dt)(t(dt, 2, 3, D + 2)), err("x", "d_model")),
    ("encoder/padding-mask-B==S", lambda dt: M("encoder", dt)(t(dt, 4, 4, D), bmask(4, 4)), err("src_mask", PADHINT)),
    ("encoder/mask-wrong-S", lambda dt: M("encoder", dt)(t(dt, 2, 4, D), bmask(2, 1, 1, 5)), err("src_mask", FIT)),
    ("encoder/mixed-x", lambda dt: M("encoder", dt)(t(other(dt), 2, 3, D)), err("x", FLOAT)),
    ("encoder/ok-fully-padded-sequence", lambda dt: finite(M("encoder", dt)(t(dt, 2, 3, D), torch.tensor([True, False])[:, None, None, None].expand(2, 1, 1, 3))), OK),
    ("encoder/ok-empty-batch", lambda dt: shape_is(M("encoder", dt)(t(dt, 0, 3, D), bmask(0, 1, 1, 3)), 0, 3, D), OK),

    # --- decoder.DecoderLayer / Decoder .forward(x, memory, src_mask, tgt_mask, need_weights, cache)
    ("dec_layer/x-wrong-d", lambda dt: M("dec_layer", dt)(t(dt, 2, 3, D + 2), t(dt, 2, 5, D)), err("x", "d_model")),
    ("dec_layer/memory-wrong-d", lambda dt: M("dec_layer", dt)(t(dt, 2, 3, D), t(dt, 2, 5, D + 2)), err("memory", "d_model")),
    ("dec_layer/memory-batch", lambda dt: M("dec_layer", dt)(t(dt, 2, 3, D), t(dt, 3, 5, D)), err("memory", "batch|B")),
    ("dec_layer/int-memory", lambda dt: M("dec_layer", dt)(t(dt, 2, 3, D), torch.ones(2, 5, D, dtype=torch.long)), err("memory", FLOAT)),
    ("dec_layer/mixed-memory", lambda dt: M("dec_layer", dt)(t(dt, 2, 3, D), t(other(dt), 2, 5, D)), err("memory", FLOAT)),
    ("dec_layer/src_mask-2d", lambda dt: M("dec_layer", dt)(t(dt, 3, 3, D), t(dt, 3, 5, D), src_mask=bmask(3, 5)), err("src_mask", PADHINT)),
    ("dec_layer/tgt_mask-2d-B==T", lambda dt: M("dec_layer", dt)(t(dt, 3, 3, D), t(dt, 3, 5, D), tgt_mask=bmask(3, 3)), err("tgt_mask", PADHINT)),
    ("dec_layer/src_mask-float", lambda dt: M("dec_layer", dt)(t(dt, 2, 3, D), t(dt, 2, 5, D), src_mask=torch.ones(2, 1, 1, 5, dtype=dt)), err("src_mask", BOOLMASK)),
    ("dec_layer/tgt_mask-float", lambda dt: M("dec_layer", dt)(t(dt, 2, 3, D), t(dt, 2, 5, D), tgt_mask=torch.ones(2, 1, 3, 3, dtype=dt)), err("tgt_mask", BOOLMASK)),
    ("dec_layer/src_mask-wrong-S", lambda dt: M("dec_layer", dt)(t(dt, 2, 3, D), t(dt, 2, 5, D), src_mask=bmask(2, 1, 1, 4)), err("src_mask", FIT)),
    ("dec_layer/ok-never-sees-future", lambda dt: no_future(dt, "layer"), OK),
    ("dec_layer/ok-empty-batch", lambda dt: shape_is(M("dec_layer", dt)(t(dt, 0, 3, D), t(dt, 0, 5, D)), 0, 3, D), OK),
    ("dec_layer/ok-weights", lambda dt: layer_maps("dec_layer", dt, {"self_attn": (2, H, 3, 3), "cross_attn": (2, H, 3, 5)}, t(dt, 2, 3, D), t(dt, 2, 5, D)), OK),
    ("decoder/memory-wrong-d", lambda dt: M("decoder", dt)(t(dt, 2, 3, D), t(dt, 2, 5, D - 2)), err("memory", "d_model")),
    ("decoder/tgt_mask-2d", lambda dt: M("decoder", dt)(t(dt, 4, 4, D), t(dt, 4, 5, D), tgt_mask=bmask(4, 4)), err("tgt_mask", PADHINT)),
    ("decoder/src_mask-wrong-S", lambda dt: M("decoder", dt)(t(dt, 2, 3, D), t(dt, 2, 5, D), src_mask=bmask(2, 1, 1, 6)), err("src_mask", FIT)),
    ("decoder/cache-str", lambda dt: M("decoder", dt)(t(dt, 2, 1, D), t(dt, 2, 5, D), cache="cache"), err("cache", "new_cache")),
    ("decoder/cache-one-layer-short", lambda dt: M("decoder", dt)(t(dt, 2, 1, D), t(dt, 2, 5, D), cache=M("decoder", dt).new_cache()[:1]), err("cache", "new_cache")),
    ("decoder/ok-never-sees-future", lambda dt: no_future(dt, "stack"), OK),
    ("decoder/ok-empty-batch", lambda dt: shape_is(M("decoder", dt)(t(dt, 0, 3, D), t(dt, 0, 5, D)), 0, 3, D), OK),

    # --- model.Transformer
    ("model/float-src", lambda dt: M("model", dt)(torch.ones(2, 5, dtype=dt), ids(2, 4)), err("src", INTEGER)),
    ("model/float-tgt", lambda dt: M("model", dt)(ids(2, 5), torch.ones(2, 4, dtype=dt)), err("tgt", INTEGER)),
    ("model/src-id>=V", lambda dt: M("model", dt)(ids(2, 5) + V, ids(2, 4)), err("src", VOCAB)),
    ("model/tgt-id>=V", lambda dt: M("model", dt)(ids(2, 5), ids(2, 4) + V), err("tgt", VOCAB)),
    ("model/tgt-negative", lambda dt: M("model", dt)(ids(2, 5), -ids(2, 4)), err("tgt", VOCAB)),
    ("model/src-1d", lambda dt: M("model", dt)(ids(5), ids(2, 4)), err("src", FIT)),
    ("model/batch-mismatch", lambda dt: M("model", dt)(ids(3, 5), ids(2, 4)), err("tgt|src|memory", "batch|B")),
    ("model/src_mask-2d", lambda dt: M("model", dt)(ids(2, 5), ids(2, 4), src_mask=bmask(2, 5)), err("src_mask", PADHINT)),
    ("model/tgt_mask-2d-B==T", lambda dt: M("model", dt)(ids(4, 5), ids(4, 4), tgt_mask=bmask(4, 4)), err("tgt_mask", PADHINT)),
    ("model/src_mask-float", lambda dt: M("model", dt)(ids(2, 5), ids(2, 4), src_mask=torch.ones(2, 1, 1, 5, dtype=dt)), err("src_mask", BOOLMASK)),
    ("model/tgt_mask-float", lambda dt: M("model", dt)(ids(2, 5), ids(2, 4), tgt_mask=torch.ones(2, 1, 4, 4, dtype=dt)), err("tgt_mask", BOOLMASK)),
    ("model/src_mask-wrong-S", lambda dt: M("model", dt)(ids(2, 5), ids(2, 4), src_mask=att.padding_mask(ids(2, 6), PAD)), err("src_mask", FIT)),
    ("model/tgt_mask-wrong-T", lambda dt: M("model", dt)(ids(2, 5), ids(2, 4), tgt_mask=att.padding_mask(ids(2, 3), PAD)), err("tgt_mask", FIT)),
    ("model/encode-float-src", lambda dt: M("model", dt).encode(torch.ones(2, 5, dtype=dt)), err("src", INTEGER)),
    ("model/encode-src_mask-float", lambda dt: M("model", dt).encode(ids(2, 5), torch.ones(2, 1, 1, 5)), err("src_mask", BOOLMASK)),
    ("model/decode-src_mask-None", lambda dt: M("model", dt).decode(ids(2, 4), t(dt, 2, 5, D), None), err("src_mask", "make_src_mask")),
    ("model/decode-memory-wrong-d", lambda dt: M("model", dt).decode(ids(2, 4), t(dt, 2, 5, D + 2), ALL5), err("memory", "d_model")),
    ("model/decode-memory-batch", lambda dt: M("model", dt).decode(ids(2, 4), t(dt, 3, 5, D), ALL5), err("memory", "batch|B")),
    ("model/decode-mixed-memory", lambda dt: M("model", dt).decode(ids(2, 4), t(other(dt), 2, 5, D), ALL5), err("memory", FLOAT)),
    ("model/decode-tgt-id>=V", lambda dt: M("model", dt).decode(ids(2, 4) + V, t(dt, 2, 5, D), ALL5), err("tgt", VOCAB)),
    ("model/decode-cache-str", lambda dt: M("model", dt).decode(ids(2, 1), t(dt, 2, 5, D), ALL5, cache="x"), err("cache", "new_cache")),
    ("model/ok-decode-cache-equals-full", decode_cache_matches_full, OK),
    ("model/ok-forward-never-sees-future", lambda dt: no_future(dt, "forward"), OK),
    ("model/ok-padding-tgt_mask-never-sees-future", lambda dt: no_future(dt, "forward_padding_mask"), OK),
    ("model/ok-decode-never-sees-future", lambda dt: no_future(dt, "decode"), OK),
    ("model/ok-make_tgt_mask-idempotent", lambda dt: torch.testing.assert_close(M("model", dt)(ids(2, 5), ids(2, 4)), M("model", dt)(ids(2, 5), ids(2, 4), tgt_mask=M("model", dt).make_tgt_mask(ids(2, 4)))), OK),
    ("model/ok-empty-batch", lambda dt: shape_is(M("model", dt)(torch.zeros(0, 5, dtype=torch.long), torch.zeros(0, 4, dtype=torch.long)), 0, 4, V), OK),
    ("model/ok-fully-padded-source", model_fully_padded_source, OK),
    ("model/ok-attention-weights", model_attention_weights, OK),
    ("model/ok-dtype-kept", lambda dt: None if M("model", dt)(ids(2, 5), ids(2, 4)).dtype == dt else pytest.fail("dtype"), OK),

    # --- training: LabelSmoothingLoss, smoothed_targets
    ("loss/target-id>=V", lambda dt: loss_fn()(t(dt, 2, 3, V), ids(2, 3) + V), err("target", VOCAB)),
    ("loss/target-negative", lambda dt: loss_fn()(t(dt, 2, 3, V), -ids(2, 3)), err("target", VOCAB)),
    ("loss/shape-mismatch", lambda dt: loss_fn()(t(dt, 2, 3, V), ids(2, 4)), err("target|logits", "shape")),
    ("loss/float-target", lambda dt: loss_fn()(t(dt, 2, 3, V), torch.ones(2, 3, dtype=dt)), err("target", INTEGER)),
    ("loss/int-logits", lambda dt: loss_fn()(torch.ones(2, 3, V, dtype=torch.long), ids(2, 3)), err("logits", FLOAT)),
    ("loss/ok-matches-cross-entropy", label_smoothing_matches_torch, OK),
    ("loss/ok-all-padding-is-zero", lambda dt: torch.testing.assert_close(loss_fn()(t(dt, 2, 3, V), torch.zeros(2, 3, dtype=torch.long)), torch.zeros((), dtype=dt)), OK),
    ("loss/ok-empty-batch-is-zero", lambda dt: torch.testing.assert_close(loss_fn()(t(dt, 0, 3, V), torch.zeros(0, 3, dtype=torch.long)), torch.zeros((), dtype=dt)), OK),
    ("smoothed/ok-rows-sum-to-1", lambda dt: torch.testing.assert_close(trn.smoothed_targets(ids(5, low=0), V, label_smoothing=0.3).sum(-1), torch.ones(5, dtype=torch.float64)), OK),

    # --- decoding
    ("greedy/float-src", lambda dt: dcd.greedy_decode(M("model", dt), torch.ones(2, 4, dtype=dt), bos_id=BOS, eos_id=EOS), err("src", INTEGER)),
    ("greedy/src-id>=V", lambda dt: dcd.greedy_decode(M("model", dt), ids(2, 4) + V, bos_id=BOS, eos_id=EOS), err("src", VOCAB)),
    ("greedy/src_mask-2d", lambda dt: dcd.greedy_decode(M("model", dt), ids(2, 4), bmask(2, 4), bos_id=BOS, eos_id=EOS), err("src_mask", PADHINT)),
    ("greedy/src_mask-float", lambda dt: dcd.greedy_decode(M("model", dt), ids(2, 4), torch.ones(2, 1, 1, 4), bos_id=BOS, eos_id=EOS), err("src_mask", BOOLMASK)),
    ("greedy/max_new_tokens=0", lambda dt: dcd.greedy_decode(M("model", dt), ids(2, 4), bos_id=BOS, eos_id=EOS, max_new_tokens=0), err("max_new_tokens", INT)),
    ("greedy/max_new_tokens=-1", lambda dt: dcd.greedy_decode(M("model", dt), ids(2, 4), bos_id=BOS, eos_id=EOS, max_new_tokens=-1), err("max_new_tokens", INT)),
    ("greedy/max_new_tokens=True", lambda dt: dcd.greedy_decode(M("model", dt), ids(2, 4), bos_id=BOS, eos_id=EOS, max_new_tokens=True), err("max_new_tokens", INT)),
    ("greedy/max_new_tokens=2.5", lambda dt: dcd.greedy_decode(M("model", dt), ids(2, 4), bos_id=BOS, eos_id=EOS, max_new_tokens=2.5), err("max_new_tokens", INT)),
    ("greedy/max_new_tokens>max_len", lambda dt: dcd.greedy_decode(M("model", dt), ids(2, 4), bos_id=BOS, eos_id=EOS, max_new_tokens=65), err("max_new_tokens", "max_len")),
    ("greedy/bos_id>=V", lambda dt: dcd.greedy_decode(M("model", dt), ids(2, 4), bos_id=V, eos_id=EOS), err("bos_id", VOCAB + "|int")),
    ("greedy/eos_id-bool", lambda dt: dcd.greedy_decode(M("model", dt), ids(2, 4), bos_id=BOS, eos_id=True), err("eos_id", INT)),
    ("greedy/pad_id-bool", lambda dt: dcd.greedy_decode(M("model", dt), ids(2, 4), bos_id=BOS, eos_id=EOS, pad_id=True), err("pad_id", INT)),
    ("greedy/use_cache-str", lambda dt: dcd.greedy_decode(M("model", dt), ids(2, 4), bos_id=BOS, eos_id=EOS, use_cache="no"), err("use_cache", BOOL)),
    ("greedy/alpha-negative", lambda dt: dcd.greedy_decode(M("model", dt), ids(2, 4), bos_id=BOS, eos_id=EOS, alpha=-0.5), err("alpha", r"\[0")),
    ("greedy/ok-result", lambda dt: greedy_result(dt, True), OK),
    ("greedy/ok-cache-equals-recompute", greedy_cache_equals_recompute, OK),
    ("greedy/ok-empty-batch", lambda dt: empty_decode(dt, dcd.greedy_decode), OK),
    ("beam/beam_size=True", lambda dt: dcd.beam_search(M("model", dt), ids(2, 4), bos_id=BOS, eos_id=EOS, beam_size=True), err("beam_size", INT)),
    ("beam/beam_size=0", lambda dt: dcd.beam_search(M("model", dt), ids(2, 4), bos_id=BOS, eos_id=EOS, beam_size=0), err("beam_size", INT)),
    ("beam/beam_size=2.0", lambda dt: dcd.beam_search(M("model", dt), ids(2, 4), bos_id=BOS, eos_id=EOS, beam_size=2.0), err("beam_size", INT)),
    ("beam/max_new_tokens=-1", lambda dt: dcd.beam_search(M("model", dt), ids(2, 4), bos_id=BOS, eos_id=EOS, max_new_tokens=-1), err("max_new_tokens", INT)),
    ("beam/max_new_tokens=0", lambda dt: dcd.beam_search(M("model", dt), ids(2, 4), bos_id=BOS, eos_id=EOS, max_new_tokens=0), err("max_new_tokens", INT)),
    ("beam/max_new_tokens>max_len", lambda dt: dcd.beam_search(M("model", dt), ids(2, 4), bos_id=BOS, eos_id=EOS, max_new_tokens=65), err("max_new_tokens", "max_len")),
    ("beam/alpha-negative", lambda dt: dcd.beam_search(M("model", dt), ids(2, 4), bos_id=BOS, eos_id=EOS, alpha=-1.0), err("alpha", r"\[0")),
    ("beam/float-src", lambda dt: dcd.beam_search(M("model", dt), torch.ones(2, 4, dtype=dt), bos_id=BOS, eos_id=EOS), err("src", INTEGER)),
    ("beam/src_mask-2d", lambda dt: dcd.beam_search(M("model", dt), ids(2, 4), bmask(2, 4), bos_id=BOS, eos_id=EOS), err("src_mask", PADHINT)),
    ("beam/eos_id-bool", lambda dt: dcd.beam_search(M("model", dt), ids(2, 4), bos_id=BOS, eos_id=True), err("eos_id", INT)),
    ("beam/ok-empty-batch", lambda dt: empty_decode(dt, dcd.beam_search, beam_size=3), OK),
    ("beam/ok-beam-1-is-greedy", beam_one_is_greedy, OK),
    ("kvcache/src_mask-float", lambda dt: dcd.KVCache(M("model", dt), t(dt, 2, 5, D), torch.ones(2, 1, 1, 5, dtype=dt)), err("src_mask", BOOLMASK)),
    ("kvcache/src_mask-01-long", lambda dt: dcd.KVCache(M("model", dt), t(dt, 2, 5, D), torch.ones(2, 1, 1, 5, dtype=torch.long)), err("src_mask", BOOLMASK)),
    ("kvcache/src_mask-2d", lambda dt: dcd.KVCache(M("model", dt), t(dt, 2, 5, D), bmask(2, 5)), err("src_mask", PADHINT)),
    ("kvcache/memory-wrong-d", lambda dt: dcd.KVCache(M("model", dt), t(dt, 2, 5, D + 2), torch.ones(2, 1, 1, 5, dtype=torch.bool)), err("memory", "d_model")),
    ("kvcache/mixed-memory", lambda dt: dcd.KVCache(M("model", dt), t(other(dt), 2, 5, D), torch.ones(2, 1, 1, 5, dtype=torch.bool)), err("memory", FLOAT)),
    ("kvcache/step-float-tokens", lambda dt: dcd.KVCache(M("model", dt), t(dt, 2, 5, D), torch.ones(2, 1, 1, 5, dtype=torch.bool)).step(torch.ones(2, dtype=dt)), err("tokens", INTEGER)),
    ("kvcache/step-id>=V", lambda dt: dcd.KVCache(M("model", dt), t(dt, 2, 5, D), torch.ones(2, 1, 1, 5, dtype=torch.bool)).step(torch.full((2,), V)), err("tokens", VOCAB)),
    ("kvcache/step-batch", lambda dt: dcd.KVCache(M("model", dt), t(dt, 2, 5, D), torch.ones(2, 1, 1, 5, dtype=torch.bool)).step(ids(3)), err("tokens", "batch|B")),
    ("kvcache/reorder-out-of-range", lambda dt: dcd.KVCache(M("model", dt), t(dt, 2, 5, D), torch.ones(2, 1, 1, 5, dtype=torch.bool)).reorder(torch.tensor([7])), err("index", r"\[0|range|batch")),
    ("greedy/ok-model-in-training-mode", lambda dt: decodes_in_eval_mode(dcd.greedy_decode, dt), OK),
    ("beam/ok-model-in-training-mode", lambda dt: decodes_in_eval_mode(dcd.beam_search, dt), OK),
    ("kvcache/ok-matches-decode", kv_cache_matches_decode, OK),
    ("cross_maps/float-src", lambda dt: dcd.cross_attention_maps(M("model", dt), torch.ones(2, 5, dtype=dt), ids(2, 4)), err("src", INTEGER)),
    ("cross_maps/float-tgt_in", lambda dt: dcd.cross_attention_maps(M("model", dt), ids(2, 5), torch.ones(2, 4, dtype=dt)), err("tgt_in|tgt", INTEGER)),
    ("cross_maps/ok-shapes", lambda dt: [shape_is(w, 2, H, 4, 5) for w in dcd.cross_attention_maps(M("model", dt), ids(2, 5), ids(2, 4))], OK),
    ("scores/float-tokens", lambda dt: dcd.sequence_scores(M("model", dt), ids(2, 5), None, torch.ones(2, 3, dtype=dt), bos_id=BOS, eos_id=EOS), err("tokens", INTEGER)),
    ("scores/tokens-id>=V", lambda dt: dcd.sequence_scores(M("model", dt), ids(2, 5), None, ids(2, 3) + V, bos_id=BOS, eos_id=EOS), err("tokens", VOCAB)),
    ("scores/tokens-1d", lambda dt: dcd.sequence_scores(M("model", dt), ids(2, 5), None, ids(3), bos_id=BOS, eos_id=EOS), err("tokens", FIT)),
    ("scores/src_mask-float", lambda dt: dcd.sequence_scores(M("model", dt), ids(2, 5), torch.ones(2, 1, 1, 5), ids(2, 3), bos_id=BOS, eos_id=EOS), err("src_mask", BOOLMASK)),
    ("scores/ok-empty-batch", lambda dt: shape_is(dcd.sequence_scores(M("model", dt), torch.zeros(0, 5, dtype=torch.long), None, torch.zeros(0, 3, dtype=torch.long), bos_id=BOS, eos_id=EOS), 0), OK),

    # --- t5 (Chapter 12): RMSNorm, T5Attention, T5, token_cross_entropy (Chapter 10), t5_generate
    ("rms/x-wrong-d", lambda dt: M("rms", dt)(t(dt, 2, D + 1)), err("x", "d_model")),
    ("rms/int-x", lambda dt: M("rms", dt)(torch.ones(2, D, dtype=torch.long)), err("x", FLOAT)),
    ("rms/mixed-x", lambda dt: M("rms", dt)(t(other(dt), 2, D)), err("x", FLOAT)),
    ("rms/x-not-tensor", lambda dt: M("rms", dt)([1.0] * D), err("x", "tensor")),
    ("rms/ok-matches-torch", lambda dt: torch.testing.assert_close(M("rms", dt)(t(dt, 3, D) * 100 + 5), F.rms_norm(t(dt, 3, D) * 100 + 5, (D,), eps=1e-6)), OK),
    ("rms/ok-zero-row", lambda dt: zeros_not_nan(M("rms", dt)(torch.zeros(2, D, dtype=dt))), OK),
    ("rms/ok-empty-batch", lambda dt: shape_is(M("rms", dt)(t(dt, 0, D)), 0, D), OK),
    ("rms/ok-half-large", rms_half, OK),
    ("t5_attn/query-2d", lambda dt: M("t5_attn", dt)(t(dt, 3, D), t(dt, 2, 3, D), t(dt, 2, 3, D)), err("query", FIT)),
    ("t5_attn/mixed-key", lambda dt: M("t5_attn", dt)(t(dt, 2, 3, D), t(other(dt), 2, 3, D), t(dt, 2, 3, D)), err("key", FLOAT)),
    ("t5_attn/bias-wrong-n_k", lambda dt: M("t5_attn", dt)(t(dt, 2, 3, D), t(dt, 2, 3, D), t(dt, 2, 3, D), t(dt, 1, H, 3, 4)), err("position_bias", "shape")),
    ("t5_attn/bias-wrong-heads", lambda dt: M("t5_attn", dt)(t(dt, 2, 3, D), t(dt, 2, 3, D), t(dt, 2, 3, D), t(dt, 1, H + 1, 3, 3)), err("position_bias", "shape")),
    ("t5_attn/bias-3d", lambda dt: M("t5_attn", dt)(t(dt, 2, 3, D), t(dt, 2, 3, D), t(dt, 2, 3, D), t(dt, H, 3, 3)), err("position_bias", "shape")),
    ("t5_attn/int-bias", lambda dt: M("t5_attn", dt)(t(dt, 2, 3, D), t(dt, 2, 3, D), t(dt, 2, 3, D), torch.zeros(1, H, 3, 3, dtype=torch.long)), err("position_bias", FLOAT)),
    ("t5_attn/padding-mask-2d", lambda dt: M("t5_attn", dt)(t(dt, 2, 3, D), t(dt, 2, 5, D), t(dt, 2, 5, D), None, bmask(2, 5)), err("mask", PADHINT)),
    ("t5_attn/float-mask", lambda dt: M("t5_attn", dt)(t(dt, 2, 3, D), t(dt, 2, 5, D), t(dt, 2, 5, D), None, torch.ones(2, 1, 1, 5, dtype=dt)), err("mask", BOOLMASK)),
    ("t5_attn/need_weights-str", lambda dt: M("t5_attn", dt)(t(dt, 2, 3, D), t(dt, 2, 3, D), t(dt, 2, 3, D), need_weights="yes"), err("need_weights", BOOL)),
    ("t5_attn/ok-fully-masked-row", t5_attention_fully_masked_row, OK),
    ("t5_attn/ok-no-scaling", t5_attention_unscaled, OK),
    ("t5_attn/ok-empty-batch", lambda dt: shape_is(M("t5_attn", dt)(t(dt, 0, 3, D), t(dt, 0, 5, D), t(dt, 0, 5, D), t(dt, 1, H, 3, 5))[0], 0, 3, D), OK),
    ("t5/float-src", lambda dt: M("t5", dt)(torch.ones(2, 5, dtype=dt), ids(2, 4)), err("src", INTEGER)),
    ("t5/src-id>=V", lambda dt: M("t5", dt)(ids(2, 5) + V, ids(2, 4)), err("src", VOCAB)),
    ("t5/tgt-negative", lambda dt: M("t5", dt)(ids(2, 5), -ids(2, 4)), err("tgt", VOCAB)),
    ("t5/tgt-none", lambda dt: M("t5", dt)(ids(2, 5), None), err("tgt", "tensor")),
    ("t5/batch-mismatch", lambda dt: M("t5", dt)(ids(3, 5), ids(2, 4)), err("tgt", "batch")),
    ("t5/tgt_mask-2d", lambda dt: M("t5", dt)(ids(2, 5), ids(2, 4), tgt_mask=bmask(2, 4)), err("tgt_mask", PADHINT)),
    ("t5/tgt_mask-float", lambda dt: M("t5", dt)(ids(2, 5), ids(2, 4), tgt_mask=torch.ones(2, 1, 4, 4, dtype=dt)), err("tgt_mask", BOOLMASK)),
    ("t5/src_mask-float", lambda dt: M("t5", dt)(ids(2, 5), ids(2, 4), src_mask=torch.ones(2, 1, 1, 5, dtype=dt)), err("src_mask", BOOLMASK)),
    ("t5/ok-never-sees-future", t5_no_future, OK),
    ("t5/ok-attention-weights", t5_attention_weights, OK),
    ("t5/ok-fully-padded-source", t5_fully_padded_source, OK),
    ("t5/ok-empty-batch", lambda dt: shape_is(M("t5", dt)(torch.zeros(0, 5, dtype=torch.long), torch.zeros(0, 4, dtype=torch.long)), 0, 4, V), OK),
    ("t5/ok-dtype-kept", lambda dt: None if M("t5", dt)(ids(2, 5), ids(2, 4)).dtype == dt else pytest.fail("dtype"), OK),
    ("token_cross_entropy/labels-list", lambda dt: brt.token_cross_entropy(t(dt, 2, 3, V), [[1, 2, 3]] * 2), err("labels", "shape")),
    ("token_cross_entropy/ok-matches-cross-entropy", seq2seq_loss_matches_torch, OK),
    ("t5_generate/float-src", lambda dt: t5_mod.t5_generate(M("t5", dt), torch.ones(2, 4, dtype=dt), 3), err("src", INTEGER)),
    ("t5_generate/src-id>=V", lambda dt: t5_mod.t5_generate(M("t5", dt), ids(2, 4) + V, 3), err("src", VOCAB)),
    ("t5_generate/max_new_tokens=0", lambda dt: t5_mod.t5_generate(M("t5", dt), ids(2, 4), 0), err("max_new_tokens", INT)),
    ("t5_generate/ok-result", t5_generate_result, OK),

    # --- vit (Chapter 12): patchify, unpatchify, ViT, shifted, image_batches
    ("patchify/not-multiple", lambda dt: vit_mod.patchify(t(dt, 1, 1, 7, 8), 4), err("images|patch_size", "multiple")),
    ("patchify/images-3d", lambda dt: vit_mod.patchify(t(dt, 1, 8, 8), 4), err("images", FIT)),
    ("unpatchify/wrong-N", lambda dt: vit_mod.unpatchify(t(dt, 1, 5, 16), 4, 8, 8), err("patches", "expected N")),
    ("unpatchify/patches-2d", lambda dt: vit_mod.unpatchify(t(dt, 4, 16), 4, 8, 8), err("patches", FIT)),
    ("patchify/ok-round-trip", lambda dt: None if torch.equal(vit_mod.unpatchify(vit_mod.patchify(t(dt, 2, 3, 6, 9), 3), 3, 6, 9), t(dt, 2, 3, 6, 9)) else pytest.fail("round trip"), OK),
    ("patchify/ok-empty-batch", lambda dt: shape_is(vit_mod.patchify(t(dt, 0, 1, 4, 4), 2), 0, 4, 4), OK),
    ("shuffle_patches/order-not-permutation", lambda dt: vit_mod.shuffle_patches(t(dt, 2, 1, 4, 4), torch.tensor([0, 0, 1, 2]), 2), err("order", "permutation")),
    ("shuffle_patches/order-too-short", lambda dt: vit_mod.shuffle_patches(t(dt, 2, 1, 4, 4), torch.tensor([1, 0]), 2), err("order", "permutation of 0 .. 3")),
    ("shuffle_patches/order-float", lambda dt: vit_mod.shuffle_patches(t(dt, 2, 1, 4, 4), torch.tensor([1.0, 0.0, 2.0, 3.0]), 2), err("order", "permutation")),
    ("shuffle_patches/order-list", lambda dt: vit_mod.shuffle_patches(t(dt, 2, 1, 4, 4), [1, 0, 2, 3], 2), err("order", "permutation")),
    ("shuffle_patches/images-3d", lambda dt: vit_mod.shuffle_patches(t(dt, 1, 4, 4), torch.arange(4), 2), err("images", FIT)),
    ("shuffle_patches/ok-inverse-restores", lambda dt: check_shuffle(dt), OK),
    ("vit/wrong-channels", lambda dt: M("vit", dt)(t(dt, 2, 3, 4, 4)), err("images", "shape")),
    ("vit/wrong-size", lambda dt: M("vit", dt)(t(dt, 2, 1, 8, 8)), err("images", "shape")),
    ("vit/images-3d", lambda dt: M("vit", dt)(t(dt, 2, 4, 4)), err("images", FIT)),
    ("vit/int-images", lambda dt: M("vit", dt)(torch.ones(2, 1, 4, 4, dtype=torch.long)), err("images", FLOAT)),
    ("vit/mixed-images", lambda dt: M("vit", dt)(t(other(dt), 2, 1, 4, 4)), err("images", FLOAT)),
    ("vit/ok-attention-rows-sum-to-1", vit_attention_rows, OK),
    ("vit/ok-empty-batch", lambda dt: shape_is(M("vit", dt)(t(dt, 0, 1, 4, 4)), 0, 3), OK),
    ("vit/ok-dtype-kept", lambda dt: None if M("vit", dt)(t(dt, 2, 1, 4, 4)).dtype == dt else pytest.fail("dtype"), OK),
    ("shifted/int-images", lambda dt: vit_mod.shifted(torch.ones(2, 1, 4, 4, dtype=torch.long)), err("images", FLOAT)),
    ("shifted/images-3d", lambda dt: vit_mod.shifted(t(dt, 1, 4, 4)), err("images", FIT)),
    ("shifted/max_shift=-1", lambda dt: vit_mod.shifted(t(dt, 2, 1, 4, 4), -1), err("max_shift", INT)),
    ("shifted/max_shift=True", lambda dt: vit_mod.shifted(t(dt, 2, 1, 4, 4), True), err("max_shift", INT)),
    ("shifted/ok-zero-is-identity", lambda dt: None if torch.equal(vit_mod.shifted(t(dt, 2, 1, 4, 4), 0), t(dt, 2, 1, 4, 4)) else pytest.fail("identity"), OK),
    ("shifted/ok-larger-than-image", lambda dt: shape_is(finite(vit_mod.shifted(t(dt, 2, 1, 4, 4), 9, torch.Generator().manual_seed(0))), 2, 1, 4, 4), OK),
    ("shifted/ok-empty-batch", lambda dt: shape_is(vit_mod.shifted(t(dt, 0, 1, 4, 4), 1), 0, 1, 4, 4), OK),
    ("image_batches/labels-wrong-shape", lambda dt: next(vit_mod.image_batches(t(dt, 4, 1, 4, 4), torch.arange(3))), err("labels", "shape")),
    ("image_batches/int-images", lambda dt: next(vit_mod.image_batches(torch.ones(4, 1, 4, 4, dtype=torch.long), torch.arange(4))), err("images", FLOAT)),
    ("image_batches/ok-shapes", image_batch_shapes, OK),
]


# ------------------------------------------------------------------------------------------- the plain cases
# (id, call(), expected): constructors, integers, strings, lists; no floating dtype involved.
def model_config(**kw):
    return mdl.TransformerConfig(**{"src_vocab_size": V, "tgt_vocab_size": V, "d_model": D, "num_heads": H,
                                    "d_ff": FF, "num_encoder_layers": 1, "num_decoder_layers": 1, **kw})


def train_call(**kw):
    lf = loss_fn()
    args = dict(model=M("model"), batches=[batch()], optimizer=optimizer(), scheduler=None, steps=1, progress=False,
                loss_fn=lambda m, b: lf(m(b.src, b.tgt_in, b.src_mask, b.tgt_mask), b.tgt_out))
    args["scheduler"] = trn.noam_scheduler(args["optimizer"], D, warmup=4)
    args.update(kw)
    try:
        return trn.train(**args)
    finally:
        M("model").eval()


@functools.cache
def small_gpt():
    """A tiny GPT (Chapter 11), max_len 8, in eval mode, built once."""
    torch.manual_seed(0)
    return gpt_mod.GPT(gpt_mod.GPTConfig(vocab_size=V, max_len=8, d_model=D, num_layers=1, num_heads=H, d_ff=FF)).eval()


PLAIN_CASES = [
    # --- attention: causal_mask, padding_mask
    ("causal_mask/True", lambda: att.causal_mask(True), err("n_q", INT)),
    ("causal_mask/negative", lambda: att.causal_mask(-2), err("n_q", INT)),
    ("causal_mask/float", lambda: att.causal_mask(2.0), err("n_q", INT)),
    ("causal_mask/str", lambda: att.causal_mask("3"), err("n_q", INT)),
    ("causal_mask/ok-empty", lambda: shape_is(att.causal_mask(0), 0, 0), OK),
    ("causal_mask/ok", lambda: None if torch.equal(att.causal_mask(3), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]]).bool()) else pytest.fail("tril"), OK),
    ("padding_mask/float-tokens", lambda: att.padding_mask(torch.ones(2, 3), PAD), err("tokens", INTEGER + "|shape")),
    ("padding_mask/1d-tokens", lambda: att.padding_mask(ids(3), PAD), err("tokens", FIT)),
    ("padding_mask/pad_id-bool", lambda: att.padding_mask(ids(2, 3), True), err("pad_id", INT)),
    ("padding_mask/pad_id-float", lambda: att.padding_mask(ids(2, 3), 0.0), err("pad_id", INT)),
    ("padding_mask/ok-shape", lambda: None if torch.equal(att.padding_mask(torch.tensor([[5, 0]]), 0), torch.tensor([True, False]).view(1, 1, 1, 2)) else pytest.fail("mask"), OK),
    ("padding_mask/ok-empty-batch", lambda: shape_is(att.padding_mask(torch.zeros(0, 4, dtype=torch.long), PAD), 0, 1, 1, 4), OK),

    # --- multi_head
    ("MHA/d_model=0", lambda: mh.MultiHeadAttention(0, 1), err("d_model", INT)),
    ("MHA/d_model=True", lambda: mh.MultiHeadAttention(True, 1), err("d_model", INT)),
    ("MHA/num_heads=0", lambda: mh.MultiHeadAttention(D, 0), err("num_heads", INT)),
    ("MHA/num_heads=True", lambda: mh.MultiHeadAttention(D, True), err("num_heads", INT)),
    ("MHA/not-divisible", lambda: mh.MultiHeadAttention(D, 3), err("num_heads|d_model", "divisible")),
    ("MHA/dropout=1.0", lambda: mh.MultiHeadAttention(D, H, dropout=1.0), err("dropout", PROB)),
    ("MHA/dropout=-0.1", lambda: mh.MultiHeadAttention(D, H, dropout=-0.1), err("dropout", PROB)),
    ("MHA/dropout-str", lambda: mh.MultiHeadAttention(D, H, dropout="0.1"), err("dropout", "number|" + PROB)),
    ("MHA/dropout-bool", lambda: mh.MultiHeadAttention(D, H, dropout=True), err("dropout", "number|" + PROB)),
    ("MHA/bias-str", lambda: mh.MultiHeadAttention(D, H, bias="False"), err("bias", BOOL)),
    ("MHA/ok-default-dropout", lambda: None if default_of(mh.MultiHeadAttention, "dropout") == 0.1 else pytest.fail("default"), OK),
    ("AttentionCache/static-str", lambda: mh.AttentionCache(static="yes"), err("static", BOOL)),
    ("AttentionCache/ok-empty", lambda: None if len(mh.AttentionCache()) == 0 and len(mh.AttentionCache(static=True)) == 0 else pytest.fail("len"), OK),
    ("copy_to_torch_mha/not-mha", lambda: mh.copy_to_torch_mha(M("mha"), nn.Linear(D, D)), err("torch_mha", "MultiheadAttention")),
    ("copy_to_torch_mha/wrong-size", lambda: mh.copy_to_torch_mha(M("mha"), nn.MultiheadAttention(2 * D, H)), err("torch_mha", "embed_dim")),
    ("copy_to_torch_mha/bias-disagree", lambda: mh.copy_to_torch_mha(M("mha"), nn.MultiheadAttention(D, H, bias=False)), err("torch_mha", "bias")),
    ("torch_attn_mask/float-mask", lambda: mh.torch_attn_mask(torch.ones(2, 1, 3, 3), 2, H, 3, 3), err("mask", BOOLMASK)),
    ("torch_attn_mask/wrong-shape", lambda: mh.torch_attn_mask(bmask(2, 1, 3, 4), 2, H, 3, 3), err("mask", FIT + "|broadcast")),

    # --- positional
    ("sinusoid/max_len=0", lambda: pos.sinusoidal_encoding(0, D), err("max_len", INT)),
    ("sinusoid/max_len=True", lambda: pos.sinusoidal_encoding(True, D), err("max_len", INT)),
    ("sinusoid/d_model-odd", lambda: pos.sinusoidal_encoding(4, 7), err("d_model", "even")),
    ("sinusoid/d_model=0", lambda: pos.sinusoidal_encoding(4, 0), err("d_model", "even|int")),
    ("sinusoid/d_model=True", lambda: pos.sinusoidal_encoding(4, True), err("d_model", "even|int")),
    ("sinusoid/int-dtype", lambda: pos.sinusoidal_encoding(4, D, dtype=torch.long), err("dtype", "float")),
    ("TokenEmbedding/vocab_size=0", lambda: pos.TokenEmbedding(0, D), err("vocab_size", INT)),
    ("TokenEmbedding/vocab_size=True", lambda: pos.TokenEmbedding(True, D), err("vocab_size", INT)),
    ("TokenEmbedding/d_model=0", lambda: pos.TokenEmbedding(V, 0), err("d_model", INT)),
    ("TokenEmbedding/padding_idx=V", lambda: pos.TokenEmbedding(V, D, padding_idx=V), err("padding_idx", VOCAB + "|int")),
    ("TokenEmbedding/padding_idx=True", lambda: pos.TokenEmbedding(V, D, padding_idx=True), err("padding_idx", INT)),
    ("TokenEmbedding/tokens-id>=V", lambda: M("emb")(ids(2, 3) + V), err("tokens", VOCAB)),
    ("TokenEmbedding/tokens-negative", lambda: M("emb")(-ids(2, 3)), err("tokens", VOCAB)),
    ("TokenEmbedding/bool-tokens", lambda: M("emb")(bmask(2, 3)), err("tokens", INTEGER)),
    ("TokenEmbedding/name-given", lambda: M("emb")(ids(2, 3) + V, name="src"), err("src", VOCAB)),
    ("PositionalEncoding/dropout=1.0", lambda: pos.PositionalEncoding(D, dropout=1.0), err("dropout", PROB)),
    ("PositionalEncoding/dropout=-0.5", lambda: pos.PositionalEncoding(D, dropout=-0.5), err("dropout", PROB)),
    ("PositionalEncoding/d_model-odd", lambda: pos.PositionalEncoding(7), err("d_model", "even")),
    ("PositionalEncoding/max_len=0", lambda: pos.PositionalEncoding(D, max_len=0), err("max_len", INT)),
    ("PositionalEncoding/max_len=True", lambda: pos.PositionalEncoding(D, max_len=True), err("max_len", INT)),
    ("PositionalEncoding/ok-default-dropout", lambda: None if default_of(pos.PositionalEncoding, "dropout") == 0.1 else pytest.fail("default"), OK),

    # --- utils
    ("seed_everything/str", lambda: utl.seed_everything("0"), err("seed", INT)),
    ("seed_everything/bool", lambda: utl.seed_everything(True), err("seed", INT)),
    ("seed_everything/float", lambda: utl.seed_everything(1.5), err("seed", INT)),
    ("seed_everything/ok-repeatable", lambda: None if (utl.seed_everything(3), torch.rand(2))[1].tolist() == (utl.seed_everything(3), torch.rand(2))[1].tolist() else pytest.fail("seed"), OK),
    ("get_device/ok", lambda: None if isinstance(utl.get_device(), torch.device) else pytest.fail("device"), OK),
    ("plot_attention/3d", lambda: utl.plot_attention(torch.rand(2, 3, 3)), err("weights", "2-D|n_q, n_k")),
    ("plot_attention_heads/2d", lambda: utl.plot_attention_heads(torch.rand(3, 3)), err("weights", "3-D|h, n_q, n_k")),
    ("plot_attention_heads/ncols=0", lambda: utl.plot_attention_heads(torch.rand(2, 3, 3), ncols=0), err("ncols", INT)),
    ("plot_attention/vmax=0", lambda: utl.plot_attention(torch.rand(2, 3), vmax=0), err("vmax", "lie in")),
    ("plot_attention_heads/vmax=-1", lambda: utl.plot_attention_heads(torch.rand(2, 3, 3), vmax=-1.0), err("vmax", "lie in")),
    ("plot_architecture/bad-name", lambda: utl.plot_architecture("attn"), err("highlight", "attention, multi-head")),
    ("plot_architecture/scale=0", lambda: utl.plot_architecture(scale=0), err("scale", "lie in")),
    ("plot_architecture/shapes=1", lambda: utl.plot_architecture(shapes=1), err("shapes", "True or False")),

    # --- feed_forward
    ("PFF/d_model=0", lambda: ffn.PositionwiseFeedForward(0, FF), err("d_model", INT)),
    ("PFF/d_model=True", lambda: ffn.PositionwiseFeedForward(True, FF), err("d_model", INT)),
    ("PFF/d_ff=0", lambda: ffn.PositionwiseFeedForward(D, 0), err("d_ff", INT)),
    ("PFF/d_ff=2.5", lambda: ffn.PositionwiseFeedForward(D, 2.5), err("d_ff", INT)),
    ("PFF/dropout=1.0", lambda: ffn.PositionwiseFeedForward(D, FF, dropout=1.0), err("dropout", PROB)),
    ("PFF/dropout=-0.1", lambda: ffn.PositionwiseFeedForward(D, FF, dropout=-0.1), err("dropout", PROB)),
    ("PFF/activation-unknown", lambda: ffn.PositionwiseFeedForward(D, FF, activation="swish"), err("activation", "relu")),
    ("PFF/ok-default-activation", lambda: None if default_of(ffn.PositionwiseFeedForward, "activation") == "relu" else pytest.fail("default"), OK),
    ("PFF/ok-default-dropout", lambda: None if default_of(ffn.PositionwiseFeedForward, "dropout") == 0.1 else pytest.fail("default"), OK),

    # --- residual
    ("LayerNorm/d_model=0", lambda: res.LayerNorm(0), err("d_model", INT)),
    ("LayerNorm/d_model=True", lambda: res.LayerNorm(True), err("d_model", INT)),
    ("LayerNorm/eps=0", lambda: res.LayerNorm(D, eps=0), err("eps", "positive|>|\\(0")),
    ("LayerNorm/eps-negative", lambda: res.LayerNorm(D, eps=-1e-5), err("eps", "positive|>|\\(0")),
    ("LayerNorm/eps-bool", lambda: res.LayerNorm(D, eps=True), err("eps", "number|positive|float")),
    ("LayerNorm/eps-str", lambda: res.LayerNorm(D, eps="1e-5"), err("eps", "number|positive|float")),
    ("Sublayer/d_model=0", lambda: res.SublayerConnection(0), err("d_model", INT)),
    ("Sublayer/dropout=1.0", lambda: res.SublayerConnection(D, dropout=1.0), err("dropout", PROB)),
    ("Sublayer/norm_first-str", lambda: res.SublayerConnection(D, norm_first="False"), err("norm_first", BOOL)),
    ("Sublayer/norm_first-int", lambda: res.SublayerConnection(D, norm_first=1), err("norm_first", BOOL)),
    ("Sublayer/ok-default-dropout", lambda: None if default_of(res.SublayerConnection, "dropout") == 0.1 else pytest.fail("default"), OK),

    # --- encoder
    ("EncoderLayer/not-divisible", lambda: enc.EncoderLayer(D, 3, FF), err("num_heads|d_model", "divisible")),
    ("EncoderLayer/d_ff=0", lambda: enc.EncoderLayer(D, H, 0), err("d_ff", INT)),
    ("EncoderLayer/num_heads=True", lambda: enc.EncoderLayer(D, True, FF), err("num_heads", INT)),
    ("EncoderLayer/dropout=1.0", lambda: enc.EncoderLayer(D, H, FF, dropout=1.0), err("dropout", PROB)),
    ("EncoderLayer/norm_first-str", lambda: enc.EncoderLayer(D, H, FF, norm_first="False"), err("norm_first", BOOL)),
    ("Encoder/num_layers=0", lambda: enc.Encoder(0, D, H, FF), err("num_layers", INT)),
    ("Encoder/num_layers=True", lambda: enc.Encoder(True, D, H, FF), err("num_layers", INT)),
    ("Encoder/dropout=1.0", lambda: enc.Encoder(1, D, H, FF, dropout=1.0), err("dropout", PROB)),
    ("Encoder/norm_first-str", lambda: enc.Encoder(1, D, H, FF, norm_first="False"), err("norm_first", BOOL)),
    ("Encoder/final_norm-str", lambda: enc.Encoder(1, D, H, FF, final_norm="yes"), err("final_norm", BOOL)),
    ("encoder_to_torch/layer-given", lambda: enc.encoder_to_torch(M("enc_layer")), err("encoder", "Encoder")),
    ("encoder_layer_to_torch/stack-given", lambda: enc.encoder_layer_to_torch(M("encoder")), err("layer", "EncoderLayer")),
    ("Encoder/ok-default-dropout", lambda: None if default_of(enc.Encoder, "dropout") == 0.1 == default_of(enc.EncoderLayer, "dropout") else pytest.fail("default"), OK),

    # --- decoder
    ("DecoderLayer/not-divisible", lambda: dec.DecoderLayer(D, 3, FF), err("num_heads|d_model", "divisible")),
    ("DecoderLayer/d_ff=True", lambda: dec.DecoderLayer(D, H, True), err("d_ff", INT)),
    ("DecoderLayer/dropout=1.0", lambda: dec.DecoderLayer(D, H, FF, dropout=1.0), err("dropout", PROB)),
    ("DecoderLayer/norm_first-str", lambda: dec.DecoderLayer(D, H, FF, norm_first="False"), err("norm_first", BOOL)),
    ("Decoder/num_layers=0", lambda: dec.Decoder(0, D, H, FF), err("num_layers", INT)),
    ("Decoder/num_layers=True", lambda: dec.Decoder(True, D, H, FF), err("num_layers", INT)),
    ("Decoder/dropout=1.5", lambda: dec.Decoder(1, D, H, FF, dropout=1.5), err("dropout", PROB)),
    ("Decoder/final_norm-str", lambda: dec.Decoder(1, D, H, FF, final_norm="no"), err("final_norm", BOOL)),
    ("decoder_to_torch/layer-given", lambda: dec.decoder_to_torch(M("dec_layer")), err("decoder", "Decoder")),
    ("decoder_layer_to_torch/stack-given", lambda: dec.decoder_layer_to_torch(M("decoder")), err("layer", "DecoderLayer")),
    ("Decoder/ok-default-dropout", lambda: None if default_of(dec.Decoder, "dropout") == 0.1 == default_of(dec.DecoderLayer, "dropout") else pytest.fail("default"), OK),

    # --- model: TransformerConfig, Transformer, transformer_to_torch
    ("Config/src_vocab_size=0", lambda: model_config(src_vocab_size=0), err("src_vocab_size", INT)),
    ("Config/tgt_vocab_size=True", lambda: model_config(tgt_vocab_size=True, tie_embeddings=False), err("tgt_vocab_size", INT)),
    ("Config/d_model=0", lambda: model_config(d_model=0), err("d_model", INT)),
    ("Config/num_heads=True", lambda: model_config(num_heads=True), err("num_heads", INT)),
    ("Config/d_ff=0", lambda: model_config(d_ff=0), err("d_ff", INT)),
    ("Config/num_encoder_layers=True", lambda: model_config(num_encoder_layers=True), err("num_encoder_layers", INT)),
    ("Config/num_decoder_layers=0", lambda: model_config(num_decoder_layers=0), err("num_decoder_layers", INT)),
    ("Config/max_len=0", lambda: model_config(max_len=0), err("max_len", INT)),
    ("Config/dropout=1.0", lambda: model_config(dropout=1.0), err("dropout", PROB)),
    ("Config/dropout=-0.1", lambda: model_config(dropout=-0.1), err("dropout", PROB)),
    ("Config/dropout-str", lambda: model_config(dropout="0.1"), err("dropout", "number|" + PROB)),
    ("Config/not-divisible", lambda: model_config(num_heads=3), err("num_heads|d_model", "divisible")),
    ("Config/d_model-odd", lambda: model_config(d_model=9, num_heads=3), err("d_model", "even")),
    ("Config/tie-different-vocabs", lambda: model_config(tgt_vocab_size=V + 1), err("tie_embeddings", "vocab")),
    ("Config/tie_embeddings-str", lambda: model_config(tie_embeddings="yes"), err("tie_embeddings", BOOL)),
    ("Config/norm_first-str", lambda: model_config(norm_first="False"), err("norm_first", BOOL)),
    ("Config/final_norm-int", lambda: model_config(final_norm=0), err("final_norm", BOOL)),
    ("Config/pad_id=True", lambda: model_config(pad_id=True), err("pad_id", INT)),
    ("Config/pad_id=-1", lambda: model_config(pad_id=-1), err("pad_id", "vocab|int")),
    ("Config/pad_id=V", lambda: model_config(pad_id=V), err("pad_id", "vocab")),
    ("Config/ok-default-dropout", lambda: None if model_config().dropout == 0.1 else pytest.fail("default"), OK),
    ("Transformer/config-dict", lambda: mdl.Transformer({"src_vocab_size": V}), err("config", "TransformerConfig")),
    ("Transformer/config-none", lambda: mdl.Transformer(None), err("config", "TransformerConfig")),
    ("transformer_to_torch/not-model", lambda: mdl.transformer_to_torch(M("encoder")), err("model", "Transformer")),

    # --- data
    ("number_pairs/unknown-src_lang", lambda: data.number_pairs([1], src_lang="xx"), err("src_lang", "xx")),
    ("number_pairs/unknown-tgt_lang", lambda: data.number_pairs([1], tgt_lang="zz"), err("tgt_lang", "zz")),
    ("number_pairs/negative", lambda: data.number_pairs([3, -1]), err("numbers", "non-negative|int")),
    ("number_pairs/bool", lambda: data.number_pairs([True]), err("numbers", "int")),
    ("number_pairs/float", lambda: data.number_pairs([1.5]), err("numbers", "int")),
    ("number_pairs/str", lambda: data.number_pairs("12"), err("numbers", "int")),
    ("number_pairs/ok-empty", lambda: None if data.number_pairs([]) == [] else pytest.fail("pairs"), OK),
    ("split_numbers/too-many", lambda: data.split_numbers(10, 5, 5), err("n_max", "n_valid")),
    ("split_numbers/n_max-bool", lambda: data.split_numbers(True, 0, 0), err("n_max", INT)),
    ("split_numbers/n_valid-negative", lambda: data.split_numbers(10, -1, 2), err("n_valid", INT + "|0 <=")),
    ("split_numbers/ok-disjoint", lambda: None if sorted(sum(data.split_numbers(20, 3, 4), [])) == list(range(20)) else pytest.fail("split"), OK),
    ("training_numbers/pool-int", lambda: data.training_numbers(5, 3), err("pool", "list of ints")),
    ("training_numbers/too-many", lambda: data.training_numbers([5, 7, 2000], 3, short_below=10), err("n", "lie in")),
    ("training_numbers/n-zero", lambda: data.training_numbers([1, 2], 0), err("n", INT)),
    ("training_numbers/ok-half-short", lambda: None if sum(n < 10 for n in data.training_numbers(list(range(20)), 15, short_below=10)) == 5 else pytest.fail("half"), OK),
    ("CharTokenizer/multichar", lambda: data.CharTokenizer(["ab", "c"]), err("chars", "single")),
    ("CharTokenizer/use_unk-str", lambda: data.CharTokenizer("ab", use_unk="no"), err("use_unk", BOOL)),
    ("CharTokenizer/encode-unknown", lambda: tok().encode("abz"), err("text", "vocabulary")),
    ("CharTokenizer/encode-not-str", lambda: tok().encode(5), err("text", "str")),
    ("CharTokenizer/encode-bos-str", lambda: tok().encode("ab", bos="yes"), err("bos", BOOL)),
    ("CharTokenizer/decode-2d", lambda: tok().decode(torch.tensor([[4, 5]])), err("ids", "1-D")),
    ("CharTokenizer/decode-float", lambda: tok().decode(torch.tensor([4.0, 5.0])), err("ids", INTEGER)),
    ("CharTokenizer/decode-float-list", lambda: tok().decode([4.0, 5.0]), err("ids", INTEGER + "|int")),
    ("CharTokenizer/decode-out-of-range", lambda: tok().decode([4, 99]), err("ids", r"\[0")),
    ("CharTokenizer/decode-negative", lambda: tok().decode([-1]), err("ids", r"\[0")),
    ("CharTokenizer/ok-decode-empty", lambda: None if tok().decode([]) == "" == tok().decode(torch.zeros(0, dtype=torch.long)) else pytest.fail("decode"), OK),
    ("CharTokenizer/ok-round-trip", lambda: None if tok().decode(tok().encode("cab", bos=True, eos=True)) == "cab" else pytest.fail("round trip"), OK),
    ("TranslationDataset/tokenizer-str", lambda: data.TranslationDataset([("a", "b")], "abc"), err("tokenizer", "CharTokenizer|encode")),
    ("TranslationDataset/pair-of-one", lambda: data.TranslationDataset([("a",)], tok()), err("pairs", "pair|two")),
    ("TranslationDataset/ok-empty", lambda: None if len(data.TranslationDataset([], tok())) == 0 else pytest.fail("len"), OK),
    ("collate/empty", lambda: data.collate([]), err("examples", EMPTY)),
    ("collate/pad_id-bool", lambda: data.collate([(ids(3), ids(4))], pad_id=True), err("pad_id", INT)),
    ("collate/float-src", lambda: data.collate([(torch.ones(3), ids(4))]), err("examples|src", INTEGER)),
    ("collate/not-pairs", lambda: data.collate([ids(3)]), err("examples", "pair")),
    ("collate/ok-shapes", lambda: (shape_is(batch().src_mask, 2, 1, 1, 4), shape_is(batch().tgt_in, 2, 3), shape_is(batch().tgt_out, 2, 3),
                                   shape_is(batch().tgt_mask, 2, 1, 1, 3)), OK),    # padding only: the decoder adds causality
    ("Sampler/batch_size=0", lambda: data.LengthGroupedSampler([1, 2], 0), err("batch_size", INT)),
    ("Sampler/batch_size=True", lambda: data.LengthGroupedSampler([1, 2], True), err("batch_size", INT)),
    ("Sampler/shuffle-str", lambda: data.LengthGroupedSampler([1, 2], 1, shuffle="no"), err("shuffle", BOOL)),
    ("Sampler/ok-empty", lambda: None if list(data.LengthGroupedSampler([], 2)) == [] and len(data.LengthGroupedSampler([], 2)) == 0 else pytest.fail("empty"), OK),
    ("Sampler/ok-covers-all", lambda: None if sorted(sum(list(data.LengthGroupedSampler([3, 1, 2, 5, 4], 2)), [])) == [0, 1, 2, 3, 4] else pytest.fail("cover"), OK),

    # --- training
    ("LabelSmoothingLoss/label_smoothing=1.5", lambda: loss_fn(label_smoothing=1.5), err("label_smoothing", r"\[0, 1")),
    ("LabelSmoothingLoss/label_smoothing=-0.1", lambda: loss_fn(label_smoothing=-0.1), err("label_smoothing", r"\[0, 1")),
    ("LabelSmoothingLoss/label_smoothing-str", lambda: loss_fn(label_smoothing="0.1"), err("label_smoothing", r"number|\[0, 1")),
    ("LabelSmoothingLoss/pad_id-bool", lambda: loss_fn(pad_id=True), err("pad_id", INT)),
    ("smoothed_targets/vocab_size=0", lambda: trn.smoothed_targets(ids(3, low=0), 0), err("vocab_size", INT)),
    ("smoothed_targets/label_smoothing=2", lambda: trn.smoothed_targets(ids(3, low=0), V, label_smoothing=2.0), err("label_smoothing", r"\[0, 1")),
    ("smoothed_targets/target>=V", lambda: trn.smoothed_targets(ids(3) + V, V), err("target", VOCAB)),
    ("smoothed_targets/float-target", lambda: trn.smoothed_targets(torch.ones(3), V), err("target", INTEGER)),
    ("smoothed_targets/ok-empty", lambda: shape_is(trn.smoothed_targets(torch.zeros(0, dtype=torch.long), V), 0, V), OK),
    ("noam_lr/step=0", lambda: trn.noam_lr(0, 512), err("step", INT)),
    ("noam_lr/step=True", lambda: trn.noam_lr(True, 512), err("step", INT)),
    ("noam_lr/d_model-negative", lambda: trn.noam_lr(1, -512), err("d_model", INT)),
    ("noam_lr/d_model=0", lambda: trn.noam_lr(1, 0), err("d_model", INT)),
    ("noam_lr/d_model=True", lambda: trn.noam_lr(1, True), err("d_model", INT)),
    ("noam_lr/warmup=0", lambda: trn.noam_lr(1, 512, warmup=0), err("warmup", INT)),
    ("noam_lr/warmup-negative", lambda: trn.noam_lr(10, 512, warmup=-4000), err("warmup", INT)),
    ("noam_lr/ok-peak", lambda: None if math.isclose(trn.noam_lr(4000, 512, 4000), 512 ** -0.5 * 4000 ** -0.5) else pytest.fail("lr"), OK),
    ("noam_scheduler/d_model=0", lambda: trn.noam_scheduler(optimizer(), 0), err("d_model", INT)),
    ("noam_scheduler/warmup=0", lambda: trn.noam_scheduler(optimizer(), 512, warmup=0), err("warmup", INT)),
    ("warmup_linear/warmup>=total", lambda: trn.warmup_linear_scheduler(optimizer(), 10, 20), err("warmup_steps", "total_steps")),
    ("warmup_linear/total_steps=True", lambda: trn.warmup_linear_scheduler(optimizer(), True, 1), err("total_steps", INT)),
    ("make_optimizer/lr-negative", lambda: trn.make_optimizer(M("model"), lr=-1.0), err("lr", "positive|>|\\(0")),
    ("make_optimizer/not-module", lambda: trn.make_optimizer("model"), err("model", "Module")),
    ("train_translator/config-not-config", lambda: translator_call(config={"d_model": 8}), err("config", "TransformerConfig")),
    ("train_translator/config-vocab-too-small", lambda: translator_call(config=small_config(src_vocab_size=5, tgt_vocab_size=5)), err("config", "fit the tokenizer")),
    ("train_translator/config-pad_id", lambda: translator_call(config=small_config(pad_id=3)), err("config", "pad_id")),
    ("train_translator/tokenizer-str", lambda: translator_call(tokenizer="abcdefg"), err("tokenizer", "CharTokenizer")),
    ("train_translator/pairs-empty", lambda: translator_call(pairs=[]), err("pairs", "non-empty")),
    ("train_translator/pairs-strings", lambda: translator_call(pairs=["ab", "cd"]), err("pairs", "pairs")),
    ("train_translator/steps=1", lambda: translator_call(steps=1), err("steps", INT)),
    ("train_translator/warmup-str", lambda: translator_call(warmup="no"), err("warmup", BOOL)),
    ("train_translator/make_scheduler-list", lambda: translator_call(make_scheduler=[1]), err("make_scheduler", "function")),
    ("train_translator/label_smoothing=1.5", lambda: translator_call(label_smoothing=1.5), err("label_smoothing", "")),
    ("train_translator/batch_size=0", lambda: translator_call(batch_size=0), err("batch_size", INT)),
    ("train_translator/ok-seeded-eval-mode", lambda: check_translator(), OK),
    ("number_tasks/int", lambda: t5_mod.number_tasks(42), err("numbers", "list")),
    ("number_tasks/negative", lambda: t5_mod.number_tasks([3, -1]), err("numbers", "non-negative")),
    ("number_tasks/ok-three-tasks", lambda: None if t5_mod.number_tasks(range(42, 43)) == [("en-de: forty-two", "zweiundvierzig", "en-de"), ("de-en: zweiundvierzig", "forty-two", "de-en"), ("en-num: forty-two", "42", "en-num")] else pytest.fail("tasks"), OK),
    ("encode_texts/tokenizer-str", lambda: t5_mod.encode_texts("abc", ["ab"], 0), err("tokenizer", "CharTokenizer")),
    ("encode_texts/texts-str", lambda: t5_mod.encode_texts(tok(), "abc", 0), err("texts", "list")),
    ("encode_texts/texts-empty", lambda: t5_mod.encode_texts(tok(), [], 0), err("texts", "non-empty")),
    ("encode_texts/pad_id-float", lambda: t5_mod.encode_texts(tok(), ["ab"], 0.0), err("pad_id", "int")),
    ("encode_texts/unknown-character", lambda: t5_mod.encode_texts(tok(), ["abz"], 0), err("text|texts", "vocabulary")),
    ("encode_texts/ok-padded", lambda: None if t5_mod.encode_texts(tok(), ["ab", "c"], -100).tolist() == [[tok().encode("ab", eos=True)[0], tok().encode("ab", eos=True)[1], EOS], [tok().encode("c")[0], EOS, -100]] else pytest.fail("padding"), OK),
    ("t5_loss/batch-tensor", lambda: t5_mod.t5_loss(M("t5"), torch.zeros(2, 3, dtype=torch.long)), err("batch", "pair")),
    ("digits_split/seed=-1", lambda: vit_mod.digits_split(seed=-1), err("seed", INT)),
    ("digits_split/ok-shapes", lambda: None if [tuple(x.shape) for x in vit_mod.digits_split()] == [(1437, 1, 8, 8), (1437,), (360, 1, 8, 8), (360,)] else pytest.fail("shapes"), OK),
    ("baselines/ok-logits", lambda: None if vit_mod.cnn_baseline()(torch.zeros(2, 1, 8, 8)).shape == vit_mod.mlp_baseline()(torch.zeros(2, 1, 8, 8)).shape == (2, 10) else pytest.fail("shape"), OK),
    ("load_results/unknown-name", lambda: trn.load_results("nonexistent"), err("name", "one of")),
    ("load_results/ok-ablation", lambda: None if trn.load_results("ablation")["runs"] else pytest.fail("no runs"), OK),
    ("evaluate_loss/empty-loader", lambda: trn.evaluate_loss(M("model"), [], loss_fn()), err("loader", EMPTY)),
    ("evaluate_loss/all-padding", lambda: trn.evaluate_loss(M("model"), [data.collate([(ids(3), torch.tensor([BOS, PAD]))])], loss_fn()), err("loader", "no target|padding|" + EMPTY)),
    ("train/empty-loader", lambda: train_call(batches=[]), err("batches", EMPTY)),
    ("train/evaluate-not-callable", lambda: train_call(evaluate=[batch()]), err("evaluate", "function")),
    ("train/steps=0", lambda: train_call(steps=0), err("steps", INT)),
    ("train/steps=True", lambda: train_call(steps=True), err("steps", INT)),
    ("train/eval_every=0", lambda: train_call(eval_every=0), err("eval_every", INT)),
    ("train/eval_every=True", lambda: train_call(eval_every=True), err("eval_every", INT)),
    ("train/progress-str", lambda: train_call(progress="no"), err("progress", BOOL)),
    ("save_checkpoint/not-model", lambda: trn.save_checkpoint(os.devnull, M("encoder")), err("model", "dataclass config")),
    ("load_checkpoint/no-config", lambda: tmp_checkpoint({"state_dict": M("model").state_dict()}), err("config|checkpoint", "config")),
    ("load_checkpoint/not-a-dict", lambda: tmp_checkpoint([1, 2]), err("checkpoint|path", "config|dict")),
    ("load_checkpoint/ok-round-trip", checkpoint_round_trip, OK),

    # --- decoding (no floating dtype involved)
    ("translate/bare-str", lambda: dcd.translate(M("model"), tok(), "ab"), err("texts", "list")),
    ("translate/not-str-items", lambda: dcd.translate(M("model"), tok(), [1, 2]), err("texts", "str")),
    ("translate/batch_size=0", lambda: dcd.translate(M("model"), tok(), ["ab"], batch_size=0), err("batch_size", INT)),
    ("translate/batch_size=True", lambda: dcd.translate(M("model"), tok(), ["ab"], batch_size=True), err("batch_size", INT)),
    ("translate/beam_size=0", lambda: dcd.translate(M("model"), tok(), ["ab"], beam_size=0), err("beam_size", INT)),
    ("translate/beam_size=True", lambda: dcd.translate(M("model"), tok(), ["ab"], beam_size=True), err("beam_size", INT)),
    ("translate/max_new_tokens=0", lambda: dcd.translate(M("model"), tok(), ["ab"], max_new_tokens=0), err("max_new_tokens", INT)),
    ("translate/alpha-negative", lambda: dcd.translate(M("model"), tok(), ["ab"], beam_size=2, alpha=-1.0), err("alpha", r"\[0")),
    ("translate/ok-empty", lambda: None if dcd.translate(M("model"), tok(), []) == [] else pytest.fail("empty"), OK),
    ("translate/ok-strings", lambda: None if all(isinstance(s, str) for s in dcd.translate(M("model"), tok(), ["ab", "c"], max_new_tokens=3)) else pytest.fail("str"), OK),
    ("length_penalty/negative-length", lambda: dcd.length_penalty(-7), err("length", r"0|non-negative|>=")),
    ("length_penalty/negative-alpha", lambda: dcd.length_penalty(3, alpha=-0.6), err("alpha", r"\[0")),
    ("length_penalty/bool-length", lambda: dcd.length_penalty(True), err("length", "int|number")),
    ("length_penalty/negative-tensor", lambda: dcd.length_penalty(torch.tensor([2.0, -9.0])), err("length", r"0|non-negative|>=")),
    ("length_penalty/ok-one", lambda: None if dcd.length_penalty(1, 0.6) == 1.0 and dcd.length_penalty(7, 0.0) == 1.0 else pytest.fail("lp"), OK),
    ("length_penalty/ok-tensor", lambda: torch.testing.assert_close(dcd.length_penalty(torch.tensor([1.0, 7.0]), 1.0), torch.tensor([1.0, 2.0])), OK),
    ("KVCache/training-model", lambda: dcd.KVCache(M("model").train(), torch.zeros(2, 5, D), torch.ones(2, 1, 1, 5, dtype=torch.bool)), err("model", "eval")),
    ("edit_distance/not-sequence", lambda: dcd.edit_distance(5, "a"), err("a", "str|sequence")),
    ("edit_distance/ok", lambda: None if dcd.edit_distance("kitten", "sitting") == 3 and dcd.edit_distance("", "abc") == 3 else pytest.fail("distance"), OK),
    ("evaluate_translations/empty", lambda: dcd.evaluate_translations([], []), err("references|hypotheses", "at least one")),
    ("evaluate_translations/length-mismatch", lambda: dcd.evaluate_translations(["a"], ["a", "b"]), err("hypotheses|references", "as many")),
    ("evaluate_translations/bare-str", lambda: dcd.evaluate_translations("ab", ["ab", "cd"]), err("hypotheses", "list")),

    # --- classifier (Chapter 10)
    ("make_sequences/max_len=33", lambda: clf.make_sequences(1, max_len=33), err("max_len", "32")),
    ("make_sequences/max_len<min_len", lambda: clf.make_sequences(1, min_len=10, max_len=9), err("max_len", "min_len")),
    ("make_sequences/n_per_class=0", lambda: clf.make_sequences(0), err("n_per_class", INT)),
    ("pool/unknown-method", lambda: clf.pool(rand(2, 3, D), bmask(2, 3), "sum"), err("method", "'cls', 'mean', 'max'")),
    ("pool/keep-not-bool", lambda: clf.pool(rand(2, 3, D), torch.ones(2, 3), "mean"), err("keep", BOOLMASK)),
    ("pool/keep-wrong-shape", lambda: clf.pool(rand(2, 3, D), bmask(2, 4), "max"), err("keep", "shape")),
    ("pool/int-hidden", lambda: clf.pool(ids(2, 3, D), bmask(2, 3), "mean"), err("hidden", "floating")),
    ("pool/ok-empty-row", lambda: [zeros_not_nan(clf.pool(rand(2, 3, D), torch.tensor([[True, False, False], [False] * 3]), m)[1]) for m in ("mean", "max")], OK),
    ("SequenceClassifier/bad-pooling", lambda: clf.SequenceClassifier(clf.ClassifierConfig(V, 3, d_model=D, num_heads=H, d_ff=FF, pooling="last")), err("pooling", "'cls'")),
    ("SequenceClassifier/num_classes=1", lambda: clf.SequenceClassifier(clf.ClassifierConfig(V, 1, d_model=D, num_heads=H, d_ff=FF)), err("num_classes", INT)),
    ("SequenceClassifier/positional-str", lambda: clf.SequenceClassifier(clf.ClassifierConfig(V, 2, d_model=D, num_heads=H, d_ff=FF, positional="no")), err("positional", BOOL)),
    ("SequenceClassifier/tokens-id>=V", lambda: clf.SequenceClassifier(clf.ClassifierConfig(V, 2, d_model=D, num_heads=H, d_ff=FF)).eval()(ids(2, 3) + V), err("tokens", VOCAB)),
    ("random_batches/mismatched-rows", lambda: next(clf.random_batches(ids(4, 3), ids(5))), err("tensors", "first axis")),
    ("random_batches/batch_size=0", lambda: next(clf.random_batches(ids(4, 3), batch_size=0)), err("batch_size", INT)),
    ("fit/steps=1", lambda: clf.fit(M("encoder"), clf.classification_loss, iter([]), steps=1, progress=False), err("steps", INT)),
    ("fit/weight_decay<0", lambda: clf.fit(M("encoder"), clf.classification_loss, iter([]), steps=2, weight_decay=-0.1, progress=False), err("weight_decay", r"\[0")),
    ("SequenceClassifier/cls_id>=V", lambda: clf.SequenceClassifier(clf.ClassifierConfig(V, 2, d_model=D, num_heads=H, d_ff=FF, cls_id=V)), err("cls_id", "vocab_size")),
    ("predict/batch_size=0", lambda: clf.predict(M("encoder"), ids(2, 3), batch_size=0), err("batch_size", INT)),

    # --- bert (Chapter 10)
    ("BertConfig/not-divisible", lambda: brt.BertConfig(vocab_size=V, d_model=D, num_heads=3, d_ff=FF), err("num_heads|d_model", "divisible")),
    ("BertConfig/pad_id=V", lambda: brt.BertConfig(vocab_size=V, pad_id=V), err("pad_id", "vocab")),
    ("BertConfig/dropout=1.0", lambda: brt.BertConfig(dropout=1.0), err("dropout", PROB)),
    ("BertConfig/eps=0", lambda: brt.BertConfig(eps=0.0), err("eps", r"\(0")),
    ("BertConfig/init_std<0", lambda: brt.BertConfig(init_std=-0.02), err("init_std", r"\[0")),
    ("BertModel/config-dict", lambda: brt.BertModel({"vocab_size": V}), err("config", "BertConfig")),
    ("BertClassifier/num_classes=1", lambda: brt.BertClassifier(brt.BertConfig(vocab_size=V, d_model=D, num_layers=1, num_heads=H, d_ff=FF, max_len=8), 1), err("num_classes", INT)),
    ("mask_tokens/mask_prob=1.5", lambda: brt.mask_tokens(ids(2, 3), 2, V, mask_prob=1.5), err("mask_prob", r"\[0, 1\]")),
    ("mask_tokens/ids>=V", lambda: brt.mask_tokens(ids(2, 3) + V, 2, V), err("tokens", VOCAB)),
    ("mask_tokens/no-regular-token", lambda: brt.mask_tokens(ids(2, 3, low=0, high=3), 2, 3, special_ids=(0, 1)), err("special_ids|mask_id", "no regular")),
    ("token_cross_entropy/labels-wrong-shape", lambda: brt.token_cross_entropy(rand(2, 3, V), ids(2, 4)), err("labels", "shape")),
    ("token_cross_entropy/int-logits", lambda: brt.token_cross_entropy(ids(2, 3, V), ids(2, 3)), err("logits", "floating")),
    ("token_cross_entropy/ok-no-chosen", lambda: zeros_not_nan(brt.token_cross_entropy(rand(2, 3, V), torch.full((2, 3), brt.IGNORE_INDEX))), OK),
    ("load_hf_bert/not-bert", lambda: brt.load_hf_bert(M("encoder"), None), err("model", "BertModel")),

    # --- gpt and sampling (Chapter 11)
    ("GPTConfig/not-divisible", lambda: gpt_mod.GPTConfig(vocab_size=V, d_model=D, num_heads=3, d_ff=FF), err("num_heads|d_model", "divisible")),
    ("GPTConfig/num_heads=0", lambda: gpt_mod.GPTConfig(vocab_size=V, d_model=D, num_heads=0), err("num_heads", INT)),
    ("GPTConfig/num_layers=True", lambda: gpt_mod.GPTConfig(num_layers=True), err("num_layers", INT)),
    ("GPTConfig/dropout=1.0", lambda: gpt_mod.GPTConfig(dropout=1.0), err("dropout", PROB)),
    ("GPTConfig/eps=0", lambda: gpt_mod.GPTConfig(eps=0.0), err("eps", r"\(0")),
    ("GPT/config-dict", lambda: gpt_mod.GPT({"vocab_size": V}), err("config", "GPTConfig")),
    ("GPT/tokens-id>=V", lambda: small_gpt()(ids(2, 3) + V), err("tokens", VOCAB)),
    ("GPT/float-tokens", lambda: small_gpt()(torch.ones(2, 3)), err("tokens", INTEGER)),
    ("GPT/too-long", lambda: small_gpt()(ids(1, 9)), err("tokens", "max_len=8")),
    ("GPT/cache-wrong-length", lambda: small_gpt()(ids(1, 2), cache=[]), err("cache", "new_cache")),
    ("GPT/mask-2d", lambda: small_gpt()(ids(2, 3), mask=bmask(2, 3)), err("mask", PADHINT)),
    ("GPT/ok-max_len", lambda: shape_is(small_gpt()(ids(2, 8)), 2, 8, V), OK),
    ("GPT/ok-empty-batch", lambda: shape_is(small_gpt()(torch.zeros(0, 3, dtype=torch.long)), 0, 3, V), OK),
    ("load_hf_gpt2/not-gpt", lambda: gpt_mod.load_hf_gpt2(M("encoder"), None), err("model", "GPT")),
    ("stdlib_sources/bare-str", lambda: gpt_mod.stdlib_sources("ast.py"), err("modules", "list")),
    ("stdlib_sources/none-found", lambda: gpt_mod.stdlib_sources(["no_such_module_xyz.py"]), err("modules", "found")),
    ("TrigramLM/vocab_size=0", lambda: gpt_mod.TrigramLM(ids(5), 0), err("vocab_size", INT)),
    ("TrigramLM/discount=1.5", lambda: gpt_mod.TrigramLM(ids(5), V, discount=1.5), err("discount", r"\[0, 1\]")),
    ("random_windows/too-short", lambda: next(gpt_mod.random_windows(ids(5), 4, 2)), err("ids", "longer than context")),
    ("random_windows/2d-ids", lambda: next(gpt_mod.random_windows(ids(2, 20), 4, 2)), err("ids", "1-D")),
    ("random_windows/context=0", lambda: next(gpt_mod.random_windows(ids(20), 0, 2)), err("context", INT)),
    ("random_windows/batch_size=True", lambda: next(gpt_mod.random_windows(ids(20), 4, True)), err("batch_size", INT)),
    ("sequence_nll/2d-ids", lambda: gpt_mod.sequence_nll(small_gpt(), ids(2, 5), 4), err("ids", "1-D")),
    ("sequence_nll/context=1", lambda: gpt_mod.sequence_nll(small_gpt(), ids(5), 1), err("context", INT)),
    ("sequence_nll/ok-one-token", lambda: None if gpt_mod.sequence_nll(small_gpt(), ids(1), 4) == 0.0 else pytest.fail("nll"), OK),
    ("sample_next/temperature=-1", lambda: smp.sample_next(rand(2, V), temperature=-1.0), err("temperature", r"\[0")),
    ("sample_next/temperature-str", lambda: smp.sample_next(rand(2, V), temperature="1"), err("temperature", "number")),
    ("sample_next/ok-greedy", lambda: None if torch.equal(smp.sample_next(rand(2, V), temperature=0), rand(2, V).argmax(-1)) else pytest.fail("argmax"), OK),
    ("filter_logits/top_k=0", lambda: smp.filter_logits(rand(2, V), top_k=0), err("top_k", INT)),
    ("filter_logits/top_k=True", lambda: smp.filter_logits(rand(2, V), top_k=True), err("top_k", INT)),
    ("filter_logits/top_p=0", lambda: smp.filter_logits(rand(2, V), top_p=0.0), err("top_p", r"\(0, 1\]")),
    ("filter_logits/top_p=1.5", lambda: smp.filter_logits(rand(2, V), top_p=1.5), err("top_p", r"\(0, 1\]")),
    ("filter_logits/int-logits", lambda: smp.filter_logits(ids(2, V), top_k=2), err("logits", "floating")),
    ("filter_logits/ok-top_p=1", lambda: None if torch.equal(smp.filter_logits(rand(2, V), top_p=1.0), rand(2, V)) else pytest.fail("kept"), OK),
    ("filter_logits/ok-top_k>=V", lambda: None if torch.equal(smp.filter_logits(rand(2, V), top_k=V + 1), rand(2, V)) else pytest.fail("kept"), OK),
    ("generate/too-long", lambda: smp.generate(small_gpt(), ids(1, 5), 4), err("max_new_tokens|prompt", "max_len=8")),
    ("generate/max_new_tokens=0", lambda: smp.generate(small_gpt(), ids(1, 5), 0), err("max_new_tokens", INT)),
    ("generate/prompt-1d", lambda: smp.generate(small_gpt(), ids(5), 2), err("prompt", FIT)),
    ("generate/float-prompt", lambda: smp.generate(small_gpt(), torch.ones(1, 5), 2), err("prompt", INTEGER)),
    ("generate/top_p=2", lambda: smp.generate(small_gpt(), ids(1, 2), 2, top_p=2.0), err("top_p", r"\(0, 1\]")),
    ("generate/ok-fills-max_len", lambda: shape_is(smp.generate(small_gpt(), ids(2, 5), 3, temperature=0), 2, 3), OK),

    # --- t5 (Chapter 12)
    ("RMSNorm/d_model=0", lambda: t5_mod.RMSNorm(0), err("d_model", INT)),
    ("RMSNorm/d_model=True", lambda: t5_mod.RMSNorm(True), err("d_model", INT)),
    ("RMSNorm/eps=0", lambda: t5_mod.RMSNorm(D, eps=0.0), err("eps", r"\(0")),
    ("RMSNorm/eps-str", lambda: t5_mod.RMSNorm(D, eps="1e-6"), err("eps", "number")),
    ("relative_position_bucket/float", lambda: t5_mod.relative_position_bucket(torch.tensor([1.0, 2.0])), err("relative_position", INTEGER)),
    ("relative_position_bucket/list", lambda: t5_mod.relative_position_bucket([1, 2]), err("relative_position", "tensor")),
    ("relative_position_bucket/bidirectional-str", lambda: t5_mod.relative_position_bucket(ids(3), "yes"), err("bidirectional", BOOL)),
    ("relative_position_bucket/num_buckets=3", lambda: t5_mod.relative_position_bucket(ids(3), True, 3), err("num_buckets", INT)),
    ("relative_position_bucket/num_buckets=1-decoder", lambda: t5_mod.relative_position_bucket(ids(3), False, 1), err("num_buckets", INT)),
    ("relative_position_bucket/max_distance=1", lambda: t5_mod.relative_position_bucket(ids(3), True, 8, 1), err("max_distance", INT)),
    ("relative_position_bucket/ok-empty", lambda: shape_is(t5_mod.relative_position_bucket(torch.zeros(0, dtype=torch.long)), 0), OK),
    ("relative_position_bucket/ok-values", lambda: None if t5_mod.relative_position_bucket(torch.tensor([-200, -1, 0, 1, 200])).tolist() == [15, 1, 0, 17, 31] else pytest.fail("buckets"), OK),
    ("RelativePositionBias/num_heads=0", lambda: t5_mod.RelativePositionBias(0, True), err("num_heads", INT)),
    ("RelativePositionBias/bidirectional-int", lambda: t5_mod.RelativePositionBias(H, 1), err("bidirectional", BOOL)),
    ("RelativePositionBias/num_buckets=3", lambda: t5_mod.RelativePositionBias(H, True, num_buckets=3), err("num_buckets", INT)),
    ("RelativePositionBias/offset=-1", lambda: t5_mod.RelativePositionBias(H, False)(2, 3, offset=-1), err("offset", INT)),
    ("RelativePositionBias/n_k=True", lambda: t5_mod.RelativePositionBias(H, False)(2, True), err("n_k", INT)),
    ("RelativePositionBias/ok-shape", lambda: shape_is(t5_mod.RelativePositionBias(H, True)(2, 3, offset=5), 1, H, 2, 3), OK),
    ("T5Attention/not-divisible", lambda: t5_mod.T5Attention(D, 3), err("num_heads|d_model", "divisible")),
    ("T5Attention/dropout=1.0", lambda: t5_mod.T5Attention(D, H, dropout=1.0), err("dropout", PROB)),
    ("T5Attention/ok-no-biases", lambda: None if all(W.bias is None for W in (M("t5_attn").W_q, M("t5_attn").W_k, M("t5_attn").W_v, M("t5_attn").W_o)) else pytest.fail("bias"), OK),
    ("T5Config/not-divisible", lambda: t5_config(num_heads=3), err("num_heads|d_model", "divisible")),
    ("T5Config/vocab_size=0", lambda: t5_config(vocab_size=0), err("vocab_size", INT)),
    ("T5Config/num_decoder_layers=0", lambda: t5_config(num_decoder_layers=0), err("num_decoder_layers", INT)),
    ("T5Config/num_buckets=3", lambda: t5_config(num_buckets=3), err("num_buckets", INT)),
    ("T5Config/max_distance=1", lambda: t5_config(max_distance=1), err("max_distance", INT)),
    ("T5Config/dropout=1.0", lambda: t5_config(dropout=1.0), err("dropout", PROB)),
    ("T5Config/eps=0", lambda: t5_config(eps=0.0), err("eps", r"\(0")),
    ("T5Config/pad_id=V", lambda: t5_config(pad_id=V), err("pad_id", "vocab")),
    ("T5Config/eos_id-bool", lambda: t5_config(eos_id=True), err("eos_id", INT)),
    ("T5Config/ok-default-t5-small", lambda: None if (t5_mod.T5Config().d_model, t5_mod.T5Config().vocab_size, t5_mod.T5Config().dropout) == (512, 32128, 0.1) else pytest.fail("default"), OK),
    ("T5Config/from_hf-d_kv", lambda: t5_mod.T5Config.from_hf(hf_t5_config(d_kv=3)), err("d_kv", "d_model")),
    ("T5Config/from_hf-gated", lambda: t5_mod.T5Config.from_hf(hf_t5_config(feed_forward_proj="gated-gelu")), err("feed_forward_proj", "relu")),
    ("T5Config/from_hf-untied", lambda: t5_mod.T5Config.from_hf(hf_t5_config(tie_word_embeddings=False)), err("hf_config", "tie")),
    ("T5Config/ok-from_hf", lambda: None if t5_mod.T5Config.from_hf(hf_t5_config()) == t5_config() else pytest.fail("from_hf"), OK),
    ("T5/config-dict", lambda: t5_mod.T5({"vocab_size": V}), err("config", "T5Config")),
    ("T5/no-memory-to-decoder-layer", lambda: t5_mod.T5(t5_config()).decoder.layers[0](rand(2, 3, D, dt=torch.float32)), err("memory", "tensor")),
    ("T5/ok-rms-norm-layers", lambda: None if all(isinstance(s.norm, t5_mod.RMSNorm) for s in t5_mod.T5(t5_config()).modules() if hasattr(s, "norm_first")) else pytest.fail("norm"), OK),
    ("init_t5_weights/ok-other-modules-untouched", lambda: (lin := nn.Linear(2, 2), w := lin.weight.detach().clone(), t5_mod.init_t5_weights(lin, D, FF), None if torch.equal(lin.weight, w) else pytest.fail("changed")), OK),
    ("shift_right/labels-1d", lambda: t5_mod.shift_right(ids(4)), err("labels", FIT)),
    ("shift_right/float-labels", lambda: t5_mod.shift_right(torch.ones(2, 3)), err("labels", INTEGER)),
    ("shift_right/start_id=-1", lambda: t5_mod.shift_right(ids(2, 3), start_id=-1), err("start_id", INT)),
    ("shift_right/pad_id-bool", lambda: t5_mod.shift_right(ids(2, 3), pad_id=True), err("pad_id", INT)),
    ("shift_right/ok-ignore-becomes-pad", lambda: None if t5_mod.shift_right(torch.tensor([[5, -100, -100]]), 2, 7).tolist() == [[2, 5, 7]] else pytest.fail("shift"), OK),
    ("shift_right/ok-length-0", lambda: shape_is(t5_mod.shift_right(torch.zeros(2, 0, dtype=torch.long)), 2, 0), OK),
    ("load_by_names/no-name", lambda: t5_mod.load_by_names(nn.Linear(2, 2), {"w": torch.ones(2, 2)}, {"weight": "w"}, "hint"), err("name", "Hugging Face")),
    ("load_by_names/missing-key", lambda: t5_mod.load_by_names(nn.Linear(2, 2), {"w": torch.ones(2, 2)}, {"weight": "w", "bias": "b"}, "hint"), err("hf_model", "has no")),
    ("load_by_names/wrong-shape", lambda: t5_mod.load_by_names(nn.Linear(2, 2), {"w": torch.ones(3, 2), "b": torch.ones(2)}, {"weight": "w", "bias": "b"}, "hint"), err("hf_model", "shape")),
    ("load_by_names/unused", lambda: t5_mod.load_by_names(nn.Linear(2, 2), {"w": torch.ones(2, 2), "b": torch.ones(2), "x": torch.ones(1)}, {"weight": "w", "bias": "b"}, "hint"), err("hf_model", "no place")),
    ("load_hf_t5/not-t5", lambda: t5_mod.load_hf_t5(M("encoder"), None), err("model", "T5")),
    ("load_hf_t5/no-lm_head", lambda: t5_mod.load_hf_t5(M("t5"), nn.Linear(2, 2)), err("hf_model", "lm_head")),
    ("t5_generate/max_new_tokens=True", lambda: t5_mod.t5_generate(M("t5"), ids(2, 4), True), err("max_new_tokens", INT)),
    ("t5_generate/src-1d", lambda: t5_mod.t5_generate(M("t5"), ids(4), 3), err("src", FIT)),

    # --- vit (Chapter 12)
    ("patchify/patch_size=0", lambda: vit_mod.patchify(torch.zeros(1, 1, 4, 4), 0), err("patch_size", INT)),
    ("patchify/patch_size-float", lambda: vit_mod.patchify(torch.zeros(1, 1, 4, 4), 2.0), err("patch_size", INT)),
    ("patchify/not-tensor", lambda: vit_mod.patchify([[1.0]], 1), err("images", "tensor")),
    ("unpatchify/height=0", lambda: vit_mod.unpatchify(torch.zeros(1, 4, 4), 2, 0, 4), err("height", INT)),
    ("unpatchify/width-bool", lambda: vit_mod.unpatchify(torch.zeros(1, 4, 4), 2, 4, True), err("width", INT)),
    ("ViTConfig/not-multiple", lambda: vit_config(image_size=5), err("image_size|patch_size", "multiple")),
    ("ViTConfig/not-divisible", lambda: vit_config(num_heads=3), err("num_heads|d_model", "divisible")),
    ("ViTConfig/num_classes=-1", lambda: vit_config(num_classes=-1), err("num_classes", INT)),
    ("ViTConfig/num_channels=0", lambda: vit_config(num_channels=0), err("num_channels", INT)),
    ("ViTConfig/dropout=1.0", lambda: vit_config(dropout=1.0), err("dropout", PROB)),
    ("ViTConfig/eps=0", lambda: vit_config(eps=0.0), err("eps", r"\(0")),
    ("ViTConfig/ok-num_patches", lambda: None if vit_config(image_size=8, patch_size=2).num_patches == 16 else pytest.fail("num_patches"), OK),
    ("ViTConfig/from_hf-non-square", lambda: vit_mod.ViTConfig.from_hf(hf_vit_config(image_size=(4, 8))), err("image_size", "square")),
    ("ViTConfig/from_hf-relu", lambda: vit_mod.ViTConfig.from_hf(hf_vit_config(hidden_act="relu")), err("hidden_act", "gelu")),
    ("ViTConfig/from_hf-no-qkv-bias", lambda: vit_mod.ViTConfig.from_hf(hf_vit_config(qkv_bias=False)), err("qkv_bias", "True")),
    ("ViTConfig/from_hf-two-dropouts", lambda: vit_mod.ViTConfig.from_hf(hf_vit_config(hidden_dropout_prob=0.1)), err("hidden_dropout_prob", "one dropout")),
    ("ViTConfig/ok-from_hf", lambda: None if vit_mod.ViTConfig.from_hf(hf_vit_config(), 3) == vit_config() else pytest.fail("from_hf"), OK),
    ("ViT/config-dict", lambda: vit_mod.ViT({"image_size": 4}), err("config", "ViTConfig")),
    ("ViT/no-head", lambda: vit_mod.ViT(vit_config(num_classes=0))(torch.zeros(2, 1, 4, 4)), err("num_classes", "head")),
    ("ViT/ok-features-without-head", lambda: shape_is(vit_mod.ViT(vit_config(num_classes=0)).features(torch.zeros(2, 1, 4, 4)), 2, 5, D), OK),
    ("load_hf_vit/not-vit", lambda: vit_mod.load_hf_vit(M("encoder"), None), err("model", "ViT")),
    ("load_hf_vit/other-kind", lambda: vit_mod.load_hf_vit(M("vit"), nn.Linear(2, 2)), err("num_classes", "ViTForImageClassification")),
    ("shifted/max_shift-float", lambda: vit_mod.shifted(torch.zeros(2, 1, 4, 4), 1.0), err("max_shift", INT)),
    ("image_batches/batch_size=0", lambda: next(vit_mod.image_batches(torch.zeros(4, 1, 4, 4), torch.arange(4), batch_size=0)), err("batch_size", INT)),
    ("image_batches/seed=-1", lambda: next(vit_mod.image_batches(torch.zeros(4, 1, 4, 4), torch.arange(4), seed=-1)), err("seed", INT)),
    ("image_batches/labels-list", lambda: next(vit_mod.image_batches(torch.zeros(4, 1, 4, 4), [0, 1, 2, 3])), err("labels", "shape")),
    ("image_batches/max_shift=-1", lambda: next(vit_mod.image_batches(torch.zeros(4, 1, 4, 4), torch.arange(4), max_shift=-1)), err("max_shift", INT)),
]


# ------------------------------------------------------------------------------------------------ the tests
def test_table_sizes():
    """The tables stay large and their ids unique (a renamed or duplicated case cannot hide another)."""
    all_ids = [c[0] for c in TENSOR_CASES + PLAIN_CASES]
    assert len(set(all_ids)) == len(all_ids), [i for i in all_ids if all_ids.count(i) > 1]
    assert len(all_ids) > 150


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case_id, call, expected", TENSOR_CASES, ids=[c[0] for c in TENSOR_CASES])
def test_tensor_case(case_id, call, expected, dtype):
    try:
        run_case(lambda: call(dtype), expected)
    finally:
        M("model", dtype).eval()      # a case that puts the shared model in train mode must not leak it


@pytest.mark.parametrize("case_id, call, expected", PLAIN_CASES, ids=[c[0] for c in PLAIN_CASES])
def test_plain_case(case_id, call, expected):
    try:
        run_case(call, expected)
    finally:
        M("model").eval()
