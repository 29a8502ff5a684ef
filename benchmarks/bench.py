"""The book's performance as ratios measured in one run: `make bench` (prints one table, writes JSON).

    .venv/bin/python benchmarks/bench.py [--json _build/bench.json] [--quick] [--repeats 5] [--only 1 3]

1. training step (forward + backward) of transformer_lib's encoder-decoder stacks vs nn.Transformer carrying the
   same weights (d_model 256, 3 + 3 layers, batch 16 x 128 tokens), CPU threads as given; plus a prototype of
   what nn.Transformer does beyond us, one fused Q/K/V product (patched onto a copy, not in the library;
   the other difference, LayerNorm as one fused kernel, is in the library since this benchmark measured it);
2. greedy decoding of 256 new tokens with the KV cache vs recomputing the prefix;
3. Chapter 1's explicit attention vs PyTorch's fused SDPA, time and memory, n = 128 ... 2048;
4. on a GPU: tokens/s and model-FLOPs utilisation (bf16) of the training step, from complexity.py's counts.

Ratios are measured in one process, ours and theirs alternating, so they mean something on any machine; the
absolute times do not (and are inflated when the machine is busy). On a machine shared with other jobs, every
multi-threaded CPU operation can wait milliseconds for its threads (oversubscription): decoding, made of
thousands of tiny operations, then measures that wait, not the model. Run it with OMP_NUM_THREADS=1 there.
"""

import argparse
import copy
import json
import platform
import statistics
import time
import types
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from transformer_lib.attention import scaled_dot_product_attention
from transformer_lib.complexity import (
    explicit_attention_saved_bytes,
    fused_attention_saved_bytes,
    saved_tensor_bytes,
    transformer_flops,
)
from transformer_lib.decoding import greedy_decode
from transformer_lib.model import Transformer, TransformerConfig, transformer_to_torch
from transformer_lib.multi_head import MultiHeadAttention
from transformer_lib.validation import checks_due


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def paired_times(fns: dict, repeats: int, warmup: bool = True) -> dict:
    """Median seconds of each function; the functions alternate within every repeat so load drifts hit all."""
    for fn in fns.values() if warmup else ():
        fn()                                                    # warm-up
    times = {name: [] for name in fns}
    cpu_times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            start, cpu_start = time.perf_counter(), time.process_time()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)
            cpu_times[name].append(time.process_time() - cpu_start)
    LAST_CPU_TIMES.clear()
    LAST_CPU_TIMES.update({name: statistics.median(t) for name, t in cpu_times.items()})
    return {name: statistics.median(t) for name, t in times.items()}


LAST_CPU_TIMES = {}   # CPU seconds of the last paired_times call: less disturbed than wall time on a busy machine


# ----- prototypes: what nn.Transformer does that our modules do not (patched onto copies, never the library) -----
def fused_qkv_forward(self, query, key, value, mask=None, need_weights=False, cache=None, attn_bias=None,
                      is_causal=False, position_ids=None):
    """Self-attention with one (3 d_model x d_model) product for Q, K and V, as nn.MultiheadAttention's in_proj."""
    if (not (query is key is value) or need_weights or cache is not None or attn_bias is not None
            or (is_causal and mask is not None) or self.rotary is not None):
        return MultiHeadAttention.forward(self, query, key, value, mask, need_weights, cache, attn_bias, is_causal,
                                          position_ids)
    if checks_due():
        self._check_inputs(query, key, value, mask, need_weights, cache)
    weight = torch.cat([self.W_q.weight, self.W_k.weight, self.W_v.weight])      # (3 d_model, d_model)
    bias = torch.cat([self.W_q.bias, self.W_k.bias, self.W_v.bias])
    Q, K, V = (self.split_heads(t) for t in F.linear(query, weight, bias).chunk(3, dim=-1))
    p = self.dropout.p if self.training else 0.0
    out = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask, dropout_p=p, is_causal=is_causal)
    return self.W_o(self.merge_heads(out)), None


