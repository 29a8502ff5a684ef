"""Chapter 11's graders (transformer_lib.exercises.sampling): the reference answers pass, float32 answers pass,
and typical mistakes are caught with a message that names them."""

import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from helpers import Call, grader_row

from transformer_lib.exercises.sampling import (
    check_bits_per_byte,
    check_byte_bigram_bpb,
    check_kv_cache_bytes,
    check_lm_loss,
    check_min_p,
    check_nats_per_char,
    check_temperature_for,
    check_top_p,
)
from transformer_lib.gpt import lm_loss
from transformer_lib.sampling import filter_logits

# --- exercise 1: nucleus sampling


def top_p(logits, p):
    return filter_logits(logits, top_p=p)


def top_p32(logits, p):
    return filter_logits(logits.float(), top_p=p)


def crossing_token_dropped(logits, p):
    probs, order = logits.softmax(-1).sort(dim=-1, descending=True)
    outside = probs.cumsum(-1) > p
    return logits.masked_fill(outside.scatter(-1, order, outside), float("-inf"))


def order_not_mapped_back(logits, p):
    probs, order = logits.softmax(-1).sort(dim=-1, descending=True)
    outside = probs.cumsum(-1) - probs >= p
    return logits.masked_fill(outside, float("-inf"))                     # sorted order used as vocabulary order


def least_probable_first(logits, p):
    probs, order = logits.softmax(-1).sort(dim=-1)
    outside = probs.cumsum(-1) - probs >= p
    return logits.masked_fill(outside.scatter(-1, order, outside), float("-inf"))


# --- exercise 2: bits per byte


def bits_per_byte(nats_per_token, tokens_per_byte):
    return nats_per_token * tokens_per_byte / math.log(2)


def bits_per_byte32(nats_per_token, tokens_per_byte):
    return torch.tensor(nats_per_token, dtype=torch.float32) * tokens_per_byte / math.log(2)


def nats_not_bits(nats_per_token, tokens_per_byte):
    return nats_per_token * tokens_per_byte


def per_token_not_per_byte(nats_per_token, tokens_per_byte):
    return nats_per_token / math.log(2)


def divided_by_tokens_per_byte(nats_per_token, tokens_per_byte):
    return nats_per_token / tokens_per_byte / math.log(2)


def times_ln2(nats_per_token, tokens_per_byte):
    return nats_per_token * tokens_per_byte * math.log(2)


def log10(nats_per_token, tokens_per_byte):
    return nats_per_token * tokens_per_byte / math.log(10)


def test_bits_per_byte_asks_for_a_number():
    with pytest.raises(AssertionError, match="must be one number"):
        check_bits_per_byte(lambda loss, per_byte: None)


# --- exercise 1: min-p sampling


def min_p(logits, m):
    probs = logits.softmax(-1)
    return logits.masked_fill(probs < m * probs.amax(-1, keepdim=True), float("-inf"))


def min_p32(logits, m):
    return min_p(logits.float(), m)


def min_p_in_logits(logits, m):                                   # the same rule: logit >= max logit + ln(m)
    return logits.masked_fill(logits < logits.amax(-1, keepdim=True) + math.log(m), float("-inf"))


def absolute_threshold(logits, m):
    return logits.masked_fill(logits.softmax(-1) < m, float("-inf"))


def rule_on_logits(logits, m):
    return logits.masked_fill(logits < m * logits.amax(-1, keepdim=True), float("-inf"))


def max_over_batch(logits, m):
    probs = logits.softmax(-1)
    return logits.masked_fill(probs < m * probs.amax(0, keepdim=True), float("-inf"))


def turned_around(logits, m):
    probs = logits.softmax(-1)
    return logits.masked_fill(probs >= m * probs.amax(-1, keepdim=True), float("-inf"))


def returns_probabilities(logits, m):
    probs = logits.softmax(-1)
    return probs.masked_fill(probs < m * probs.amax(-1, keepdim=True), float("-inf"))


# --- exercise 2: a byte-bigram model's bits per byte


def byte_bigram(train_text, texts, dtype=torch.float64, per_char=False, joined=False, first=8.0, seen_only=False,
                log=torch.log2):
    data = torch.tensor(list(train_text.encode()))
    counts = torch.bincount(data[:-1] * 256 + data[1:], minlength=256 * 256).view(256, 256).to(dtype)
    size = len(set(data.tolist())) if seen_only else 256
    bits_of = -log((counts + 1) / (counts.sum(1, keepdim=True) + size))
    bits = total = 0
    for text in (["".join(texts)] if joined else texts):
        b = torch.tensor(list(text.encode()))
        bits += first + bits_of[b[:-1], b[1:]].sum()
        total += len(b)
    return (bits / (sum(map(len, texts)) if per_char else total)).item()


