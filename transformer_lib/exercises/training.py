"""The graders of Chapter 8's exercises (training a translator), imported by the chapter's exercise cells.

Hand-written, not exported from the chapter: a grader's reference and named slips are the answers, and Colab shows
every cell of a chapter, so their code stays out of the chapters."""

__all__ = ['check_label_smoothing', 'check_fixed_smoothing_loss', 'check_length_penalty', 'check_noam', 'check_cosine_lr',
           'check_french_characters', 'check_cached_greedy', 'check_others_smoothing', 'check_tie_alpha']

import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..validation import checked
from .grading import call_reader, close_to, grade, number


def _smoothing_variants(logits, target, label_smoothing, pad_id) -> dict:
    """The typical wrong label-smoothed losses, keyed by what is wrong. logits (N, V), target (N,)."""
    V, ls = logits.size(-1), label_smoothing
    logp = F.log_softmax(logits, -1)                                          # (N, V)
    q = torch.full_like(logp, ls / V)
    q[torch.arange(len(target)), target] += 1 - ls
    per_token = -(q * logp).sum(-1)                                           # (N,) the padding's too
    real = target != pad_id
    return {
        "the smoothing is missing (this is the plain cross-entropy)":
            nn.CrossEntropyLoss(ignore_index=pad_id)(logits, target),
        "padding positions are not ignored (average over target != pad_id only)":
            nn.CrossEntropyLoss(label_smoothing=ls)(logits, target),
        "the mean runs over all B * T positions, padding included: the padding adds zeros but counts in the "
        "denominator; divide the sum by the number of real targets (target != pad_id)":
            (per_token * real).sum() / len(target),
        "the padding positions still add their loss to the sum; only the denominator counts real targets":
            per_token.sum() / real.sum(),
        "the smoothing mass goes to the V - 1 wrong classes only; spread label_smoothing / V over all V classes":
            _other_classes_variant(logits, target, ls, pad_id),
    }


