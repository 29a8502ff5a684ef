"""The graders of Chapter 11's exercises (decoder-only Transformers), imported by the chapter's exercise cells.

Hand-written, not exported from the chapter: a grader's reference and named slips are the answers, and Colab shows
every cell of a chapter, so their code stays out of the chapters."""

__all__ = ['check_top_p', 'check_bits_per_byte', 'check_min_p', 'check_nats_per_char', 'check_byte_bigram_bpb',
           'check_temperature_for',
           'check_kv_cache_bytes', 'check_lm_loss']

import math

import torch

from ..gpt import GPT, GPTConfig
from .grading import call_reader, close_to, grade, number


def _nucleus(logits, p):
    """The definition, one row at a time: the fewest most probable tokens whose probabilities reach p."""
    out = torch.full_like(logits, float("-inf"))
    for b in range(logits.size(0)):
        probs, order = logits[b].softmax(-1).sort(descending=True)
        k = int((probs.cumsum(-1) < p).sum()) + 1                  # tokens before the sum reaches p, plus one
        keep = order[:min(k, len(order))]
        out[b, keep] = logits[b, keep]
    return out


def check_top_p(fn, trials: int = 20) -> None:
    """Test fn(logits (B, V), p) -> logits with -inf outside the nucleus against the definition, on random
    logits. Raises AssertionError naming the mistake; prints a verdict."""
    g = torch.Generator().manual_seed(0)
    for trial in range(trials):
        B, V = 3, int(torch.randint(2, 30, (1,), generator=g))
        logits = torch.randn(B, V, generator=g, dtype=torch.float64) * (1 + trial % 4)
        p = float(torch.rand(1, generator=g)) * 0.98 + 0.01
        got, want = fn(logits.clone(), p), _nucleus(logits, p)
        assert isinstance(got, torch.Tensor) and got.shape == logits.shape, \
            f"return a tensor of the logits' shape {tuple(logits.shape)}, got {getattr(got, 'shape', type(got))}"
        kept, should = got.isfinite(), want.isfinite()
        if torch.equal(kept, should):
            assert close_to(got[kept], logits[kept]), "the kept tokens must keep their logits unchanged"
            continue
        if (kept.sum(-1) == should.sum(-1) - 1).any():
            raise AssertionError(f"p={p:.3f}: the token whose probability makes the sum reach p must be kept "
                                 "(keep the tokens whose preceding mass is < p)")
        probs, order = logits.softmax(-1).sort(dim=-1)                            # least probable first
        ascending = [torch.zeros_like(kept).scatter(-1, order, low)                # a nucleus built upside down
                     for low in (probs.cumsum(-1) - probs < p, probs.cumsum(-1) <= p)]
        if any(torch.equal(kept, a) for a in ascending):
            raise AssertionError(f"p={p:.3f}: the least probable token is kept: sort in descending order, the "
                                 "nucleus takes the most probable tokens first")
        if (kept & ~should).any() and (should & ~kept).any():
            raise AssertionError(f"p={p:.3f}: the wrong tokens are kept: sort by probability, most probable first, "
                                 "and map the choice back to vocabulary order")
        raise AssertionError(f"p={p:.3f}: kept {kept.sum(-1).tolist()} tokens per row, the nucleus has "
                             f"{should.sum(-1).tolist()}")
    print("check_top_p: correct on", trials, "random cases")

