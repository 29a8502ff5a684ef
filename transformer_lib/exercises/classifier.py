"""The graders of Chapter 10's exercises (encoder-only Transformers), imported by the chapter's exercise cells.

Hand-written, not exported from the chapter: a grader's reference and named slips are the answers, and Colab shows
every cell of a chapter, so their code stays out of the chapters."""

__all__ = ['check_pooling', 'check_cls_at_end', 'check_few_labels', 'check_attention_pooling', 'check_context_free_loss']

import math

import torch
import torch.nn as nn

from ..classifier import pool
from .grading import call_reader, grade


def _case(g, S, with_empty):
    """Random hidden states (4, S, 5) and a padding pattern; padded positions hold large values."""
    B, d = 4, 5
    hidden = torch.randn(B, S, d, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, S + 1, (B,), generator=g)
    lengths[0] = S                                             # one row without padding
    lengths[1] = max(1, S - 2)                                 # one row with padding
    if with_empty:
        lengths[-1] = 0                                        # one row of padding only
    keep = torch.arange(S)[None, :] < lengths[:, None]         # (B, S), padding at the end
    hidden = torch.where(keep[..., None], hidden, 10 + hidden.abs())   # a max that reads padding will show
    return hidden, keep


def check_pooling(fn, trials: int = 4) -> None:
    """Test fn(hidden (B, S, d), keep (B, S) bool, method) for method "mean" and "max" against the masked
    formulas (transformer_lib.classifier.pool). Raises AssertionError naming the mistake; prints a verdict."""
    g = torch.Generator().manual_seed(0)
    for method in ("mean", "max"):
        mistakes = {"mean": {"padding counted in the mean (divided by S, not by the number of real tokens)":
                             lambda h, keep, m: (h * keep[..., None]).sum(1) / h.size(1),
                             "the mask is ignored: the mean includes the padded positions": lambda h, keep, m: h.mean(1)},
                    "max": {"the mask is ignored: the max can pick a padded position": lambda h, keep, m: h.amax(1)}}
        mistakes = {**mistakes[method], "a sequence with no real token must pool to zeros (NaN or anything else is "
                    "wrong there: divide by max(count, 1); replace -inf by 0)": lambda h, keep, m: torch.where(
                        keep.any(1, keepdim=True), pool(h, keep, m), float("nan"))}
        cases = {}
        for with_empty in (False, True):
            for _ in range(trials):
                hidden, keep = _case(g, int(torch.randint(3, 9, (1,), generator=g)), with_empty)
                cases[f"{method} on hidden {tuple(hidden.shape)}{' with an empty row' if with_empty else ''}"] = (
                    hidden, keep, method)
        grade(fn, pool, cases, mistakes, against="the masked formula", shape="(B, d) = ")
    print("check_pooling: correct for masked mean and max, with padding and empty sequences")

def _cls_cases(g):
    """Padded token batches (B, S) with padding (id 0) at the end, lengths 1..S, one row without padding."""
    for S in (5, 8, 11):
        B = 4
        lengths = torch.randint(1, S + 1, (B,), generator=g)
        lengths[0], lengths[1] = S, max(1, S - 3)
        tokens = torch.randint(3, 20, (B, S), generator=g)                     # real ids 3..19
        tokens[torch.arange(S)[None, :] >= lengths[:, None]] = 0                # (B, S) padded at the end
        yield tokens, lengths


