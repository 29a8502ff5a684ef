"""Chapter 8's graders (transformer_lib.exercises.training): the reference answers pass, float32 answers pass,
and typical mistakes are caught with a message that names them."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import Call, grader_row

from transformer_lib.data import CharTokenizer, number_pairs
from transformer_lib.decoding import length_penalty
from transformer_lib.exercises.training import (
    check_cached_greedy,
    check_cosine_lr,
    check_fixed_smoothing_loss,
    check_french_characters,
    check_label_smoothing,
    check_length_penalty,
    check_noam,
    check_others_smoothing,
    check_tie_alpha,
)
from transformer_lib.training import noam_lr

# --- exercise 1 and bug hunt 5: label smoothing


def smoothed_loss(logits, target, label_smoothing, pad_id):
    V = logits.size(-1)
    return nn.CrossEntropyLoss(label_smoothing=label_smoothing, ignore_index=pad_id)(logits.reshape(-1, V),
                                                                                   target.reshape(-1))


def smoothed_loss32(logits, target, label_smoothing, pad_id):
    logp = F.log_softmax(logits.float(), dim=-1)                          # (B, T, V) float32
    V = logp.size(-1)
    q = torch.full_like(logp, label_smoothing / V)
    q.scatter_(-1, target[..., None], 1 - label_smoothing + label_smoothing / V)
    real = (target != pad_id)[..., None]
    return -(q * logp * real).sum() / real.sum()


def mean_over_padding(logits, target, label_smoothing, pad_id):              # the bug of the bug hunt
    logp = F.log_softmax(logits, dim=-1)
    V = logp.size(-1)
    q = torch.full_like(logp, label_smoothing / V)
    q.scatter_(-1, target[..., None], 1 - label_smoothing + label_smoothing / V)
    real = (target != pad_id)[..., None]
    return -(q * logp * real).sum(-1).mean()


def padding_loss_summed(logits, target, label_smoothing, pad_id):          # only the denominator repaired
    logp = F.log_softmax(logits, dim=-1)
    V = logp.size(-1)
    q = torch.full_like(logp, label_smoothing / V)
    q.scatter_(-1, target[..., None], 1 - label_smoothing + label_smoothing / V)
    return -(q * logp).sum() / (target != pad_id).sum()


def padding_not_ignored(logits, target, label_smoothing, pad_id):
    V = logits.size(-1)
    return nn.CrossEntropyLoss(label_smoothing=label_smoothing)(logits.reshape(-1, V), target.reshape(-1))


def no_smoothing(logits, target, label_smoothing, pad_id):
    return smoothed_loss(logits, target, 0.0, pad_id)


# --- exercise 2: the length-normalised score


def score(log_prob, length, alpha):
    return log_prob / length_penalty(length, alpha)


def score32(log_prob, length, alpha):
    return log_prob.float() / ((5 + length.float()) / 6) ** alpha


def multiplied(log_prob, length, alpha):
    return log_prob * ((5 + length) / 6) ** alpha


def precedence(log_prob, length, alpha):
    return log_prob / ((5 + length) / 6 ** alpha)


def plain_length(log_prob, length, alpha):
    return log_prob / length ** alpha


def alpha_ignored(log_prob, length, alpha):
    return log_prob / ((5 + length) / 6)


# --- exercise 1: smoothing over the other V - 1 classes, and its floor


def _others(logits, target, ls, pad_id, q_true, q_other, real_only=True, denominator=None):
    logp = F.log_softmax(logits, dim=-1)                                   # (B, T, V)
    q = torch.full_like(logp, q_other)
    q.scatter_(-1, target[..., None], q_true)
    per_token = -(q * logp).sum(-1)                                        # (B, T)
    real = target != pad_id
    if denominator == "all":
        return (per_token * real).sum() / real.numel()
    return per_token[real].mean() if real_only else per_token.mean()


def others(logits, target, ls, pad_id):
    V = logits.size(-1)
    return _others(logits, target, ls, pad_id, 1 - ls, ls / (V - 1))


def others32(logits, target, ls, pad_id):
    return others(logits.float(), target, ls, pad_id)


def others_floor(V, ls):
    return -(1 - ls) * math.log(1 - ls) - ls * math.log(ls / (V - 1))


def others_floor32(V, ls):
    e = torch.tensor(ls, dtype=torch.float32)
    return -(1 - e) * torch.log(1 - e) - e * torch.log(e / (V - 1))


def others_on_all_v(logits, target, ls, pad_id):                        # eps / (V - 1) on the true class too
    V = logits.size(-1)
    return _others(logits, target, ls, pad_id, 1 - ls + ls / (V - 1), ls / (V - 1))


def others_eps_over_v(logits, target, ls, pad_id):
    V = logits.size(-1)
    return _others(logits, target, ls, pad_id, 1 - ls, ls / V)


def others_padding_kept(logits, target, ls, pad_id):
    V = logits.size(-1)
    return _others(logits, target, ls, pad_id, 1 - ls, ls / (V - 1), real_only=False)


def others_mean_over_all(logits, target, ls, pad_id):
    V = logits.size(-1)
    return _others(logits, target, ls, pad_id, 1 - ls, ls / (V - 1), denominator="all")


def floor_chapters(V, e):
    p = 1 - e + e / V
    return -p * math.log(p) - (V - 1) * e / V * math.log(e / V)


# --- exercise 2: the alpha at which two hypotheses tie


def tie_alpha(l1, n1, l2, n2):
    return math.log(l2 / l1) / math.log((5 + n2) / (5 + n1))


def tie_alpha32(l1, n1, l2, n2):
    return torch.log(torch.tensor(l2 / l1, dtype=torch.float32)) / torch.log(torch.tensor((5 + n2) / (5 + n1),
                                                                                           dtype=torch.float32))


def test_tie_alpha_ties_the_library_scores():
    """At tie_alpha the library's length_penalty gives the two hypotheses the same score (the 5 and 9 tokens of
    the exercise tie at alpha = 0.542)."""
    alpha = tie_alpha(-2.0, 5, -2.4, 9)
    lp = length_penalty(torch.tensor([5.0, 9.0], dtype=torch.float64), alpha)
    assert math.isclose(-2.0 / float(lp[0]), -2.4 / float(lp[1]), rel_tol=1e-12) and round(alpha, 3) == 0.542


# --- exercise 3: the paper's schedule


def noam(step, d_model, warmup):
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def noam32(step, d_model, warmup):
    step = torch.tensor(step, dtype=torch.float32)
    return d_model ** -0.5 * torch.minimum(step ** -0.5, step * warmup ** -1.5)


def no_d_model(step, d_model, warmup):
    return min(step ** -0.5, step * warmup ** -1.5)


def from_zero(step, d_model, warmup):                 # meant for LambdaLR's i, called with the paper's step
    return noam_lr(step + 1, d_model, warmup)


def minus_one(step, d_model, warmup):
    return noam(step - 1, d_model, warmup)


def wrong_terms(step, d_model, warmup):
    return d_model ** -0.5 * min(step ** -0.5, warmup ** -1.5)


def max_not_min(step, d_model, warmup):
    return d_model ** -0.5 * max(step ** -0.5, step * warmup ** -1.5)


# --- exercise 3: a cosine schedule


def cosine(step, total, warmup, peak):
    if step <= warmup:
        return peak * step / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def cosine32(step, total, warmup, peak):
    s = torch.tensor(float(step), dtype=torch.float32)
    if step <= warmup:
        return peak * s / warmup
    return peak * 0.5 * (1 + torch.cos(math.pi * (s - warmup) / (total - warmup)))


BELOW_TENTH = 100 + math.floor(1900 * math.acos(-0.8) / math.pi) + 1          # 1611


def test_below_tenth_is_the_first_step_below_a_tenth():
    lrs = [cosine(s, 2000, 100, 1.0) for s in range(1, 2001)]
    assert lrs[BELOW_TENTH - 1] < 0.1 <= lrs[BELOW_TENTH - 2] and BELOW_TENTH == 1611


def cosine_from_zero(step, total, warmup, peak):
    return cosine(step - 1, total, warmup, peak)


def no_half(step, total, warmup, peak):
    return 2 * cosine(step, total, warmup, peak) if step > warmup else cosine(step, total, warmup, peak)


def over_total(step, total, warmup, peak):
    return cosine(step, total + warmup, warmup, peak)


def linear_decay(step, total, warmup, peak):
    return peak * step / warmup if step <= warmup else peak * (total - step) / (total - warmup)


def no_warmup(step, total, warmup, peak):
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def from_step_zero(step, total, warmup, peak):
    return peak * step / warmup if step <= warmup else peak * 0.5 * (1 + math.cos(math.pi * step / total))


# --- exercise 4: another target language


def test_french_characters_agree_with_num2words_and_the_chapters_tokenizer():
    """The grader's answer equals what the chapter's tokenizer (from a sample of its training numbers) and French
    number words of 0..999 and every thousand-word give."""
    from num2words import num2words

    sample = number_pairs(list(range(0, 1_000_000, 997)) + list(range(1000)))
    tokenizer = CharTokenizer.from_texts([text for pair in sample for text in pair])
    french = [num2words(n, lang="fr") for n in range(1000)]
    more = [num2words(n, lang="fr") for n in range(0, 1_000_000, 9973)]
    missing = {ch for text in french + more for ch in text} - set(tokenizer.stoi)
    assert missing == {"m", "p", "q", "é"}
    unwritable = sum(any(ch in missing for ch in text) for text in french)
    assert unwritable == 707
    check_french_characters(missing, unwritable)


# --- bug hunt 6: the KV-cached greedy decoder


def _greedy(model, src, max_new_tokens, offset, use_cache=True, positions=True, mask=True, dtype=None):
    src_mask = model.make_src_mask(src)
    memory = model.encode(src, src_mask)
    cache = model.decoder.new_cache() if use_cache else None
    token = torch.full((src.size(0),), 1, dtype=torch.long)                 # BOS
    tokens, logits = [], []
    for t in range(max_new_tokens):
        x = model.tgt_embed(token[:, None])                                 # (B, 1, d_model)
        if positions:
            x = model.pos_encoding(x, offset(t))
        h = model.decoder(x, memory, src_mask if mask else None, None, cache)
        step = model.lm_head(h[:, -1])                                    # (B, V)
        step = step if dtype is None else step.to(dtype)
        token = step.argmax(-1)
        tokens.append(token)
        logits.append(step)
    return torch.stack(tokens, 1), torch.stack(logits, 1)


def cached_greedy(model, src, max_new_tokens):
    return _greedy(model, src, max_new_tokens, lambda t: t)


def cached_greedy32(model, src, max_new_tokens):
    return _greedy(model, src, max_new_tokens, lambda t: t, dtype=torch.float32)


def library_cache(model, src, max_new_tokens):
    from transformer_lib.decoding import KVCache
    src_mask = model.make_src_mask(src)
    cache = KVCache(model, model.encode(src, src_mask), src_mask)
    token, tokens, logits = torch.full((src.size(0),), 1), [], []
    for _ in range(max_new_tokens):
        step = cache.step(token)
        token = step.argmax(-1)
        tokens.append(token)
        logits.append(step)
    return torch.stack(tokens, 1), torch.stack(logits, 1)


def forgot_offset(model, src, max_new_tokens):
    return _greedy(model, src, max_new_tokens, lambda t: 0)


def offset_plus_one(model, src, max_new_tokens):
    return _greedy(model, src, max_new_tokens, lambda t: t + 1)


def no_positions(model, src, max_new_tokens):
    return _greedy(model, src, max_new_tokens, lambda t: t, positions=False)


def no_cache(model, src, max_new_tokens):
    return _greedy(model, src, max_new_tokens, lambda t: t, use_cache=False)


def no_src_mask(model, src, max_new_tokens):
    return _greedy(model, src, max_new_tokens, lambda t: t, mask=False)


def not_argmax(model, src, max_new_tokens):
    tokens, logits = cached_greedy(model, src, max_new_tokens)
    return (tokens + 1) % logits.size(-1), logits


def test_graders_are_fast():
    import time

    def run_all():
        check_cached_greedy(cached_greedy)
        check_noam(noam, peak_step=4000, peak_lr=math.sqrt(1 / 64 / 4000))
        check_length_penalty(score)
        check_cosine_lr(cosine, below_tenth=BELOW_TENTH)
        check_others_smoothing(others, floor=others_floor)
        check_tie_alpha(tie_alpha)
    run_all()                  # once first: torch's lazy imports (the first optimizer takes seconds) are not grading
    start = time.perf_counter()
    run_all()
    assert time.perf_counter() - start < 1.0


SMOOTHING_MISTAKES = [
    (mean_over_padding, "the mean runs over all B \\* T positions, padding included"),
    (padding_loss_summed, "padding positions still add their loss"),
    (padding_not_ignored, "padding positions are not ignored"),
    (no_smoothing, "the smoothing is missing"),
]

GRADERS = [
    grader_row(check_label_smoothing, correct=[smoothed_loss, smoothed_loss32], mistakes=SMOOTHING_MISTAKES),
    grader_row(check_fixed_smoothing_loss, correct=[smoothed_loss, smoothed_loss32], mistakes=SMOOTHING_MISTAKES),
    grader_row(check_others_smoothing, correct=[others, others32, Call(others, floor=others_floor),
                                                Call(others32, floor=others_floor32)], mistakes=[
        (smoothed_loss, "that is the chapter's smoothing"),
        (others_on_all_v, "the true class gets 1 - eps \\+ eps / \\(V - 1\\)"),
        (others_eps_over_v, "each other class gets eps / V"),
        (no_smoothing, "the smoothing is missing"),
        (others_padding_kept, "padding positions are not ignored"),
        (others_mean_over_all, "the mean runs over all B \\* T positions"),
        (Call(others, floor=floor_chapters), "the floor of the chapter's smoothing"),
        (Call(others, floor=lambda V, e: -e * math.log(e / (V - 1))), "the true class's term"),
        (Call(others, floor=lambda V, e: -(1 - e) * math.log(1 - e)), "the other classes' term is missing"),
        (Call(others, floor=lambda V, e: -(1 - e) * math.log(1 - e) - (V - 1) * e * math.log(e / (V - 1))),
         "counted V - 1 times too often"),
        (Call(others, floor=lambda V, e: others_floor(V, e) / math.log(2)), "in bits"),
        (Call(others, floor=lambda V, e: -others_floor(V, e)), "the sign"),
        (Call(others, floor=lambda V, e: 0.0), "the floor is not 0"),
        (Call(others, floor=lambda V, e: 1.0), "q's entropy, in nats"),
    ], prints="check_others_smoothing: right on 20"),
    grader_row(check_tie_alpha, correct=[tie_alpha, tie_alpha32], mistakes=[
        (lambda *c: -tie_alpha(*c), "one ratio is upside down"),
        (lambda *c: 1 / tie_alpha(*c), "that is 1 / alpha"),
        (lambda l1, n1, l2, n2: math.log(l2 / l1) / math.log(n2 / n1), "the 5 of the penalty is missing"),
        (lambda l1, n1, l2, n2: (l2 / l1) / ((5 + n2) / (5 + n1)), "no logarithms"),
        (lambda *c: 0.5, "set l1 / lp\\(n1\\) = l2 / lp\\(n2\\)"),
    ], prints="check_tie_alpha: at your alpha"),
    grader_row(check_length_penalty, correct=[score, score32], mistakes=[
        (multiplied, "you multiply"),
        (precedence, "6 \\*\\* alpha is computed first"),
        (plain_length, "plain length normalisation"),
        (alpha_ignored, "alpha is ignored"),
    ]),
    grader_row(check_noam, correct=[Call(noam, peak_step=4000, peak_lr=1.976e-3), Call(noam32, peak_step=4000, peak_lr=1.976e-3), Call(noam_lr, peak_step=4000, peak_lr=1.976e-3)], mistakes=[
        (no_d_model, "forgot d_model\\^-0.5"),
        (from_zero, "step counted from 0"),
        (minus_one, "step counted from 0"),
        (wrong_terms, "min of the wrong terms"),
        (max_not_min, "max instead of min"),
        (Call(noam, peak_step=3999), "step counted from 0"),
        (Call(noam, peak_step=4001), "where the two terms of the min meet"),
        (Call(noam, peak_lr=4000 ** -0.5), "forgot d_model\\^-0.5"),
        (Call(noam, peak_lr=6.988e-4), "d_model = 512"),
    ]),
    grader_row(check_cosine_lr, correct=[cosine, cosine32, Call(cosine, below_tenth=BELOW_TENTH),
                                         Call(cosine, below_tenth=float(BELOW_TENTH))], mistakes=[
        (cosine_from_zero, "step counted from 0"),
        (no_half, "the 1/2 is missing"),
        (over_total, "the cosine runs over total_steps"),
        (linear_decay, "that is the linear decay"),
        (no_warmup, "the warm-up is missing"),
        (from_step_zero, "the cosine starts at step 0"),
        (Call(cosine, below_tenth=BELOW_TENTH - 1), "still at or above a tenth of the peak .*one step early"),
        (Call(cosine, below_tenth=1811), "the linear decay's step"),
        (Call(cosine, below_tenth=1500), "solve \\(1 \\+ cos"),
    ], prints="check_cosine_lr: your schedule is right"),
    grader_row(check_french_characters, correct=[Call({"m", "p", "q", "é"}, 707), Call("mpqé", 707.0),
                                                 Call(["é", "m", "p", "q"], torch.tensor(707))], mistakes=[
        (Call({"p", "q", "é"}, 707), "'m' is missing: 'mille'"),
        (Call({"m", "p", "q"}, 707), "'é' is missing: 'zéro'"),
        (Call({"m", "p", "q", "é", "a"}, 707), "the tokenizer has ids for \\['a'\\]"),
        (Call({"m", "p", "q", "é", "M"}, 707), "occur in no French number word"),
        (Call({"m", "p", "q", "é"}, 706), "0 \\(zéro\\) counts"),
        (Call({"m", "p", "q", "é"}, 293), "how many the model could write"),
        (Call({"m", "p", "q", "é"}, 0.707), "not a fraction"),
        (Call({"m", "p", "q", "é"}, 700), "count the numbers 0..999"),
    ], prints="check_french_characters: the tokenizer lacks 4"),
    grader_row(check_cached_greedy, correct=[cached_greedy, cached_greedy32, library_cache], mistakes=[
        (forgot_offset, "step t gets the encoding of position 0: the cache forgot the position offset"),
        (offset_plus_one, "position t \\+ 1"),
        (no_positions, "no positional encoding"),
        (no_cache, "each step sees only its newest token"),
        (no_src_mask, "source's padding"),
        (not_argmax, "not the argmax"),
    ]),
]
