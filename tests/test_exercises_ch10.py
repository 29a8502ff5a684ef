"""Chapter 10's graders (transformer_lib.exercises.classifier): the reference answers pass, float32 answers pass,
and typical mistakes are caught with a message that names them."""

import torch
import torch.nn as nn
from helpers import grader_row

from transformer_lib.classifier import pool
from transformer_lib.exercises.classifier import (
    check_classifier_positions,
    check_cls_at_end,
    check_few_labels,
    check_pooling,
)

# --- exercise 1: masked pooling


def pooling(hidden, keep, method):
    return pool(hidden, keep, method)


def pooling32(hidden, keep, method):
    return pool(hidden.float(), keep, method)


def padding_in_mean(hidden, keep, method):
    if method == "mean":
        return (hidden * keep[..., None]).sum(1) / hidden.size(1)
    return pool(hidden, keep, method)


def max_reads_padding(hidden, keep, method):
    return hidden.amax(1) if method == "max" else pool(hidden, keep, method)


def nan_for_empty(hidden, keep, method):
    real = keep[..., None]
    if method == "mean":
        return (hidden * real).sum(1) / real.sum(1)                        # 0 / 0 for an empty row
    return pool(hidden, keep, method)


# --- exercise 2: [CLS] at the end


def cls_at_end(tokens, pad_id=0, cls_id=1):
    lengths = (tokens != pad_id).sum(1)                                    # (B,)
    out = torch.cat([tokens, tokens.new_full((tokens.size(0), 1), pad_id)], dim=1)
    out[torch.arange(tokens.size(0)), lengths] = cls_id
    return out


def cls_after_padding(tokens, pad_id=0, cls_id=1):
    return torch.cat([tokens, tokens.new_full((tokens.size(0), 1), cls_id)], dim=1)


def cls_at_start(tokens, pad_id=0, cls_id=1):
    return torch.cat([tokens.new_full((tokens.size(0), 1), cls_id), tokens], dim=1)


def cls_overwrites_last_token(tokens, pad_id=0, cls_id=1):
    lengths = (tokens != pad_id).sum(1)
    out = torch.cat([tokens, tokens.new_full((tokens.size(0), 1), pad_id)], dim=1)
    out[torch.arange(tokens.size(0)), lengths - 1] = cls_id
    return out


def cls_one_too_far(tokens, pad_id=0, cls_id=1):
    lengths = (tokens != pad_id).sum(1)
    out = torch.cat([tokens, tokens.new_full((tokens.size(0), 2), pad_id)], dim=1)
    out[torch.arange(tokens.size(0)), lengths + 1] = cls_id
    return out[:, :-1]


def cls_without_room(tokens, pad_id=0, cls_id=1):
    out = tokens.clone()
    lengths = (tokens != pad_id).sum(1).clamp(max=tokens.size(1) - 1)
    out[torch.arange(tokens.size(0)), lengths] = cls_id
    return out


# --- exercise 3: k labelled sequences per class


def few_labels(X, y, k, seed):
    g = torch.Generator().manual_seed(seed)
    rows = torch.cat([(y == c).nonzero()[:, 0][torch.randperm(int((y == c).sum()), generator=g)[:k]]
                      for c in range(int(y.max()) + 1)])
    return X[rows], y[rows]


def first_rows(X, y, k, seed):
    n = k * (int(y.max()) + 1)
    return X[:n], y[:n]


def unstratified(X, y, k, seed):
    rows = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))[:k * (int(y.max()) + 1)]
    return X[rows], y[rows]


def labels_not_paired(X, y, k, seed):
    X_few, y_few = few_labels(X, y, k, seed)
    return X_few, y_few.sort().values if not torch.equal(y_few.sort().values, y_few) else y_few.flip(0)


def with_replacement(X, y, k, seed):
    g = torch.Generator().manual_seed(seed)
    rows = torch.cat([(y == c).nonzero()[:, 0][torch.randint(int((y == c).sum()), (k,), generator=g)]
                      for c in range(int(y.max()) + 1)])
    return X[rows], y[rows]


def global_random_state(X, y, k, seed):
    rows = torch.cat([(y == c).nonzero()[:, 0][torch.randperm(int((y == c).sum()))[:k]]
                      for c in range(int(y.max()) + 1)])
    return X[rows], y[rows]


