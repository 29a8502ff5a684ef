"""Bad and edge-case inputs to Chapter 14's module (transformer_lib.llama), the options it added to Chapters 2 and
4 (num_kv_heads, rotary, gated), and Chapter 11's ablate_heads.

Same pattern as tests/test_bad_inputs.py: each case is a row (id, call, expected), `expected` being
err(names, phrase) (a ValueError whose message names the user's argument and matches `phrase`) or OK (the call
asserts the documented result itself). TENSOR_CASES take the floating dtype and run on float32 and float64.
"""

import torch
import torch.nn as nn
from helpers import OK, err, table_tests

import transformer_lib.feed_forward as ffn
import transformer_lib.gpt as gpt_mod
import transformer_lib.llama as llm
import transformer_lib.multi_head as mh


def config(**kw):
    return llm.LlamaConfig(**{**dict(vocab_size=11, max_len=16, d_model=8, num_layers=1, num_heads=2,
                                     num_kv_heads=1, d_ff=12), **kw})


def llama(dt, **kw):
    torch.manual_seed(0)
    return llm.Llama(config(**kw)).to(dt).eval()


def ids(*shape, high=11, seed=0):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def rand(*shape, dt=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dt)


def empty_batch(dt):
    out = llama(dt)(ids(0, 5))
    assert out.shape == (0, 5, 11)


def fully_masked_row_is_zero(dt):
    Q = rand(1, 1, 4, 2, dt=dt)
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    mask[..., 1, :] = False
    out = llm.tiled_attention(Q, Q, Q, mask, block_size=2)
    assert torch.equal(out[0, 0, 1], torch.zeros(2, dtype=dt)) and out.isfinite().all()


def window_one_attends_to_itself(dt):
    assert torch.equal(llm.sliding_window_mask(3, 3, 1), torch.eye(3, dtype=torch.bool))


def ablate_nothing(dt):
    torch.manual_seed(0)
    model = gpt_mod.GPT(gpt_mod.GPTConfig(vocab_size=11, max_len=8, d_model=8, num_layers=1, num_heads=2, d_ff=16,
                                          dropout=0.0)).to(dt).eval()
    with gpt_mod.ablate_heads(model, {}):
        assert torch.equal(model(ids(2, 5)), model(ids(2, 5)))


TENSOR_CASES = [
    # --- Llama's door
    ("Llama/tokens-float", lambda dt: llama(dt)(rand(2, 3, dt=dt)), err("tokens", "integer|floating|int")),
    ("Llama/tokens-1d", lambda dt: llama(dt)(ids(5)), err("tokens", r"\(B, length\)|dim")),
    ("Llama/tokens-out-of-vocabulary", lambda dt: llama(dt)(ids(1, 3, high=11) + 11), err("tokens", "vocab|range|< 11")),
    ("Llama/too-long", lambda dt: llama(dt)(ids(1, 17)), err("max_len", "do not fit")),
    ("Llama/mask-2d", lambda dt: llama(dt)(ids(2, 3), mask=torch.ones(2, 3, dtype=torch.bool)), err("mask", "rank|dim|4")),
    ("Llama/mask-float", lambda dt: llama(dt)(ids(2, 3), mask=torch.ones(2, 1, 1, 3)), err("mask", "bool")),
    ("Llama/cache-foreign", lambda dt: llama(dt)(ids(1, 3), cache=[1]), err("cache", "new_cache")),
    ("Llama/empty-batch", empty_batch, OK),
    # --- RotaryEmbedding called directly
    ("RotaryEmbedding/x-wrong-width", lambda dt: llm.RotaryEmbedding(4)(rand(1, 1, 3, 6, dt=dt)), err("x", "d_k=4")),
    ("RotaryEmbedding/offset-negative", lambda dt: llm.RotaryEmbedding(4)(rand(1, 1, 3, 4, dt=dt), -2), err("offset", "int|>=")),
    # --- tiled_attention
    ("tiled_attention/Q-3d", lambda dt: llm.tiled_attention(rand(2, 3, 4, dt=dt), rand(1, 2, 3, 4, dt=dt), rand(1, 2, 3, 4, dt=dt)), err("Q", r"\(B, h, n_q, d\)|dim")),
    ("tiled_attention/K-other-heads", lambda dt: llm.tiled_attention(rand(1, 2, 3, 4, dt=dt), rand(1, 1, 3, 4, dt=dt), rand(1, 1, 3, 4, dt=dt)), err("K", "heads")),
    ("tiled_attention/V-other-length", lambda dt: llm.tiled_attention(rand(1, 2, 3, 4, dt=dt), rand(1, 2, 3, 4, dt=dt), rand(1, 2, 5, 4, dt=dt)), err("K and V", "length")),
    ("tiled_attention/mixed-dtypes", lambda dt: llm.tiled_attention(rand(1, 1, 3, 4, dt=dt), rand(1, 1, 3, 4, dt=torch.float16), rand(1, 1, 3, 4, dt=dt)), err("Q|K", "float16")),
    ("tiled_attention/causal-more-queries", lambda dt: llm.tiled_attention(rand(1, 1, 5, 4, dt=dt), rand(1, 1, 3, 4, dt=dt), rand(1, 1, 3, 4, dt=dt), is_causal=True), err("is_causal", "n_q <= n_k")),
    ("tiled_attention/block_size-0", lambda dt: llm.tiled_attention(rand(1, 1, 3, 4, dt=dt), rand(1, 1, 3, 4, dt=dt), rand(1, 1, 3, 4, dt=dt), block_size=0), err("block_size", "int|>=")),
    ("tiled_attention/scale-negative", lambda dt: llm.tiled_attention(rand(1, 1, 3, 4, dt=dt), rand(1, 1, 3, 4, dt=dt), rand(1, 1, 3, 4, dt=dt), scale=-1.0), err("scale", ">|positive|0")),
    ("tiled_attention/row-with-no-key", fully_masked_row_is_zero, OK),
    # --- ablate_heads (Chapter 11)
    ("ablate_heads/nothing", ablate_nothing, OK),
]

