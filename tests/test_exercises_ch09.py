"""Chapter 9's graders (transformer_lib.exercises.complexity): the worked solutions pass, also as float32
numbers, and typical mistakes are caught with a message that names them."""
import numpy as np
import torch
from helpers import grader_row

from transformer_lib.complexity import transformer_flops
from transformer_lib.exercises.complexity import (
    check_crossover,
    check_encoder_layer_flops,
    check_tokens_per_second,
)

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


# --- exercise 2: the crossover length

def crossover_length(d_model, d_ff):
    return 2 * d_model + d_ff


# --- exercise 3: tokens per second

def tokens_per_second(config, B, S, T, F):
    return B * T * F / transformer_flops(config, B, S, T, backward=True)


def forward_only(config, B, S, T, F):
    return B * T * F / transformer_flops(config, B, S, T)


def backward_counted_twice(config, B, S, T, F):
    return B * T * F / (3 * transformer_flops(config, B, S, T, backward=True))


def source_tokens(config, B, S, T, F):
    return B * S * F / transformer_flops(config, B, S, T, backward=True)


def both_sides(config, B, S, T, F):
    return B * (S + T) * F / transformer_flops(config, B, S, T, backward=True)


def per_sentence(config, B, S, T, F):
    return T * F / transformer_flops(config, B, S, T, backward=True)


def seconds_per_token(config, B, S, T, F):
    return 1 / tokens_per_second(config, B, S, T, F)


GRADERS = [
    grader_row(check_encoder_layer_flops, correct=[encoder_layer_flops, lambda *a: torch.tensor(encoder_layer_flops(*a))], mistakes=[
        (multiplications_only, "half: a product"),
        (no_n_squared_terms, "the n\\^2 terms .* are missing"),
        (three_projections, "W_q, W_k, W_v and W_o make four"),
        (no_ffn, "feed-forward network .* is missing"),
        (only_q_k, "one of the two n\\^2 products is missing"),
        (lambda *a: encoder_layer_flops(*a) + 1, "off by \\+1"),
    ], prints='check_encoder_layer_flops: correct'),
    grader_row(check_crossover, correct=[crossover_length, lambda d, f: np.float32(2 * d + f), lambda d, f: torch.tensor(2.0 * d + f, dtype=torch.float32)], mistakes=[
        (lambda d, f: f, "equals the FFN alone"),
        (lambda d, f: 2 * d, "equals the four projections alone"),
        (lambda d, f: 6 * d, "right only for d_ff = 4 d_model"),
        (lambda d, f: 4 * d + 2 * f, "counts only Q K\\^T"),
        (lambda d, f: d + f, "2 FLOPs"),
        (lambda d, f: 2 * f + d, "mixes up d_model and d_ff"),
        (lambda d, f: None, "must be one number"),
    ], prints='check_crossover: correct'),
    grader_row(check_tokens_per_second, correct=[tokens_per_second, lambda c, B, S, T, F: B * T * F / transformer_flops(c, B, S, T, backward=True,
                                                                                  fused=False), lambda *a: torch.tensor(tokens_per_second(*a), dtype=torch.float32)], mistakes=[
        (forward_only, "forward pass only"),
        (backward_counted_twice, "multiplies by 3 twice"),
        (source_tokens, "counts the source tokens"),
        (both_sides, "counts source and target tokens"),
        (per_sentence, "tokens of one sentence"),
        (seconds_per_token, "seconds per token"),
        (lambda *a: 1.5 * tokens_per_second(*a), "one step costs"),
    ], prints='check_tokens_per_second: correct'),
]
