"""Chapter 14: the Llama-style decoder, proven equal to Hugging Face's LlamaForCausalLM / MistralForCausalLM in
float64, its parts (RoPE, GQA with the KV cache, SwiGLU), tiled attention against SDPA, and LoRA."""

import dataclasses
import types

import pytest
import torch
import torch.nn.functional as F
from helpers import import_hf, max_diff

from transformer_lib.attention import causal_mask
from transformer_lib.complexity import saved_tensor_bytes
from transformer_lib.feed_forward import PositionwiseFeedForward
from transformer_lib.llama import (
    Llama,
    LlamaConfig,
    LoRALinear,
    RotaryEmbedding,
    add_lora,
    llama_hf_names,
    load_hf_llama,
    merge_lora,
    sliding_window_mask,
    tiled_attention,
    to_hf_llama,
)
from transformer_lib.multi_head import AttentionCache, MultiHeadAttention
from transformer_lib.sampling import generate

F64 = torch.float64


def small(**kw):
    base = dict(vocab_size=50, max_len=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=48)
    return LlamaConfig(**{**base, **kw})


def ids(B, T, seed=0, V=50):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def rms_norm_in_float64(self, hidden_states):
    """Hugging Face's LlamaRMSNorm.forward without its .to(torch.float32): the statistic in float64."""
    return self.weight * (hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True)
                                                      + self.variance_epsilon))


def hf_tolerance():
    """How close float64 can get to Hugging Face's Llama. Before transformers 4.46 LlamaForCausalLM and
    MistralForCausalLM return their logits converted to float32: against those releases (the floor, `make
    test-floor`) the models agree to about 1e-8. A wrong weight, mask or rotation is off by far more."""
    from packaging.version import Version

    return 1e-6 if Version(import_hf("transformers").__version__) < Version("4.46") else 1e-12


def hf_model(kind="Llama", seed=0, **kw):
    transformers = import_hf("transformers")
    cfg = getattr(transformers, f"{kind}Config")(vocab_size=50, hidden_size=32, intermediate_size=48,
                                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                 max_position_embeddings=64, rms_norm_eps=1e-5,
                                                 attn_implementation="sdpa", **kw)
    torch.manual_seed(seed)
    hf = getattr(transformers, f"{kind}ForCausalLM")(cfg).double().eval()
    for module in hf.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(rms_norm_in_float64, module)
    ours = load_hf_llama(Llama(LlamaConfig.from_hf(cfg)).double().eval(), hf)
    return ours, hf


def test_rope_scores_depend_on_the_offset_only_and_position_zero_is_the_identity():
    rope = RotaryEmbedding(16).double()
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(16, generator=g, dtype=F64), torch.randn(16, generator=g, dtype=F64)

    def at(x, m):
        return rope(x.view(1, 1, 1, -1), m).view(-1)
    for offset in (0, 5, 40):
        scores = torch.stack([at(q, n + offset) @ at(k, n) for n in (0, 3, 20)])
        assert (scores - scores[0]).abs().max() < 1e-5
    assert torch.equal(at(q, 0), q)
    assert abs(at(q, 9) @ at(k, 2) - q @ k) > 1e-3                    # a real rotation


def test_rope_equals_hugging_face():
    transformers = import_hf("transformers")
    from transformers.models.llama import modeling_llama
    hf = modeling_llama.LlamaRotaryEmbedding(config=transformers.LlamaConfig(hidden_size=64, num_attention_heads=4))
    x = torch.randn(2, 4, 30, 16, dtype=F64, generator=torch.Generator().manual_seed(1))
    cos, sin = hf(x, torch.arange(30)[None].expand(2, 30))
    assert max_diff(RotaryEmbedding(16).double()(x), modeling_llama.apply_rotary_pos_emb(x, x, cos, sin)[0]) < 1e-15