def _check_smoothing(fn, name: str, trials: int) -> None:
    """fn(logits (B, T, V), target (B, T), label_smoothing, pad_id) -> scalar against nn.CrossEntropyLoss."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(trials):
        B, T, V = (int(torch.randint(lo, hi, (1,), generator=gen)) for lo, hi in ((1, 5), (1, 7), (3, 12)))
        ls, pad_id = (0.1, 0.25, 0.0, 0.5)[trial % 4], trial % 3
        logits = 3 * torch.randn(B, T, V, generator=gen, dtype=torch.float64)
        target = torch.randint(0, V, (B, T), generator=gen)
        target[0, 0] = (pad_id + 1) % V                        # at least one real token ...
        target[-1, -1] = pad_id if T > 1 else target[-1, -1]   # ... and, where possible, one padding token
        got = fn(logits, target, ls, pad_id)
        if not isinstance(got, torch.Tensor) or got.numel() != 1:
            raise AssertionError(f"expected a scalar tensor, got {type(got).__name__} "
                                 f"{tuple(got.shape) if isinstance(got, torch.Tensor) else got!r}")
        got = got.reshape(())                                  # the reader's dtype sets the tolerance (close_to)
        flat_logits, flat_target = logits.reshape(-1, V), target.reshape(-1)
        want = nn.CrossEntropyLoss(label_smoothing=ls, ignore_index=pad_id)(flat_logits, flat_target)
        if close_to(got, want):
            continue
        hints = _smoothing_variants(flat_logits, flat_target, ls, pad_id)
        hint = next((h for h, v in hints.items() if close_to(got, v)), "")
        raise AssertionError(f"B={B}, T={T}, V={V}, label_smoothing={ls}, pad_id={pad_id}: expected {float(want):.6f}, "
                             f"got {float(got):.6f}" + (f"; {hint}" if hint else ""))
    print(f"{name}: matches nn.CrossEntropyLoss(label_smoothing, ignore_index=pad_id) on {trials} random batches")


def check_label_smoothing(fn, trials: int = 20) -> None:
    """Test fn(logits (B, T, V), target (B, T), label_smoothing, pad_id) -> scalar against nn.CrossEntropyLoss
    on random float64 inputs (an answer computed in float32 is accepted: close_to). Raises AssertionError that
    says what differs."""
    _check_smoothing(fn, "check_label_smoothing", trials)


def check_fixed_smoothing_loss(fn, trials: int = 20) -> None:
    """Bug hunt: test the repaired smoothed_loss(logits (B, T, V), target (B, T), label_smoothing, pad_id) ->
    scalar on random batches with padding against nn.CrossEntropyLoss(label_smoothing=..., ignore_index=pad_id).
    Names the bug (the mean over padding positions too) if it is still there."""
    _check_smoothing(fn, "check_fixed_smoothing_loss", trials)


def _other_classes_variant(logits, target, label_smoothing, pad_id):
    V = logits.size(-1)
    q = torch.full_like(logits, label_smoothing / (V - 1))
    q[torch.arange(len(target)), target] = 1 - label_smoothing
    loss = -(q * F.log_softmax(logits, -1)).sum(-1)
    return loss[target != pad_id].mean()


def check_length_penalty(fn) -> None:
    """Test fn(log_prob (N,), length (N,), alpha) -> (N,) scores log P(Y | X) / lp(|Y|), lp = ((5 + |Y|) / 6)^alpha,
    the score beam search ranks finished hypotheses by, against the library's length_penalty, for several alpha
    (float64 inputs; a float32 answer is accepted)."""
    from transformer_lib.decoding import length_penalty

    gen = torch.Generator().manual_seed(0)
    log_prob = -0.1 - 10 * torch.rand(12, generator=gen, dtype=torch.float64)   # (N,) log-probabilities < 0
    length = torch.randint(1, 40, (12,), generator=gen).double()                # (N,) |Y|, EOS counted
    for alpha in (0.6, 1.5, 0.0, 1.0):
        got = fn(log_prob.clone(), length.clone(), alpha)
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (12,):
            raise AssertionError(f"alpha={alpha}: expected a tensor of shape (12,) (one score per hypothesis), got "
                                 f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}")
        lp = length_penalty(length, alpha)
        want = log_prob / lp
        if close_to(got, want):
            continue
        hints = {
            "you multiply log P(Y | X) by lp(Y); divide by it": log_prob * lp,
            "6 ** alpha is computed first: write ((5 + |Y|) / 6) ** alpha, with the parentheses":
                log_prob / ((5 + length) / 6 ** alpha),
            "only 5 + |Y| is raised to alpha: write ((5 + |Y|) / 6) ** alpha": log_prob / ((5 + length) ** alpha / 6),
            "that is the plain length normalisation |Y| ** alpha; the paper's lp is ((5 + |Y|) / 6) ** alpha":
                log_prob / length ** alpha,
            "alpha is ignored (your lp is (5 + |Y|) / 6, alpha = 1)": log_prob / ((5 + length) / 6),
        }
        hint = next((h for h, v in hints.items() if close_to(got, v)), "")
        i = int((got.double() - want).abs().argmax())
        raise AssertionError(f"alpha={alpha}, log P={float(log_prob[i]):.4f}, |Y|={int(length[i])}: expected "
                             f"{float(want[i]):.6f}, got {float(got[i]):.6f}" + (f"; {hint}" if hint else ""))
    print("check_length_penalty: log P(Y | X) / ((5 + |Y|) / 6) ** alpha for alpha in 0, 0.6, 1, 1.5")


def _noam_reference(d_model: int, warmup: int):
    """The lr that noam_scheduler gives optimizer step s (1, 2, ...), with make_optimizer's lr=1.0."""
    from transformer_lib.training import noam_scheduler

    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    factor = noam_scheduler(opt, d_model, warmup).lr_lambdas[0]      # LambdaLR's i = steps taken so far
    return lambda step: factor(step - 1)


