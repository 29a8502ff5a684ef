"""Tests for transformer_lib/decoding.py (Chapter 8): greedy decoding, KV cache, beam search, metrics."""

import math

import pytest
import torch
import torch.nn as nn

from transformer_lib.attention import padding_mask
from transformer_lib.data import CharTokenizer
from transformer_lib.decoding import (
    KVCache,
    beam_search,
    cross_attention_maps,
    edit_distance,
    evaluate_translations,
    greedy_decode,
    length_penalty,
    sequence_scores,
    translate,
)
from transformer_lib.model import Transformer, TransformerConfig
from transformer_lib.multi_head import AttentionCache, MultiHeadAttention

BOS, EOS, PAD = 1, 2, 0
IDS = {"bos_id": BOS, "eos_id": EOS}


def random_model(vocab=9, seed=0, peaky=2.0, dtype=torch.float64, **overrides):
    """A small random model whose output distribution is peaked enough to give varied outputs."""
    torch.manual_seed(seed)
    cfg = dict(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=2, num_decoder_layers=2, dropout=0.0,
               tie_embeddings=False, max_len=128)
    cfg.update(overrides)
    model = Transformer(TransformerConfig(vocab, vocab, **cfg)).to(dtype).eval()
    nn.init.normal_(model.lm_head.weight, std=peaky)
    return model


def random_source(B=4, S=7, vocab=9, seed=0):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (B, S), generator=gen)
    for b in range(1, B):                      # different amounts of padding
        src[b, S - b:] = PAD
    return src, padding_mask(src, PAD)


def never_ending_model(token=5, **overrides):
    """A model that writes `token` at every step and never EOS: the final LayerNorm outputs its bias (weight 0),
    and the generator scores only `token`."""
    model = random_model(**overrides)
    with torch.no_grad():
        model.decoder.norm.weight.zero_()
        model.decoder.norm.bias.fill_(1.0)
        model.lm_head.weight.zero_()
        model.lm_head.weight[token] = 1.0
    return model


# ---------------------------------------------------------------- the KV cache: identical to recomputing

@pytest.mark.parametrize("overrides", [{}, {"norm_first": True}, {"final_norm": False}])
def test_kv_cache_equals_recomputation(overrides):
    model = random_model(**overrides)
    src, mask = random_source()
    fast, fast_scores = greedy_decode(model, src, mask, **IDS, max_new_tokens=20)
    slow, slow_scores = greedy_decode(model, src, mask, **IDS, max_new_tokens=20, use_cache=False)
    assert torch.equal(fast, slow)
    assert fast_scores.dtype == slow_scores.dtype == torch.float64 and fast_scores.shape == (4,)
    assert torch.allclose(fast_scores, slow_scores, rtol=0, atol=1e-12)


def test_kv_cache_equals_recomputation_float32():
    model = random_model(seed=2, dtype=torch.float32)
    src, mask = random_source(seed=2)
    fast, fast_scores = greedy_decode(model, src, mask, **IDS, max_new_tokens=20)
    slow, slow_scores = greedy_decode(model, src, mask, **IDS, max_new_tokens=20, use_cache=False)
    assert torch.equal(fast, slow) and fast.size(1) > 3
    assert torch.allclose(fast_scores, slow_scores, rtol=0, atol=1e-5)      # float32: 20 tokens of ~1e-7
    assert torch.allclose(fast_scores, sequence_scores(model, src, mask, fast, **IDS), rtol=0, atol=1e-5)