def test_rope_rejects_odd_width_and_bad_offset():
    with pytest.raises(ValueError, match="d_k must be even"):
        RotaryEmbedding(7)
    with pytest.raises(ValueError, match="offset"):
        RotaryEmbedding(8)(torch.randn(1, 1, 2, 8), -1)
    with pytest.raises(ValueError, match="x"):
        RotaryEmbedding(8)(torch.randn(1, 1, 2, 6))


@pytest.mark.parametrize("kind", ["Llama", "Mistral"])
def test_model_equals_hugging_face_with_padding_loss_and_cache(kind):
    tol = hf_tolerance()
    ours, hf = hf_model(kind, **({"sliding_window": 5} if kind == "Mistral" else {}))
    x = ids(3, 40, seed=2)
    keep = torch.ones(3, 40, dtype=torch.bool)
    keep[1, 30:], keep[2, 9:] = False, False
    with torch.no_grad():
        assert max_diff(ours(x), hf(x).logits) < tol
        a, b = ours(x, mask=keep[:, None, None, :]), hf(x, attention_mask=keep.long()).logits
        assert max(max_diff(a[r, keep[r]], b[r, keep[r]]) for r in range(3)) < tol
        labels = x.masked_fill(~keep, -100)
        loss = F.cross_entropy(a[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        assert abs(loss - hf(x, attention_mask=keep.long(), labels=labels).loss) < 1e-6
        cache = ours.new_cache()
        steps = [ours(x[:, :7], cache=cache)] + [ours(x[:, i:i + 1], cache=cache) for i in range(7, 40)]
        assert max_diff(torch.cat(steps, 1), hf(x).logits) < tol
        assert cache[0][0].k.shape == (3, 2, 40, 8)                        # only the 2 K/V heads are cached


def test_sliding_window_is_tested_against_a_wrong_window_and_the_mask_is_a_band():
    ours, hf = hf_model("Mistral", sliding_window=5)
    x = ids(2, 30, seed=3)
    with torch.no_grad():
        for w in (4, 6):
            other = Llama(dataclasses.replace(ours.config, sliding_window=w)).double().eval()
            other.load_state_dict(ours.state_dict())
            assert max_diff(other(x), hf(x).logits) > 1e-3
    m = sliding_window_mask(4, 6, 3)
    assert m.tolist() == [[(q - 3 < j <= q) for j in range(6)] for q in range(2, 6)]


def test_to_hf_round_trip_and_tied_output_layer():
    transformers = import_hf("transformers")
    ours, hf = hf_model()
    back = to_hf_llama(ours, transformers.LlamaForCausalLM(hf.config).double())
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), hf.state_dict().values(), strict=True))
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True)
    tied = load_hf_llama(Llama(LlamaConfig.from_hf(cfg)), transformers.LlamaForCausalLM(cfg))
    assert tied.lm_head is None and "lm_head.weight" not in llama_hf_names(tied)


def test_from_hf_refuses_what_llama_does_not_build():
    transformers = import_hf("transformers")
    for kw, name in ((dict(hidden_act="gelu"), "hidden_act"), (dict(attention_bias=True), "attention_bias"),
                     (dict(mlp_bias=True), "mlp_bias")):
        cfg = transformers.LlamaConfig(hidden_size=32, num_attention_heads=4, **kw)
        with pytest.raises(ValueError, match=name):
            LlamaConfig.from_hf(cfg)


def test_load_refuses_another_family():
    transformers = import_hf("transformers")
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=50))
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        load_hf_llama(Llama(small()), gpt2)


def test_gqa_cache_holds_kv_heads_and_decoding_equals_recompute():
    torch.manual_seed(0)
    model = Llama(small(num_layers=3, num_kv_heads=1)).double().eval()
    prompt = ids(3, 6, seed=4)
    assert torch.equal(generate(model, prompt, 20, temperature=0.0), generate(model, prompt, 20, temperature=0.0,
                                                                               use_cache=False))
    attn = MultiHeadAttention(32, 4, dropout=0.0, num_kv_heads=2)
    assert attn.W_k.weight.shape == (16, 32) and attn.W_v.weight.shape == (16, 32)
    cache = AttentionCache()
    x = torch.randn(2, 5, 32)
    attn(x, x, x, cache=cache, is_causal=True)
    assert cache.k.shape == (2, 2, 5, 8)