def byte_bigram_dict(train_text, texts):                           # another way: dictionaries, pure Python
    data = train_text.encode()
    pairs, starts = {}, {}
    for a, b in zip(data[:-1], data[1:], strict=True):
        pairs[a, b] = pairs.get((a, b), 0) + 1
        starts[a] = starts.get(a, 0) + 1
    bits = total = 0
    for text in texts:
        b = text.encode()
        bits += 8 + sum(-math.log2((pairs.get((x, y), 0) + 1) / (starts.get(x, 0) + 256))
                        for x, y in zip(b[:-1], b[1:], strict=True))
        total += len(b)
    return bits / total


def byte_bigram_unsmoothed(train_text, texts):
    data = torch.tensor(list(train_text.encode()))
    counts = torch.bincount(data[:-1] * 256 + data[1:], minlength=256 * 256).view(256, 256).double()
    bits_of = -(counts / counts.sum(1, keepdim=True)).log2()
    return sum(8 + bits_of[b[:-1], b[1:]].sum().item() for b in (torch.tensor(list(t.encode())) for t in texts)) \
        / sum(len(t.encode()) for t in texts)


def test_byte_bigram_asks_for_a_number():
    with pytest.raises(AssertionError, match="must be one number"):
        check_byte_bigram_bpb(lambda train_text, texts: None)


# --- exercise 2: nats per character


def nats_per_char(bpb, cpb):
    return bpb * math.log(2) / cpb


def nats_per_char32(bpb, cpb):
    return torch.tensor(bpb, dtype=torch.float32) * math.log(2) / cpb


def times_chars_per_byte(bpb, cpb):
    return bpb * math.log(2) * cpb


def bits_left(bpb, cpb):
    return bpb / cpb


def divided_by_ln2(bpb, cpb):
    return bpb / math.log(2) / cpb


def chars_ignored(bpb, cpb):
    return bpb * math.log(2)


# --- exercise 3: temperature by target


def temperature_for(logits, q):
    low, high = math.log(1e-4), math.log(1e4)
    for _ in range(100):
        mid = (low + high) / 2
        if (logits / math.exp(mid)).softmax(-1).max() > q:
            low = mid
        else:
            high = mid
    return math.exp((low + high) / 2)


def temperature_for32(logits, q):
    return torch.tensor(temperature_for(logits.float(), q), dtype=torch.float32)


def reciprocal(logits, q):
    return 1 / temperature_for(logits, q)


def search_turned_around(logits, q):                          # raises tau where it should lower it
    low, high = math.log(1e-4), math.log(1e4)
    for _ in range(100):
        mid = (low + high) / 2
        if (logits / math.exp(mid)).softmax(-1).max() > q:
            high = mid
        else:
            low = mid
    return math.exp((low + high) / 2)


def too_few_steps(logits, q):
    low, high = math.log(1e-4), math.log(1e4)
    for _ in range(5):
        mid = (low + high) / 2
        if (logits / math.exp(mid)).softmax(-1).max() > q:
            low = mid
        else:
            high = mid
    return math.exp((low + high) / 2)


def test_temperature_for_asks_for_a_positive_number():
    with pytest.raises(AssertionError, match="positive number"):
        check_temperature_for(lambda logits, q: -1.0)
    with pytest.raises(AssertionError, match="must be one number"):
        check_temperature_for(lambda logits, q: None)


# --- exercise 4: memory of the KV cache


def kv_cache_bytes(L, d, h, t, dtype_bytes, batch):
    return 2 * L * d * t * dtype_bytes * batch


def kv_cache_bytes_per_head(L, d, h, t, dtype_bytes, batch):       # (B, h, t, d_k) keys and values: a float
    return 2 * L * batch * h * t * (d / h) * dtype_bytes


def keys_only(L, d, h, t, dtype_bytes, batch):
    return L * d * t * dtype_bytes * batch


def heads_twice(L, d, h, t, dtype_bytes, batch):
    return 2 * L * h * d * t * dtype_bytes * batch


def in_bits(L, d, h, t, dtype_bytes, batch):
    return 2 * L * d * t * 8 * dtype_bytes * batch


def one_head(L, d, h, t, dtype_bytes, batch):
    return 2 * L * (d // h) * t * dtype_bytes * batch


def no_batch(L, d, h, t, dtype_bytes, batch):
    return 2 * L * d * t * dtype_bytes


def numbers_not_bytes(L, d, h, t, dtype_bytes, batch):
    return 2 * L * d * t * batch


def queries_too(L, d, h, t, dtype_bytes, batch):
    return 3 * L * d * t * dtype_bytes * batch


def test_kv_cache_bytes_falls_back_to_the_numbers():
    with pytest.raises(AssertionError, match=r"expected 576,000 bytes"):
        check_kv_cache_bytes(lambda L, d, h, t, dtype_bytes, batch: 1)


# --- exercise 4 (bug hunt): the next-token loss


def ce(logits, targets, reduction="mean"):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction)