def seed_ignored(X, y, k, seed):
    rows = torch.cat([(y == c).nonzero()[:k, 0] for c in range(int(y.max()) + 1)])
    return X[rows], y[rows]


# --- exercise 4: learned positions


class LearnedPositions(nn.Module):
    def __init__(self, d_model, max_len, dropout=0.0):
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        S = x.size(1)
        if S > self.max_len:
            raise ValueError(f"a sequence of {S} positions is longer than max_len={self.max_len}")
        return self.dropout(x + self.table(torch.arange(S, device=x.device)))


class ZeroInitPositions(LearnedPositions):                  # GPT-2-like, but starting from zeros: still right
    def __init__(self, d_model, max_len):
        super().__init__(d_model, max_len)
        nn.init.zeros_(self.table.weight)


class Float64Positions(LearnedPositions):                  # works in float64 inside, returns x's dtype
    def forward(self, x):
        return super().forward(x.double()).to(x.dtype)


class FixedTable(LearnedPositions):
    def __init__(self, d_model, max_len):
        super().__init__(d_model, max_len)
        del self.table
        self.register_buffer("table_", torch.randn(max_len, d_model))

    def table(self, positions):
        return self.table_[positions]


class OneRowForAll(LearnedPositions):
    def forward(self, x):
        return x + self.table(torch.zeros(x.size(1), dtype=torch.long))


class Multiplied(LearnedPositions):
    def forward(self, x):
        return x * self.table(torch.arange(x.size(1)))


class Concatenated(LearnedPositions):
    def forward(self, x):
        return torch.cat([x, self.table(torch.arange(x.size(1))).expand(x.size(0), -1, -1)], dim=-1)


class FromTheEnd(LearnedPositions):
    def forward(self, x):
        return x + self.table.weight[-x.size(1):]


class BatchAxis(LearnedPositions):
    def forward(self, x):
        return x + self.table.weight[:x.size(0)]


class NoLengthCheck(LearnedPositions):
    def forward(self, x):
        return x + self.table.weight[:x.size(1)]


class OffByOneCheck(LearnedPositions):
    def forward(self, x):
        if x.size(1) >= self.max_len:
            raise ValueError(f"longer than max_len={self.max_len}")
        return super().forward(x)


class Detached(LearnedPositions):
    def forward(self, x):
        return x + self.table.weight.detach()[:x.size(1)] if x.size(1) <= self.max_len else super().forward(x)


def test_learned_positions_leaves_the_global_random_state_alone():
    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    check_classifier_positions(LearnedPositions)
    assert torch.equal(torch.rand(3), want)


GRADERS = [
    grader_row(check_pooling, correct=[pooling, pooling32], mistakes=[
        (padding_in_mean, "padding counted in the mean"),
        (max_reads_padding, "max can pick a padded position"),
        (nan_for_empty, "NaN"),
    ]),
    grader_row(check_cls_at_end, correct=[cls_at_end], mistakes=[
        (cls_after_padding, "after the padding"),
        (cls_at_start, "at the start"),
        (cls_overwrites_last_token, "overwrites the last real token"),
        (cls_one_too_far, "padding gap"),
        (cls_without_room, "one more column"),
    ]),
    grader_row(check_few_labels, correct=[few_labels], mistakes=[
        (first_rows, "first rows of X"),
        (unstratified, "stratified"),
        (labels_not_paired, "not paired with its own label"),
        (with_replacement, "appears twice"),
        (global_random_state, "same seed gave different rows"),
        (seed_ignored, "the seed changes nothing"),
    ]),
    grader_row(check_classifier_positions, correct=[LearnedPositions, ZeroInitPositions, Float64Positions], mistakes=[
        (FixedTable, "no trainable parameters"),
        (OneRowForAll, "every position gets row 0"),
        (Multiplied, "depends on x"),
        (Concatenated, "concatenated"),
        (FromTheEnd, r"table\[:n\]"),
        (BatchAxis, "along axis 1"),
        (NoLengthCheck, "raise a ValueError"),
        (OffByOneCheck, "fit the table"),
        (Detached, "no gradient"),
    ]),
]
