"""transformer_lib.sampling (Chapter 11): top-k and nucleus filtering, sampling one token, generation with and
without the KV cache; and the nucleus exercise checker (transformer_lib.exercises.sampling)."""

import pytest
import torch
from helpers import randomize

from transformer_lib.exercises.sampling import check_top_p
from transformer_lib.gpt import GPT, GPTConfig
from transformer_lib.sampling import filter_logits, generate, sample_next

DT = torch.float64
V = 50


def rand_logits(*shape, seed=0, scale=2.0):
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


def random_gpt(seed=0, max_len=32):
    cfg = GPTConfig(vocab_size=V, max_len=max_len, d_model=32, num_layers=2, num_heads=4, d_ff=64)
    return randomize(GPT(cfg).double(), seed=seed, std=0.2).eval()


def prompt_ids(B, T, seed=0):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


def nucleus_size(probs_row, p):
    """The smallest k such that the k most probable tokens hold a mass >= p (plain Python, float64)."""
    total = 0.0
    for k, q in enumerate(sorted(probs_row.tolist(), reverse=True), start=1):
        total += q
        if total >= p:
            return k
    return len(probs_row)


# ---------------------------------------------------------------- filter_logits

@pytest.mark.parametrize("k", [1, 3, 10, V - 1])
def test_top_k_keeps_exactly_the_k_largest(k):
    logits = rand_logits(4, V, seed=1)
    out = filter_logits(logits, top_k=k)
    kept = out.isfinite()
    assert torch.all(kept.sum(-1) == k)
    top = logits.topk(k, dim=-1).indices
    assert torch.all(kept.gather(-1, top))                                    # they are the k largest
    assert torch.equal(out[kept], logits[kept])                              # with their logits unchanged
    assert torch.all(out[~kept] == float("-inf"))


def test_top_k_at_least_the_vocabulary_keeps_everything():
    logits = rand_logits(2, V, seed=2)
    for k in (V, V + 5):
        assert torch.equal(filter_logits(logits, top_k=k), logits)
    assert torch.equal(filter_logits(logits), logits)                        # no filter at all


def test_top_k_works_on_any_leading_axes():
    logits = rand_logits(2, 3, V, seed=3)
    out = filter_logits(logits, top_k=4)
    assert out.shape == logits.shape and torch.all(out.isfinite().sum(-1) == 4)
    assert torch.equal(out[1, 2], filter_logits(logits[1, 2], top_k=4))


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.8, 0.9, 0.99])
def test_top_p_keeps_the_smallest_prefix_reaching_p(p):
    logits = rand_logits(8, V, seed=4)
    probs = logits.softmax(-1)
    out = filter_logits(logits, top_p=p)
    kept = out.isfinite()
    for b in range(8):
        k = nucleus_size(probs[b], p)
        order = probs[b].argsort(descending=True)
        assert kept[b].sum().item() == k, b
        assert torch.all(kept[b, order[:k]]) and not kept[b, order[k:]].any(), b
        assert probs[b, kept[b]].sum().item() >= p                          # the kept mass reaches p ...
        assert probs[b, order[:k - 1]].sum().item() < p                    # ... and one fewer would not
    assert torch.equal(out[kept], logits[kept])
    assert torch.all(kept.gather(-1, logits.argmax(-1, keepdim=True)))      # the most probable always stays


def test_top_p_keeps_the_most_probable_token_when_it_alone_exceeds_p():
    logits = torch.tensor([[0.0, 8.0, 1.0, 2.0]], dtype=DT)                 # token 1 holds > 99% of the mass
    out = filter_logits(logits, top_p=0.01)
    assert out.isfinite().tolist() == [[False, True, False, False]]


def test_top_p_one_keeps_everything():
    logits = rand_logits(3, V, seed=5, scale=10.0)                           # tiny tail probabilities
    assert torch.equal(filter_logits(logits, top_p=1.0), logits)


def test_top_k_then_top_p_is_the_nucleus_of_the_renormalised_top_k():
    logits = rand_logits(5, V, seed=6)
    out = filter_logits(logits, top_k=10, top_p=0.7)
    top10 = filter_logits(logits, top_k=10)
    probs = top10.softmax(-1)
    for b in range(5):
        assert out[b].isfinite().sum().item() == nucleus_size(probs[b], 0.7)
    assert not (out.isfinite() & ~top10.isfinite()).any()