def lm_loss_from_whole_window(model, batch):           # causal: the logits of x[:, :-1] are those of x, cut
    x = batch[0]
    return ce(model(x)[:, :-1], x[:, 1:])


def not_shifted(model, batch):                          # the exercise's bug
    return ce(model(batch[0]), batch[0])


def shifted_the_wrong_way(model, batch):
    return ce(model(batch[0][:, 1:]), batch[0][:, :-1])


def summed(model, batch):
    return ce(model(batch[0][:, :-1]), batch[0][:, 1:], "sum")


def per_window(model, batch):
    return summed(model, batch) / len(batch[0])


def loss_in_bits(model, batch):
    return lm_loss(model, batch) / math.log(2)


def last_position_only(model, batch):
    return ce(model(batch[0][:, :-1])[:, -1:], batch[0][:, -1:])


def a_python_float(model, batch):
    return lm_loss(model, batch).item()


def test_check_lm_loss_leaves_the_callers_generator_alone():
    torch.manual_seed(5)
    want = torch.rand(3)
    torch.manual_seed(5)
    check_lm_loss(lm_loss)
    assert torch.equal(torch.rand(3), want)


GRADERS = [
    grader_row(check_top_p, correct=[top_p, top_p32], mistakes=[
        (crossing_token_dropped, "makes the sum reach p must be kept"),
        (order_not_mapped_back, "wrong tokens are kept"),
        (least_probable_first, "least probable token is kept"),
    ]),
    grader_row(check_bits_per_byte, correct=[bits_per_byte, bits_per_byte32], mistakes=[
        (nats_not_bits, "nats, not bits"),
        (per_token_not_per_byte, "per token, not per byte"),
        (divided_by_tokens_per_byte, "divided by the tokens per byte"),
        (times_ln2, "multiplied by ln 2"),
        (log10, "log base 10"),
    ]),
    grader_row(check_min_p, correct=[min_p, min_p32, min_p_in_logits], mistakes=[
        (absolute_threshold, "the threshold is min_p itself"),
        (rule_on_logits, "compared logits with min_p times the largest logit"),
        (max_over_batch, "over the batch axis"),
        (turned_around, "kept the unlikely tokens"),
        (returns_probabilities, "keep their logits unchanged"),
    ], prints="check_min_p: correct"),
    grader_row(check_nats_per_char, correct=[nats_per_char, nats_per_char32], mistakes=[
        (times_chars_per_byte, "multiplied by the characters per byte"),
        (bits_left, "bits, not nats"),
        (divided_by_ln2, "divided by ln 2"),
        (chars_ignored, "characters per byte are left out"),
    ], prints="check_nats_per_char: bits per byte"),
    grader_row(check_byte_bigram_bpb, correct=[byte_bigram, byte_bigram_dict, partial(byte_bigram, dtype=torch.float32)],
               mistakes=[
        (partial(byte_bigram, log=torch.log), "nats, not bits"),
        (partial(byte_bigram, per_char=True), "divided by the characters, not the bytes"),
        (partial(byte_bigram, joined=True), "the texts were scored as one"),
        (partial(byte_bigram, first=0.0), "first byte of each text is left out or free"),
        (partial(byte_bigram, seen_only=True), "over the byte values the training text uses"),
        (byte_bigram_unsmoothed, "add one to every count"),
    ], prints="check_byte_bigram_bpb: bits per byte of the add-one byte bigram"),
    grader_row(check_temperature_for, correct=[temperature_for, temperature_for32], mistakes=[
        (reciprocal, "return its reciprocal"),
        (search_turned_around, "the answer lies at a"),
        (too_few_steps, r"not 0\.9 \(to 1e-5\)"),
    ], prints="check_temperature_for: the most probable"),
    grader_row(check_kv_cache_bytes, correct=[kv_cache_bytes, kv_cache_bytes_per_head], mistakes=[
        (keys_only, r"forgot the values \(factor 2\)"),
        (heads_twice, "counted heads twice"),
        (in_bits, "bits, not bytes"),
        (one_head, "one head only"),
        (no_batch, "forgot the batch"),
        (numbers_not_bytes, "numbers, not bytes"),
        (queries_too, "queries"),
    ], prints='75,497,472'),
    grader_row(check_lm_loss, correct=[lm_loss, lm_loss_from_whole_window, Call(lm_loss, dtype=torch.float32)],
               mistakes=[
        (not_shifted, "a loss too good to be true"),
        (Call(not_shifted, dtype=torch.float32), "a loss too good to be true"),
        (shifted_the_wrong_way, "shifted the wrong way"),
        (summed, "a sum over the tokens"),
        (per_window, "number of windows"),
        (loss_in_bits, "bits, not nats"),
        (last_position_only, "only the last position"),
        (a_python_float, "tensor that backward"),
    ], prints="check_lm_loss: the mean"),
]