PLAIN_CASES = [
    ("LlamaConfig/odd-d_k", lambda: config(d_model=6, num_heads=2), err("d_model", "even")),
    ("LlamaConfig/kv-heads-not-dividing", lambda: config(num_heads=2, num_kv_heads=3), err("num_heads", "num_kv_heads")),
    ("LlamaConfig/sliding_window-0", lambda: config(sliding_window=0), err("sliding_window", "int|>=")),
    ("LlamaConfig/rope_base-1", lambda: config(rope_base=1.0), err("rope_base", "lie in")),
    ("LlamaConfig/dropout-1", lambda: config(dropout=1.0), err("dropout", "lie in")),
    ("LlamaConfig/tie-not-bool", lambda: config(tie_embeddings=1), err("tie_embeddings", "True or False")),
    ("Llama/config-dict", lambda: llm.Llama({"d_model": 8}), err("config", "LlamaConfig")),
    ("llama_block/config-dict", lambda: llm.llama_block({}, llm.RotaryEmbedding(4)), err("config", "LlamaConfig")),
    ("llama_hf_names/not-llama", lambda: llm.llama_hf_names(nn.Linear(2, 2)), err("model", "Llama")),
    ("load_hf_llama/not-a-module", lambda: llm.load_hf_llama(llm.Llama(config()), {"a": 1}), err("hf_model", "Hugging Face|nn.Module")),
    ("sliding_window_mask/n_k<n_q", lambda: llm.sliding_window_mask(4, 3, 2), err("n_k", "n_q")),
    ("sliding_window_mask/window-0", lambda: llm.sliding_window_mask(3, 3, 0), err("window", "int|>=")),
    ("sliding_window_mask/window-1", lambda: window_one_attends_to_itself(None), OK),
    ("RotaryEmbedding/odd", lambda: llm.RotaryEmbedding(5), err("d_k", "even")),
    ("LoRALinear/not-linear", lambda: llm.LoRALinear(nn.Conv1d(2, 2, 1)), err("base", "nn.Linear")),
    ("LoRALinear/rank-too-big", lambda: llm.LoRALinear(nn.Linear(4, 3), rank=4), err("rank", "min")),
    ("LoRALinear/alpha-0", lambda: llm.LoRALinear(nn.Linear(4, 3), rank=2, alpha=0.0), err("alpha", ">|positive|0")),
    ("add_lora/targets-str", lambda: llm.add_lora(llm.Llama(config()), targets="W_q"), err("targets", "list")),
    ("add_lora/no-such-layer", lambda: llm.add_lora(llm.Llama(config()), targets=("q_proj",)), err("model", "no nn.Linear named")),
    ("add_lora/not-a-module", lambda: llm.add_lora("model"), err("model", "nn.Module")),
    ("merge_lora/nothing-to-merge", lambda: llm.merge_lora(llm.Llama(config())), err("model", "add_lora")),
    ("MultiHeadAttention/num_kv_heads-3", lambda: mh.MultiHeadAttention(8, 2, num_kv_heads=3), err("num_heads", "num_kv_heads")),
    ("MultiHeadAttention/num_kv_heads-0", lambda: mh.MultiHeadAttention(8, 2, num_kv_heads=0), err("num_kv_heads", "int|>=")),
    ("MultiHeadAttention/rotary-function", lambda: mh.MultiHeadAttention(8, 2, rotary=lambda x, t: x), err("rotary", "module")),
    ("PositionwiseFeedForward/gated-not-bool", lambda: ffn.PositionwiseFeedForward(8, 16, gated="yes"), err("gated", "True or False")),
    ("copy_to_torch_mha/gqa", lambda: mh.copy_to_torch_mha(mh.MultiHeadAttention(8, 2, num_kv_heads=1), nn.MultiheadAttention(8, 2, batch_first=True)), err("mha", "num_kv_heads")),
    ("ablate_heads/head-out-of-range", lambda: gpt_mod.ablate_heads(gpt_mod.GPT(gpt_mod.GPTConfig(vocab_size=11, max_len=8, d_model=8, num_layers=1, num_heads=2, d_ff=16)), {0: [5]}).__enter__(), err("heads", "head|range|<")),
]

test_case_ids_unique, test_tensor_case, test_plain_case = table_tests(TENSOR_CASES, PLAIN_CASES)
