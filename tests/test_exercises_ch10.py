"""Chapter 10's graders (transformer_lib.exercises.classifier): the reference answers pass, float32 answers pass,
and typical mistakes are caught with a message that names them."""

import math

import torch
import torch.nn as nn
from helpers import grader_row

from transformer_lib.classifier import pool
from transformer_lib.exercises.classifier import (
    check_attention_pooling,
    check_cls_at_end,
    check_context_free_loss,
    check_few_labels,
    check_pooling,
)

# --- the pooling grader (python -m transformer_lib.check runs it on a reader's own `pool`)


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


def within_class_positions(X, y, k, seed):              # exercise 3's bug: positions in the class used as rows
    g = torch.Generator().manual_seed(seed)
    rows = torch.cat([torch.randperm(int((y == c).sum()), generator=g)[:k] for c in y.unique().tolist()])
    return X[rows], y[rows]


def few_labels32(X, y, k, seed):                        # float32 sequences (the grader's pool, as floats)
    X_few, y_few = few_labels(X.float(), y, k, seed)
    return X_few.long(), y_few


def seed_ignored(X, y, k, seed):
    rows = torch.cat([(y == c).nonzero()[:k, 0] for c in range(int(y.max()) + 1)])
    return X[rows], y[rows]


# --- exercise 1: attention pooling with a learned query


