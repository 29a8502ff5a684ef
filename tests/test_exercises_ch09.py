"""Chapter 9's graders (transformer_lib.exercises.complexity): the worked solutions pass, also as float32
numbers, and typical mistakes are caught with a message that names them."""
import math

import numpy as np
import torch
from helpers import grader_row

from transformer_lib.complexity import count_flops, ffn_flops, mha_flops
from transformer_lib.exercises.complexity import (
    check_cached_decode_flops,
    check_decoder_layer_flops,
    check_encoder_layer_flops,
    check_training_crossover,
)
from transformer_lib.model import Transformer, TransformerConfig

# --- exercise 1: an encoder layer's FLOPs


def encoder_layer_flops(B, n, d, d_ff):
    return 4 * 2 * B * n * d * d + 2 * 2 * B * n * n * d + 2 * 2 * B * n * d * d_ff


def multiplications_only(B, n, d, d_ff):                   # m k p instead of 2 m k p
    return encoder_layer_flops(B, n, d, d_ff) // 2


def no_n_squared_terms(B, n, d, d_ff):
    return encoder_layer_flops(B, n, d, d_ff) - 4 * B * n * n * d


def three_projections(B, n, d, d_ff):                      # W_o forgotten
    return encoder_layer_flops(B, n, d, d_ff) - 2 * B * n * d * d


def no_ffn(B, n, d, d_ff):
    return encoder_layer_flops(B, n, d, d_ff) - 4 * B * n * d * d_ff


def only_q_k(B, n, d, d_ff):                               # weights V forgotten
    return encoder_layer_flops(B, n, d, d_ff) - 2 * B * n * n * d


# --- exercise 1 (now): a decoder layer's FLOPs, with a memory of S positions

def decoder_layer_flops(B, n, S, d, d_ff):
    return 12 * B * n * d * d + 4 * B * n * n * d + 4 * B * S * d * d + 4 * B * n * S * d + 4 * B * n * d * d_ff


def test_decoder_layer_flops_agrees_with_flop_counter():
    from transformer_lib.decoder import DecoderLayer
    torch.manual_seed(0)
    for B, n, S, d, d_ff in ((1, 3, 7, 8, 5), (2, 6, 4, 12, 10)):
        layer = DecoderLayer(d, 2, d_ff, dropout=0.0).eval()
        assert count_flops(layer, torch.randn(B, n, d), torch.randn(B, S, d)) == decoder_layer_flops(B, n, S, d, d_ff)


# --- exercise 2: the crossover of a training step (fused attention)

def training_crossover(d_model, d_ff):
    return (12 * d_model + 6 * d_ff) / 7


def test_training_crossover_agrees_with_flop_counter():
    """At the crossover of a training step the n^2 part and the rest cost the same, as FlopCounterMode counts them: an
    encoder layer's step measured at two lengths splits into a*n + b*n^2, and the n where a*n = b*n^2 is the answer."""
    from transformer_lib.encoder import EncoderLayer
    d, d_ff = 8, 20                                       # crossover (96 + 120) / 7, not an integer
    layer = EncoderLayer(d, 2, d_ff, dropout=0.0)

    def step(n):
        x = torch.randn(1, n, d, requires_grad=True)    # inside a model the layer's input needs a gradient
        return count_flops(lambda: layer(x).sum().backward())
    s1, s2 = step(3), step(6)                             # s(n) = a n + b n^2
    b = (s2 - 2 * s1) / 18
    a = (s1 - 9 * b) / 3
    assert abs(a / b - training_crossover(d, d_ff)) < 1e-9


# --- exercise 3: the FLOPs of T cached decoding steps

def cached_decode_flops(config, B, S, T):
    d, d_ff, L = config.d_model, config.d_ff, config.num_decoder_layers
    return B * L * (T * (12 * d * d + 4 * S * d + 4 * d * d_ff) + 2 * d * T * (T + 1) + 4 * S * d * d)


def test_cached_decode_flops_agrees_with_flop_counter():
    torch.manual_seed(0)
    config = TransformerConfig(30, 35, d_model=16, num_heads=2, d_ff=24, num_encoder_layers=2, num_decoder_layers=3,
                               dropout=0.0, tie_embeddings=False)
    model = Transformer(config).eval()
    src, tgt = torch.randint(1, 30, (2, 7)), torch.randint(1, 35, (2, 9))
    memory, src_mask, cache = model.encode(src), model.make_src_mask(src), model.decoder.new_cache()
    with torch.no_grad():
        counted = sum(count_flops(model.decode, tgt[:, t - 1:t], memory, src_mask, cache=cache) for t in range(1, 10))
    assert counted == cached_decode_flops(config, 2, 7, 9)


def memory_every_step(c, B, S, T):
    return cached_decode_flops(c, B, S, T) + B * c.num_decoder_layers * (T - 1) * 4 * S * c.d_model ** 2


def memory_never(c, B, S, T):
    return cached_decode_flops(c, B, S, T) - B * c.num_decoder_layers * 4 * S * c.d_model ** 2


def keys_one_short(c, B, S, T):                           # step t attends to t - 1 keys
    return cached_decode_flops(c, B, S, T) - B * c.num_decoder_layers * 4 * c.d_model * T


def self_projection_short(c, B, S, T):                    # three self-attention projections per step, not four
    return cached_decode_flops(c, B, S, T) - B * c.num_decoder_layers * 2 * c.d_model ** 2 * T


def no_cross_scores(c, B, S, T):
    return cached_decode_flops(c, B, S, T) - B * c.num_decoder_layers * 4 * S * c.d_model * T


