"""Chapter 6's graders (transformer_lib.exercises.encoder): the worked solutions pass, also in float32 or other
integer dtypes, and typical mistakes are caught with a message that names them."""
import copy

import pytest
import torch
from helpers import grader_row

from transformer_lib.exercises.encoder import (
    check_balance_d_ff,
    check_encoder_layer,
    check_left_pad_positions,
)

# --- exercise 1: the encoder layer written by hand

def my_encoder_layer(layer, x, mask, norm_first=None, residual=(True, True)):
    norm_first = layer.sublayer1.norm_first if norm_first is None else norm_first
    norm1, norm2 = layer.sublayer1.norm, layer.sublayer2.norm

    def attend(y):
        return layer.self_attn(y, y, y, mask)[0]
    r1, r2 = residual
    if norm_first:
        x = x * r1 + attend(norm1(x))
        return x * r2 + layer.feed_forward(norm2(x))
    x = norm1(x * r1 + attend(x))
    return norm2(x * r2 + layer.feed_forward(x))


def encoder_layer32(layer, x, mask):
    return my_encoder_layer(copy.deepcopy(layer).float(), x.float(), mask)


def forgot_the_mask(layer, x, mask):
    return my_encoder_layer(layer, x, None)


def always_post_norm(layer, x, mask):
    return my_encoder_layer(layer, x, mask, norm_first=False)


def no_attention_residual(layer, x, mask):
    return my_encoder_layer(layer, x, mask, residual=(False, True))


def calls_the_layer(layer, x, mask):
    return layer(x, mask)


# --- exercise 2: positions counted from the first real token

def left_pad_positions(tokens, pad_id):
    return ((tokens != pad_id).long().cumsum(1) - 1).clamp(min=0)


def left_pad_positions_int32(tokens, pad_id):
    return ((tokens != pad_id).int().cumsum(1, dtype=torch.int32) - 1)       # -1 at left pads: allowed


def row_positions(tokens, pad_id):                         # torch.arange: ignores the padding
    return torch.arange(tokens.size(1)).expand(tokens.shape)


def count_from_one(tokens, pad_id):                        # a running count without the - 1
    return (tokens != pad_id).long().cumsum(1)


def minus_the_pads(tokens, pad_id):                        # right only for left padding
    return torch.arange(tokens.size(1)) - (tokens == pad_id).sum(1, keepdim=True)


def float_positions(tokens, pad_id):
    return left_pad_positions(tokens, pad_id).float()


# --- exercise 3: the d_ff at which attention and FFN hold equally many parameters

def balance_d_ff(d):
    return (4 * d * d + 3 * d) / (2 * d + 1)


def forgot_the_biases(d):
    return 2 * d


def counted_one_projection(d):
    return d * d / (2 * d + 1)


def forgot_w_o(d):
    return (3 * d * d + 2 * d) / (2 * d + 1)


def only_linear2(d):
    return (4 * d * d + 3 * d) / d


def test_an_unrecognised_balance_reports_both_counts():
    with pytest.raises(AssertionError, match=r"off by \+1.*attention holds"):
        check_balance_d_ff(lambda d: balance_d_ff(d) + 1)


GRADERS = [
    grader_row(check_encoder_layer, correct=[my_encoder_layer, encoder_layer32], mistakes=[
        (forgot_the_mask, "ignores the padding mask"),
        (always_post_norm, "other norm placement"),
        (no_attention_residual, "without the residual connection around self-attention"),
        (calls_the_layer, r"you called layer\(\.\.\.\)"),
    ], prints='check_encoder_layer: all'),
    grader_row(check_left_pad_positions, correct=[left_pad_positions, left_pad_positions_int32], mistakes=[
        (row_positions, "count from the start of the row, padding included"),
        (count_from_one, "start at 1, not 0"),
        (minus_the_pads, "subtract the number of pads, which is right only when all padding is on the left"),
        (float_positions, "must be an integer tensor"),
    ], prints='check_left_pad_positions: correct'),
    grader_row(check_balance_d_ff, correct=[balance_d_ff, lambda d: torch.tensor(balance_d_ff(d), dtype=torch.float32)], mistakes=[
        (forgot_the_biases, "without the biases"),
        (counted_one_projection, "counts one projection of attention's four"),
        (forgot_w_o, "forgets the output projection W_o"),
        (only_linear2, "counts only linear2"),
        (lambda d: 4 * d, "base model's d_ff"),
        (lambda d: "1024", "must be one number"),
    ], prints='check_balance_d_ff: correct'),
]
