"""Chapter 15 (transformer_lib.applications): the story generator against an independent replay of each story,
the rule baselines, the span-head input layout and masks, exact match against a rule played as a model, the
QA training loop, and the summarization data."""

import random

import pytest
import torch
from helpers import RuleAsModel, answer_of, replay

from transformer_lib.applications import (
    ID,
    OBJECTS,
    PLACES,
    VOCAB,
    encode,
    exact_match,
    final_state,
    last_place,
    make_story,
    nearest_place,
    qa_batch,
    start_scores,
    tell_story,
    train_qa,
)
from transformer_lib.bert import BertConfig, BertForQuestionAnswering


@pytest.mark.parametrize("kind", ["person", "object"])
def test_every_answer_is_the_true_final_place(kind):
    rng = random.Random(0)
    for _ in range(300):
        sentences, question, (s, w) = make_story(rng, question=kind)
        assert 4 <= len(sentences) <= 10 and all(x in VOCAB for sent in sentences for x in sent)
        assert sentences[s][w] == answer_of(sentences, question)
        if kind == "person":          # the supporting sentence is the person's last move
            moves = [k for k, x in enumerate(sentences) if x[0] == question[2] and x[-2] in PLACES]
            assert s == moves[-1]


def test_tell_story_returns_the_state_its_sentences_describe():
    rng = random.Random(1)
    for _ in range(300):
        sentences, where, holder, lying = tell_story(rng)
        w, h, ly = replay(sentences)
        assert {p: place for p, (place, _) in where.items()} == w and holder == h
        assert {o: place for o, (place, _) in lying.items()} == ly
        for obj in OBJECTS:                    # an object is held by one person, or lies somewhere, or is unseen
            assert not (obj in holder and obj in lying)


def test_stories_do_not_repeat_a_move_to_the_same_place_and_start_with_a_move():
    rng = random.Random(2)
    for _ in range(300):
        sentences = tell_story(rng)[0]
        assert sentences[0][-2] in PLACES
        here = {}
        for s in sentences:
            if s[-2] in PLACES:
                assert here.get(s[0]) != s[-2]
                here[s[0]] = s[-2]


def test_make_story_refuses_bad_arguments():
    rng = random.Random(0)
    with pytest.raises(ValueError, match="question must be 'person' or 'object'"):
        make_story(rng, question="place")
    with pytest.raises(ValueError, match="max_sentences must be >= min_sentences = 5, got 3"):
        make_story(rng, 5, 3)
    with pytest.raises(ValueError, match="min_sentences must be an int"):
        make_story(rng, 2.5)


def test_the_rules_on_a_story_written_by_hand():
    story = [s.split() for s in ("mary went to the kitchen .", "john moved to the garden .",
                                 "mary picked up the apple .", "john got the milk .")]
    assert last_place(story, "where is mary ?".split()) == "garden"          # the story's last place
    assert nearest_place(story, "where is mary ?".split()) == "garden"       # wrong: her last mention names none
    assert answer_of(story, "where is mary ?".split()) == "kitchen"
    story.append("mary travelled to the office .".split())
    assert nearest_place(story, "where is mary ?".split()) == "office" == answer_of(story, "where is mary ?".split())
    assert nearest_place(story, "where is the apple ?".split()) == "garden"     # wrong: mary took it to the office
    assert answer_of(story, "where is the apple ?".split()) == "office"
    assert nearest_place(story, "where is the milk ?".split()) == "garden" == answer_of(story, "x the milk ?".split())


@pytest.mark.parametrize("sentence_segments", [True, False])
def test_encode_lays_out_cls_question_sep_story_sep(sentence_segments):
    sentences, question, answer = make_story(random.Random(3))
    ids, segments, position = encode(sentences, question, answer, sentence_segments)
    words = [VOCAB[i] for i in ids]
    n_q = len(question)
    assert words == ["[CLS]", *question, "[SEP]", *[w for s in sentences for w in s], "[SEP]"]
    assert words[position] == sentences[answer[0]][answer[1]]
    assert segments[:n_q + 2] == [0] * (n_q + 2) and len(segments) == len(ids)
    story_segments = segments[n_q + 2:-1]
    expected = [k + 1 if sentence_segments else 1 for k, s in enumerate(sentences) for _ in s]
    assert story_segments == expected and segments[-1] == expected[-1]