def check_cls_at_end(fn, pad_id: int = 0, cls_id: int = 1) -> None:
    """Test fn(tokens (B, S), pad_id, cls_id) -> (B, S + 1): each row's real tokens, then [CLS] right after the
    last real token, then padding. Also checks that extra padding columns do not move [CLS] (padding
    invariance). Raises AssertionError naming the mistake; prints a verdict."""
    g = torch.Generator().manual_seed(0)
    for tokens, lengths in _cls_cases(g):
        B, S = tokens.shape
        got = fn(tokens.clone(), pad_id, cls_id)
        assert isinstance(got, torch.Tensor), f"return a tensor of token ids, got {type(got).__name__}"
        assert got.shape == (B, S + 1), (f"tokens {tuple(tokens.shape)} must become {(B, S + 1)}: one more column, "
                                         f"room for [CLS]; got {tuple(got.shape)}")
        where = (got == cls_id).long()
        counts = where.sum(1)
        assert (counts <= 1).all(), (f"each row needs exactly one [CLS] (id {cls_id}); your rows hold "
                                     f"{counts.tolist()} of them")
        one = counts == 1                                                       # rows that have a [CLS]
        at, want = where.argmax(1)[one], lengths[one]                           # where [CLS] is, should be
        if not torch.equal(at, want) or not one.all():
            if torch.equal(at, want):
                b = int((~one).nonzero()[0])
                raise AssertionError(f"row {b} has {int(lengths[b])} real tokens and no [CLS]: every row needs one, "
                                     "at position length (0-based)")
            b = int((at != want).nonzero()[0])
            n = int(want[b])
            if (at == S).all():
                raise AssertionError(f"your [CLS] sits after the padding (column {S} in every row, whatever each "
                                     "row's length): put it right after each row's last real token")
            if (at == 0).all():
                raise AssertionError("your [CLS] is at the start of every row: this exercise puts it at the end, "
                                     "right after the last real token")
            if torch.equal(at, want - 1):
                raise AssertionError(f"row {b} has {n} real tokens and your [CLS] is at position {n - 1}: it "
                                     "overwrites the last real token (it belongs at position length, 0-based)")
            if torch.equal(at, want + 1):
                raise AssertionError(f"row {b} has {n} real tokens and your [CLS] is at position {n + 1}, leaving a "
                                     f"padding gap at {n}: it belongs at position length = {n} (0-based)")
            raise AssertionError(f"row {b} has {n} real tokens; its [CLS] must be at position {n}, yours is at "
                                 f"{int(at[b])}")
        rows = torch.arange(B)
        keep = torch.arange(S + 1)[None, :] < lengths[:, None]                  # (B, S + 1) real positions
        real = torch.cat([tokens, tokens.new_full((B, 1), pad_id)], 1)
        if not torch.equal(got[keep], real[keep]):
            raise AssertionError("the real tokens must stay where they were, in their order, before [CLS]")
        after = ~keep
        after[rows, lengths] = False
        if not (got[after] == pad_id).all():
            raise AssertionError(f"every position after [CLS] must be padding (id {pad_id})")
        more = fn(torch.cat([tokens, tokens.new_full((B, 3), pad_id)], 1), pad_id, cls_id)   # 3 more pads
        if not torch.equal(more[:, :S + 1], got):
            raise AssertionError("with 3 more padding columns your rows change: [CLS] must not depend on padding")
    print("check_cls_at_end: [CLS] right after the last real token, whatever the padding")


def _labelled_pool(g, per_class=(9, 13, 20, 11)):
    """X (N, 3) whose column 0 is the row number (to find rows again), y (N,) sorted by class."""
    y = torch.cat([torch.full((n,), c) for c, n in enumerate(per_class)])
    X = torch.randint(3, 30, (len(y), 3), generator=g)
    X[:, 0] = torch.arange(len(y))
    return X, y


def check_few_labels(fn) -> None:
    """Test fn(X (N, S), y (N,), k, seed) -> (X_few (C k, S), y_few (C k,)): k rows of each of the C classes
    of y, drawn at random without repeats, each row with its own label, the same rows for the same seed and
    other rows for another seed. Exercise 3 is a bug hunt, so a failure reports the symptom seen in the draw
    (counts per class, repeats, unmatched labels, seeds), not its cause. Raises AssertionError; prints a verdict."""
    g = torch.Generator().manual_seed(0)
    X, y = _labelled_pool(g)
    C = int(y.max()) + 1
    for k in (1, 3, 5):
        for seed in (0, 1):
            out = fn(X.clone(), y.clone(), k, seed)
            assert isinstance(out, (tuple, list)) and len(out) == 2, "return a pair (X_few, y_few)"
            X_few, y_few = out
            assert isinstance(X_few, torch.Tensor) and isinstance(y_few, torch.Tensor), "return two tensors"
            assert X_few.shape == (C * k, X.size(1)) and y_few.shape == (C * k,), (
                f"k={k} of each of {C} classes: expected X_few {(C * k, X.size(1))} and y_few {(C * k,)}, got "
                f"{tuple(X_few.shape)} and {tuple(y_few.shape)}")
            rows = X_few[:, 0]                                                  # which rows of X were taken
            assert ((rows >= 0) & (rows < len(X))).all() and torch.equal(X[rows], X_few), "the rows of X_few must be rows of X, unchanged"
            wrong = (y[rows] != y_few).nonzero()[:, 0]
            if len(wrong):
                i = int(wrong[0])
                raise AssertionError(f"k={k}, seed={seed}: row {i} of X_few is sequence {int(rows[i])} of X, whose "
                                     f"label in y is {int(y[rows[i]])}, but y_few[{i}] says {int(y_few[i])}")
            counts = torch.bincount(y_few, minlength=C)
            if not (counts == k).all():
                seen = (f"they are the first {C * k} rows of X" if torch.equal(rows, torch.arange(C * k))
                        else f"rows {sorted(rows.tolist())} of X")
                raise AssertionError(f"k={k}, seed={seed}: X_few holds {counts.tolist()} sequences of the {C} "
                                     f"classes, not {k} of each ({seen}; y lists class 0's rows first, then class "
                                     f"1's, ...)")
            if len(rows.unique()) < len(rows):
                twice = int(next(r for r in rows.tolist() if (rows == r).sum() > 1))
                raise AssertionError(f"k={k}, seed={seed}: sequence {twice} of X appears twice in X_few")
            again = fn(X.clone(), y.clone(), k, seed)[0]
            if not torch.equal(again, X_few):
                raise AssertionError(f"k={k}, seed={seed}: two calls with the same seed gave different rows")
        other = fn(X.clone(), y.clone(), 5, 1)[0]
        if torch.equal(fn(X.clone(), y.clone(), 5, 0)[0], other):
            raise AssertionError("k=5: seeds 0 and 1 give the same rows")
    print(f"check_few_labels: k of each of {C} classes, paired, without repeats, reproducible by seed")


