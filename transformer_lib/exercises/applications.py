"""The graders of Chapter 15's exercises (question answering and summarization), imported by the chapter's exercise cells.

Hand-written, not exported from the chapter: a grader's reference and named slips are the answers, and Colab shows
every cell of a chapter, so their code stays out of the chapters."""

__all__ = ['check_best_span', 'check_where_is_object', 'check_rouge_l', 'check_reader', 'check_raw_length']

import random
from collections import Counter

import torch

from ..applications import (
    answer_text,
    last_place,
    lead_sentence,
    make_story,
    nearest_place,
    normalize_answer,
    place_of,
    predict_answers,
    shipped_pairs,
    squad_scores,
)
from .grading import call_reader, number


def check_best_span(best_span, n: int = 300, seed: int = 11, max_answer_len: int = 8):
    """Grade best_span(start_scores, end_scores, max_answer_len) -> (i, j) on n random float32 score vectors of
    a story (-inf outside it): the pair i <= j < i + max_answer_len of largest s_i + e_j, found here by trying
    every pair. Ints, 0-dim tensors and numpy ints are all accepted as i and j."""
    g = torch.Generator().manual_seed(seed)
    for k in range(n):
        S = int(torch.randint(12, 60, (), generator=g))
        scores = torch.randn(2, S, generator=g) * 3                                # float32, as a reader's
        lo, hi = int(torch.randint(2, 8, (), generator=g)), S - 1                   # the story: positions lo..hi-1
        scores[:, :lo], scores[:, hi:] = float("-inf"), float("-inf")
        s, e = scores
        pairs = [(s[i] + e[j], i, j) for i in range(lo, hi) for j in range(i, min(i + max_answer_len, hi))]
        best, bi, bj = max(pairs, key=lambda p: p[0].item())
        got = best_span(s.clone(), e.clone(), max_answer_len)
        try:
            i, j = (int(x) for x in got)
        except (TypeError, ValueError):
            raise AssertionError(f"best_span must return two positions (i, j), got {got!r}") from None
        where = f"(scores {k} of {n}: S = {S}, the story at positions {lo}..{hi - 1})"
        if not (0 <= i < S and 0 <= j < S) or torch.isinf(s[i] + e[j]):
            raise AssertionError(f"best_span returned ({i}, {j}), a span outside the story {where}: its score "
                                 f"is -inf; search only positions whose start and end scores are finite")
        if j < i:
            raise AssertionError(f"best_span returned ({i}, {j}): the span ends before it starts {where}; the best "
                                 f"start and the best end, taken separately, need not make a span: search pairs "
                                 f"with i <= j")
        if j - i + 1 > max_answer_len:
            raise AssertionError(f"best_span returned ({i}, {j}), {j - i + 1} positions long {where}; spans may "
                                 f"have at most max_answer_len = {max_answer_len} (j < i + max_answer_len)")
        if (s[i] + e[j]).item() < best.item() - 1e-5 * (1 + abs(best.item())):
            hint = ("you fixed the start at the best start score and then chose the end; the best pair can start "
                    "at a worse start" if i == int(s.argmax()) else "try every valid pair (i, j)")
            raise AssertionError(f"best_span returned ({i}, {j}) with s_i + e_j = {(s[i] + e[j]).item():.4f}, but "
                                 f"({bi}, {bj}) scores {best.item():.4f} {where}: {hint}")
    print(f"check_best_span: the best valid span on all {n} score vectors")


def check_where_is_object(where_is_object, n: int = 1000, seed: int = 8):
    """Grade where_is_object(sentences, obj) -> place (text, "the back garden"; compared after SQuAD's
    normalisation, so "back garden" counts too) on n generated two-fact stories; name the first wrong story."""
    rng = random.Random(seed)
    for _ in range(n):
        story = make_story(rng, question="object")
        sentences, question, _ = story
        obj, truth = question[-2], answer_text(story)
        got = where_is_object(sentences, obj)
        if not isinstance(got, str) or normalize_answer(got) != normalize_answer(truth):
            took = max(k for k, s in enumerate(sentences) if obj in s and place_of(s) is None)
            if got == nearest_place(sentences, question):
                hint = ("that is the last place named before the object's last mention: the person who took it "
                        "may have moved since")
            elif isinstance(got, str) and got.split()[-1:] != truth.split()[-1:]:
                hint = "follow the person who last picked it up to where they are now, or, if they dropped it, " \
                       "to where they were when they dropped it"
            else:
                hint = "a place is every word after the verb of a move, up to the '.'"
            story_text = "\n".join(f"{k + 1:2d} " + " ".join(x) for k, x in enumerate(sentences))
            raise AssertionError(f"where_is_object(story, {obj!r}) returned {got!r}, but the answer is {truth!r} "
                                 f"(the object's last pick-up or drop is sentence {took + 1}): {hint}\n{story_text}")
    print(f"check_where_is_object: correct on all {n} stories")


