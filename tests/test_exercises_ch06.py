"""Chapter 6's graders (transformer_lib.exercises.encoder): the worked solutions pass, also in float32 or other
integer dtypes, and typical mistakes are caught with a message that names them."""
import copy

import torch
from helpers import Call, grader_row

from transformer_lib.exercises.encoder import (
    check_encoder_layer,
    check_left_pad_positions,
    check_packing,
    check_reach,
)

# --- exercise 1: the encoder layer written by hand

def my_encoder_layer(layer, x, mask, norm_first=None, residual=(True, True)):
    norm_first = layer.self_attn_residual.norm_first if norm_first is None else norm_first
    norm1, norm2 = layer.self_attn_residual.norm, layer.feed_forward_residual.norm

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


# --- exercise 1: sequence packing (segment ids -> a block-diagonal mask and per-sentence positions)

def packing_mask(segments):
    same = segments[:, :, None] == segments[:, None, :]
    return (same & (segments > 0)[:, None, :])[:, None]


def packed_positions(segments):
    index = torch.arange(segments.size(1)).expand_as(segments)
    first = torch.ones_like(segments, dtype=torch.bool)
    first[:, 1:] = segments[:, 1:] != segments[:, :-1]
    return index - torch.where(first, index, 0).cummax(1).values


def positions_by_loop(segments):                           # another correct answer: one count per sentence
    out = torch.zeros_like(segments, dtype=torch.int32)
    for b, row in enumerate(segments.tolist()):
        for i, s in enumerate(row):
            out[b, i] = 0 if i == 0 or row[i - 1] != s else out[b, i - 1] + 1
    return out


def packed_row_positions(segments):                        # one count for the whole row
    return torch.arange(segments.size(1)).expand_as(segments)


def padding_only_mask(segments):                           # the sentences of a row see each other
    return (segments > 0)[:, None, None, :].expand(-1, 1, segments.size(1), -1)


def causal_blocks(segments):
    S = segments.size(1)
    return packing_mask(segments) & torch.ones(S, S, dtype=torch.bool).tril()


def pad_keys_visible(segments):
    same = segments[:, :, None] == segments[:, None, :]
    return (same | (segments == 0)[:, None, :])[:, None]


def with_positions(mask_fn):                               # a mask graded with the right positions
    return Call(mask_fn, packed_positions)


def with_mask(positions_fn):                               # positions graded with the right mask
    return Call(packing_mask, positions_fn)


# --- exercise 3: how far information travels through L restricted layers

def reach(S, r, L):
    return (torch.arange(S)[:, None] - torch.arange(S)[None, :]).abs() <= L * r


def band(width):
    return lambda S, r, L: (torch.arange(S)[:, None] - torch.arange(S)[None, :]).abs() <= width(r, L)


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
    grader_row(check_packing, correct=[
        with_positions(packing_mask), with_positions(lambda s: packing_mask(s).expand(-1, 1, -1, -1).clone()),
        with_mask(positions_by_loop),
    ], mistakes=[
        (with_positions(padding_only_mask), "attend to the other sentences packed into its row"),
        (with_positions(causal_blocks), "causal inside each sentence"),
        (with_positions(lambda s: ~packing_mask(s)), "inverted"),
        (with_positions(pad_keys_visible), "see the padding keys"),
        (with_positions(lambda s: packing_mask(s)[:, 0]), "give it a head axis"),
        (with_positions(lambda s: packing_mask(s).float()), "must return a bool tensor"),
        (with_mask(packed_row_positions), "count from the start of the row"),
        (with_mask(lambda s: packed_positions(s) + 1), "start at 1"),
        (with_mask(lambda s: packed_positions(s) * 0), "all your positions are 0"),
        (with_mask(lambda s: packed_positions(s).float()), "must return an integer tensor"),
        (with_mask(lambda s: packed_positions(s)[:, :-1]), "expected \\(B, S\\)"),
    ], prints=["mask and positions right", "encode exactly as they do alone"]),
    grader_row(check_reach, correct=[reach, lambda S, r, L: reach(S, r, L).float(), lambda S, r, L: reach(S, r, L).int()],
               mistakes=[
        (band(lambda r, L: r), "one layer's reach"),
        (band(lambda r, L: L * r - 1), "stops one position short"),
        (band(lambda r, L: (L + 1) * r), "one layer too far"),
        (lambda S, r, L: reach(S, r, L) & (torch.arange(S)[:, None] >= torch.arange(S)), "looks only backwards"),
        (band(lambda r, L: (L - 1) * r), "one layer short"),
        (band(lambda r, L: L * (2 * r + 1)), r"your reach is L\(2r \+ 1\) each way: 2r \+ 1 is the size of one layer's window"),
        (band(lambda r, L: 2 * L * r), "your reach is 2Lr each way: that is the width of the window without the token itself"),
        (band(lambda r, L: r ** L), "r to the power L"),
        (lambda S, r, L: reach(S, r, L)[:, :-1], "expected \\(S, S\\)"),
        (lambda S, r, L: [[True] * S] * S, "must return an \\(S, S\\) tensor"),
    ], prints="check_reach: right in all"),
]


def test_the_check_command_finds_the_exercises_by_their_names():
    from transformer_lib.check import run_checks

    results = run_checks({"packing_mask": packing_mask, "packed_positions": packed_positions, "reach": reach,
                          "left_pad_positions": left_pad_positions})
    assert [(name, passed) for name, passed, _ in results] == [
        ("packing_mask", True), ("left_pad_positions", True), ("reach", True)]
    (name, passed, verdict), = run_checks({"packing_mask": packing_mask, "packed_positions": packed_row_positions})
    assert not passed and "count from the start of the row" in verdict and "chapter 6, exercise 1" in verdict
    (name, passed, verdict), = run_checks({"packing_mask": packing_mask})
    assert not passed and "needs packed_positions too" in verdict