def check_bits_per_byte(fn) -> None:
    """Test fn(nats_per_token, tokens_per_byte) -> bits per byte = nats_per_token * tokens_per_byte / ln 2 on a
    few (loss, tokenizer) pairs. Raises AssertionError naming the mistake; prints a verdict."""
    ln2 = math.log(2)
    mistakes = {
        "nats, not bits: divide by ln 2 (one bit is ln 2 = 0.693 nats)": lambda loss, per_byte: loss * per_byte,
        "bits per token, not per byte: multiply by the tokens per byte": lambda loss, per_byte: loss / ln2,
        "divided by the tokens per byte: a byte holds tokens_per_byte tokens, so multiply":
            lambda loss, per_byte: loss / per_byte / ln2,
        "nats per token, unchanged: divide by ln 2 (nats -> bits) and multiply by the tokens per byte":
            lambda loss, per_byte: loss,
        "multiplied by ln 2: nats -> bits divides by ln 2": lambda loss, per_byte: loss * per_byte * ln2,
        "log base 10: bits are log base 2, so divide by ln 2, not ln 10":
            lambda loss, per_byte: loss * per_byte / math.log(10),
    }
    grade(fn, lambda loss, per_byte: loss * per_byte / ln2,
          {f"loss {loss} nats per token, {per_byte} tokens per byte": (loss, per_byte)
           for loss, per_byte in [(3.258, 0.369), (1.35, 0.999), (2.0, 0.25), (0.7, 1.6)]},
          mistakes, says="expected {want:.4g} bits per byte, got {got:.4g}")
    print("check_bits_per_byte: nats per token -> bits per byte, correct on 4 cases")


def _min_p(logits, min_p):
    """The definition: -inf for every token whose probability is below min_p times the row's largest."""
    probs = logits.softmax(-1)
    return logits.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), float("-inf"))


def check_min_p(fn, trials: int = 20) -> None:
    """Test fn(logits (B, V), min_p) -> logits with -inf for every token whose probability is below min_p times
    that of the row's most probable token (min-p sampling, Nguyen et al. 2024), on random logits. Raises
    AssertionError naming the mistake; prints a verdict."""
    g = torch.Generator().manual_seed(0)
    for trial in range(trials):
        B, V = 3, int(torch.randint(4, 30, (1,), generator=g))
        logits = torch.randn(B, V, generator=g, dtype=torch.float64) * (0.5 + trial % 4)
        logits[1] += 3.0                                                   # rows on different scales
        min_p = float(torch.rand(1, generator=g)) * 0.5 + 0.02
        where = f"min_p={min_p:.3f}, logits {tuple(logits.shape)}"
        got = call_reader(fn, f"{where}: your function", logits.clone(), min_p)
        assert isinstance(got, torch.Tensor) and got.shape == logits.shape, \
            f"{where}: return a tensor of the logits' shape {tuple(logits.shape)}, got {getattr(got, 'shape', type(got))}"
        want = _min_p(logits, min_p)
        kept, should = got.isfinite(), want.isfinite()
        if torch.equal(kept.cpu(), should):
            if not close_to(got[kept].cpu(), logits[kept]):
                raise AssertionError(f"{where}: the kept tokens must keep their logits unchanged (return logits with "
                                     "-inf outside, not probabilities)")
            continue
        probs = logits.softmax(-1)
        slips = {
            "the threshold is min_p itself, not min_p times the most probable token's probability: min-p scales "
            "the cut with how confident the model is": probs >= min_p,
            "compared logits with min_p times the largest logit: the rule is on probabilities (in logits: "
            "logit >= largest logit + ln(min_p))": logits >= min_p * logits.amax(-1, keepdim=True),
            "the largest probability taken over the batch axis: take each row's own most probable token "
            "(amax over dim=-1)": probs >= min_p * probs.amax(0, keepdim=True),
            "compared with min_p times the row's total (1), not its most probable token": probs >= min_p * probs.sum(-1, keepdim=True),
            "kept the unlikely tokens and dropped the likely ones: keep a token when its probability is at "
            "least min_p times the largest": probs < min_p * probs.amax(-1, keepdim=True),
        }
        for message, keep in slips.items():
            if torch.equal(kept.cpu(), keep):
                raise AssertionError(f"{where}: {message}")
        raise AssertionError(f"{where}: kept {kept.sum(-1).tolist()} tokens per row, min-p keeps "
                             f"{should.sum(-1).tolist()}")
    print(f"check_min_p: correct on {trials} random cases")


