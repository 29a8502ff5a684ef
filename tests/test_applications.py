"""Chapter 15 (transformer_lib.applications): the story generator against an independent replay of each story,
the heuristics, the span-head input layout and masks, best-span decoding against a search over every pair, SQuAD's
normalisation, exact match and F1, the scores of a rule played as a model, the QA training loop, and the
summarization data."""

import random

import pytest
import torch
from helpers import RuleAsModel, answer_of, replay

from transformer_lib.applications import (
    OBJECTS,
    QA_ID,
    QA_PLACES,
    QA_VOCAB,
    answer_text,
    best_spans,
    encode_qa_example,
    exact_match,
    last_place,
    make_story,
    nearest_place,
    normalize_answer,
    place_of,
    predict_answers,
    qa_batch,
    span_scores,
    squad_scores,
    tell_story,
    token_f1,
    train_qa,
)
from transformer_lib.bert import BertConfig, BertForQuestionAnswering


def small_reader(seed=0, **kwargs):
    torch.manual_seed(seed)
    return BertForQuestionAnswering(BertConfig(**{**dict(vocab_size=len(QA_VOCAB), d_model=16, num_layers=1,
                                                         num_heads=2, d_ff=32, max_len=112, dropout=0.0,
                                                         type_vocab_size=12), **kwargs}))


@pytest.mark.parametrize("kind", ["person", "object"])
def test_every_answer_is_the_true_final_place(kind):
    rng = random.Random(0)
    for _ in range(300):
        story = make_story(rng, question=kind)
        sentences, question, (s, first, last) = story
        assert 4 <= len(sentences) <= 10 and all(x in QA_VOCAB for sent in sentences for x in sent)
        assert answer_text(story) == answer_of(sentences, question) == " ".join(sentences[s][first:last + 1])
        assert answer_text(story).removeprefix("the ") in QA_PLACES and sentences[s][last + 1:] == ["."]
        if kind == "person":          # the supporting sentence is the person's last move
            moves = [k for k, x in enumerate(sentences) if x[0] == question[2] and x[-2] not in OBJECTS]
            assert s == moves[-1]


@pytest.mark.parametrize("places", [("kitchen", "garden", "office", "hallway"), QA_PLACES])
def test_tell_story_returns_the_state_its_sentences_describe(places):
    rng = random.Random(1)
    for _ in range(300):
        sentences, where, holder, lying = tell_story(rng, places=places)
        w, h, ly = replay(sentences)
        assert {p: place for p, (place, _) in where.items()} == w and holder == h
        assert {o: place for o, (place, _) in lying.items()} == ly and set(w.values()) <= set(places)
        for obj in OBJECTS:                    # an object is held by one person, or lies somewhere, or is unseen
            assert not (obj in holder and obj in lying)


def test_the_default_world_is_the_readers():
    """tell_story's default places are the reader's multi-word places (QA_PLACES), the world make_story uses."""
    a, b = random.Random(3), random.Random(3)
    assert tell_story(a) == tell_story(b, places=QA_PLACES)
    assert any(len(s) > 6 for s in tell_story(random.Random(4), 10, 10)[0])     # "the hall next to the garden"


def test_stories_do_not_repeat_a_move_to_the_same_place_and_start_with_a_move():
    rng = random.Random(2)
    for _ in range(300):
        sentences = tell_story(rng, places=QA_PLACES)[0]
        assert place_of(sentences[0]) is not None
        here = {}
        for s in sentences:
            if place_of(s):
                assert here.get(s[0]) != place_of(s)
                here[s[0]] = place_of(s)


def test_make_story_refuses_bad_arguments():
    rng = random.Random(0)
    with pytest.raises(ValueError, match="question must be 'person' or 'object'"):
        make_story(rng, question="place")
    with pytest.raises(ValueError, match="max_sentences must be >= min_sentences = 5, got 3"):
        make_story(rng, 5, 3)
    with pytest.raises(ValueError, match="min_sentences must be an int"):
        make_story(rng, 2.5)
    with pytest.raises(ValueError, match="max_sentences must be >= 2 for question='object'"):
        make_story(rng, 1, 1, question="object")        # it looped for ever: no one-sentence story holds an object
    assert make_story(rng, 2, 2, question="object")[1][-2] in OBJECTS