def check_rouge_l(rouge_l_f, n: int = 300):
    """Grade rouge_l_f(prediction, reference) -> ROUGE-L's F1 (word lists) against rouge-score on n docstring
    pairs of section 15.6: the body's lead sentence as the prediction, the summary line as the reference, both in
    rouge-score's own tokens (lower case, letters and digits). A mismatch names the slip when it is a common one."""
    from rouge_score import rouge_scorer, tokenize

    scorer = rouge_scorer.RougeScorer(["rougeL"])
    f1 = lambda match, p, r: 2 * match / (len(p) + len(r)) if match else 0.0          # noqa: E731

    def substring(p, r):                    # the longest run of words that both hold in a row
        best, run = 0, [0] * (len(r) + 1)
        for a in p:
            run = [0] + [run[j] + 1 if a == b else 0 for j, b in enumerate(r)]
            best = max(best, *run)
        return best

    def lcs(p, r):
        row = [0] * (len(r) + 1)
        for a in p:
            prev, row = row, [0]
            for j, b in enumerate(r):
                row.append(prev[j] + 1 if a == b else max(prev[j + 1], row[j]))
        return row[-1]

    slips = {"you counted the longest run of words the two share in a row (a substring); ROUGE-L's longest common "
             "subsequence keeps the order but may skip words in between": lambda p, r: f1(substring(p, r), p, r),
             "your score is ROUGE-1 (shared words in any order); ROUGE-L counts only words that appear in the same "
             "order in both": lambda p, r: f1(sum((Counter(p) & Counter(r)).values()), p, r),
             "you returned the recall LCS / len(reference), not the F1 of precision and recall":
                 lambda p, r: lcs(p, r) / len(r),
             "you returned the precision LCS / len(prediction), not the F1 of precision and recall":
                 lambda p, r: lcs(p, r) / len(p)}
    tested = 0
    for pair in shipped_pairs():
        prediction = tokenize.tokenize(lead_sentence(pair["body"]), None)
        reference = tokenize.tokenize(pair["summary"], None)
        if not prediction or not reference:
            continue
        truth = scorer.score(" ".join(reference), " ".join(prediction))["rougeL"].fmeasure
        got = float(rouge_l_f(prediction, reference))
        if abs(got - truth) > 1e-6:
            named = [text for text, slip in slips.items() if abs(slip(prediction, reference) - got) < 1e-6]
            raise AssertionError(f"rouge_l_f gave {got:.4f} but ROUGE-L F1 is {truth:.4f} for prediction "
                                 f"{' '.join(prediction)!r} and reference {' '.join(reference)!r}"
                                 + (f": {named[0]}" if named else ""))
        tested += 1
        if tested == n:
            break
    print(f"check_rouge_l: equal to rouge-score on {n} docstring pairs")