def check_nats_per_char(fn) -> None:
    """Test fn(bits_per_byte, chars_per_byte) -> the loss in nats per character that a character-level model must
    reach to match bits_per_byte = bits_per_byte * ln 2 / chars_per_byte, on a few pairs. Raises AssertionError
    naming the mistake; prints a verdict."""
    ln2 = math.log(2)
    mistakes = {
        "multiplied by the characters per byte: a byte's bits are shared by chars_per_byte characters, so each "
        "character's share is bits_per_byte / chars_per_byte": lambda bpb, cpb: bpb * ln2 * cpb,
        "bits, not nats: one bit is ln 2 = 0.693 nats, so multiply by ln 2": lambda bpb, cpb: bpb / cpb,
        "divided by ln 2: bits -> nats multiplies by ln 2": lambda bpb, cpb: bpb / ln2 / cpb,
        "the characters per byte are left out: a loss per byte is not a loss per character unless every character "
        "is one byte": lambda bpb, cpb: bpb * ln2,
        "bits per byte, unchanged": lambda bpb, cpb: bpb,
    }
    grade(fn, lambda bpb, cpb: bpb * ln2 / cpb,
          {f"{bpb} bits per byte, {cpb} characters per byte": (bpb, cpb)
           for bpb, cpb in [(1.5, 0.5), (2.2, 0.8), (1.0, 1.0), (0.9, 0.25)]},
          mistakes, says="expected {want:.4g} nats per character, got {got:.4g}")
    print("check_nats_per_char: bits per byte -> nats per character, correct on 4 cases")


def _byte_bigram_bits(train_text, texts, *, alphabet=False, across=False, per_char=False, first=8.0, nats=False):
    """Bits per byte of the add-one smoothed byte-bigram model of train_text on texts (the definition of
    check_byte_bigram_bpb), with switches that make the usual slips: alphabet (the add-one over the byte values seen
    in training, not 256), across (texts scored as one text), per_char (divided by characters), first (the bits of
    a text's first byte; None: the first byte not counted at all), nats (the later bytes' costs in nats)."""
    data = list(train_text.encode())
    counts = torch.zeros(256, 256, dtype=torch.float64)
    for a, b in zip(data[:-1], data[1:], strict=True):
        counts[a, b] += 1
    size = len(set(data)) if alphabet else 256
    p = (counts + 1) / (counts.sum(1, keepdim=True) + size)
    bits_of = -(p.log() if nats else p.log2())
    bits = count = 0
    for text in (["".join(texts)] if across else texts):
        b = list(text.encode())
        bits += (first or 0.0) + sum(bits_of[x, y].item() for x, y in zip(b[:-1], b[1:], strict=True))
        count += len(b) if first is not None else len(b) - 1
    characters = sum(map(len, texts)) - (0 if first is not None else len(texts))
    return bits / (characters if per_char else count)


def check_byte_bigram_bpb(fn) -> None:
    """Test fn(train_text, texts) -> the held-out bits per byte of the add-one smoothed byte-bigram model of
    train_text (p(b | a) = (n(a b) + 1) / (n(a .) + 256) over the UTF-8 bytes; each text scored on its own, its
    first byte 8 bits) on texts, a list of strings, on three small cases. Raises AssertionError naming the
    mistake; prints a verdict."""
    cases = {
        "train 'abracadabra', texts ['abra', 'cad']": ("abracadabra", ["abra", "cad"]),
        "train 'the cat sat on the mat', texts ['a cat', 'the hat']": ("the cat sat on the mat", ["a cat", "the hat"]),
        "train 'café au lait, crème brûlée', texts ['crème', 'café noir']":
            ("café au lait, crème brûlée", ["crème", "café noir"]),
    }
    for where, (train, texts) in cases.items():
        got = number(call_reader(fn, f"{where}: your function", train, list(texts)), f"{where}: your answer")
        if not math.isfinite(got):
            raise AssertionError(f"{where}: you return {got}: a byte pair that the training text never shows gets "
                                 "probability 0, which costs infinitely many bits: add one to every count")
    ln2 = math.log(2)
    mistakes = {
        "nats, not bits: use log base 2 (or divide by ln 2)":
            [lambda train, texts: _byte_bigram_bits(train, texts) * ln2,
             lambda train, texts: _byte_bigram_bits(train, texts, nats=True)],
        "divided by the characters, not the bytes: 'é' is two bytes in UTF-8, and the model predicts bytes":
            lambda train, texts: _byte_bigram_bits(train, texts, per_char=True),
        "the texts were scored as one: each text starts afresh (its first byte costs 8 bits), no pair spans two "
        "texts": lambda train, texts: _byte_bigram_bits(train, texts, across=True),
        "the first byte of each text is left out or free: it costs 8 bits (one of 256 values) and counts as a byte":
            [lambda train, texts: _byte_bigram_bits(train, texts, first=None),
             lambda train, texts: _byte_bigram_bits(train, texts, first=0.0)],
        "the add-one smoothing is over the byte values the training text uses: it is over all 256 byte values, "
        "so every value the next byte can take gets its one":
            lambda train, texts: _byte_bigram_bits(train, texts, alphabet=True),
    }
    grade(fn, _byte_bigram_bits, {where: (train, list(texts)) for where, (train, texts) in cases.items()},
          mistakes, says="you return {got:.4f} bits per byte, expected {want:.4f}")
    print("check_byte_bigram_bpb: bits per byte of the add-one byte bigram, correct on 3 cases")