def test_qa_batch_pads_and_start_scores_see_only_the_story():
    stories = [make_story(random.Random(k)) for k in range(6)]
    tokens, segments, answers = qa_batch(stories)
    lengths = [len(encode(*s)[0]) for s in stories]
    assert tokens.shape == segments.shape == (6, max(lengths)) and answers.shape == (6,)
    for b, n in enumerate(lengths):
        assert (tokens[b, n:] == ID["[PAD]"]).all() and (segments[b, n:] == 0).all()
    torch.manual_seed(0)
    model = BertForQuestionAnswering(BertConfig(vocab_size=len(VOCAB), d_model=16, num_layers=1, num_heads=2,
                                                d_ff=32, max_len=80, dropout=0.0, type_vocab_size=12))
    scores = start_scores(model, tokens, segments)
    story = (segments > 0) & (tokens != ID["[SEP]"]) & (tokens != ID["[PAD]"])
    assert torch.isneginf(scores[~story]).all() and torch.isfinite(scores[story]).all()
    assert story.sum(1).tolist() == [sum(map(len, s[0])) for s in stories]


@pytest.mark.parametrize("kind", ["person", "object"])
def test_exact_match_of_a_rule_played_as_a_model_is_the_rules_accuracy(kind):
    rng = random.Random(4)
    stories = [make_story(rng, question=kind) for _ in range(200)]
    for rule in (last_place, answer_of):
        accuracy = sum(rule(s, q) == s[a][w] for s, q, (a, w) in stories) / len(stories)
        model = RuleAsModel(rule).train()
        assert exact_match(model, stories) == pytest.approx(accuracy)
        assert model.training                                         # the caller's mode is restored
    assert exact_match(RuleAsModel(answer_of), stories) == 1.0


def test_train_qa_lowers_the_loss_and_refuses_bad_arguments():
    torch.manual_seed(0)
    model = BertForQuestionAnswering(BertConfig(vocab_size=len(VOCAB), d_model=32, num_layers=1, num_heads=2,
                                                d_ff=64, max_len=80, dropout=0.0, type_vocab_size=12, init_std=0.2))
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
    model = BertForQuestionAnswering(BertConfig(vocab_size=len(VOCAB), d_model=16, num_layers=1, num_heads=2,
                                                d_ff=32, max_len=80, dropout=0.0, type_vocab_size=12))
    app.train_qa(model, steps=20, short_steps=20, batch_size=32, exclude=keys)
    assert len(seen) == 640 and not keys & set(seen)
    seen.clear()
    app.train_qa(model, steps=20, short_steps=20, batch_size=32)
    assert keys & set(seen)                       # without `exclude` short stories do repeat: the test can fail


def test_train_qa_stops_after_the_first_steps_of_the_full_run():
    def run(**kwargs):
        torch.manual_seed(0)
        model = BertForQuestionAnswering(BertConfig(vocab_size=len(VOCAB), d_model=16, num_layers=1, num_heads=2,
                                                    d_ff=32, max_len=80, dropout=0.0, type_vocab_size=12))
        return train_qa(model, steps=10, short_steps=4, batch_size=4, **kwargs)

    full, first = run(evaluate=lambda m: 1.5, eval_every=5), run(stop_after=6)
    assert first["loss"] == full["loss"][:6] and first["lr"] == full["lr"][:6]    # the schedule of 10 steps
    assert full["lr"][-1] < full["lr"][0] == 1e-3 and full["eval_step"] == [5, 10] and full["eval"] == [1.5, 1.5]
    assert first["optimizer"] == full["optimizer"] and first["optimizer"]["class"] == "AdamW"
    with pytest.raises(ValueError, match="stop_after must be <= steps=10, got 11"):
        run(stop_after=11)


def test_final_state():
    rng = random.Random(6)
    sentences, where_, holder_, _ = tell_story(rng)
    summary = final_state(where_, holder_)
    where, holder, _ = replay(sentences)
    assert summary[-1] == "."
    clauses = " ".join(summary[:-1]).split(" , ")
    assert [c.split()[0] for c in clauses] == list(dict.fromkeys(s[0] for s in sentences if s[-2] in PLACES))
    for c in clauses:
        person, place = c.split()[0], c.split()[4]
        assert place == where[person]
        assert sorted(w for w in c.split()[5:] if w in OBJECTS) == sorted(o for o, h in holder.items() if h == person)
    assert final_state({"mary": ("kitchen", 0)}, {"apple": "mary", "milk": "mary"}) == \
        "mary is in the kitchen with the apple and the milk .".split()


def test_encode_names_a_word_outside_the_vocabulary():
    story = [s.split() for s in ("mary went to the kitchen .", "mary ate the banana .")]
    with pytest.raises(ValueError, match=r"must be in VOCAB; not in it: \['ate', 'banana'\]"):
        qa_batch([(story, "where is mary ?".split(), (0, 4))])
