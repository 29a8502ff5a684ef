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

BOS, EOS, PAD = 1, 2, 0


def random_model(vocab=9, seed=0, peaky=2.0, **overrides):
    """A small random model whose output distribution is peaked enough to give varied outputs."""
    torch.manual_seed(seed)
    cfg = dict(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=2, num_decoder_layers=2, dropout=0.0,
               tie_embeddings=False, max_len=128)
    cfg.update(overrides)
    model = Transformer(TransformerConfig(vocab, vocab, **cfg)).double().eval()
    nn.init.normal_(model.generator.weight, std=peaky)
    return model


def random_source(B=4, S=7, vocab=9, seed=0):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (B, S), generator=gen)
    for b in range(1, B):                      # different amounts of padding
        src[b, S - b:] = PAD
    return src, padding_mask(src, PAD)


@pytest.mark.parametrize("overrides", [{}, {"norm_first": True}, {"final_norm": False}])
def test_kv_cache_equals_recomputation(overrides):
    model = random_model(**overrides)
    src, mask = random_source()
    fast, fast_logits = greedy_decode(model, src, mask, bos_id=BOS, eos_id=EOS, max_len=20, return_logits=True)
    slow, slow_logits = greedy_decode(model, src, mask, bos_id=BOS, eos_id=EOS, max_len=20, use_cache=False,
                                      return_logits=True)
    assert torch.equal(fast, slow)
    assert fast_logits.shape == slow_logits.shape == (4, fast.size(1), 9)
    assert torch.allclose(fast_logits, slow_logits, rtol=0, atol=1e-12)


def test_kv_cache_step_by_step_against_decode():
    model = random_model(seed=3)
    src, mask = random_source(seed=3)
    memory = model.encode(src, mask)
    tgt = torch.randint(0, 9, (4, 10))
    full = model.generator(model.decode(tgt, memory, mask, model.make_tgt_mask(torch.ones_like(tgt))))
    cache = KVCache(model, memory, mask)
    for t in range(10):
        assert torch.allclose(cache.step(tgt[:, t]), full[:, t], atol=1e-12)
    assert cache.t == 10 and cache.self_kv[0][0].shape == (4, 2, 10, 8)      # (B, h, t, d_k)
    assert cache.cross_kv[0][0].shape == (4, 2, 7, 8)                          # (B, h, S, d_k)


def test_kv_cache_reorder():
    model = random_model(seed=4)
    src, mask = random_source(seed=4)
    memory = model.encode(src, mask)
    a, b = KVCache(model, memory, mask), KVCache(model, memory[[2, 0]], mask[[2, 0]])
    tokens = torch.tensor([1, 5, 6, 7])
    a.step(tokens)
    b.step(tokens[[2, 0]])
    a.reorder(torch.tensor([2, 0]))
    assert torch.allclose(a.step(torch.tensor([4, 5])), b.step(torch.tensor([4, 5])), atol=1e-12)


def test_kv_cache_needs_eval():
    model = random_model().train()
    with pytest.raises(ValueError, match="eval"):
        KVCache(model, torch.zeros(1, 3, 16, dtype=torch.float64))


def test_greedy_stops_at_eos_and_pads():
    model = random_model(seed=5)
    src, mask = random_source(B=6, seed=5)
    out, logits = greedy_decode(model, src, mask, bos_id=BOS, eos_id=EOS, max_len=30, return_logits=True)
    assert torch.equal(out[:, 0], logits[:, 0].argmax(-1))
    for row in out.tolist():
        if EOS in row:
            assert all(t == PAD for t in row[row.index(EOS) + 1:])
    if (out == EOS).any(1).all():                       # stopped as soon as every row finished
        assert (out[:, -1] == EOS).any()
    with torch.no_grad():
        model.generator.weight.zero_()
        model.generator.weight[EOS] = 1.0               # logit of EOS = sum of the final hidden state ...
        model.decoder.norm.bias.fill_(10.0)             # ... which this makes large: EOS wins at once
    out = greedy_decode(model, src, mask, bos_id=BOS, eos_id=EOS)
    assert out.shape == (6, 1) and (out == EOS).all()


def test_greedy_max_len():
    model = random_model(seed=6)
    src, mask = random_source(seed=6)
    out = greedy_decode(model, src, mask, bos_id=BOS, eos_id=-1, max_len=5)     # an EOS that never comes
    assert out.shape == (4, 5)
    assert greedy_decode(model, src, mask, bos_id=BOS, eos_id=-1).shape == (4, 7 + 50)   # default: S + 50


