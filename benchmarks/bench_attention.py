"""Chapter 1's attention vs PyTorch's fused kernel: forward + backward time, measured in one run.

    .venv/bin/python benchmarks/bench_attention.py [--lengths 128 256 512 1024] [--repeats 5]

Prints, for each sequence length n, the median time of ours (which materialises the (B, h, n, n) weights)
and of torch.nn.functional.scaled_dot_product_attention, and their ratio. Both run on the same inputs in the
same process, so the ratio is meaningful on any machine; the absolute times are not. This is why speed
claims live here and not in the tests.
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from transformer_lib.attention import causal_mask, scaled_dot_product_attention
from transformer_lib.utils import get_device


def median_time(fn, repeats):
    fn()                                                    # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d-k", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    device = get_device()
    print(f"device {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"B={args.batch} h={args.heads} d_k={args.d_k} causal={args.causal}")
    print(f"{'n':>6} {'ours ms':>10} {'torch ms':>10} {'ratio':>7} {'weights MiB':>12}")
    for n in args.lengths:
        shape = (args.batch, args.heads, n, args.d_k)
        Q, K, V = (torch.randn(shape, device=device, requires_grad=True) for _ in range(3))
        mask = causal_mask(n, device=device) if args.causal else None

        def ours(Q=Q, K=K, V=V, mask=mask):
            out, _ = scaled_dot_product_attention(Q, K, V, mask)
            out.sum().backward()

        def theirs(Q=Q, K=K, V=V, mask=mask):
            F.scaled_dot_product_attention(Q, K, V, attn_mask=mask).sum().backward()

        t_ours, t_torch = median_time(ours, args.repeats), median_time(theirs, args.repeats)
        weights_mib = args.batch * args.heads * n * n * 4 / 2**20
        print(f"{n:6d} {1e3 * t_ours:10.1f} {1e3 * t_torch:10.1f} {t_ours / t_torch:6.2f}x {weights_mib:12.1f}")


if __name__ == "__main__":
    main()