def _noam_variants(step: int, d_model: int, warmup: int) -> dict:
    s, w, d = step, warmup, d_model ** -0.5
    return {
        "forgot d_model^-0.5": min(s ** -0.5, s * w ** -1.5),
        "step counted from 0: your lr(step) is the paper's lr(step + 1); the paper's step_num starts at 1 "
        "(noam_scheduler passes LambdaLR's i + 1)": d * min((s + 1) ** -0.5, (s + 1) * w ** -1.5),
        "step counted from 0: your lr(step) is the paper's lr(step - 1); the first update is step_num = 1":
            d * min((s - 1) ** -0.5, (s - 1) * w ** -1.5) if s > 1 else math.nan,
        "max instead of min: the warm-up term and the decay term swap roles":
            d * max(s ** -0.5, s * w ** -1.5),
        "min of the wrong terms: the warm-up term is step * warmup^-1.5, not warmup^-1.5":
            d * min(s ** -0.5, w ** -1.5),
        "min of the wrong terms: the warm-up term is step * warmup^-1.5, not step * warmup^-0.5":
            d * min(s ** -0.5, s * w ** -0.5),
    }


def check_noam(fn, peak_step=None, peak_lr=None) -> None:
    """Test fn(step, d_model, warmup) -> the paper's learning rate for optimizer step `step` = 1, 2, ... against
    the lr that noam_scheduler(make_optimizer(model, lr=1.0), d_model, warmup) sets, for several d_model and
    warmup; and, if given, the step of the schedule's peak and its lr for the ablation's d_model=64, warmup=4000."""
    for d_model, warmup in ((512, 4000), (64, 4000), (64, 100), (32, 10)):
        want_of = _noam_reference(d_model, warmup)
        steps = sorted({1, 2, 3, warmup // 2, warmup - 1, warmup, warmup + 1, 2 * warmup, 10 * warmup, 100_000})
        wrong = {}
        for step in steps:
            try:
                got = float(fn(step, d_model, warmup))
            except ZeroDivisionError:
                raise AssertionError(f"lr({step}, d_model={d_model}, warmup={warmup}) divides by zero: step counted "
                                     f"from 0? The paper's step_num starts at 1") from None
            want = want_of(step)
            if not math.isclose(got, want, rel_tol=1e-5):
                wrong[step] = got
        if not wrong:
            continue
        for hint in _noam_variants(1, d_model, warmup):                 # one that explains every wrong value
            if all(math.isclose(got, _noam_variants(s, d_model, warmup)[hint], rel_tol=1e-5)
                   for s, got in wrong.items()):
                break
        else:
            if all(s < warmup for s in wrong):
                hint = ("the warm-up is wrong (min of the wrong terms?): below warmup the lr is "
                        "step * warmup^-1.5 * d_model^-0.5")
            elif all(s > warmup for s in wrong):
                hint = "the decay is wrong (min of the wrong terms?): after warmup the lr is step^-0.5 * d_model^-0.5"
            else:
                hint = "lr = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)"
        step = min(wrong)
        raise AssertionError(f"d_model={d_model}, warmup={warmup}: lr({step}) should be {want_of(step):.6g}, got "
                             f"{wrong[step]:.6g}; {hint}")
    msg = "check_noam: your lr equals noam_scheduler's at every step tested (d_model 512, 64, 32)"
    if peak_step is not None:
        if peak_step == 3999:
            raise AssertionError("peak_step=3999: step counted from 0; the paper's step_num starts at 1, and the "
                                 "peak is at step_num = warmup = 4000")
        if peak_step != 4000:
            raise AssertionError(f"peak_step={peak_step}: the lr peaks where the two terms of the min meet, "
                                 f"step^-0.5 = step * warmup^-1.5, i.e. at step = warmup")
        msg += "; peak at step 4000"
    if peak_lr is not None:
        want = 64 ** -0.5 * 4000 ** -0.5
        if not math.isclose(float(peak_lr), want, rel_tol=5e-3):
            hints = {"forgot d_model^-0.5": 4000 ** -0.5,
                     "that is the peak for d_model = 512 (the paper's); the ablation's d_model is 64":
                         512 ** -0.5 * 4000 ** -0.5,
                     "that is the peak for warmup = 100; the question is about warmup = 4000": 64 ** -0.5 * 100 ** -0.5}
            hint = next((h for h, v in hints.items() if math.isclose(float(peak_lr), v, rel_tol=5e-3)),
                        "the peak lr is d_model^-0.5 * warmup^-0.5")
            raise AssertionError(f"peak_lr={float(peak_lr):.4g}, expected {want:.4g}: {hint}")
        msg += f", lr {want:.4g}"
    print(msg)


def _as_chars(name: str, answer) -> set:
    if isinstance(answer, str):
        return set(answer)
    try:
        chars = set(answer)
    except TypeError:
        raise AssertionError(f"{name} must be a set, list or string of characters, "
                             f"got {type(answer).__name__}") from None
    if not all(isinstance(c, str) and len(c) == 1 for c in chars):
        raise AssertionError(f"{name} must hold single characters, got {sorted(map(repr, chars))}")
    return chars


def _cosine(step, total, warmup, peak, *, shift=0, half=True, span=None, start=None, linear=False, warm=True,
            rising=False):
    """The warm-up + cosine schedule of exercise 3 at optimizer step `step` (1, 2, ...), and its usual slips."""
    s = step + shift
    if warm and s <= warmup:
        return peak * s / warmup
    x = (s - (warmup if start is None else start)) / (total - warmup if span is None else span)
    if linear:
        return peak * (1 - x)
    c = -math.cos(math.pi * x) if rising else math.cos(math.pi * x)
    return peak * (0.5 if half else 1.0) * (1 + c)


def check_cosine_lr(fn, below_tenth=None) -> None:
    """Test fn(step, total_steps, warmup_steps, peak_lr) -> the learning rate of optimizer step `step` = 1, 2, ...:
    a linear warm-up to peak_lr at warmup_steps (peak_lr * step / warmup_steps, as warmup_linear_scheduler), then a
    half cosine from peak_lr down to 0 at total_steps; and, if given, below_tenth: the first step after the peak at
    which the lr of the chapter's run (2,000 steps, warm-up 100) is below a tenth of the peak. Names the mistake."""
    runs = ((2000, 100, 1.0), (1000, 1, 2.0), (50, 10, 0.5))
    cases = {}
    for total, warmup, peak in runs:
        for step in sorted({1, max(1, warmup // 2), warmup, warmup + 1, (warmup + total) // 2, total - warmup // 2,
                            total - 1, total}):
            cases[f"total_steps={total}, warmup_steps={warmup}, peak_lr={peak:g}, step={step}"] = (
                step, total, warmup, peak)

    def slip(**how):
        return lambda step, total, warmup, peak: _cosine(step, total, warmup, peak, **how)
    mistakes = {
        "step counted from 0: your lr(step) is the schedule's lr(step - 1); the first update is step 1, and "
        "step = warmup_steps is the peak": slip(shift=-1),
        "step counted from 0: your lr(step) is the schedule's lr(step + 1)": slip(shift=1),
        "the 1/2 is missing: (1 + cos) runs from 2 to 0, so the lr jumps to twice the peak after the warm-up":
            slip(half=False),
        "the cosine runs over total_steps, not over the total_steps - warmup_steps steps of the decay: it has not "
        "reached 0 at the last step": lambda step, total, warmup, peak: _cosine(step, total, warmup, peak, span=total),
        "the cosine starts at step 0, not at the end of the warm-up: lr falls below the peak right after the "
        "warm-up and reaches 0 early": lambda step, total, warmup, peak: _cosine(step, total, warmup, peak, start=0,
                                                                                 span=total),
        "that is the linear decay (warmup_linear_scheduler); the exercise asks for a half cosine": slip(linear=True),
        "the warm-up is missing: the lr must rise linearly to peak_lr over warmup_steps": slip(warm=False),
        "1 - cos rises from 0 to 2 x peak: the decay is (1 + cos)/2, from 1 at the end of the warm-up to 0":
            slip(rising=True),
    }
    grade(fn, lambda step, total, warmup, peak: _cosine(step, total, warmup, peak), cases, mistakes,
          says="you return {got:.6g}, expected {want:.6g}")
    msg = "check_cosine_lr: your schedule is right at the warm-up, the peak and the decay of 3 runs"
    if below_tenth is not None:
        want = next(s for s in range(101, 2001) if _cosine(s, 2000, 100, 1.0) < 0.1)
        got = number(below_tenth, "below_tenth")
        if got != want:
            hints = {want - 1: "at that step the chapter's schedule is still at or above a tenth of the peak (as if "
                               "your cosine reached 0 one step early)",
                     next(s for s in range(101, 2001) if (2000 - s) / 1900 < 0.1):
                         "that is the linear decay's step (warmup_linear_scheduler): the cosine falls faster",
                     next(s for s in range(101, 2001) if _cosine(s, 2000, 100, 1.0, span=2000) < 0.1):
                         "that cosine runs over total_steps; the decay spans total_steps - warmup_steps",
                     next(s for s in range(101, 2001) if _cosine(s, 2000, 100, 1.0, start=0, span=2000) < 0.1):
                         "that cosine starts at step 0; the decay starts at the end of the warm-up"}
            hint = hints.get(got, "solve (1 + cos(pi x)) / 2 = 1/10 for x = (step - warmup) / (total - warmup)")
            raise AssertionError(f"below_tenth={got:g}, expected another step: {hint}")
        msg += f"; below a tenth of the peak from step {want}"
    print(msg)


@functools.lru_cache(maxsize=1)
def _french_facts() -> tuple:
    """(the characters of French number words below a million, the French words of 0..999, the tokenizer's
    characters, the German characters): about 1,030 num2words calls, once."""
    from num2words import num2words

    from transformer_lib.data import number_pairs

    french = [num2words(n, lang="fr") for n in range(1000)]
    more = [num2words(n, lang="fr") for n in (1000, 1001, 2000, 21_000, 80_000, 81_000, 100_000, 200_000, 999_999)]
    below = list(range(100)) + [100 * k for k in range(1, 10)] + [1000, 1001, 21_000, 101_000, 999_999]
    en_de = number_pairs(below)
    english = {ch for en, _ in en_de for ch in en}
    german = {ch for _, de in en_de for ch in de}
    fr_chars = {ch for fr in french + more for ch in fr}
    return fr_chars, french, english | german, german


def check_french_characters(missing, unwritable) -> None:
    """Test missing, the characters that French number words below a million use and the chapter's tokenizer has
    no id for (a set, list or string of characters), and unwritable, how many of the numbers 0..999 the model
    could not write in French for lack of them."""
    fr_chars, words, vocab, german = _french_facts()
    want = fr_chars - vocab
    got = _as_chars("missing", missing)
    if got != want:
        below_1000 = {ch for w in words for ch in w} - vocab
        if got == below_1000:
            hint = "'m' is missing: 'mille' (a thousand) first appears at 1,000, and the question is about all numbers below a million"
        elif got == want - {"é"}:
            hint = "'é' is missing: 'zéro' (0) is a number too"
        elif got == fr_chars - german:
            hint = ("you compared with the German targets' characters, but the tokenizer has one vocabulary for both "
                    "languages (the tied embedding): English characters such as ' ' and '-' have ids too")
        elif got - fr_chars:
            hint = f"{sorted(got - fr_chars)} occur in no French number word below a million"
        elif got & vocab:
            hint = f"the tokenizer has ids for {sorted(got & vocab)} (English or German uses them)"
        else:
            hint = f"{len(want)} characters, all of them in French words below a million"
        raise AssertionError(f"missing = {sorted(got)}: {hint}")
    count = sum(any(ch in want for ch in w) for w in words)
    got = number(unwritable, "unwritable")
    if got != count:
        hints = {count - 1: "0 (zéro) counts: the numbers 0..999",
                 1000 - count: "that is how many the model could write",
                 count / 1000: "a count of numbers, not a fraction",
                 sum(any(ch in fr_chars - german for ch in w) for w in words):
                     "that counts the characters German lacks; English ones (' ', '-') have ids too",
                 sum(sum(ch in want for ch in w) for w in words): "count numbers, not characters"}
        hint = hints.get(got, "count the numbers 0..999 whose French words contain a character in missing")
        raise AssertionError(f"unwritable = {got:g}, expected another number: {hint}")
    print(f"check_french_characters: the tokenizer lacks {len(want)} French characters; {count} of the numbers "
          f"0..999 need at least one of them")


@functools.lru_cache(maxsize=1)
def _tiny_translator():
    """A small random float64 Transformer (seeded, without touching the global RNG) and a padded source batch."""
    from transformer_lib.model import Transformer, TransformerConfig

    config = TransformerConfig(src_vocab_size=11, tgt_vocab_size=11, d_model=16, num_heads=2, d_ff=32,
                               num_encoder_layers=1, num_decoder_layers=2, dropout=0.0, max_len=32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Transformer(config).double().eval()
        for p in model.parameters():                              # larger weights: positions matter more
            p.data.mul_(2.0)
        src = torch.randint(3, 11, (3, 6))                         # (B, S)
    src[1, 4:] = 0                                                # padding
    src[2, 3:] = 0
    return model, src


@torch.no_grad()
def _stepwise(model, inputs, memory, src_mask, start, use_cache=True, positions=True):
    """Logits (B, L, V) of decoding inputs (B, L) one token per step; start(t) = the position given to step t."""
    cache = model.decoder.new_cache() if use_cache else None
    out = []
    with checked():                                   # the grader's own inputs: skip the argument checks
        for t in range(inputs.size(1)):
            x = model.tgt_embed(inputs[:, t:t + 1])                               # (B, 1, d_model)
            if positions:
                x = model.pos_encoding(x, start(t))
            out.append(model.lm_head(model.decoder(x, memory, src_mask, None, cache)[:, -1]))   # (B, V)
    return torch.stack(out, dim=1)


def check_cached_greedy(fn, max_new_tokens: int = 7) -> None:
    """Bug hunt: test fn(model, src, max_new_tokens) -> (tokens (B, L), logits (B, L, V)), greedy decoding with a
    key/value cache from BOS = 1 for exactly max_new_tokens steps, on a small random float64 Transformer. The
    logits of every step must equal those of recomputing the whole prefix (as greedy_decode(use_cache=False)),
    and the tokens must be their argmax. Names the usual slips: the position offset, the cache, the mask."""
    model, src = _tiny_translator()
    with torch.no_grad():
        tokens, logits = fn(model, src.clone(), max_new_tokens)
    B, V, L = src.size(0), model.config.tgt_vocab_size, max_new_tokens
    if not isinstance(tokens, torch.Tensor) or tuple(tokens.shape) != (B, L):
        raise AssertionError(f"tokens must have shape (B={B}, L={L}), got "
                             f"{tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__}")
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape) != (B, L, V):
        raise AssertionError(f"logits must have shape (B={B}, L={L}, V={V}), got "
                             f"{tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__}")
    if not torch.equal(tokens, logits.argmax(-1)):
        raise AssertionError("your tokens are not the argmax of your logits: greedy decoding feeds back the most "
                             "probable token")
    inputs = torch.cat([torch.full((B, 1), 1), tokens[:, :-1]], dim=1)           # (B, L): BOS, then the outputs
    src_mask = model.make_src_mask(src)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        want = model.lm_head(model.decode(inputs, memory, src_mask))             # (B, L, V): whole prefix
    if close_to(logits, want):
        print(f"check_cached_greedy: {L} cached steps equal recomputing the prefix (logits and tokens)")
        return
    variants = {                        # what each usual slip gives on the same inputs (computed lazily)
        "step t gets the encoding of position 0: the cache forgot the position offset (pass start=t, the number "
        "of cached positions, to pos_encoding)": dict(start=lambda t: 0),
        "step t gets the encoding of position t + 1: the offset is one too many (BOS is at position 0)":
            dict(start=lambda t: t + 1),
        "no positional encoding at all: add model.pos_encoding(x, t)": dict(start=lambda t: 0, positions=False),
        "each step sees only its newest token: pass the same cache (model.decoder.new_cache()) to every step":
            dict(start=lambda t: t, use_cache=False),
        "each step sees only its newest token, at position 0: the cache is not passed, nor the offset":
            dict(start=lambda t: 0, use_cache=False),
        "the cross-attention attends to the source's padding: pass src_mask = model.make_src_mask(src)":
            dict(start=lambda t: t, src_mask=None),
    }
    hint = next((h for h, kw in variants.items()
                 if close_to(logits, _stepwise(model, inputs, memory, **{"src_mask": src_mask, **kw}))), "")
    per_step = (logits.double() - want).abs().amax(dim=(0, 2))                    # (L,)
    bad = (per_step > 1e-4 * float(want.abs().max())).nonzero()
    first = int(bad[0]) if len(bad) else int(per_step.argmax())
    raise AssertionError(f"step {first}: your logits differ from recomputing the prefix by up to "
                         f"{float(per_step[first]):.2g}" + (" (steps before it agree)" if first else "") +
                         (f"; {hint}" if hint else ""))


def _per_token_smoothed(logits, target, q_true, q_other):
    """-(q * log_softmax(logits)).sum(-1) for the target q with q_true at the target class and q_other at every
    other class: (N, V), (N,) -> (N,)."""
    logp = F.log_softmax(logits, -1)
    q = torch.full_like(logp, q_other)
    q[torch.arange(len(target)), target] = q_true
    return -(q * logp).sum(-1)


def _others_variants(logits, target, ls, pad_id) -> dict:
    """The usual slips of exercise 1's smoothing (1 - eps at the target, eps / (V - 1) elsewhere). (N, V), (N,)."""
    V, real = logits.size(-1), target != pad_id
    right = _per_token_smoothed(logits, target, 1 - ls, ls / (V - 1))
    return {
        "that is the chapter's smoothing, eps / V on every class, the true one included; here the true class gets "
        "exactly 1 - eps and each of the V - 1 other classes eps / (V - 1)":
            nn.CrossEntropyLoss(label_smoothing=ls, ignore_index=pad_id)(logits, target),
        "the true class gets 1 - eps + eps / (V - 1): eps / (V - 1) went to all V classes, so your target sums to "
        "more than 1; spread eps over the V - 1 other classes only":
            _per_token_smoothed(logits, target, 1 - ls + ls / (V - 1), ls / (V - 1))[real].mean(),
        "each other class gets eps / V: the V - 1 other classes share eps, so each gets eps / (V - 1)":
            _per_token_smoothed(logits, target, 1 - ls, ls / V)[real].mean(),
        "the smoothing is missing (this is the plain cross-entropy)":
            nn.CrossEntropyLoss(ignore_index=pad_id)(logits, target),
        "padding positions are not ignored (average over target != pad_id only)": right.mean(),
        "the mean runs over all B * T positions, padding included: the padding adds zeros but counts in the "
        "denominator; divide the sum by the number of real targets": (right * real).sum() / len(target),
    }


def _others_floor(V, ls) -> float:
    """The smallest per-token value of exercise 1's loss: the entropy of its target, in nats."""
    return -(1 - ls) * math.log(1 - ls) - ls * math.log(ls / (V - 1))


def check_others_smoothing(fn, floor=None, trials: int = 20) -> None:
    """Exercise 1: test fn(logits (B, T, V), target (B, T), label_smoothing, pad_id) -> scalar, the cross-entropy
    against a target with 1 - label_smoothing at the true class and label_smoothing / (V - 1) at each other class,
    averaged over the non-padding positions, on random float64 batches (a float32 answer is accepted); and, if
    given, floor(V, label_smoothing) -> the smallest value that loss can take per token. Names the mistake."""
    gen = torch.Generator().manual_seed(1)
    for trial in range(trials):
        B, T, V = (int(torch.randint(lo, hi, (1,), generator=gen)) for lo, hi in ((1, 5), (2, 7), (3, 12)))
        ls, pad_id = (0.1, 0.25, 0.5, 0.3)[trial % 4], trial % 3
        logits = 3 * torch.randn(B, T, V, generator=gen, dtype=torch.float64)
        target = torch.randint(0, V, (B, T), generator=gen)
        target[0, 0] = (pad_id + 1) % V                        # at least one real token and one padding token
        target[-1, -1] = pad_id
        got = call_reader(fn, "your loss", logits.clone(), target.clone(), ls, pad_id)
        if not isinstance(got, torch.Tensor) or got.numel() != 1:
            raise AssertionError(f"expected a scalar tensor, got {type(got).__name__} "
                                 f"{tuple(got.shape) if isinstance(got, torch.Tensor) else got!r}")
        got = got.reshape(())
        flat_logits, flat_target = logits.reshape(-1, V), target.reshape(-1)
        want = _other_classes_variant(flat_logits, flat_target, ls, pad_id)
        if close_to(got, want):
            continue
        hints = _others_variants(flat_logits, flat_target, ls, pad_id)
        hint = next((h for h, v in hints.items() if close_to(got, v)), "")
        raise AssertionError(f"B={B}, T={T}, V={V}, label_smoothing={ls}, pad_id={pad_id}: your loss is "
                             f"{float(got):.6f}, " + (hint if hint else "not the cross-entropy against that target "
                                                      "(1 - eps at the true class, eps / (V - 1) at each other)"))
    msg = f"check_others_smoothing: right on {trials} random batches with padding"
    if floor is not None:
        mistakes = {
            "that is the floor of the chapter's smoothing (eps / V on every class); this target has 1 - eps at the "
            "true class and eps / (V - 1) at each other": lambda V, e: (
                -(1 - e + e / V) * math.log(1 - e + e / V) - (V - 1) * e / V * math.log(e / V)),
            "the true class's term -(1 - eps) log(1 - eps) is missing": lambda V, e: -e * math.log(e / (V - 1)),
            "the other classes' term is missing: V - 1 classes of probability eps / (V - 1) add -eps log(eps / (V - 1))":
                lambda V, e: -(1 - e) * math.log(1 - e),
            "the other classes are counted V - 1 times too often: together they add -eps log(eps / (V - 1)), "
            "not -(V - 1) eps log(eps / (V - 1))":
                lambda V, e: -(1 - e) * math.log(1 - e) - (V - 1) * e * math.log(e / (V - 1)),
            "that is in bits: the loss uses natural logarithms (nats)": lambda V, e: _others_floor(V, e) / math.log(2),
            "the sign: an entropy is -sum q log q, which is >= 0": lambda V, e: -_others_floor(V, e),
            "the floor is not 0 with smoothing: the loss is smallest when the model predicts q itself, and then it "
            "is the entropy H(q) > 0": lambda V, e: 0.0,
        }
        cases = {f"floor(V={V}, label_smoothing={e})": (V, e) for V, e in ((30, 0.1), (5, 0.25), (100, 0.05), (3, 0.5))}
        grade(floor, _others_floor, cases, mistakes, name="floor", says="your floor is {got:.6g}",
              hint=" (the loss is smallest when the model predicts the target q itself: then it is q's entropy, "
                   "in nats)")
        msg += "; the floor is right for 4 vocabularies"
    print(msg)


def _tie_alpha(l1, n1, l2, n2) -> float:
    return math.log(l2 / l1) / math.log((5 + n2) / (5 + n1))


def check_tie_alpha(fn) -> None:
    """Exercise 2: test fn(l1, n1, l2, n2) -> the alpha at which two finished hypotheses with log-probabilities
    l1, l2 < 0 and lengths n1, n2 (EOS counted) get the same score log P / ((5 + |Y|) / 6) ** alpha."""
    cases = {f"log P = {l1}, |Y| = {n1} against log P = {l2}, |Y| = {n2}": (l1, n1, l2, n2)
             for l1, n1, l2, n2 in ((-2.0, 4, -3.1, 11), (-0.7, 12, -0.5, 3), (-5.5, 20, -9.0, 37), (-1.2, 1, -1.25, 2))}
    mistakes = {
        "one ratio is upside down (your alpha has the wrong sign): the scores are equal when "
        "l2 / l1 = lp(n2) / lp(n1)": lambda l1, n1, l2, n2: -_tie_alpha(l1, n1, l2, n2),
        "that is 1 / alpha: solving r ** alpha = q gives alpha = log q / log r": lambda *c: 1 / _tie_alpha(*c),
        "the 5 of the penalty is missing: lp(|Y|) = ((5 + |Y|) / 6) ** alpha, so the ratio of the penalties is "
        "((5 + n2) / (5 + n1)) ** alpha": lambda l1, n1, l2, n2: math.log(l2 / l1) / math.log(n2 / n1),
        "no logarithms: solving r ** alpha = q gives alpha = log q / log r, not q / r":
            lambda l1, n1, l2, n2: (l2 / l1) / ((5 + n2) / (5 + n1)),
    }
    grade(fn, _tie_alpha, cases, mistakes, name="tie_alpha", says="your alpha is {got:.6g}",
          hint=": with it the two scores log P / lp differ; set l1 / lp(n1) = l2 / lp(n2) and solve for alpha")
    print("check_tie_alpha: at your alpha the two hypotheses score the same, in 4 cases")
