"""The graders of Chapter 9's exercises (what the Transformer costs), imported by the chapter's exercise cells.

Hand-written, not exported from the chapter: a grader's reference and named slips are the answers, and Colab shows
every cell of a chapter, so their code stays out of the chapters."""

__all__ = ['check_encoder_layer_flops', 'check_decoder_layer_flops', 'check_training_crossover', 'check_cached_decode_flops']

import math
import random

import torch

from ..complexity import count_flops, ffn_flops, mha_flops
from ..decoder import DecoderLayer
from ..encoder import EncoderLayer
from ..model import TransformerConfig
from .grading import grade


def check_encoder_layer_flops(fn, seed: int = 0) -> None:
    """Test fn(B, n, d_model, d_ff) -> the forward FLOPs (matrix products) of one EncoderLayer on a (B, n, d_model)
    input against FlopCounterMode, on 5 random sizes. Raises AssertionError naming the mistake (products counted
    as m k p, a missing projection, n^2 term or FFN); prints a verdict."""
    rng = random.Random(seed)
    flops = {}                                                  # (B, n, d_model, d_ff): FlopCounterMode's count
    for _ in range(5):
        h = rng.choice([1, 2, 4])
        B, n, d, d_ff = rng.randint(1, 3), rng.randint(2, 9), 2 * h * rng.randint(1, 3), rng.randint(3, 20)
        with torch.random.fork_rng():                           # leaves the reader's random state alone
            flops[B, n, d, d_ff] = count_flops(EncoderLayer(d, h, d_ff, dropout=0.0).eval(), torch.randn(B, n, d))

    def less(term):                                             # the count without a term
        return lambda B, n, d, d_ff: flops[B, n, d, d_ff] - term(B, n, d, d_ff)
    mistakes = {
        "half: a product of (m x k) and (k x p) matrices is 2·m·k·p FLOPs (multiply and add), not m·k·p":
            lambda *case: flops[case] // 2,
        "the n^2 terms (Q K^T and weights V, 2·2·B·n·n·d_model) are missing": less(lambda B, n, d, f: 4 * B * n * n * d),
        "one of the two n^2 products is missing: Q K^T and weights V each cost 2·B·n·n·d_model":
            less(lambda B, n, d, f: 2 * B * n * n * d),
        "one d_model x d_model projection is missing: W_q, W_k, W_v and W_o make four":
            less(lambda B, n, d, f: 2 * B * n * d * d),
        "the feed-forward network (two products, 2·2·B·n·d_model·d_ff) is missing":
            less(lambda B, n, d, f: 4 * B * n * d * f),
    }
    grade(fn, lambda *case: flops[case], {f"B={B}, n={n}, d_model={d}, d_ff={d_ff}": (B, n, d, d_ff)
                                          for B, n, d, d_ff in flops}, mistakes, scale=1e-5,
          says="expected {want} FLOPs, got {got:g}", hint=lambda got, *case: f" (off by {got - flops[case]:+g})")
    print("check_encoder_layer_flops: correct on 5 random sizes")


def _decoder_terms(B, n, S, d, f) -> dict:
    """One DecoderLayer's forward FLOPs (matrix products), term by term: the reference's parts and its slips'."""
    return {"self projections": 8 * B * n * d * d, "self n^2": 4 * B * n * n * d,
            "cross q o": 4 * B * n * d * d, "cross k v": 4 * B * S * d * d, "cross scores": 4 * B * n * S * d,
            "ffn": 4 * B * n * d * f}


def _decoder_slips() -> dict:
    def less(*names, plus=lambda t, B, n, S, d, f: 0):
        return lambda B, n, S, d, f: (sum(_decoder_terms(B, n, S, d, f).values())
                                      - sum(_decoder_terms(B, n, S, d, f)[k] for k in names)
                                      + plus(None, B, n, S, d, f))
    return {
        "half: a product of (m x k) and (k x p) matrices is 2·m·k·p FLOPs (multiply and add), not m·k·p":
            lambda *case: sum(_decoder_terms(*case).values()) // 2,
        "the cross-attention is missing: a decoder layer has two attentions, the masked self-attention and the "
        "attention over the memory": less("cross q o", "cross k v", "cross scores"),
        "the cross-attention's keys and values project the target's n positions: they project the memory's S":
            less("cross k v", plus=lambda t, B, n, S, d, f: 4 * B * n * d * d),
        "the cross-attention's scores and weighted sum run over n keys: their keys are the S memory positions":
            less("cross scores", plus=lambda t, B, n, S, d, f: 4 * B * n * n * d),
        "the cross-attention's scores and weighted sum (2·2·B·n·S·d_model) are missing": less("cross scores"),
        "the projection of the memory into the cross-attention's keys and values (2·2·B·S·d_model^2) is missing":
            less("cross k v"),
        "the self-attention's n^2 terms (Q K^T and weights V, 2·2·B·n·n·d_model) are missing": less("self n^2"),
        "one d_model x d_model projection is missing: each attention has four, W_q, W_k, W_v and W_o": [
            less(plus=lambda t, B, n, S, d, f: -2 * B * n * d * d),
            less(plus=lambda t, B, n, S, d, f: -2 * B * S * d * d)],
        "the feed-forward network (two products, 2·2·B·n·d_model·d_ff) is missing": less("ffn"),
        "the batch size is missing: every product runs for each of the B sequences":
            lambda B, n, S, d, f: sum(_decoder_terms(1, n, S, d, f).values()),
    }


