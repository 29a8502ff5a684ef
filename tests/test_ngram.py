"""transformer_lib.gpt.NGramLM (Chapter 11's count baseline), an interpolated Kneser-Ney n-gram model, against
nltk's KneserNeyInterpolated (nltk.lm, a production implementation) in float64.

The two define the same recursion, p(c | h) = max(n(h c) - D, 0) / n(h .) + D N(h .) / n(h .) p(c | h'), with raw
counts at the top order, continuation counts N1+(. h c) below it, and a context never seen backing off whole.
They differ in exactly two places, each pinned by a test below:

1. The bottom. nltk's unigram is N1+(. c) / N1+(. .), undiscounted and not smoothed: a token never seen after
   another token gets probability 0 (log 0 on held-out text). Ours discounts it too and gives the mass saved to
   the uniform 1 / V (Chen and Goodman's interpolated form), so nothing has probability 0. With nltk's unigram
   replaced by ours, the two agree to float64 round-off (test_equal_to_nltk).
2. The start of the corpus. For a lower-order context h, nltk counts N(h .) in raw counts and ours in
   continuation counts; they differ only for an n-gram h c that occurs at the very start of the training tokens
   and nowhere else (nothing precedes it, so its continuation count is 0). There nltk's distribution no longer
   sums to 1, or it divides by zero when h itself occurs only there; ours stays a distribution
   (test_corpus_start_is_where_nltk_differs, test_corpus_start_breaks_nltks_normalisation). The comparison corpus therefore starts with a prefix that recurs.
"""

import math
import random

import pytest
import torch

from transformer_lib.gpt import NGramLM

nltk_lm = pytest.importorskip("nltk.lm")
from nltk.util import everygrams  # noqa: E402  (after the importorskip)

V = 7                                                # ids 0-5 occur, 6 never does
D = 0.75


def corpus(n=400, seed=0):
    """A small corpus with structure (a few frequent patterns) and noise; it starts with 0 1 2 3, which recurs."""
    rng = random.Random(seed)
    t = [0, 1, 2, 3]
    while len(t) < n:
        t += rng.choice([[0, 1, 2], [3, 4], [1, 2, 0, 5], [rng.randrange(6)], [2, 2, 4]])
    return t + [0, 1, 2, 3]


def nltk_model(tokens, order, discount=D):
    words = [str(c) for c in tokens]
    lm = nltk_lm.KneserNeyInterpolated(order, discount=discount)
    lm.fit([list(everygrams(words, max_len=order))], vocabulary_text=words)
    return lm


def contexts(tokens, k):
    """Every context of k ids seen in the corpus, and a few never seen."""
    seen = {tuple(tokens[i:i + k]) for i in range(len(tokens) - k + 1)}
    return sorted(seen) + [(5,) * k, (4, 4, 4, 4, 4)[:k], (6,) * k]


@pytest.mark.parametrize("order", [2, 3, 4, 5])
def test_equal_to_nltk(order):
    """Every token after every context (seen, unseen, shorter than order - 1), in float64, nltk's unigram
    replaced by ours (difference 1 of the module docstring): equal to round-off."""
    t = corpus()
    ours, theirs = NGramLM(torch.tensor(t), V, order, D), nltk_model(t, order)
    theirs.estimator.unigram_score = lambda word: ours.prob(int(word))       # our bottom in nltk's recursion
    worst, checked = 0.0, 0
    for k in range(order):
        for h in contexts(t, k):
            if 6 in h:
                continue                                                     # nltk maps an unseen id to <UNK>
            for c in range(6):
                p = theirs.score(str(c), [str(x) for x in h])
                worst = max(worst, abs(ours.prob(c, h) - p))
                checked += 1
    assert checked > 50 and worst < 1e-15, (checked, worst)


@pytest.mark.parametrize("order", [2, 3, 5])
def test_nltk_unigram_is_unsmoothed(order):
    """Difference 1: nltk's unigram is N1+(. c) / N1+(. .); ours is max(N1+(. c) - D, 0) / N1+(. .) plus
    D N(.) / N1+(. .) / V, so a token never seen still gets probability > 0, where nltk gives 0."""
    t = corpus()
    ours, theirs = NGramLM(torch.tensor(t), V, order, D), nltk_model(t, order)
    left = {c: len({a for a, b in zip(t, t[1:], strict=False) if b == c}) for c in range(V)}   # N1+(. c)
    total, types = sum(left.values()), sum(n > 0 for n in left.values())
    for c in range(6):
        assert theirs.estimator.unigram_score(str(c)) == pytest.approx(left[c] / total, abs=1e-15)
        assert ours.prob(c) == pytest.approx(max(left[c] - D, 0) / total + D * types / total / V, abs=1e-15)
    assert ours.prob(6) == pytest.approx(D * types / total / V, abs=1e-15) and ours.prob(6) > 0
    assert theirs.score("6") == 0                                            # <UNK>: never counted