def test_filter_logits_value_errors():
    logits = rand_logits(2, V, seed=7)
    for k in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match=r"\btop_k\b"):
            filter_logits(logits, top_k=k)
    for p in (0.0, -0.1, 1.5, "0.9", float("nan")):
        with pytest.raises(ValueError, match=r"\btop_p\b"):
            filter_logits(logits, top_p=p)
    with pytest.raises(ValueError, match=r"\blogits\b.*floating"):
        filter_logits(torch.arange(5), top_k=2)


# ---------------------------------------------------------------- sample_next

def test_temperature_zero_is_argmax():
    logits = rand_logits(6, V, seed=8)
    assert torch.equal(sample_next(logits, temperature=0), logits.argmax(-1))
    assert torch.equal(sample_next(logits, temperature=0.0, top_k=3, top_p=0.5), logits.argmax(-1))


def test_a_tiny_temperature_is_argmax():
    logits = torch.arange(V, dtype=DT).roll(7)[None].repeat(100, 1) * 0.1   # gaps of 0.1, argmax at index 6
    g = torch.Generator().manual_seed(9)
    assert torch.all(sample_next(logits, temperature=1e-3, generator=g) == 6)
    spread = sample_next(logits, temperature=1.0, generator=g)               # the temperature matters
    assert len(spread.unique()) > 5


def test_top_k_draws_stay_in_the_top_k():
    row = rand_logits(V, seed=10, scale=0.5)                                  # flat: every token is likely
    logits = row[None].repeat(1000, 1)
    draws = sample_next(logits, top_k=5, generator=torch.Generator().manual_seed(11))
    top = set(row.topk(5).indices.tolist())
    assert set(draws.tolist()) == top                                        # never outside, each one drawn
    draws = sample_next(logits, top_p=0.3, generator=torch.Generator().manual_seed(12))
    assert set(draws.tolist()) == set(filter_logits(row, top_p=0.3).isfinite().nonzero().flatten().tolist())


def test_a_seeded_generator_reproduces():
    logits = rand_logits(200, V, seed=13, scale=0.5)
    a = sample_next(logits, generator=torch.Generator().manual_seed(14))
    b = sample_next(logits, generator=torch.Generator().manual_seed(14))
    c = sample_next(logits, generator=torch.Generator().manual_seed(15))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == (200,) and a.dtype == torch.long


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_empirical_frequencies_follow_the_softmax(temperature):
    row = torch.tensor([1.0, 0.2, -0.5, 0.7, 0.0, -1.5], dtype=DT)
    n = 20_000
    draws = sample_next(row[None].repeat(n, 1), temperature=temperature,
                        generator=torch.Generator().manual_seed(16))
    freq = torch.bincount(draws, minlength=6).double() / n
    want = (row / temperature).softmax(-1)
    assert (freq - want).abs().max().item() < 0.015                           # about 4 standard errors


def test_sample_next_value_errors():
    logits = rand_logits(2, V, seed=17)
    for t in (-1.0, "1", True, float("nan")):
        with pytest.raises(ValueError, match=r"\btemperature\b"):
            sample_next(logits, temperature=t)
    with pytest.raises(ValueError, match=r"\btop_k\b"):
        sample_next(logits, top_k=0)
    with pytest.raises(ValueError, match=r"\btop_p\b"):
        sample_next(logits, top_p=1.5)


def test_sample_next_validates_top_k_and_top_p_when_greedy():
    logits = rand_logits(2, V, seed=18)
    with pytest.raises(ValueError, match=r"\btop_k\b"):
        sample_next(logits, temperature=0.0, top_k=0)
    with pytest.raises(ValueError, match=r"\btop_p\b"):
        sample_next(logits, temperature=0.0, top_p=7.0)


# ---------------------------------------------------------------- generate

@pytest.mark.parametrize("kwargs", [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.8, top_k=5),
                                    dict(temperature=1.2, top_p=0.8)],
                         ids=["greedy", "sample", "top_k", "top_p"])
def test_generate_with_and_without_cache_gives_the_same_tokens(kwargs):
    model = random_gpt(seed=19)
    prompt = prompt_ids(3, 4, seed=20)
    cached = generate(model, prompt, 12, generator=torch.Generator().manual_seed(21), **kwargs)
    full = generate(model, prompt, 12, generator=torch.Generator().manual_seed(21), use_cache=False, **kwargs)
    assert cached.shape == (3, 12) and cached.dtype == prompt.dtype
    assert torch.equal(cached, full)
    assert len(cached.unique()) > 3                                          # not a degenerate constant