def check_temperature_for(fn) -> None:
    """Test fn(logits (V,), q) -> a temperature tau > 0 at which the most probable token of softmax(logits / tau)
    has probability q (to 1e-5), for 1/V < q < 1, on random logits. Raises AssertionError naming the mistake;
    prints a verdict."""
    g = torch.Generator().manual_seed(0)
    for V, q in ((5, 0.9), (50, 0.5), (12, 0.2), (1000, 0.05), (8, 0.99)):
        logits = torch.randn(V, generator=g, dtype=torch.float64) * 2
        where = f"logits ({V},), q={q}"
        tau = number(call_reader(fn, f"{where}: your function", logits.clone(), q), f"{where}: your temperature")
        assert math.isfinite(tau) and tau > 0, f"{where}: a temperature must be a positive number, got {tau:g}"
        top = (logits / tau).softmax(-1).max().item()
        if abs(top - q) <= 1e-5:
            continue
        if abs((logits * tau).softmax(-1).max().item() - q) <= 1e-5:
            raise AssertionError(f"{where}: your temperature {tau:.4g} works when it multiplies the logits; "
                                 "sample_next divides them by the temperature (return its reciprocal)")
        side = "higher" if top > q else "lower"
        raise AssertionError(f"{where}: at your temperature {tau:.4g} the most probable token has probability "
                             f"{top:.6f}, not {q} (to 1e-5): the answer lies at a {side} temperature")
    print("check_temperature_for: the most probable token gets probability q, on 5 cases")


def check_kv_cache_bytes(fn) -> None:
    """Test fn(L, d, h, t, dtype_bytes, batch) -> bytes of the KV cache of a decoder with L layers of width d
    and h heads after t tokens: 2 (keys and values) * L * d * t * dtype_bytes * batch, on GPT-2 small and other
    sizes. Raises AssertionError naming the mistake; prints a verdict."""
    cases = [(3, 96, 6, 50, 4, 5), (5, 120, 10, 7, 8, 3), (12, 768, 12, 1024, 4, 1), (12, 768, 12, 1024, 2, 8)]
    wrong = None
    for L, d, h, t, nbytes, batch in cases:
        got = number(fn(L, d, h, t, nbytes, batch), f"fn{(L, d, h, t, nbytes, batch)}")
        want = 2 * L * d * t * nbytes * batch
        if close_to(got, want, scale=1e-5):                              # a count: to 1e-9
            continue
        mistakes = {
            "forgot the values (factor 2): every layer caches a key and a value vector per token": want / 2,
            "counted heads twice: h heads of d_k = d / h numbers are d per token, not h * d": want * h,
            "counted one head only: h heads of d_k = d / h numbers each, d per token": want / h,
            "bits, not bytes: dtype_bytes is already in bytes (4 for float32): do not multiply by 8": want * 8,
            "divided by 8: dtype_bytes is already in bytes": want / 8,
            "numbers, not bytes: multiply by dtype_bytes": want / nbytes,
            "forgot the batch: every sequence keeps its own cache": want / batch,
            "forgot the layers: every layer keeps its own keys and values": want / L,
            "cached the queries too (factor 3): only keys and values are kept, a query is used once": want * 1.5,
        }
        named = [m for m, value in mistakes.items() if close_to(got, value, scale=1e-5)]
        case = f"L={L}, d={d}, h={h}, t={t}, dtype_bytes={nbytes}, batch={batch}"
        if len(named) == 1:
            raise AssertionError(f"{case}: your {got:,.0f} bytes: {named[0]}")
        wrong = wrong or f"{case}: expected {want:,} bytes (2 L d t dtype_bytes batch), got {got:,.0f}"
    if wrong:
        raise AssertionError(wrong)
    print(f"check_kv_cache_bytes: correct; GPT-2 small after 1,024 tokens in float32: {2 * 12 * 768 * 1024 * 4:,} bytes")