def test_kv_cache_step_by_step_against_decode():
    model = random_model(seed=3)
    src, mask = random_source(seed=3)
    memory = model.encode(src, mask)
    tgt = torch.randint(0, 9, (4, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model.lm_head(model.decode(tgt, memory, mask))        # no tgt_mask: the decoder is causal
        cache = KVCache(model, memory, mask)
        for t in range(10):
            assert cache.t == t
            assert torch.allclose(cache.step(tgt[:, t]), full[:, t], rtol=0, atol=1e-12)
    assert cache.t == 10 and len(cache.layers) == 2
    self_cache, cross_cache = cache.layers[0]
    assert isinstance(self_cache, AttentionCache) and not self_cache.static and cross_cache.static
    assert self_cache.k.shape == (4, 2, 10, 8)                          # (B, h, t, d_k)
    assert cross_cache.k.shape == (4, 2, 7, 8)                          # (B, h, S, d_k), projected once


def test_kv_cache_goes_through_multi_head_attention(monkeypatch):
    """No third attention path: every attention of a cached step is a MultiHeadAttention.forward with a cache."""
    model = random_model(seed=4)
    src, mask = random_source(seed=4)
    calls = []
    original = MultiHeadAttention.forward

    def spy(self, *args, **kwargs):
        calls.append(kwargs.get("cache", args[5] if len(args) > 5 else None))
        return original(self, *args, **kwargs)
    monkeypatch.setattr(MultiHeadAttention, "forward", spy)
    cache = KVCache(model, model.encode(src, mask), mask)
    calls.clear()
    with torch.no_grad():
        cache.step(torch.full((4,), BOS))
        cache.step(torch.full((4,), 5))
    assert len(calls) == 2 * 2 * 2                                       # 2 steps x 2 layers x (self, cross)
    assert all(isinstance(c, AttentionCache) for c in calls)
    assert sum(c.static for c in calls) == 4


def test_kv_cache_reorder():
    model = random_model(seed=4)
    src, mask = random_source(seed=4)
    memory = model.encode(src, mask)
    a, b = KVCache(model, memory, mask), KVCache(model, memory[[2, 0, 0]], mask[[2, 0, 0]])
    tokens = torch.tensor([1, 5, 6, 7])
    with torch.no_grad():
        a.step(tokens)
        b.step(tokens[[2, 0, 0]])
        a.reorder(torch.tensor([2, 0, 0]))                              # select and duplicate rows
        assert torch.allclose(a.step(torch.tensor([4, 5, 6])), b.step(torch.tensor([4, 5, 6])), rtol=0, atol=1e-12)


def test_kv_cache_errors():
    model = random_model()
    src, mask = random_source()
    memory = model.encode(src, mask)
    with pytest.raises(ValueError, match="eval"):
        KVCache(random_model().train(), memory, mask)
    with pytest.raises(ValueError, match="^src_mask must be a bool tensor"):
        KVCache(model, memory, mask.double())                  # a 0/1 float mask would be an additive bias
    with pytest.raises(ValueError, match=r"^src_mask of shape \(4, 7\) does not fit"):
        KVCache(model, memory, mask[:, 0, 0])                  # a (B, S) padding mask
    with pytest.raises(ValueError, match="^memory must be"):
        KVCache(model, memory[0], mask)
    with pytest.raises(ValueError, match="^src_mask is required"):
        KVCache(model, memory, None)
    cache = KVCache(model, memory, mask)
    with pytest.raises(ValueError, match="^tokens must"):
        cache.step(torch.ones(4, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="^tokens must"):
        cache.step(torch.ones(3, dtype=torch.long))
    with pytest.raises(ValueError, match="^tokens must be an integer tensor"):
        cache.step(torch.ones(4))


# ---------------------------------------------------------------- greedy decoding

def test_greedy_stops_at_eos_and_pads():
    model = random_model(seed=26)                       # a seed whose six outputs all end, at different steps
    src, mask = random_source(B=6, seed=26)
    out, scores = greedy_decode(model, src, mask, **IDS, max_new_tokens=30)
    lengths = [row.index(EOS) + 1 for row in out.tolist()]              # every row has an EOS
    assert lengths == [2, 4, 15, 8, 6, 8]
    assert out.size(1) == max(lengths) < 30                             # stopped when the last row finished
    for row, n in zip(out.tolist(), lengths, strict=True):
        assert EOS not in row[:n - 1] and all(t == PAD for t in row[n:])   # PAD after the first EOS
    assert torch.allclose(scores, sequence_scores(model, src, mask, out, **IDS), rtol=0, atol=1e-12)
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.weight[EOS] = 1.0               # logit of EOS = sum of the final hidden state ...
        model.decoder.norm.bias.fill_(10.0)             # ... which this makes large: EOS wins at once
    out, scores = greedy_decode(model, src, mask, **IDS)
    assert out.shape == (6, 1) and (out == EOS).all()
    assert torch.allclose(scores, sequence_scores(model, src, mask, out, **IDS), rtol=0, atol=1e-12)


def test_greedy_max_new_tokens():
    model = never_ending_model(seed=6)
    src, mask = random_source(seed=6)
    out, scores = greedy_decode(model, src, mask, **IDS, max_new_tokens=5)
    assert out.tolist() == [[5] * 5] * 4
    assert torch.allclose(scores, sequence_scores(model, src, mask, out, **IDS), rtol=0, atol=1e-12)
    assert greedy_decode(model, src, mask, **IDS)[0].shape == (4, 7 + 50)           # default: S + 50
    short = never_ending_model(seed=6, max_len=20)
    assert greedy_decode(short, src, mask, **IDS)[0].shape == (4, 20)             # ... within the table
    assert beam_search(short, src, mask, **IDS, beam_size=2)[0].shape == (4, 20)


def test_greedy_and_beam_return_the_same_types():
    model = random_model(seed=7)
    src, mask = random_source(seed=7)
    for tokens, scores in (greedy_decode(model, src, mask, **IDS, max_new_tokens=9),
                           beam_search(model, src, mask, **IDS, beam_size=3, max_new_tokens=9)):
        assert tokens.dtype == torch.long and tokens.dim() == 2 and tokens.size(0) == 4
        assert scores.dtype == torch.float64 and scores.shape == (4,)
        assert torch.allclose(scores, sequence_scores(model, src, mask, tokens, **IDS), rtol=0, atol=1e-12)


@pytest.mark.parametrize("decode", [greedy_decode, beam_search])
def test_decoding_an_empty_batch(decode):
    model = random_model()
    src = torch.zeros(0, 5, dtype=torch.long)
    tokens, scores = decode(model, src, padding_mask(src, PAD), **IDS)
    assert tokens.shape == (0, 0) and tokens.dtype == torch.long
    assert scores.shape == (0,) and scores.dtype == torch.float64


@pytest.mark.parametrize("decode", [greedy_decode, beam_search])
@pytest.mark.parametrize("kwargs, name", [
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"max_new_tokens": True}, "max_new_tokens"), ({"max_new_tokens": 2.5}, "max_new_tokens"),
    ({"max_new_tokens": 129}, "max_new_tokens"),                       # beyond the model's max_len = 128
    ({"bos_id": True}, "bos_id"), ({"eos_id": -1}, "eos_id"), ({"eos_id": 9}, "eos_id"),
    ({"pad_id": True}, "pad_id"), ({"pad_id": 1.0}, "pad_id"),
    ({"alpha": -0.5}, "alpha"), ({"alpha": float("nan")}, "alpha"), ({"alpha": True}, "alpha"),
    ({"alpha": float("inf")}, "alpha"),
])
def test_decoding_argument_errors(decode, kwargs, name):
    model = random_model()
    src, mask = random_source()
    with pytest.raises(ValueError, match=f"^{name} must"):
        decode(model, src, mask, **{**IDS, **kwargs})


@pytest.mark.parametrize("decode", [greedy_decode, beam_search])
def test_decoding_mask_and_source_errors(decode):
    model = random_model()
    src, mask = random_source()
    with pytest.raises(ValueError, match="^src_mask must be a bool tensor"):
        decode(model, src, mask.double(), **IDS)
    with pytest.raises(ValueError, match="^src_mask of shape"):
        decode(model, src, mask[:, 0, 0], **IDS)
    with pytest.raises(ValueError, match="^src must be"):
        decode(model, src.double(), mask, **IDS)
    with pytest.raises(ValueError, match="^src must be"):
        decode(model, src[0], mask, **IDS)
    with pytest.raises(ValueError, match="^use_cache must be True or False"):
        greedy_decode(model, src, mask, **IDS, use_cache="no")


def test_decoding_without_a_source_mask():
    model = random_model(seed=8)
    src = random_source(seed=8)[0][:1]                                   # one unpadded source
    with_mask = greedy_decode(model, src, padding_mask(src, PAD), **IDS, max_new_tokens=8)
    without = greedy_decode(model, src, None, **IDS, max_new_tokens=8)
    assert torch.equal(with_mask[0], without[0]) and torch.allclose(with_mask[1], without[1], atol=1e-12)


def test_decoding_with_a_broadcast_source_mask():
    model = random_model(seed=9)
    src = torch.randint(3, 9, (3, 6), generator=torch.Generator().manual_seed(9))
    src[:, 4:] = PAD                                                      # the same padding in every row
    full, one = padding_mask(src, PAD), padding_mask(src, PAD)[:1]         # (3, 1, 1, S) and (1, 1, 1, S)
    for decode, kwargs in ((greedy_decode, {}), (beam_search, {"beam_size": 3})):
        a = decode(model, src, full, **IDS, max_new_tokens=8, **kwargs)
        b = decode(model, src, one, **IDS, max_new_tokens=8, **kwargs)
        assert torch.equal(a[0], b[0]) and torch.allclose(a[1], b[1], rtol=0, atol=1e-12)


# ---------------------------------------------------------------- beam search

@pytest.mark.parametrize("seed", range(4))
def test_beam_size_one_is_greedy(seed):
    model = random_model(seed=seed)
    src, mask = random_source(B=6, seed=seed)
    greedy, g_scores = greedy_decode(model, src, mask, **IDS, max_new_tokens=15)
    beam, scores = beam_search(model, src, mask, **IDS, beam_size=1, max_new_tokens=15)
    assert torch.equal(greedy, beam)
    assert torch.allclose(scores, g_scores, rtol=0, atol=1e-12)
    assert torch.allclose(scores, sequence_scores(model, src, mask, beam, **IDS), rtol=0, atol=1e-12)


def all_outputs(vocab, eos_id, max_len):
    prefixes, outputs = [[]], []
    for _ in range(max_len):
        outputs += [p + [eos_id] for p in prefixes]
        prefixes = [p + [tok] for p in prefixes for tok in range(vocab) if tok != eos_id]
    return outputs + prefixes


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_wide_beam_finds_the_best_sequence(alpha):
    model = random_model(vocab=5, seed=1, peaky=1.5, d_model=8, num_encoder_layers=1, num_decoder_layers=1)
    outputs = all_outputs(5, EOS, 4)
    assert len(outputs) == 1 + 4 + 16 + 64 + 256
    cands = nn.utils.rnn.pad_sequence([torch.tensor(o) for o in outputs], batch_first=True, padding_value=PAD)
    beats_greedy = 0
    for trial in range(6):
        src = torch.randint(3, 5, (1, 3), generator=torch.Generator().manual_seed(trial))
        scores = sequence_scores(model, src.expand(len(outputs), -1), None, cands, **IDS, alpha=alpha)
        best = outputs[int(scores.argmax())]
        tokens, score = beam_search(model, src, None, **IDS, beam_size=400, alpha=alpha, max_new_tokens=4)
        assert tokens[0].tolist() == best
        assert float(score[0]) == pytest.approx(float(scores.max()), abs=1e-12)
        greedy = greedy_decode(model, src, None, **IDS, alpha=alpha, max_new_tokens=4)[0][0].tolist()
        beats_greedy += greedy != best
    assert beats_greedy > 0            # the test is not trivial: greedy misses the optimum sometimes


def test_beam_batched_equals_one_by_one():
    model = random_model(seed=7)
    src, mask = random_source(B=5, seed=7)
    tokens, scores = beam_search(model, src, mask, **IDS, beam_size=3, max_new_tokens=12)
    for b in range(5):
        t1, s1 = beam_search(model, src[b:b + 1], mask[b:b + 1], **IDS, beam_size=3, max_new_tokens=12)
        assert tokens[b, :t1.size(1)].tolist() == t1[0].tolist() and (tokens[b, t1.size(1):] == PAD).all()
        assert float(s1) == pytest.approx(float(scores[b]), abs=1e-12)
    assert torch.allclose(scores, sequence_scores(model, src, mask, tokens, **IDS), atol=1e-12)


def plain_beam_search(model, src, beam_size, alpha, max_len):
    """The reference: one source, no cache, no early stop. Extend every open hypothesis by every token, keep the
    best beam_size of them (fewer as hypotheses finish), finish those ending in EOS (or at max_len), and return
    the finished one with the best log P / lp, after every slot has finished."""
    open_, slots, best = [([], 0.0)], beam_size, ([], -math.inf)
    for t in range(1, max_len + 1):
        candidates = []
        for tokens, logp in open_:
            tgt = torch.tensor([[BOS, *tokens]])
            with torch.no_grad():
                step = torch.log_softmax(model(src, tgt, padding_mask(src, PAD))[0, -1].double(), -1)
            candidates += [(logp + float(step[v]), tokens + [v]) for v in range(step.numel())]
        candidates.sort(key=lambda c: -c[0])
        open_ = []
        for logp, tokens in candidates[:slots]:
            if tokens[-1] == EOS or t == max_len:
                slots -= 1
                if logp / length_penalty(t, alpha) > best[1]:
                    best = (tokens, logp / length_penalty(t, alpha))
            else:
                open_.append((tokens, logp))
        if not open_:
            break
    return best


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_beam_search_equals_a_plain_beam_search_without_early_stopping(alpha):
    model = random_model(seed=4, peaky=1.0)
    src, mask = random_source(B=4, seed=4)
    for k in (2, 3):
        tokens, scores = beam_search(model, src, mask, **IDS, beam_size=k, alpha=alpha, max_new_tokens=10)
        for b in range(4):
            real = src[b:b + 1, :int(mask[b].sum())]                  # the source without its padding
            ref_tokens, ref_score = plain_beam_search(model, real, k, alpha, max_len=10)
            assert tokens[b, :len(ref_tokens)].tolist() == ref_tokens, (k, b)
            assert float(scores[b]) == pytest.approx(ref_score, abs=1e-10)


def test_beam_search_stops_once_no_open_hypothesis_can_win(monkeypatch):
    # a model sure of EOS at the first step (log P ~ 0) and of nothing else: the other open hypotheses cannot
    # catch up, so the search ends after one step instead of running on until they finish too
    model = random_model(seed=5)
    with torch.no_grad():
        model.decoder.norm.weight.zero_()
        model.decoder.norm.bias.fill_(1.0)
        model.lm_head.weight.zero_()
        model.lm_head.weight[EOS] = 30.0
    src, mask = random_source(B=3, seed=5)
    steps = []
    step = KVCache.step
    monkeypatch.setattr(KVCache, "step", lambda self, *a, **kw: steps.append(1) or step(self, *a, **kw))
    for alpha in (0.0, 0.6):
        steps.clear()
        tokens, scores = beam_search(model, src, mask, **IDS, beam_size=4, alpha=alpha, max_new_tokens=20)
        assert tokens.tolist() == [[EOS]] * 3 and len(steps) == 1, (alpha, len(steps))
        assert plain_beam_search(model, src[:1], 4, alpha, max_len=20)[0] == [EOS]


def test_beam_never_scores_below_its_own_greedy_hypothesis_for_wide_beams():
    model = random_model(seed=8)
    src, mask = random_source(B=4, seed=8)
    greedy, g_scores = greedy_decode(model, src, mask, **IDS, max_new_tokens=6)
    assert torch.allclose(g_scores, sequence_scores(model, src, mask, greedy, **IDS), atol=1e-12)
    _, b_scores = beam_search(model, src, mask, **IDS, beam_size=9 ** 3, max_new_tokens=6)
    assert (b_scores >= g_scores - 1e-12).all()


@pytest.mark.parametrize("beam_size", [0, -2, True, 2.0, "4"])
def test_beam_size_errors(beam_size):
    model = random_model()
    src, mask = random_source()
    with pytest.raises(ValueError, match="^beam_size must be an int >= 1"):
        beam_search(model, src, mask, **IDS, beam_size=beam_size)


# ---------------------------------------------------------------- scores and the length penalty

def test_length_penalty():
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(10, 0.6) == pytest.approx(2.5 ** 0.6)
    assert length_penalty(7, 0.0) == 1.0 and length_penalty(0, 0.6) == pytest.approx((5 / 6) ** 0.6)
    assert math.isclose(length_penalty(torch.tensor(3.0, dtype=torch.float64), 1.0).item(), 8 / 6)
    assert torch.allclose(length_penalty(torch.tensor([1, 4]), 1.0), torch.tensor([1.0, 1.5]))


@pytest.mark.parametrize("length, alpha, name", [(-1, 0.6, "length"), (-6, 0.5, "length"), (3, -0.6, "alpha"),
                                                 (True, 0.6, "length"), (3, float("nan"), "alpha"),
                                                 (torch.tensor([2, -1]), 0.6, "length"), ("3", 0.6, "length"),
                                                 (torch.tensor([1j]), 0.6, "length"),
                                                 (float("inf"), 0.6, "length"), (3, float("inf"), "alpha")])
def test_length_penalty_errors(length, alpha, name):
    with pytest.raises(ValueError, match=f"^{name} must"):          # never a complex number
        length_penalty(length, alpha)


def test_sequence_scores_errors():
    model = random_model()
    src, mask = random_source()
    with pytest.raises(ValueError, match="^tokens must"):
        sequence_scores(model, src, mask, torch.zeros(4, 0, dtype=torch.long), **IDS)
    with pytest.raises(ValueError, match="^tokens must"):
        sequence_scores(model, src, mask, torch.zeros(4, 3), **IDS)
    with pytest.raises(ValueError, match="^alpha must"):
        sequence_scores(model, src, mask, torch.ones(4, 3, dtype=torch.long), **IDS, alpha=-1.0)


# ---------------------------------------------------------------- translate, attention maps, metrics

def test_translate_and_cross_attention():
    tok = CharTokenizer("abcdef")
    model = random_model(vocab=len(tok), seed=9)
    texts = ["abc", "f", "deadbeef", "cab"]
    greedy = translate(model, tok, texts, batch_size=2, max_new_tokens=12)
    beam = translate(model, tok, texts, beam_size=1, max_new_tokens=12)
    assert greedy == beam and all(isinstance(t, str) for t in greedy)
    assert translate(model, tok, texts, beam_size=3, max_new_tokens=12) != greedy      # beam search does something
    one = [translate(model, tok, [t], max_new_tokens=12)[0] for t in texts]
    assert one == greedy                                   # batching and sorting change nothing
    assert translate(model, tok, tuple(texts), max_new_tokens=12) == greedy
    assert translate(model, tok, []) == []
    src = torch.tensor([tok.encode("abc", eos=True)])
    maps = cross_attention_maps(model, src, torch.tensor([[BOS, 5, 6]]))
    assert len(maps) == 2 and maps[0].shape == (1, 2, 3, 4)
    assert torch.allclose(maps[0].sum(-1), torch.ones(1, 2, 3, dtype=torch.float64))


@pytest.mark.parametrize("texts, kwargs, match", [
    ("ab", {}, r"^texts must be a list of strings; for one text pass \[text\]"),
    (b"ab", {}, "^texts must be a list of strings"),
    (["ab", 3], {}, "^texts must hold strings, got int 3 at index 1"),
    (["ab"], {"batch_size": 0}, "^batch_size must be an int >= 1"),
    (["ab"], {"batch_size": True}, "^batch_size must be an int >= 1"),
    (["ab"], {"beam_size": True}, "^beam_size must be an int >= 1"),
    (["ab"], {"beam_size": 0}, "^beam_size must be an int >= 1"),
    (["ab"], {"alpha": -1.0}, "^alpha must"),
    (["ab"], {"max_new_tokens": 0}, "^max_new_tokens must be an int >= 1"),
    (["ab!"], {}, "character '!' at position 2 is not in the vocabulary"),
])
def test_translate_errors(texts, kwargs, match):
    tok = CharTokenizer("abcdef")
    model = random_model(vocab=len(tok))
    with pytest.raises(ValueError, match=match):
        translate(model, tok, texts, **kwargs)


def test_edit_distance_and_metrics():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("", "") == 0 and edit_distance("abc", "") == 3 and edit_distance("", "ab") == 2
    assert edit_distance("zweiundvierzig", "vierundzweizig") == 6
    assert edit_distance("ab", "ba") == 2
    refs = ["dreihundert", "elf"]
    r = evaluate_translations(refs, refs)
    assert r == pytest.approx({"exact_match": 1.0, "cer": 0.0, "chrf": 100.0, "bleu": 100.0}, abs=1e-9)
    r = evaluate_translations(["dreihundert", "elv"], refs)
    assert r["exact_match"] == 0.5 and r["cer"] == pytest.approx(1 / 14)
    assert 0 < r["chrf"] < 100 and 0 < r["bleu"] < 100
    with pytest.raises(ValueError, match="as many hypotheses"):
        evaluate_translations(["a"], ["a", "b"])