def patched(model):
    model = copy.deepcopy(model)
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.forward = types.MethodType(fused_qkv_forward, module)
    return model


def bench_training_step(args, device):
    torch.manual_seed(0)
    c = TransformerConfig(src_vocab_size=1000, tgt_vocab_size=1000, d_model=args.d_model, num_heads=8,
                          d_ff=4 * args.d_model, num_encoder_layers=args.layers, num_decoder_layers=args.layers,
                          dropout=0.1)
    ours = Transformer(c).to(device)
    theirs = transformer_to_torch(ours)
    B, n = args.batch, args.tokens
    x = torch.randn(B, n, c.d_model, device=device)            # embedded source and target: the stacks only
    y = torch.randn(B, n, c.d_model, device=device)
    causal = nn.Transformer.generate_square_subsequent_mask(n, device=device)

    def step_ours(model):
        def run():
            model.decoder(y, model.encoder(x)).sum().backward()
        return run

    def step_theirs():
        theirs(x, y, tgt_mask=causal, tgt_is_causal=True).sum().backward()

    # The prototype computes the same function: check in float64 with dropout off, before timing.
    check = Transformer(TransformerConfig(**{**c.__dict__, "dropout": 0.0})).double().to(device)
    xs, ys = x.double()[:2, :9], y.double()[:2, :9]
    reference = transformer_to_torch(check)(xs, ys, tgt_mask=causal[:9, :9].double(), tgt_is_causal=True)
    for variant in [check, patched(check)]:
        diff = (variant.decoder(ys, variant.encoder(xs)) - reference).abs().max().item()
        assert diff < 1e-12, diff

    fns = {"ours": step_ours(ours), "nn.Transformer": step_theirs,
           "ours + fused QKV (prototype)": step_ours(patched(ours))}
    t = paired_times(fns, args.repeats)
    cpu = dict(LAST_CPU_TIMES)
    rows = [{"item": "1. training step", "case": name, "ms": 1e3 * s, "ratio": t["nn.Transformer"] / s,
             "ratio_means": "nn.Transformer time / this time (>= 1: at least as fast as PyTorch)",
             "cpu_ratio": cpu["nn.Transformer"] / cpu[name]} for name, s in t.items()]
    return rows