def _attention_pool(hidden, keep, query):
    """Attention pooling with a learned query: softmax over the real positions of hidden · query / sqrt(d), the
    weighted sum of hidden; a row without a real token pools to zeros."""
    scores = (hidden @ query.to(hidden.dtype)) / hidden.size(-1) ** 0.5                 # (B, S)
    weights = scores.masked_fill(~keep, float("-inf")).softmax(-1).nan_to_num(0.0)    # empty row: 0, not NaN
    return (weights[..., None] * hidden).sum(1)                                         # (B, d)


def _pool_slips():
    """The typical slips of attention pooling, each the reference with one mistake: {message: mutant}."""
    def scores(h, q):
        return h @ q.to(h.dtype) / h.size(-1) ** 0.5

    def weighted(h, w):
        return (w[..., None] * h).sum(1)

    return {
        "the padded positions get attention weight: set their scores to -inf before the softmax":
            lambda h, keep, q: weighted(h, scores(h, q).softmax(-1)),
        "the padded scores are set to 0, not -inf: a score of 0 still gets weight e^0 in the softmax":
            lambda h, keep, q: weighted(h, scores(h, q).masked_fill(~keep, 0.0).softmax(-1)),
        "the weights are multiplied by keep after the softmax: the real tokens' weights no longer sum to 1 (mask "
        "the scores before the softmax instead)": lambda h, keep, q: weighted(h, scores(h, q).softmax(-1) * keep),
        "the scores are not divided by sqrt(d_model)":
            lambda h, keep, q: weighted(h, (h @ q.to(h.dtype)).masked_fill(~keep, float("-inf")).softmax(-1).nan_to_num(0.0)),
        "the softmax runs over the batch axis (dim 0), not over the positions":
            lambda h, keep, q: weighted(h, scores(h, q).masked_fill(~keep, float("-inf")).softmax(0).nan_to_num(0.0)),
        "the mean of the weighted vectors, not their sum: the weights already sum to 1":
            lambda h, keep, q: _attention_pool(h, keep, q) / h.size(1),
        "a sequence with no real token must pool to zeros (its softmax over no position is NaN: replace it by 0)":
            lambda h, keep, q: torch.where(keep.any(1, keepdim=True), _attention_pool(h, keep, q), float("nan")),
    }