def test_gqa_equals_mha_with_each_kv_head_repeated():
    """GQA = MHA whose W_k and W_v repeat each K/V head for the query heads of its group."""
    g = torch.Generator().manual_seed(5)
    gqa = MultiHeadAttention(32, 4, dropout=0.0, num_kv_heads=2).double()
    mha = MultiHeadAttention(32, 4, dropout=0.0).double()
    with torch.no_grad():
        for p in gqa.parameters():
            p.normal_(generator=g)
        for W in ("W_q", "W_o"):
            getattr(mha, W).load_state_dict(getattr(gqa, W).state_dict())
        for W in ("W_k", "W_v"):
            heads = getattr(gqa, W).weight.view(2, 8, 32).repeat_interleave(2, dim=0).reshape(32, 32)
            getattr(mha, W).weight.copy_(heads)
            getattr(mha, W).bias.copy_(getattr(gqa, W).bias.view(2, 8).repeat_interleave(2, dim=0).reshape(32))
    x = torch.randn(2, 7, 32, dtype=F64, generator=g)
    mask = causal_mask(7)[None, None]
    assert max_diff(gqa(x, x, x, mask)[0], mha(x, x, x, mask)[0]) < 1e-11
    assert max_diff(gqa(x, x, x, mask, need_weights=True)[0], mha(x, x, x, mask)[0]) < 1e-11


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="num_kv_heads"):
        MultiHeadAttention(32, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="rotary"):
        MultiHeadAttention(32, 4, rotary=lambda x, t: x)
    with pytest.raises(ValueError, match="num_kv_heads"):
        small(num_kv_heads=3)
    with pytest.raises(ValueError, match="config"):
        Llama({"d_model": 32})
    with pytest.raises(ValueError, match="tokens"):
        Llama(small())(torch.randn(2, 3))
    with pytest.raises(ValueError, match="max_len"):
        Llama(small())(ids(1, 65))
    with pytest.raises(ValueError, match="cache"):
        Llama(small())(ids(1, 3), cache=[])


def test_swiglu_is_the_gated_ffn():
    ffn = PositionwiseFeedForward(8, 12, dropout=0.0, activation="silu", bias=False, gated=True).double()
    x = torch.randn(3, 8, dtype=F64)
    want = (F.silu(x @ ffn.linear1.weight.T) * (x @ ffn.linear_up.weight.T)) @ ffn.linear2.weight.T
    assert max_diff(ffn(x), want) < 1e-14
    assert PositionwiseFeedForward(8, 12).linear_up is None


def tiled_case(B, h, n_q, n_k, d, block, causal=False, mask=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    Q, K, V = (torch.randn(B, h, n, d, generator=g, dtype=F64, requires_grad=True) for n in (n_q, n_k, n_k))
    full = mask
    if causal:
        c = causal_mask(n_q, n_k)[None, None]
        full = c if mask is None else mask & c
    out, want = tiled_attention(Q, K, V, mask, causal, block), F.scaled_dot_product_attention(Q, K, V, attn_mask=full)
    d_out = torch.randn_like(out)
    got_g, want_g = torch.autograd.grad(out, (Q, K, V), d_out), torch.autograd.grad(want, (Q, K, V), d_out)
    return max([max_diff(out, want)] + [max_diff(a, b) for a, b in zip(got_g, want_g, strict=True)])


@pytest.mark.parametrize("block", [1, 5, 16, 100])
def test_tiled_attention_equals_sdpa_forward_and_backward(block):
    pad = torch.ones(2, 1, 1, 33, dtype=torch.bool)
    pad[1, ..., 20:] = False
    assert tiled_case(2, 3, 33, 33, 8, block, causal=True) < 1e-12
    assert tiled_case(2, 3, 33, 33, 8, block, mask=pad) < 1e-12
    assert tiled_case(2, 3, 33, 33, 8, block, causal=True, mask=pad) < 1e-12
    assert tiled_case(2, 2, 4, 33, 8, block, causal=True) < 1e-12                 # decoding: n_q < n_k


def test_tiled_attention_row_without_keys_is_zero_and_gradcheck_passes():
    empty = torch.ones(1, 1, 6, 6, dtype=torch.bool)
    empty[..., 2, :] = False
    Q, K, V = (torch.randn(1, 2, 6, 4, dtype=F64, requires_grad=True) for _ in range(3))
    out = tiled_attention(Q, K, V, empty, block_size=4)
    assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))
    assert torch.autograd.gradcheck(lambda q, k, v: tiled_attention(q, k, v, empty, True, 3), (Q, K, V))