def check_decoder_layer_flops(fn, seed: int = 0) -> None:
    """Test fn(B, n, S, d_model, d_ff) -> the forward FLOPs (matrix products) of one DecoderLayer on a (B, n, d_model)
    target with a (B, S, d_model) memory, against FlopCounterMode, on 5 random sizes whose slips all differ. Raises
    AssertionError naming the mistake; prints a verdict."""
    rng, flops, slips = random.Random(seed), {}, _decoder_slips()
    while len(flops) < 5:
        h = rng.choice([1, 2, 4])
        case = (rng.randint(2, 4), rng.randint(2, 9), rng.randint(2, 9), 2 * h * rng.randint(1, 3), rng.randint(3, 20))
        values = [sum(_decoder_terms(*case).values())] + [
            w(*case) for m in slips.values() for w in (m if isinstance(m, list) else [m])]
        if len(set(values)) < len(values) or case in flops:            # two slips alike: their names would not tell
            continue
        B, n, S, d, d_ff = case
        with torch.random.fork_rng():                                   # leaves the reader's random state alone
            layer = DecoderLayer(d, h, d_ff, dropout=0.0).eval()
            flops[case] = count_flops(layer, torch.randn(B, n, d), torch.randn(B, S, d))
        assert flops[case] == values[0], (case, flops[case], values[0])   # the term list is FlopCounterMode's count
    grade(fn, lambda *case: flops[case], {f"B={B}, n={n}, S={S}, d_model={d}, d_ff={d_ff}": (B, n, S, d, d_ff)
                                          for B, n, S, d, d_ff in flops}, slips, scale=1e-5,
          says="expected {want} FLOPs, got {got:g}", hint=lambda got, *case: f" (off by {got - flops[case]:+g})")
    print("check_decoder_layer_flops: correct on 5 random sizes")

def check_training_crossover(fn) -> None:
    """Test fn(d_model, d_ff) -> the length n at which, in one training step (forward + backward) of an encoder layer
    with PyTorch's fused attention kernel, the FLOPs of the n^2 products (Q K^T and weights V) equal those of all the
    n d^2 products (four projections, FFN), for several widths. Raises AssertionError naming the mistake; prints a
    verdict."""
    def crossing(n2_factor, rest_factor):               # n where n2_factor * 4 n^2 d = rest_factor * (8 n d^2 + 4 n d d_ff)
        return lambda d, d_ff: rest_factor * (8 * d + 4 * d_ff) / (4 * n2_factor)
    right = crossing(3.5, 3)
    mistakes = {
        "that is the forward pass's crossover (section 9.3), which also holds for a training step with explicit "
        "attention (everything costs 3x its forward FLOPs); the fused kernel's backward recomputes Q K^T, so its n^2 "
        "part costs 1 + 5/2 times its forward FLOPs": crossing(1, 1),
        "that counts the n^2 part's backward (5/2 of its forward FLOPs) but not its forward pass": crossing(2.5, 3),
        "that gives the n^2 part its backward but the n d^2 products none: a training step costs them 3x their "
        "forward FLOPs": crossing(3.5, 1),
        "that recomputes both n^2 products: the kernel recomputes only Q K^T (five backward products for the "
        "forward's two, not six)": crossing(4, 3),
        "that counts the forward pass's n^2 term as 2 n^2 d: Q K^T and weights V cost 2 n^2 d each":
            crossing(1.75, 3),
        "a whole number: the FLOPs are equal at a real n between two lengths; return the exact real n, not rounded":
            [lambda d, d_ff, f=f: f(right(d, d_ff)) for f in (math.ceil, math.floor, round)],
    }
    # the base model (512, 2048) last and no multiple of it: its n, asked in the exercise, is not in a failure message
    cases = ((64, 100), (16, 64), (768, 3072), (8, 8), (512, 2048))
    grade(fn, right, {f"d_model={d}, d_ff={d_ff}": (d, d_ff) for d, d_ff in cases}, mistakes, scale=1e-2,
          says="you return {got:g}, expected {want:g}",
          hint=lambda got, d, d_ff: f" (off by {got - right(d, d_ff):+g}): write both parts of a training step's FLOPs "
                                    f"as multiples of their forward FLOPs, then set them equal")
    print("check_training_crossover: correct for 5 widths")


