"""The graders of Chapter 11's exercises (decoder-only Transformers), imported by the chapter's exercise cells.

Hand-written, not exported from the chapter: a grader's reference and named slips are the answers, and Colab shows
every cell of a chapter, so their code stays out of the chapters."""

__all__ = ['check_top_p', 'check_bits_per_byte', 'check_temperature', 'check_kv_cache_bytes', 'check_lm_loss']

import math

import torch

from .grading import call_reader, close_to, grade, number
from ..gpt import GPT, GPTConfig


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


def check_temperature(fn) -> None:
    """Test fn(logits (B, V), temperature) -> probabilities (B, V) = softmax(logits / temperature) per row, and
    all the mass on the argmax at temperature 0 (greedy), on random logits (some -inf, as after top-k).
    Raises AssertionError naming the mistake; prints a verdict."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, generator=g, dtype=torch.float64) * 2                # (B, V)
    logits[2, 5:] = float("-inf")                                                     # two filtered tokens
    for tau in (0.5, 2.0, 1.0, 0.0):
        got = fn(logits.clone(), tau)
        assert isinstance(got, torch.Tensor) and got.shape == logits.shape, (
            f"temperature {tau}: return probabilities of the logits' shape {tuple(logits.shape)}, got "
            f"{getattr(got, 'shape', type(got).__name__)}")
        if tau == 0:
            want = torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).to(logits.dtype)
        else:
            want = (logits / tau).softmax(-1)
        if close_to(got, want):
            continue
        sums = got.double().sum(-1)
        if got.isnan().any():
            raise AssertionError(f"temperature {tau}: NaN in your probabilities" + (
                ": temperature 0 is greedy decoding, all the mass on the most probable token (one-hot at the "
                "argmax), not logits / 0" if tau == 0 else ""))
        if (got < 0).any():
            raise AssertionError(f"temperature {tau}: negative values: return probabilities, not log-probabilities")
        if tau and close_to(got, logits.softmax(-1) / tau):
            raise AssertionError(f"temperature {tau}: your rows sum to {sums.mean():.3g}: you divided the "
                                 "probabilities by the temperature; divide the logits, then take the softmax")
        if tau and tau != 1 and close_to(got, logits.softmax(-1)):
            raise AssertionError(f"temperature {tau} changes nothing in your distribution: dividing the "
                                 "probabilities by it and renormalising cancels out; divide the logits before the softmax")
        if tau and close_to(got, (logits * tau).softmax(-1)):
            raise AssertionError(f"temperature {tau}: you multiplied the logits by the temperature; divide them "
                                 "(a temperature below 1 must sharpen the distribution)")
        if tau and close_to(got, (logits / tau).softmax(0)):
            raise AssertionError(f"temperature {tau}: your rows sum to {[round(s, 3) for s in sums.tolist()]}: softmax over the batch "
                                 "axis; take it over the vocabulary (dim=-1)")
        if not close_to(sums, torch.ones_like(sums)):
            raise AssertionError(f"temperature {tau}: your rows sum to {[round(s, 3) for s in sums.tolist()]}, not 1")
        raise AssertionError(f"temperature {tau}: wrong probabilities (max difference "
                             f"{(got.double() - want).abs().max().item():.2g})")
    print("check_temperature: softmax(logits / temperature), and greedy at temperature 0")


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
    random GPT. Names a position scored on a token it can already see, the shift the wrong way, a sum or a mean over windows instead of
    tokens, bits instead of nats, and the last position scored alone."""
    import torch.nn.functional as F

    def ce(logits, targets, reduction="mean"):
        return F.cross_entropy(logits.flatten(0, 1).double(), targets.flatten(), reduction=reduction).item()

    def slips(model, batch):
        x = batch[0]
        return {
            "position t is scored on a token it can already see: the loss falls towards 0 while the model learns "
            "nothing of the next token": ce(model(x), x),
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
