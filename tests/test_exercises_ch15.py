"""Chapter 15's graders (transformer_lib.exercises.applications): correct answers pass, and typical mistakes are
caught with a message that names them. check_reader is tested with rules played as models (tests/test_applications)."""

from collections import Counter

import pytest
from helpers import RuleAsModel, answer_of, grader_row

from transformer_lib.applications import PLACES, last_place, nearest_place
from transformer_lib.exercises.applications import (
    check_reader,
    check_rouge1,
    check_where_is,
    check_where_is_object,
)


def where_is(sentences, person):
    return [s[-2] for s in sentences if s[0] == person and s[-2] in PLACES][-1]


def where_is_object(sentences, obj):
    return answer_of(sentences, ["where", "is", "the", obj, "?"])


def rouge1_f(prediction, reference):
    overlap = sum((Counter(prediction) & Counter(reference)).values())
    p, r = overlap / len(prediction), overlap / len(reference)
    return 2 * p * r / (p + r) if overlap else 0.0


def test_check_reader_passes_a_perfect_reader_and_names_the_rule_a_weak_one_follows(capsys):
    check_reader(RuleAsModel(answer_of), n=100)
    check_reader(RuleAsModel(answer_of), question="object", n=100)
    assert capsys.readouterr().out.count("check_reader:") == 2
    with pytest.raises(AssertionError, match="agree with the rule 'the last place in the story' on 100.0%.*learned "
                                             "that rule"):
        check_reader(RuleAsModel(last_place), n=100)
    with pytest.raises(AssertionError, match="before the question's word' on 100.0%.*two_fact=0.5"):
        check_reader(RuleAsModel(nearest_place), question="object", n=100)
    with pytest.raises(ValueError, match="question must be 'person' or 'object', got 'place'"):
        check_reader(RuleAsModel(answer_of), question="place")


GRADERS = [
    grader_row(check_where_is, correct=[where_is], mistakes=[
        (lambda sentences, person: nearest_place(sentences, ["where", "is", person, "?"]), "MOVES the person"),
        (lambda sentences, person: last_place(sentences, None),
         r"where_is\(story, '\w+'\) returned '\w+', but the answer is the"),
        (lambda sentences, person: [s[-2] for s in sentences if s[0] == person and s[-2] in PLACES][0],  # the first move
         r"returned '\w+', but the answer is the .*the last sentence that MOVES the person decides"),
    ]),
    grader_row(check_where_is_object, correct=[where_is_object], mistakes=[
        (lambda sentences, obj: nearest_place(sentences, ["where", "is", "the", obj, "?"]),
         "follow the person who last picked it up"),
        (lambda sentences, obj: last_place(sentences, None), "follow the person who last picked it up"),
        (lambda sentences, obj: PLACES[0], r"returned '\w+', but the answer is the"),              # a constant
    ]),
    grader_row(check_rouge1, correct=[rouge1_f, lambda p, r: float(rouge1_f(p, r))], mistakes=[   # any real number type
        (lambda p, r: 2 * sum(w in r for w in p) / (len(p) + len(r)),
         r"count each word at most min\(count in prediction, count in reference\)"),
        (lambda p, r: sum((Counter(p) & Counter(r)).values()) / len(r), "ROUGE-1 F1 is"),       # recall, not F1
        (lambda p, r: sum((Counter(p) & Counter(r)).values()) / len(p), "ROUGE-1 F1 is"),       # precision
    ]),
]