@pytest.mark.parametrize("seed", range(4))
def test_beam_size_one_is_greedy(seed):
    model = random_model(seed=seed)
    src, mask = random_source(B=6, seed=seed)
    greedy = greedy_decode(model, src, mask, bos_id=BOS, eos_id=EOS, max_len=15)
    beam, scores = beam_search(model, src, mask, bos_id=BOS, eos_id=EOS, beam_size=1, max_len=15)
    assert torch.equal(greedy, beam)
    assert torch.allclose(scores, sequence_scores(model, src, mask, beam, bos_id=BOS, eos_id=EOS), atol=1e-12)


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
        scores = sequence_scores(model, src.expand(len(outputs), -1), None, cands, bos_id=BOS, eos_id=EOS,
                                 alpha=alpha)
        best = outputs[int(scores.argmax())]
        tokens, score = beam_search(model, src, None, bos_id=BOS, eos_id=EOS, beam_size=400, alpha=alpha, max_len=4)
        assert tokens[0].tolist() == best
        assert float(score[0]) == pytest.approx(float(scores.max()), abs=1e-12)
        greedy = greedy_decode(model, src, None, bos_id=BOS, eos_id=EOS, max_len=4)[0].tolist()
        beats_greedy += greedy != best
    assert beats_greedy > 0            # the test is not trivial: greedy misses the optimum sometimes


def test_beam_batched_equals_one_by_one():
    model = random_model(seed=7)
    src, mask = random_source(B=5, seed=7)
    tokens, scores = beam_search(model, src, mask, bos_id=BOS, eos_id=EOS, beam_size=3, max_len=12)
    for b in range(5):
        t1, s1 = beam_search(model, src[b:b + 1], mask[b:b + 1], bos_id=BOS, eos_id=EOS, beam_size=3, max_len=12)
        assert tokens[b, :t1.size(1)].tolist() == t1[0].tolist() and (tokens[b, t1.size(1):] == PAD).all()
        assert float(s1) == pytest.approx(float(scores[b]), abs=1e-12)
    assert torch.allclose(scores, sequence_scores(model, src, mask, tokens, bos_id=BOS, eos_id=EOS), atol=1e-12)


def test_beam_never_scores_below_its_own_greedy_hypothesis_for_wide_beams():
    model = random_model(seed=8)
    src, mask = random_source(B=4, seed=8)
    greedy = greedy_decode(model, src, mask, bos_id=BOS, eos_id=EOS, max_len=6)
    g_scores = sequence_scores(model, src, mask, greedy, bos_id=BOS, eos_id=EOS)
    _, b_scores = beam_search(model, src, mask, bos_id=BOS, eos_id=EOS, beam_size=9 ** 3, max_len=6)
    assert (b_scores >= g_scores - 1e-12).all()


def test_beam_errors():
    model = random_model()
    src, mask = random_source()
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, src, mask, bos_id=BOS, eos_id=EOS, beam_size=0)


def test_length_penalty():
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(10, 0.6) == pytest.approx(2.5 ** 0.6)
    assert length_penalty(7, 0.0) == 1.0
    assert math.isclose(length_penalty(torch.tensor(3.0, dtype=torch.float64), 1.0).item(), 8 / 6)


def test_translate_and_cross_attention():
    tok = CharTokenizer("abcdef")
    model = random_model(vocab=len(tok), seed=9)
    texts = ["abc", "f", "deadbeef", "cab"]
    greedy = translate(model, tok, texts, batch_size=2, max_len=12)
    beam = translate(model, tok, texts, beam_size=1, max_len=12)
    assert greedy == beam and all(isinstance(t, str) for t in greedy)
    assert translate(model, tok, texts, beam_size=3, max_len=12) != greedy      # beam search does something
    one = [translate(model, tok, [t], max_len=12)[0] for t in texts]
    assert one == greedy                                   # batching and sorting change nothing
    src = torch.tensor([tok.encode("abc", eos=True)])
    maps = cross_attention_maps(model, src, torch.tensor([[BOS, 5, 6]]))
    assert len(maps) == 2 and maps[0].shape == (1, 2, 3, 4)
    assert torch.allclose(maps[0].sum(-1), torch.ones(1, 2, 3, dtype=torch.float64))


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