def test_the_heuristics_on_a_story_written_by_hand():
    story = [s.split() for s in ("mary went to the hall next to the garden .", "john moved to the back garden .",
                                 "mary picked up the apple .", "john got the milk .")]
    assert place_of(story[0]) == "the hall next to the garden" and place_of(story[2]) is None
    assert last_place(story, "where is mary ?".split()) == "the back garden"       # the story's last place
    assert nearest_place(story, "where is mary ?".split()) == "the back garden"    # wrong: her last mention names none
    assert answer_of(story, "where is mary ?".split()) == "the hall next to the garden"
    story.append("mary travelled to the office next to the kitchen .".split())
    assert nearest_place(story, "where is mary ?".split()) == "the office next to the kitchen" == \
        answer_of(story, "where is mary ?".split())
    assert nearest_place(story, "where is the apple ?".split()) == "the back garden"   # wrong: mary took it along
    assert answer_of(story, "where is the apple ?".split()) == "the office next to the kitchen"
    assert nearest_place(story, "where is the milk ?".split()) == "the back garden" == \
        answer_of(story, "x the milk ?".split())


def test_squad_normalisation_exact_match_and_f1():
    assert normalize_answer("The Hall, next to  the garden.") == "hall next to garden"
    assert normalize_answer("an apple a day") == "apple day" and normalize_answer("theatre") == "theatre"
    assert exact_match("The kitchen.", "kitchen") == 1.0 and exact_match("the back garden", "the garden") == 0.0
    assert token_f1("the garden", "the hall next to the garden") == pytest.approx(0.4)        # P 1, R 1/4
    assert token_f1("the back garden", "the garden") == pytest.approx(2 / 3)                  # P 1/2, R 1
    assert token_f1("garden garden", "garden") == pytest.approx(2 / 3)       # a repeated word counts once
    assert token_f1("the kitchen", "the hall") == 0.0 and token_f1("the", "the hall") == 0.0
    stories = [make_story(random.Random(k)) for k in range(20)]
    truths = [answer_text(s) for s in stories]
    assert squad_scores(truths, stories) == {"exact": 1.0, "f1": 1.0}
    wrong = ["the garden"] * 20
    expected = {"exact": sum(exact_match(w, t) for w, t in zip(wrong, truths, strict=True)) / 20,
                "f1": sum(token_f1(w, t) for w, t in zip(wrong, truths, strict=True)) / 20}
    assert squad_scores(wrong, stories) == pytest.approx(expected)
    with pytest.raises(ValueError, match="one answer per story"):
        squad_scores(wrong[:3], stories)


@pytest.mark.parametrize("sentence_segments", [True, False])
def test_encode_qa_example_lays_out_cls_question_sep_story_sep(sentence_segments):
    sentences, question, answer = make_story(random.Random(3))
    ids, segments, (start, end) = encode_qa_example(sentences, question, answer, sentence_segments)
    words = [QA_VOCAB[i] for i in ids]
    n_q = len(question)
    assert words == ["[CLS]", *question, "[SEP]", *[w for s in sentences for w in s], "[SEP]"]
    assert " ".join(words[start:end + 1]) == answer_text((sentences, question, answer))
    assert segments[:n_q + 2] == [0] * (n_q + 2) and len(segments) == len(ids)
    story_segments = segments[n_q + 2:-1]
    expected = [k + 1 if sentence_segments else 1 for k, s in enumerate(sentences) for _ in s]
    assert story_segments == expected and segments[-1] == expected[-1]


def test_qa_batch_pads_and_span_scores_see_only_the_story():
    stories = [make_story(random.Random(k)) for k in range(6)]
    tokens, segments, starts, ends = qa_batch(stories)
    lengths = [len(encode_qa_example(*s)[0]) for s in stories]
    assert tokens.shape == segments.shape == (6, max(lengths)) and starts.shape == ends.shape == (6,)
    assert (starts <= ends).all()
    for b, n in enumerate(lengths):
        assert (tokens[b, n:] == QA_ID["[PAD]"]).all() and (segments[b, n:] == 0).all()
    scores = span_scores(small_reader(), tokens, segments)
    assert scores.shape == (6, tokens.size(1), 2)
    story = (segments > 0) & (tokens != QA_ID["[SEP]"]) & (tokens != QA_ID["[PAD]"])
    assert torch.isneginf(scores[~story]).all() and torch.isfinite(scores[story]).all()
    assert story.sum(1).tolist() == [sum(map(len, s[0])) for s in stories]


@pytest.mark.parametrize("max_answer_len", [1, 3, 8])
def test_best_spans_is_the_best_valid_pair(max_answer_len):
    """With n_best = S the n-best search is exact: equal to a search over every pair i <= j < i + L."""
    g = torch.Generator().manual_seed(max_answer_len)
    scores = torch.randn(16, 30, 2, generator=g)
    scores[:, :4], scores[:, 25:] = float("-inf"), float("-inf")              # the story: positions 4..24
    a, b = best_spans(scores, max_answer_len, n_best=30)
    for r in range(16):
        best = max(((scores[r, i, 0] + scores[r, j, 1]).item(), i, j)
                   for i in range(4, 25) for j in range(i, min(i + max_answer_len, 25)))
        assert (a[r].item(), b[r].item()) == best[1:]
    a20, b20 = best_spans(scores, max_answer_len)                              # n_best = 20 finds them here too
    assert torch.equal(a20, a) and torch.equal(b20, b)