def no_ffn_decode(c, B, S, T):
    return cached_decode_flops(c, B, S, T) - B * c.num_decoder_layers * 4 * c.d_model * c.d_ff * T


def encoder_layers(c, B, S, T):
    return cached_decode_flops(c, B, S, T) // c.num_decoder_layers * c.num_encoder_layers


def with_generator(c, B, S, T):
    return cached_decode_flops(c, B, S, T) + 2 * B * T * c.d_model * c.tgt_vocab_size


def without_cache(c, B, S, T):
    d = c.d_model
    return c.num_decoder_layers * sum(mha_flops(B, t, t, d) + mha_flops(B, t, S, d) + ffn_flops(B * t, d, c.d_ff)
                                      for t in range(1, T + 1))


GRADERS = [
    grader_row(check_decoder_layer_flops, correct=[decoder_layer_flops,
                                                   lambda *a: torch.tensor(float(decoder_layer_flops(*a)))],
               mistakes=[
        (lambda *a: decoder_layer_flops(*a) // 2, "half: a product"),
        (lambda B, n, S, d, f: decoder_layer_flops(B, n, S, d, f) - 4 * B * S * d * d + 4 * B * n * d * d,
         "keys and values project the target's n positions"),
        (lambda B, n, S, d, f: decoder_layer_flops(B, n, S, d, f) - 4 * B * n * S * d + 4 * B * n * n * d,
         "run over n keys"),
        (lambda B, n, S, d, f: decoder_layer_flops(B, n, S, d, f) - 4 * B * n * d * d - 4 * B * S * d * d
         - 4 * B * n * S * d, "the cross-attention is missing"),
        (lambda B, n, S, d, f: decoder_layer_flops(B, n, S, d, f) - 4 * B * S * d * d,
         "projection of the memory .* is missing"),
        (lambda B, n, S, d, f: decoder_layer_flops(B, n, S, d, f) - 4 * B * n * S * d,
         "scores and weighted sum .* are missing"),
        (lambda B, n, S, d, f: decoder_layer_flops(B, n, S, d, f) - 2 * B * S * d * d, "W_q, W_k, W_v and W_o"),
        (lambda B, n, S, d, f: decoder_layer_flops(B, n, S, d, f) - 4 * B * n * d * f, "feed-forward network"),
        (lambda B, n, S, d, f: decoder_layer_flops(1, n, S, d, f), "the batch size is missing"),
        (lambda *a: decoder_layer_flops(*a) + 1, "off by \\+1"),
    ], prints="check_decoder_layer_flops: correct"),
    grader_row(check_encoder_layer_flops, correct=[encoder_layer_flops, lambda *a: torch.tensor(encoder_layer_flops(*a))], mistakes=[
        (multiplications_only, "half: a product"),
        (no_n_squared_terms, "the n\\^2 terms .* are missing"),
        (three_projections, "W_q, W_k, W_v and W_o make four"),
        (no_ffn, "feed-forward network .* is missing"),
        (only_q_k, "one of the two n\\^2 products is missing"),
        (lambda *a: encoder_layer_flops(*a) + 1, "off by \\+1"),
    ], prints='check_encoder_layer_flops: correct'),
    grader_row(check_training_crossover, correct=[training_crossover, lambda d, f: np.float32((12 * d + 6 * f) / 7),
                                                  lambda d, f: torch.tensor((12 * d + 6 * f) / 7, dtype=torch.float32)],
               mistakes=[
        (lambda d, f: 2 * d + f, "the forward pass's crossover"),
        (lambda d, f: (24 * d + 12 * f) / 10, "but not its forward pass"),
        (lambda d, f: (8 * d + 4 * f) / 14, "the n d\\^2 products none"),
        (lambda d, f: (24 * d + 12 * f) / 16, "recomputes both n\\^2 products"),
        (lambda d, f: (24 * d + 12 * f) / 7, "counts the forward pass's n\\^2 term as 2 n\\^2 d"),
        (lambda d, f: 1.01 * (12 * d + 6 * f) / 7, "off by"),
        (lambda d, f: math.ceil((12 * d + 6 * f) / 7), "return the exact real n"),
        (lambda d, f: round((12 * d + 6 * f) / 7), "return the exact real n"),
        (lambda d, f: None, "must be one number"),
    ], prints="check_training_crossover: correct"),
    grader_row(check_cached_decode_flops, correct=[cached_decode_flops,
                                                   lambda *a: torch.tensor(float(cached_decode_flops(*a)),
                                                                           dtype=torch.float32),
                                                   lambda *a: float(np.float32(cached_decode_flops(*a)))],
               mistakes=[
        (memory_every_step, "projects the memory .* at every step"),
        (memory_never, "projection of the memory is missing"),
        (keys_one_short, "one too few"),
        (no_cross_scores, "scores and weighted sum over the S memory positions"),
        (no_ffn_decode, "feed-forward network"),
        (lambda *a: cached_decode_flops(*a) / 2, "half"),
        (encoder_layers, "counts the encoder's layers"),
        (with_generator, "adds the output layer"),
        (without_cache, "decoding without the cache"),
        (lambda *a: cached_decode_flops(*a) + 1000, "off by \\+1,000"),
        (lambda c, B, S, T: cached_decode_flops(c, 1, S, T), "the batch size is missing"),
        (self_projection_short, "off by -"),            # not the memory's projection: the first case has T != 2 S
    ], prints="check_cached_decode_flops: correct"),
]