def bench_decoding(args, device):
    torch.manual_seed(0)
    c = TransformerConfig(src_vocab_size=1000, tgt_vocab_size=1000, d_model=args.d_model, num_heads=8,
                          d_ff=4 * args.d_model, num_encoder_layers=args.layers, num_decoder_layers=args.layers,
                          dropout=0.0)
    model = Transformer(c).to(device).eval()
    eos = 3
    with torch.no_grad():
        model.tgt_embed.embedding.weight[eos].zero_()           # logit of EOS is 0: never the argmax in practice
    src = torch.randint(4, 1000, (args.decode_batch, 32), device=device)
    outputs = {}

    def run(use_cache):
        def fn():
            with torch.no_grad():
                outputs[use_cache] = greedy_decode(model, src, bos_id=1, eos_id=eos, max_new_tokens=args.new_tokens,
                                                   use_cache=use_cache)[0]
        return fn

    t = paired_times({"with KV cache": run(True), "recomputing the prefix": run(False)},
                     max(1, args.repeats // 2), warmup=False)
    assert outputs[True].shape[1] == args.new_tokens and torch.equal(outputs[True], outputs[False])   # same tokens
    return [{"item": f"2. greedy decoding, {args.decode_batch} x {args.new_tokens} tokens", "case": name, "ms": 1e3 * s,
             "ratio": t["recomputing the prefix"] / s, "ratio_means": "time without cache / this time"}
            for name, s in t.items()]


def bench_attention(args, device):
    rows = []
    B, h, d_k = 1, 8, 64
    for n in args.lengths:
        Q, K, V = (torch.randn(B, h, n, d_k, device=device, requires_grad=True) for _ in range(3))

        def explicit(Q=Q, K=K, V=V):
            scaled_dot_product_attention(Q, K, V)[0].sum().backward()

        def fused(Q=Q, K=K, V=V):
            F.scaled_dot_product_attention(Q, K, V).sum().backward()

        t = paired_times({"explicit": explicit, "fused SDPA": fused}, args.repeats)
        saved = {"explicit": saved_tensor_bytes(scaled_dot_product_attention, Q, K, V),
                 "fused SDPA": saved_tensor_bytes(F.scaled_dot_product_attention, Q, K, V)}
        if device.type == "cpu":
            assert saved["explicit"] == explicit_attention_saved_bytes(B * h, n, n, d_k)
            assert saved["fused SDPA"] == fused_attention_saved_bytes(B * h, n, n, d_k)
        for name, s in t.items():
            row = {"item": f"3. attention n={n}", "case": name, "ms": 1e3 * s, "ratio": t["explicit"] / s,
                   "ratio_means": "explicit time / this time", "saved_MiB": saved[name] / 2**20}
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                (explicit if name == "explicit" else fused)()
                row["peak_MiB"] = (torch.cuda.max_memory_allocated() - base) / 2**20
            rows.append(row)
    return rows


PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}    # dense bf16 tensor-core peaks


def bench_gpu(args, device):
    if device.type != "cuda":
        return [{"item": "4. GPU training step (bf16)", "case": "skipped: no GPU", "ms": None, "ratio": None}]
    torch.manual_seed(0)
    c = TransformerConfig.base(vocab_size=32000, dropout=0.1)
    model = Transformer(c).to(device)
    B, n = args.gpu_batch, args.gpu_tokens
    src = torch.randint(1, 32000, (B, n), device=device)
    tgt = torch.randint(1, 32000, (B, n), device=device)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(src, tgt)
        F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten()).backward()

    s = paired_times({"step": step}, args.repeats)["step"]
    flops = transformer_flops(c, B, n, n, backward=True)
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
    return [{"item": "4. GPU training step (bf16)", "case": f"base model, B={B}, S=T={n}, {name}", "ms": 1e3 * s,
             "ratio": None, "tokens_per_s": 2 * B * n / s, "TFLOPs": flops / s / 1e12,
             "MFU": None if peak is None else flops / s / 1e12 / peak}]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="_build/bench.json")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--decode-batch", type=int, default=8, help="sentences decoded together in item 2")
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024, 2048])
    parser.add_argument("--gpu-batch", type=int, default=32)
    parser.add_argument("--gpu-tokens", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--only", type=int, nargs="+", choices=[1, 2, 3, 4], default=[1, 2, 3, 4],
                        help="run only these items")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.d_model, args.layers, args.batch, args.tokens = 3, 64, 1, 4, 32
        args.new_tokens, args.lengths, args.gpu_batch, args.gpu_tokens = 32, [128, 256], 4, 64
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    header = (f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
              f"{platform.processor() or platform.machine()}")
    print(header)
    rows = []
    benches = (bench_training_step, bench_decoding, bench_attention, bench_gpu)
    for bench in (benches[i - 1] for i in args.only):
        new = bench(args, device)
        rows += new
        for r in new:
            ms = "" if r["ms"] is None else f"{r['ms']:10.1f}"
            ratio = "" if r.get("ratio") is None else f"{r['ratio']:7.2f}x"
            extra = "".join(f"  {k} {r[k]:,.1f}" for k in ("saved_MiB", "peak_MiB", "tokens_per_s", "TFLOPs")
                            if r.get(k) is not None)
            if r.get("cpu_ratio") is not None:
                extra += f"  (by CPU time {r['cpu_ratio']:.2f}x)"
            if r.get("MFU") is not None:
                extra += f"  MFU {r['MFU']:.1%}"
            print(f"{r['item']:34} {r['case']:30} {ms:>10} ms {ratio:>8}{extra}", flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"header": header, "args": vars(args), "rows": rows}, indent=1))
    print(f"written {args.json}")


if __name__ == "__main__":
    main()
