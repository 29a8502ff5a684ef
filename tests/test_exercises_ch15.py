"""Chapter 15's graders (transformer_lib.exercises.applications): correct answers pass, and typical mistakes are
caught with a message that names them. check_reader is tested with rules played as models (tests/helpers.py)."""

from collections import Counter

import pytest
import torch
from helpers import RuleAsModel, answer_of, grader_row

from transformer_lib.applications import QA_PLACES, last_place, nearest_place
from transformer_lib.exercises.applications import (
    check_best_span,
    check_reader,
    check_rouge_l,
    check_where_is_object,
)


def best_span(s, e, max_answer_len):
    pairs = [((s[i] + e[j]).item(), i, j) for i in range(len(s)) for j in range(i, min(i + max_answer_len, len(s)))]
    return max(pairs)[1:]


def best_span_tensor(s, e, max_answer_len):            # vectorised, returning 0-dim tensors, in float32
    S = s.size(0)
    i, j = torch.meshgrid(torch.arange(S), torch.arange(S), indexing="ij")
    total = (s[:, None] + e[None, :]).masked_fill(~((j >= i) & (j < i + max_answer_len)), float("-inf"))
    k = total.flatten().argmax()
    return k // S, k % S


def where_is_object(sentences, obj):
    return answer_of(sentences, ["where", "is", "the", obj, "?"])


def lcs(p, r):
    table = [[0] * (len(r) + 1) for _ in range(len(p) + 1)]
    for i, a in enumerate(p):
        for j, b in enumerate(r):
            table[i + 1][j + 1] = table[i][j] + 1 if a == b else max(table[i][j + 1], table[i + 1][j])
    return table[-1][-1]


def rouge_l_f(prediction, reference):
    n = lcs(prediction, reference)
    return 2 * n / (len(prediction) + len(reference)) if n else 0.0


def longest_run(p, r):
    runs = [[0] * (len(r) + 1) for _ in range(len(p) + 1)]
    for i, a in enumerate(p):
        for j, b in enumerate(r):
            runs[i + 1][j + 1] = runs[i][j] + 1 if a == b else 0
    return max(map(max, runs))


def test_check_reader_passes_a_perfect_reader_and_names_the_heuristic_a_weak_one_follows(capsys):
    check_reader(RuleAsModel(answer_of), n=100)
    check_reader(RuleAsModel(answer_of), question="object", n=100)
    assert capsys.readouterr().out.count("check_reader: exact match 100.0%, F1 100.0%") == 2
    with pytest.raises(AssertionError, match="agree with the heuristic 'the last place in the story' on 100.0%.*"
                                             "learned that heuristic"):
        check_reader(RuleAsModel(last_place), n=100)
    with pytest.raises(AssertionError, match="before the question's word' on 100.0%.*two_fact=0.5"):
        check_reader(RuleAsModel(nearest_place), question="object", n=100)
    with pytest.raises(AssertionError, match=r"exact match is .*goal: 99.9%"):
        check_reader(RuleAsModel(nearest_place), n=100, goal=0.999)
    with pytest.raises(ValueError, match="question must be 'person' or 'object', got 'place'"):
        check_reader(RuleAsModel(answer_of), question="place")


GRADERS = [
    grader_row(check_best_span, correct=[best_span, best_span_tensor,
                                         lambda s, e, L: tuple(float(x) for x in best_span(s, e, L))], mistakes=[
        (lambda s, e, L: (s.argmax(), e.argmax()), r"ends before it starts|positions long"),   # separately
        (lambda s, e, L: best_span(s, e, L + 3), r"positions long .*at most max_answer_len = 8"),
        (lambda s, e, L: (int(s.argmax()), int(s.argmax()) + int(e[int(s.argmax()):int(s.argmax()) + L].argmax())),
         r"you fixed the start at the best start score"),
        (lambda s, e, L: (0, 0), r"a span outside the story"),
        (lambda s, e, L: 3, r"must return two positions"),
    ]),
    grader_row(check_where_is_object, correct=[where_is_object,
                                               lambda s, o: where_is_object(s, o).removeprefix("the ")], mistakes=[
        (lambda sentences, obj: nearest_place(sentences, ["where", "is", "the", obj, "?"]),
         "the person who took it may have moved since"),
        (lambda sentences, obj: last_place(sentences, None), r"returned 'the [a-z ]+', but the answer is"),
        (lambda sentences, obj: "the " + QA_PLACES[0], r"returned 'the kitchen', but the answer is"),   # a constant
        (lambda sentences, obj: where_is_object(sentences, obj).split()[-1],     # the place's last word only
         "a place is every word after the verb of a move"),
    ]),
    grader_row(check_rouge_l, correct=[rouge_l_f, lambda p, r: torch.tensor(rouge_l_f(p, r), dtype=torch.float32)],
               mistakes=[
        (lambda p, r: 2 * longest_run(p, r) / (len(p) + len(r)), "a substring"),
        (lambda p, r: 2 * sum((Counter(p) & Counter(r)).values()) / (len(p) + len(r)), "your score is ROUGE-1"),
        (lambda p, r: lcs(p, r) / len(r), "you returned the recall"),
        (lambda p, r: lcs(p, r) / len(p), "you returned the precision"),
        (lambda p, r: 0.5, r"ROUGE-L F1 is \d"),                                    # a constant: no slip to name
    ]),
]