def test_tiled_attention_keeps_linear_memory():
    kept = []
    for n in (128, 256, 512):
        Q, K, V = (torch.randn(1, 1, n, 16, requires_grad=True) for _ in range(3))
        kept.append(saved_tensor_bytes(tiled_attention, Q, K, V, is_causal=True, block_size=32))
    assert kept[1] == 2 * kept[0] and kept[2] == 2 * kept[1]


def test_tiled_attention_bad_input():
    Q = torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match="K"):
        tiled_attention(Q, torch.randn(1, 3, 5, 4), Q)
    with pytest.raises(ValueError, match="is_causal"):
        tiled_attention(Q, Q[:, :, :3], Q[:, :, :3], is_causal=True)
    with pytest.raises(ValueError, match="mask"):
        tiled_attention(Q, Q, Q, mask=torch.ones(5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="block_size"):
        tiled_attention(Q, Q, Q, block_size=0)


def test_lora_starts_as_the_base_trains_only_adapters_and_merges_exactly():
    torch.manual_seed(0)
    model = Llama(small()).double().eval()
    x = ids(2, 10, seed=6)
    with torch.no_grad():
        before = model(x)
    add_lora(model, rank=2, alpha=4.0)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert sum(isinstance(m, LoRALinear) for m in model.modules()) == 2 * 2      # W_q and W_v of 2 blocks
    with torch.no_grad():
        assert torch.equal(model(x), before)                                      # B = 0
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.normal_()
        adapted = model(x)
        assert max_diff(adapted, before) > 1e-3
        merged = merge_lora(model)
        assert not any(isinstance(m, LoRALinear) for m in merged.modules())
        assert max_diff(merged(x), adapted) < 1e-12


def test_lora_bad_input():
    with pytest.raises(ValueError, match="no nn.Linear named"):
        add_lora(Llama(small()), targets=("q_proj",))
    with pytest.raises(ValueError, match="targets"):
        add_lora(Llama(small()), targets="W_q")
    with pytest.raises(ValueError, match="rank"):
        LoRALinear(torch.nn.Linear(4, 3), rank=4)
    with pytest.raises(ValueError, match="add_lora first"):
        merge_lora(Llama(small()))


def test_lora_equals_peft():
    peft = pytest.importorskip("peft", reason="peft is optional: pip install peft to compare LoRA with it")
    torch.manual_seed(0)
    base = Llama(small()).double().eval()
    ours = add_lora(__import__("copy").deepcopy(base), rank=2, alpha=4.0)
    theirs = peft.get_peft_model(base, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["W_q", "W_v"],
                                                      lora_dropout=0.0))
    with torch.no_grad():
        for name, m in ours.named_modules():
            if isinstance(m, LoRALinear):
                m.lora_B.normal_()
                layer = theirs.base_model.model.get_submodule(name)
                layer.lora_A["default"].weight.copy_(m.lora_A)
                layer.lora_B["default"].weight.copy_(m.lora_B)
        x = ids(2, 9, seed=7)
        assert max_diff(ours(x), theirs(x)) < 1e-12