def test_greedy_generation_is_the_argmax_continuation():
    model = random_gpt(seed=22)
    prompt = prompt_ids(2, 3, seed=23)
    out = generate(model, prompt, 5, temperature=0.0)
    tokens = prompt
    with torch.no_grad():
        for _ in range(5):
            tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, tokens[:, 3:])


def test_generate_is_reproducible_and_the_generator_matters():
    model = random_gpt(seed=24)
    prompt = prompt_ids(2, 3, seed=25)
    a = generate(model, prompt, 10, generator=torch.Generator().manual_seed(1))
    b = generate(model, prompt, 10, generator=torch.Generator().manual_seed(1))
    c = generate(model, prompt, 10, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_generate_fills_max_len_exactly_and_refuses_one_more():
    model = random_gpt(seed=26, max_len=12)
    prompt = prompt_ids(2, 4, seed=27)
    assert generate(model, prompt, 8, temperature=0.0).shape == (2, 8)      # 4 + 8 = max_len
    assert generate(model, prompt, 8, temperature=0.0, use_cache=False).shape == (2, 8)
    with pytest.raises(ValueError, match=r"(?s)(?=.*\bmax_new_tokens\b)(?=.*max_len=12)"):
        generate(model, prompt, 9)


def test_generate_runs_in_eval_mode_and_restores_the_callers_mode():
    model = random_gpt(seed=28)                                              # dropout 0.1
    prompt = prompt_ids(2, 4, seed=29)
    want = generate(model.eval(), prompt, 6, temperature=0)
    assert not model.training
    got = generate(model.train(), prompt, 6, temperature=0)
    assert model.training                                                    # the caller's mode, restored
    assert torch.equal(got, want)                                            # but no dropout while generating


def test_generate_value_errors():
    model = random_gpt(seed=30)
    prompt = prompt_ids(2, 3, seed=31)
    cases = [(dict(temperature=-0.5), "temperature"), (dict(temperature="hot"), "temperature"),
             (dict(top_k=0), "top_k"), (dict(top_k=2.5), "top_k"), (dict(top_p=0.0), "top_p"),
             (dict(top_p=1.01), "top_p"), (dict(max_new_tokens=0), "max_new_tokens")]
    for kwargs, name in cases:
        with pytest.raises(ValueError, match=rf"\b{name}\b"):
            generate(model, prompt, **{"max_new_tokens": 3, **kwargs})
    with pytest.raises(ValueError, match=r"\bprompt\b"):
        generate(model, prompt[0], 3)                                        # 1-D
    with pytest.raises(ValueError, match=r"\bprompt\b"):
        generate(model, prompt.double(), 3)                                  # not token ids


# ---------------------------------------------------------------- the exercise checker

def reference_top_p(logits, p):
    return filter_logits(logits, top_p=p)


def drops_the_crossing_token(logits, p):
    probs, order = logits.softmax(-1).sort(-1, descending=True)
    drop = (probs.cumsum(-1) >= p).scatter(-1, order, probs.cumsum(-1) >= p)
    return logits.masked_fill(drop, float("-inf"))


def forgets_the_vocabulary_order(logits, p):
    probs, _ = logits.softmax(-1).sort(-1, descending=True)
    before = probs.cumsum(-1) - probs
    return logits.masked_fill(before >= p, float("-inf"))                  # the sorted mask on unsorted logits


def returns_the_kept_logits_only(logits, p):
    return reference_top_p(logits, p)[0]


def returns_probabilities(logits, p):
    out = reference_top_p(logits, p)
    return out.softmax(-1).log().where(out.isfinite(), out) + 1.0


def test_check_top_p_accepts_a_correct_solution(capsys):
    check_top_p(reference_top_p)
    assert "check_top_p: correct" in capsys.readouterr().out


@pytest.mark.parametrize("fn, message", [
    (drops_the_crossing_token, r"the token whose probability makes the sum reach p must be kept"),
    (forgets_the_vocabulary_order, r"wrong tokens are kept"),
    (returns_the_kept_logits_only, r"logits' shape \(3, \d+\)"),
    (returns_probabilities, r"keep their logits unchanged"),
], ids=["crossing-token", "vocabulary-order", "shape", "changed-logits"])
def test_check_top_p_names_the_mistake(fn, message, capsys):
    with pytest.raises(AssertionError, match=message):
        check_top_p(fn)
    assert "correct" not in capsys.readouterr().out