def check_attention_pooling(cls) -> None:
    """Test cls(d_model), the reader's attention pooling module: one trained parameter `query` of d_model numbers,
    forward(hidden (B, S, d_model), keep (B, S) bool) -> (B, d_model), the softmax over the real positions of
    hidden · query / sqrt(d_model) weighting hidden; zeros for a row without a real token. Raises AssertionError
    naming the mistake; prints a verdict."""
    d = 5
    with torch.random.fork_rng():                          # building it leaves the global random state alone
        module = call_reader(cls, f"{getattr(cls, '__name__', 'your class')}({d})", d)
    assert isinstance(module, nn.Module), f"{getattr(cls, '__name__', 'cls')}(d_model) must build an nn.Module"
    query = getattr(module, "query", None)
    if not isinstance(query, nn.Parameter):
        raise AssertionError(f"your module's query must be a trained nn.Parameter of d_model = {d} numbers, got "
                             f"{type(query).__name__}: register it as self.query = nn.Parameter(...)")
    assert query.numel() == d, f"query must hold d_model = {d} numbers, yours has shape {tuple(query.shape)}"
    module.eval()
    dtypes = [torch.float64, torch.float32]               # float32 work is accepted too

    def answer(hidden, keep, q):                          # the reader's module with the case's query put in
        for dtype in list(dtypes):
            try:
                with torch.no_grad():
                    module.to(dtype).query.copy_(q.view_as(module.query))
                    out = module(hidden.to(dtype), keep)
                dtypes[:] = [dtype]                       # the first dtype that ran, kept for the other cases
                return out
            except Exception:
                if dtype == dtypes[-1]:
                    raise

    g = torch.Generator().manual_seed(1)
    cases = {}
    for with_empty in (False, True):
        for trial in range(3):
            hidden, keep = _case(g, int(torch.randint(3, 9, (1,), generator=g)), with_empty)
            q = 2 * torch.randn(d, generator=g, dtype=torch.float64)
            cases[f"hidden {tuple(hidden.shape)}{', an empty row' if with_empty else ''}, query {trial}"] = (
                hidden, keep, q)
    hidden, keep = _case(g, 6, False)
    cases["query = 0"] = (hidden, keep, torch.zeros(d, dtype=torch.float64))
    grade(answer, _attention_pool, cases, _pool_slips(), name="your module", against="attention pooling",
          shape="(B, d_model) = ")
    with torch.no_grad():
        module.query.copy_(torch.randn(d, generator=g, dtype=torch.float64).view_as(module.query))
    module.zero_grad()
    pooled = module(hidden.to(dtypes[0]), keep)
    if pooled.requires_grad:
        pooled.pow(2).sum().backward()
    if module.query.grad is None or module.query.grad.abs().sum() == 0:
        raise AssertionError("no gradient reaches your query: the pooled output must be computed from it (no "
                             ".detach(), no .data), or training cannot learn where to look")
    print("check_attention_pooling: softmax over the real positions, scaled scores, zeros for an empty row, and "
          "a query that trains")


def _entropy(tokens, special_ids):
    """The entropy (nats) of the frequencies of the tokens of tokens that are not in special_ids."""
    real = tokens[~torch.isin(tokens, torch.tensor(list(special_ids), dtype=tokens.dtype))]
    p = torch.bincount(real).double()
    p = p[p > 0] / p.sum()
    return float(-(p * p.log()).sum())


def _frequency_slips():
    def per_row(tokens, special_ids):
        return sum(_entropy(row[None], special_ids) for row in tokens) / len(tokens)

    def uniform_over_seen(tokens, special_ids):
        real = tokens[~torch.isin(tokens, torch.tensor(list(special_ids), dtype=tokens.dtype))]
        return float(torch.log(torch.tensor(float(len(real.unique())))))

    return {
        "the special tokens (padding, [CLS]) are counted in the frequencies: they are never chosen for masking, "
        "so leave them out": [lambda t, s: _entropy(t, ()), lambda t, s: _entropy(t, s[:1]),
                              lambda t, s: _entropy(t, s[1:])],
        "that is in bits (log base 2); the MLM loss is a cross-entropy in nats (natural log)":
            lambda t, s: _entropy(t, s) / math.log(2),
        "that is uniform guessing among the values that occur (ln of their number), not the guess that follows "
        "their frequencies": uniform_over_seen,
        "the frequencies are counted per sequence and the entropies averaged: a model that reads no input uses one "
        "distribution for every position of every sequence; count over the whole batch": per_row,
        "the sign is wrong: an entropy -sum p ln p is positive": lambda t, s: -_entropy(t, s),
    }


def check_context_free_loss(fn) -> None:
    """Test fn(tokens (B, S) of ids, special_ids) -> the MLM loss (nats) of the best prediction that reads no
    input: the entropy of the frequencies of the non-special tokens. Raises AssertionError naming the mistake;
    prints a verdict."""
    g = torch.Generator().manual_seed(0)
    cases = {}
    for B, S, V in ((6, 9, 12), (4, 14, 30), (3, 5, 7)):
        skew = torch.linspace(2.0, 0.2, V - 3) ** 2                        # some values far more common
        tokens = 3 + torch.multinomial(skew, B * S, replacement=True, generator=g).view(B, S)
        tokens[:, 0] = 1                                                    # [CLS]
        lengths = torch.randint(2, S + 1, (B,), generator=g)
        lengths[0] = S
        tokens[torch.arange(S)[None, :] >= lengths[:, None]] = 0            # padding at the end
        cases[f"tokens {tuple(tokens.shape)}, {V - 3} values, special_ids (0, 1)"] = (tokens, (0, 1))
    grade(fn, _entropy, cases, _frequency_slips(), name="your function", against="the entropy of the frequencies",
          pure="tokens", says="you return {got:.4g}")
    print("check_context_free_loss: the entropy, in nats, of the frequencies of the tokens that can be masked")