def _cached_steps_flops(config, B, S, T, memory_every_step=False, keys=0, cross=True, cross_scores=True,
                        memory=True, ffn=True, layers=None) -> int:
    """T cached steps of model.decode, one new token each, on a memory of S tokens: the reference and its slips."""
    d, d_ff, L = config.d_model, config.d_ff, config.num_decoder_layers if layers is None else layers
    per_step = 8 * d * d + 4 * d * d_ff * ffn + cross * (4 * d * d + 4 * S * d * cross_scores)
    attention = 4 * d * (T * (T + 1) // 2 + keys * T)              # step t: the new query against t keys
    projections = 4 * S * d * d * memory * (T if memory_every_step else 1) * cross
    return B * L * (T * per_step + attention + projections)


def check_cached_decode_flops(fn) -> None:
    """Test fn(config, batch, src_len, tgt_len) -> the matrix-product FLOPs of tgt_len steps of Transformer.decode
    with the KV cache (section 9.6: one new token per step, from the first, on a memory of src_len tokens; the
    output layer is not part of decode), on several models and lengths. Raises AssertionError naming the mistake."""
    def uncached(config, B, S, T):                                  # each step re-runs the whole prefix
        d = config.d_model
        return config.num_decoder_layers * sum(mha_flops(B, t, t, d) + mha_flops(B, t, S, d)
                                               + ffn_flops(B * t, d, config.d_ff) for t in range(1, T + 1))
    mistakes = {
        "that projects the memory into the cross-attention's keys and values at every step: they do not change, "
        "so the static cache projects them once, at the first step": lambda *c: _cached_steps_flops(
            *c, memory_every_step=True),
        "the first step's projection of the memory is missing (the cross-attention's keys and values, "
        "2·2·B·S·d_model^2 per layer, once)": lambda *c: _cached_steps_flops(*c, memory=False),
        "at step t the new token attends to t keys, the t - 1 cached ones and itself: you count one too few":
            lambda *c: _cached_steps_flops(*c, keys=-1),
        "at step t the new token attends to t keys, the t - 1 cached ones and itself: you count one too many":
            lambda *c: _cached_steps_flops(*c, keys=1),
        "the cross-attention's scores and weighted sum over the S memory positions (2·2·B·S·d_model per layer and "
        "step) are missing": lambda *c: _cached_steps_flops(*c, cross_scores=False),
        "the cross-attention is missing: a decoder layer has two attentions": lambda *c: _cached_steps_flops(
            *c, cross=False),
        "the feed-forward network (2·2·B·d_model·d_ff per layer and step) is missing":
            lambda *c: _cached_steps_flops(*c, ffn=False),
        "half: a product of (m x k) and (k x p) matrices is 2·m·k·p FLOPs (multiply and add), not m·k·p":
            lambda *c: _cached_steps_flops(*c) / 2,
        "that counts the encoder's layers: decode runs the num_decoder_layers decoder layers":
            lambda config, *c: _cached_steps_flops(config, *c, layers=config.num_encoder_layers),
        "that adds the output layer (2·B·d_model·V per token): model.decode stops before it":
            lambda config, B, S, T: _cached_steps_flops(config, B, S, T) + 2 * B * T * config.d_model
            * config.tgt_vocab_size,
        "that is decoding without the cache: each step re-runs the decoder over the whole prefix": uncached,
        "the batch size is missing: every product runs for each of the B sequences, so the total is B times one "
        "sequence's": lambda config, B, S, T: _cached_steps_flops(config, 1, S, T),
    }
    cases = [(TransformerConfig(40, 40, d_model=32, num_heads=4, d_ff=64, num_encoder_layers=3,
                                num_decoder_layers=2), 1, 10, 15),
             (TransformerConfig(50, 60, d_model=16, num_heads=2, d_ff=40, num_encoder_layers=3,
                                num_decoder_layers=1, tie_embeddings=False), 3, 7, 5),
             (TransformerConfig.base(), 2, 64, 100)]
    grade(fn, _cached_steps_flops, {f"d_model={c.d_model}, d_ff={c.d_ff}, {c.num_decoder_layers} decoder layers, "
                                    f"B={B}, S={S}, T={T}": (c, B, S, T) for c, B, S, T in cases},
          mistakes, scale=1e-3, says="you return {got:,.0f} FLOPs, expected {want:,}",
          hint=lambda got, c, B, S, T: f" (off by {got - _cached_steps_flops(c, B, S, T):+,.0f})")
    print("check_cached_decode_flops: correct on 3 models and lengths")