class AttentionPool(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.query = nn.Parameter(torch.zeros(d_model))

    def weights(self, hidden, keep):
        scores = hidden @ self.query / hidden.size(-1) ** 0.5
        return scores.masked_fill(~keep, float("-inf")).softmax(-1).nan_to_num(0.0)

    def forward(self, hidden, keep):
        return (self.weights(hidden, keep)[..., None] * hidden).sum(1)


class Float32Pool(AttentionPool):                          # computes in float32 whatever it is given
    def forward(self, hidden, keep):
        return super().forward(hidden.float(), keep) if self.query.dtype == torch.float32 else \
            (_ for _ in ()).throw(TypeError("float32 only"))


class EinsumPool(AttentionPool):                           # another correct way to write it
    def forward(self, hidden, keep):
        scores = torch.einsum("bsd,d->bs", hidden, self.query) / hidden.size(-1) ** 0.5
        scores = torch.where(keep, scores, torch.finfo(scores.dtype).min)
        weights = scores.softmax(-1) * keep.any(1, keepdim=True)
        return torch.einsum("bs,bsd->bd", weights, hidden)


class UnmaskedPool(AttentionPool):
    def forward(self, hidden, keep):
        return (self.weights(hidden, torch.ones_like(keep))[..., None] * hidden).sum(1)


class ZeroScorePool(AttentionPool):
    def forward(self, hidden, keep):
        scores = (hidden @ self.query / hidden.size(-1) ** 0.5).masked_fill(~keep, 0.0)
        return (scores.softmax(-1)[..., None] * hidden).sum(1)


class MaskAfterSoftmax(AttentionPool):
    def forward(self, hidden, keep):
        weights = (hidden @ self.query / hidden.size(-1) ** 0.5).softmax(-1) * keep
        return (weights[..., None] * hidden).sum(1)


class Unscaled(AttentionPool):
    def forward(self, hidden, keep):
        scores = (hidden @ self.query).masked_fill(~keep, float("-inf"))
        return (scores.softmax(-1).nan_to_num(0.0)[..., None] * hidden).sum(1)


class SoftmaxOverBatch(AttentionPool):
    def forward(self, hidden, keep):
        scores = (hidden @ self.query / hidden.size(-1) ** 0.5).masked_fill(~keep, float("-inf"))
        return (scores.softmax(0).nan_to_num(0.0)[..., None] * hidden).sum(1)


class MeanOfWeighted(AttentionPool):
    def forward(self, hidden, keep):
        return (self.weights(hidden, keep)[..., None] * hidden).mean(1)


class NanForEmpty(AttentionPool):
    def forward(self, hidden, keep):
        scores = (hidden @ self.query / hidden.size(-1) ** 0.5).masked_fill(~keep, float("-inf"))
        return (scores.softmax(-1)[..., None] * hidden).sum(1)


class BufferQuery(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.register_buffer("query", torch.zeros(d_model))

    def forward(self, hidden, keep):
        return AttentionPool.forward(self, hidden, keep)

    weights = AttentionPool.weights


class DetachedQuery(AttentionPool):
    def forward(self, hidden, keep):
        scores = (hidden @ self.query.detach() / hidden.size(-1) ** 0.5).masked_fill(~keep, float("-inf"))
        return (scores.softmax(-1).nan_to_num(0.0)[..., None] * hidden).sum(1)


def test_attention_pooling_leaves_the_global_random_state_alone():
    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    check_attention_pooling(AttentionPool)
    assert torch.equal(torch.rand(3), want)


def test_attention_pooling_with_a_zero_query_is_the_masked_mean():
    hidden, keep = torch.randn(3, 6, 4, dtype=torch.float64), torch.arange(6)[None, :] < torch.tensor([[6], [2], [1]])
    assert torch.allclose(AttentionPool(4).double()(hidden, keep), pool(hidden, keep, "mean"))


# --- exercise 4: the MLM loss of the best prediction that reads no input


def context_free_loss(tokens, special_ids):
    real = tokens[~torch.isin(tokens, torch.tensor(special_ids))]
    _, counts = real.unique(return_counts=True)
    p = counts.double() / counts.sum()
    return -(p * p.log()).sum().item()


def context_free_loss32(tokens, special_ids):             # float32 work, returned as a tensor
    real = tokens[~torch.isin(tokens, torch.tensor(special_ids))]
    p = torch.bincount(real).float()
    p = p[p > 0] / p.sum()
    return -(p * p.log()).sum()


def counts_special_tokens(tokens, special_ids):
    return context_free_loss(tokens, ())


def counts_padding(tokens, special_ids):
    return context_free_loss(tokens, special_ids[1:])


def in_bits(tokens, special_ids):
    return context_free_loss(tokens, special_ids) / math.log(2)


def uniform_over_seen(tokens, special_ids):
    real = tokens[~torch.isin(tokens, torch.tensor(special_ids))]
    return math.log(len(real.unique()))


def per_sequence(tokens, special_ids):
    return sum(context_free_loss(row[None], special_ids) for row in tokens) / len(tokens)


def minus_sign_lost(tokens, special_ids):
    return -context_free_loss(tokens, special_ids)


def test_context_free_loss_on_the_chapters_data_is_below_uniform():
    from transformer_lib.classifier import VOCAB_SIZE, make_sequences
    X, _ = make_sequences(200, seed=11)
    assert context_free_loss(X, (0, 1)) < math.log(VOCAB_SIZE - 3)


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
    grader_row(check_few_labels, correct=[few_labels, few_labels32], mistakes=[
        (first_rows, "they are the first 4 rows of X"),
        (unstratified, "sequences of the 4 classes, not"),
        (within_class_positions, "sequences of the 4 classes, not"),
        (labels_not_paired, "label in y is"),
        (with_replacement, "appears twice"),
        (global_random_state, "same seed gave different rows"),
        (seed_ignored, "seeds 0 and 1 give the same rows"),
    ]),
    grader_row(check_attention_pooling, correct=[AttentionPool, Float32Pool, EinsumPool], mistakes=[
        (UnmaskedPool, "padded positions get attention weight"),
        (ZeroScorePool, "set to 0, not -inf"),
        (MaskAfterSoftmax, "multiplied by keep after the softmax"),
        (Unscaled, "not divided by sqrt"),
        (SoftmaxOverBatch, "batch axis"),
        (MeanOfWeighted, "the mean of the weighted vectors"),
        (NanForEmpty, "no real token must pool to zeros"),
        (BufferQuery, "trained nn.Parameter"),
        (DetachedQuery, "no gradient reaches your query"),
    ]),
    grader_row(check_context_free_loss, correct=[context_free_loss, context_free_loss32], mistakes=[
        (counts_special_tokens, "special tokens"),
        (counts_padding, "special tokens"),
        (in_bits, "bits"),
        (uniform_over_seen, "uniform guessing among the values that occur"),
        (per_sequence, "per sequence"),
        (minus_sign_lost, "sign is wrong"),
    ]),
]