def test_corpus_start_is_where_nltk_differs():
    """Difference 2: 6 occurs once, at position 0. For the order-3 model the bigram context (6,) has a raw count
    but no continuation count (nothing precedes it): nltk divides by zero there, ours backs off to the unigram."""
    t = [6] + corpus()
    ours, theirs = NGramLM(torch.tensor(t), V, 3, D), nltk_model(t, 3)
    with pytest.raises(ZeroDivisionError):
        theirs.score("0", ["5", "6"])                                        # (5, 6) never seen: backs off to (6,)
    assert [ours.prob(c, (5, 6)) for c in range(V)] == [ours.prob(c) for c in range(V)]
    assert abs(sum(ours.prob(c, (5, 6)) for c in range(V)) - 1) < 1e-12


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_probabilities_sum_to_one(order):
    t = [6] + corpus()                                                       # the start case included
    lm = NGramLM(torch.tensor(t), V, order, D)
    for k in range(order):
        for h in contexts(t, k) + [(6,) * k]:
            probs = [lm.prob(c, h) for c in range(V)]
            assert abs(sum(probs) - 1) < 1e-12, (h, sum(probs))
            assert min(probs) > 0


def test_nll_lower_order_and_discount():
    t = torch.tensor(corpus())
    lm = NGramLM(t, V, 4, D)
    seq = [0, 1, 2, 6, 3, 4, 1, 2, 0]
    want = -sum(math.log(lm.prob(c, seq[max(0, i - 3):i])) for i, c in enumerate(seq))
    assert abs(lm.nll(torch.tensor(seq)) - want) < 1e-12
    held = torch.tensor(corpus(200, seed=1))
    for order in (1, 2, 3):                                                  # the same model as counted afresh
        assert lm.lower_order(order).nll(held) == pytest.approx(NGramLM(t, V, order, D).nll(held), abs=1e-12)
    assert lm.with_discount(0.5).nll(held) == pytest.approx(NGramLM(t, V, 4, 0.5).nll(held), abs=1e-12)
    assert lm.D == D and lm.order == 4                                       # the copies leave lm alone
    assert NGramLM(t, V, 4, D).nll(held) < NGramLM(t, V, 1, D).nll(held)   # context helps on this corpus


@pytest.mark.parametrize("bad, match", [
    (lambda t: NGramLM(t, V, 0), "order"),
    (lambda t: NGramLM(t, V, 3, discount=1.5), "discount"),
    (lambda t: NGramLM(t + V, V, 3), "tokens"),
    (lambda t: NGramLM(t, V, 3).lower_order(4), "order"),
    (lambda t: NGramLM(t, V, 3).with_discount(-0.1), "discount"),
    (lambda t: NGramLM(t, V, 3).nll(t + V), "tokens"),
])
def test_bad_inputs(bad, match):
    with pytest.raises(ValueError, match=match):
        bad(torch.tensor(corpus(50)))


def test_corpus_start_breaks_nltks_normalisation():
    """Difference 2, the other case: 6 5 occurs only at position 0, 6 again later (in 4 6 0). nltk's N(6 .) counts
    both 5 and 0 in raw counts, but only 6 0 has a token before it, so for the order-3 model nltk's p(. | 5 6), which
    backs off to the context 6, sums to more than 1; ours counts N(6 .) in continuation counts and sums to 1."""
    t = [6, 5] + corpus() + [4, 6, 0]
    ours, theirs = NGramLM(torch.tensor(t), V, 3, D), nltk_model(t, 3)
    nltk_total = sum(theirs.score(str(c), ["5", "6"]) for c in range(V))
    assert nltk_total == pytest.approx(1 - D + D * 2, abs=1e-12)             # alpha(0) = 1 - D, gamma = 2 D / 1
    assert abs(sum(ours.prob(c, (5, 6)) for c in range(V)) - 1) < 1e-12