def test_best_spans_n_best_can_miss_when_every_best_end_precedes_every_best_start():
    s = torch.tensor([float("-inf"), 0.0, 0.0, 5.0, 4.0])
    e = torch.tensor([float("-inf"), 0.5, 0.4, 0.0, -1.0])
    scores = torch.stack([s, e], -1)[None]
    assert [int(x) for x in best_spans(scores, 8, n_best=5)] == [3, 3]
    a, b = best_spans(scores, 8, n_best=2)
    assert int(b) == int(a) - 1                     # no valid pair among them: an empty span, predict_answers says ""
    a, b = best_spans(torch.stack([torch.tensor([0.0, 5.0, 0, 0, 0, 0]), torch.tensor([0.0, 0, 0, 0, 0, 5.0])], -1)[None],
                      max_answer_len=3, n_best=1)   # the one pair is too long: empty too, not a span of 5 tokens
    assert (int(a), int(b)) == (1, 0)
    with pytest.raises(ValueError, match="n_best must be an int"):
        best_spans(scores, 8, n_best=0)
    with pytest.raises(ValueError, match=r"scores must be a tensor of shape \(B, S, 2\)"):
        best_spans(scores[0], 8)
    with pytest.raises(ValueError, match="scores"):
        best_spans(torch.zeros(1, 5, 3), 8)


@pytest.mark.parametrize("kind", ["person", "object"])
def test_squad_scores_of_a_rule_played_as_a_model_are_the_rules(kind):
    rng = random.Random(4)
    stories = [make_story(rng, question=kind) for _ in range(200)]
    for rule in (last_place, nearest_place, answer_of):
        said = [rule(s, q) for s, q, _ in stories]
        model = RuleAsModel(rule).train()
        assert predict_answers(model, stories) == said
        assert squad_scores(predict_answers(model, stories), stories) == squad_scores(said, stories)
        assert model.training                                         # the caller's mode is restored
    assert squad_scores(predict_answers(RuleAsModel(answer_of), stories), stories) == {"exact": 1.0, "f1": 1.0}


def test_train_qa_lowers_the_loss_and_refuses_bad_arguments():
    model = small_reader(d_model=32, d_ff=64, init_std=0.2)
    losses = train_qa(model, steps=80, short_steps=80, batch_size=16, lr=3e-3)["loss"]
    assert len(losses) == 80 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-10:]) < 0.8 * sum(losses[:10])
    with pytest.raises(ValueError, match="steps must be an int >= 2"):
        train_qa(model, steps=1)
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        train_qa(model, steps=2, seed=-1)


def test_train_qa_never_trains_on_an_excluded_story(monkeypatch):
    import transformer_lib.applications as app

    rng = random.Random(5)
    excluded = [make_story(rng, 2, 4) for _ in range(300)]
    keys = {(tuple(map(tuple, s)), tuple(q)) for s, q, _ in excluded}
    seen = []
    real = app.qa_batch

    def spy(stories, sentence_segments=True):
        seen.extend((tuple(map(tuple, s)), tuple(q)) for s, q, _ in stories)
        return real(stories, sentence_segments)

    monkeypatch.setattr(app, "qa_batch", spy)
    model = small_reader()
    app.train_qa(model, steps=20, short_steps=20, batch_size=32, exclude=keys)
    assert len(seen) == 640 and not keys & set(seen)
    seen.clear()
    app.train_qa(model, steps=20, short_steps=20, batch_size=32)
    assert keys & set(seen)                       # without `exclude` short stories do repeat: the test can fail


def test_train_qa_stops_after_the_first_steps_of_the_full_run():
    def run(**kwargs):
        return train_qa(small_reader(), steps=10, short_steps=4, batch_size=4, **kwargs)

    full, first = run(evaluate=lambda m: 1.5, eval_every=5), run(stop_after=6)
    assert first["loss"] == full["loss"][:6] and first["lr"] == full["lr"][:6]    # the schedule of 10 steps
    assert full["lr"][-1] < full["lr"][0] == 1e-3 and full["eval_step"] == [5, 10] and full["eval"] == [1.5, 1.5]
    assert first["optimizer"] == full["optimizer"] and first["optimizer"]["class"] == "AdamW"
    with pytest.raises(ValueError, match="stop_after must be <= steps=10, got 11"):
        run(stop_after=11)


def test_encode_qa_example_names_a_word_outside_the_vocabulary():
    story = [s.split() for s in ("mary went to the kitchen .", "mary ate the banana .")]
    with pytest.raises(ValueError, match=r"must be in QA_VOCAB; not in it: \['ate', 'banana'\]"):
        qa_batch([(story, "where is mary ?".split(), (0, 3, 4))])