def check_reader(model, question: str = "person", n: int = 500, seed: int = 10, goal: float = 0.95):
    """Grade a trained BertForQuestionAnswering (the chapter's QA_VOCAB, sentence numbers as segments) on n fresh
    stories by SQuAD's exact match: one-fact questions ("person") pass at >= goal; two-fact ones ("object") pass
    when the reader beats the better heuristic of 15.2 on the same stories by a point. A failure says which
    heuristic its answers agree with."""
    if question not in ("person", "object"):
        raise ValueError(f"question must be 'person' or 'object', got {question!r}")
    rng = random.Random(seed)
    stories = [make_story(rng, question=question) for _ in range(n)]
    said = predict_answers(model, stories)
    scores = squad_scores(said, stories)
    rules = {name: (rule, squad_scores([rule(s, q) for s, q, _ in stories], stories)["exact"])
             for name, rule in (("the last place in the story", last_place),
                                ("the last place at or before the question's word", nearest_place))}
    best = max(exact for _, exact in rules.values())
    target, kind = (goal, "one-fact") if question == "person" else (best + 0.01, "two-fact")
    if scores["exact"] < target:
        agree = {name: sum(normalize_answer(x) == normalize_answer(rule(s, q))
                           for x, (s, q, _) in zip(said, stories, strict=True)) / n
                 for name, (rule, _) in rules.items()}
        name, share = max(agree.items(), key=lambda kv: kv[1])
        raise AssertionError(
            f"your reader's exact match is {scores['exact']:.1%} (F1 {scores['f1']:.1%}) on {n} {kind} questions "
            f"(goal: {target:.1%}; the better heuristic gets {best:.1%}); its answers agree with the heuristic "
            f"'{name}' on {share:.1%} of them"
            + (": it has learned that heuristic, not the binding of a place to a person" if share > 0.8 else "")
            + ("; was it trained on two-fact questions (train_qa(..., two_fact=0.5))?" if question == "object"
               else "; check init_std, the curriculum (short_steps) and the steps"))
    print(f"check_reader: exact match {scores['exact']:.1%}, F1 {scores['f1']:.1%} on {n} fresh {kind} questions "
          f"(goal {target:.1%}; the better heuristic {best:.1%})")

def check_raw_length(raw_length):
    """Grade raw_length(inputs_length, noise_density, mean_span_length) -> (n, targets_length): the largest n whose
    span_corruption input has at most inputs_length tokens, and that n's target length, for 60 lengths and three
    settings, against span_corruption's own outputs (the lengths do not depend on the random draw)."""
    import functools
    import random

    from transformer_lib.applications import span_corruption

    @functools.cache
    def measured(n, noise_density, mean_span_length):      # (input length, target length, spans) of n raw tokens
        inputs, targets = span_corruption(list(range(100, 100 + n)), random.Random(0), noise_density, mean_span_length)
        return len(inputs), len(targets), sum(1 for t in inputs if t < 100) - 1

    def largest(inputs_length, settings, counted=lambda i, s: i):   # the largest n whose counted input fits
        n = 2
        while counted(*measured(n + 1, *settings)[::2]) <= inputs_length:
            n += 1
        return n

    def answer(counted=lambda i, s: i, target=lambda t: t, extra=0):
        def mutant(inputs_length, *settings):
            n = largest(inputs_length, settings, counted) + extra
            return n, target(measured(n, *settings)[1])
        return mutant

    cases = {f"raw_length({length}, {d}, {m})": (length, d, m)
             for d, m, lengths in ((0.15, 3.0, range(5, 520, 13)), (0.3, 5.0, range(5, 300, 29)),
                                   (0.1, 2.0, (7, 64, 100, 255, 256, 257, 400, 511, 512, 513)))
             for length in lengths}
    mistakes = {        # named when the reader's answers equal the slip's on every case the reader gets wrong
        "n is one past the largest n whose input fits": answer(extra=1),
        "n is one short: the largest n whose input has AT MOST inputs_length tokens (<=, not <)": answer(extra=-1),
        "the input's EOS is not counted (span_corruption ends the input with EOS)": answer(lambda i, s: i - 1),
        "the sentinels are not counted: each dropped span leaves one sentinel in the input": answer(lambda i, s: i - s),
        "neither the sentinels nor the EOS are counted in the input": answer(lambda i, s: i - s - 1),
        "the target's length leaves out its closing sentinel or its EOS (each sentinel with its span, then one "
        "more sentinel, then EOS)": answer(target=lambda t: t - 1),
    }
    wrong = []
    for where, args in cases.items():
        got = call_reader(raw_length, where, *args)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise AssertionError(f"{where} must return a pair (n, targets_length), got {got!r}")
        got = tuple(int(number(x, f"{where}'s n and targets_length")) for x in got)
        if got != answer()(*args):
            wrong.append((where, got, args))
    if wrong:
        named = [m for m, slip in mistakes.items() if all(got == slip(*args) for _, got, args in wrong)]
        where, got, args = wrong[0]
        raise AssertionError(f"{where} returned {got}, span_corruption's lengths give {answer()(*args)} "
                             f"({len(wrong)} of {len(cases)} cases wrong)" + (f": {named[0]}" if named else ""))
    print(f"check_raw_length: correct for all {len(cases)} input lengths and settings")