def _lm_case(dtype, seed):
    """A small random GPT (dropout 0, eval mode) and a batch (windows (4, 13),) of random token ids."""
    g = torch.Generator().manual_seed(seed)
    torch_state = torch.get_rng_state()
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=50, max_len=16, d_model=32, num_layers=2, num_heads=2, d_ff=64,
                          dropout=0.0)).to(dtype).eval()
    with torch.no_grad():
        model.token.weight.mul_(8)                                 # sharper predictions than a fresh model's
    torch.set_rng_state(torch_state)                               # the caller's generator as it was
    return model, (torch.randint(0, 50, (4, 13), generator=g),)


def check_lm_loss(fn, dtype=torch.float64, seed: int = 0) -> None:
    """Test fn(model, batch) -> the mean next-token cross-entropy in nats, as a tensor backward() can use, for
    batch = (windows,) with windows (B, T + 1) token ids (section 11.5's lm_loss is the reference), on a small
    random GPT. Names the exercise's bug by its symptom only (a loss far too low), the shift the wrong way, a sum or a mean over windows instead of
    tokens, bits instead of nats, and the last position scored alone."""
    import torch.nn.functional as F

    def ce(logits, targets, reduction="mean"):
        return F.cross_entropy(logits.flatten(0, 1).double(), targets.flatten(), reduction=reduction).item()

    def slips(model, batch):
        x = batch[0]
        return {
            "far below the next-token cross-entropy of this small random model (its embeddings sharpened): a loss "
            "too good to be true "
            "(which token is each position scored on?)": ce(model(x), x),
            "shifted the wrong way: every position is scored on the token before it": ce(model(x[:, 1:]), x[:, :-1]),
            "a sum over the tokens, not their mean": ce(model(x[:, :-1]), x[:, 1:], "sum"),
            "divided by the number of windows, not of tokens": ce(model(x[:, :-1]), x[:, 1:], "sum") / len(x),
            "bits, not nats: cross_entropy is in nats; leave out the division by log 2":
                ce(model(x[:, :-1]), x[:, 1:]) / math.log(2),
            "only the last position is scored: every position predicts its next token, all in one pass":
                ce(model(x[:, :-1])[:, -1:], x[:, -1:]),
        }
    model, batch = _lm_case(dtype, seed)
    loss = call_reader(fn, "your loss", model, batch)
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.requires_grad):
        raise AssertionError(f"return the loss as a one-element tensor that backward() can use (computed from the "
                             f"model's logits), got {loss!r}"[:300])
    reference, (x,) = _lm_case(torch.float64, seed)
    want = ce(reference(x[:, :-1]), x[:, 1:])
    grade(lambda: call_reader(fn, "your loss", *_lm_case(dtype, seed)).detach(), lambda: want, {"": ()}, slips(reference, (x,)), name="your loss",
          against="the mean next-token cross-entropy", says="you return {got:.4f} nats, expected {want:.4f}")
    print("check_lm_loss: the mean cross-entropy of every next token, in nats")

