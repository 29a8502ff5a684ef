"""Chapter 16's graders (transformer_lib.exercises.assistant): the reference answers pass, and typical mistakes are
caught with a message that names them."""

import codecs
import collections
import time
from itertools import pairwise

import pytest
import torch
from helpers import grader_row

from transformer_lib.assistant import merge_pair
from transformer_lib.bert import IGNORE_INDEX
from transformer_lib.exercises.assistant import (
    check_bpe_merges,
    check_dpo_loss,
    check_last_hidden,
    check_last_turn_labels,
    check_stream_decode,
)

# --- exercise 1: decoding a stream of tokens


def incremental(tok, ids):
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    shown = [utf8.decode(tok.token_bytes(i)) for i in ids]
    if shown:
        shown[-1] += utf8.decode(b"", final=True)
    return shown


def by_lead_bytes(tok, ids):                           # the bookkeeping done by hand: hold back an unfinished tail
    shown, pending = [], b""
    for i in ids:
        pending += tok.token_bytes(i)
        cut = len(pending)
        for back in range(1, min(4, len(pending)) + 1):
            byte = pending[-back]
            if byte >= 0xC0:                           # a lead byte: its character needs 2, 3 or 4 bytes
                need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
                cut = len(pending) - back if back < need else len(pending)
                break
            if byte < 0x80:
                break
        shown.append(pending[:cut].decode("utf-8", errors="replace"))
        pending = pending[cut:]
    if pending:
        shown[-1] += pending.decode("utf-8", errors="replace")
    return shown


def each_token_alone(tok, ids):
    return [tok.decode([i]) for i in ids]


def whole_text_so_far(tok, ids):
    return [tok.decode(ids[:k + 1]) for k in range(len(ids))]


def all_at_the_end(tok, ids):
    return [""] * (len(ids) - 1) + [tok.decode(ids)] if ids else []


def bytes_dropped(tok, ids):
    return [tok.token_bytes(i).decode("utf-8", errors="ignore") for i in ids]


def differences_of_prefixes(tok, ids):                # new text = decode(prefix) minus what was shown: '�' leaks
    shown, before = [], ""
    for k in range(len(ids)):
        now = tok.decode(ids[:k + 1])
        shown.append(now[len(before):])
        before = now
    return shown


def held_until_all_decodes(tok, ids):                  # a token waits whole while any byte is unfinished
    shown, pending = [], b""
    for i in ids:
        pending += tok.token_bytes(i)
        try:
            shown.append(pending.decode("utf-8"))
            pending = b""
        except UnicodeDecodeError:
            shown.append("")
    if shown and pending:
        shown[-1] += pending.decode("utf-8", errors="replace")
    return shown


def no_flush_at_the_end(tok, ids):                     # the unfinished bytes of the last character are lost
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    return [utf8.decode(tok.token_bytes(i)) for i in ids]


def test_streams_hold_a_token_with_complete_characters_then_a_cut_one():
    from transformer_lib.exercises.assistant import _stream_tokenizer, _streams
    tok = _stream_tokenizer()
    assert any(incremental(tok, ids)[:k + 1] != held_until_all_decodes(tok, ids)[:k + 1] and incremental(tok, ids)[k]
               for _, ids in _streams(tok) for k in range(len(ids)))
    assert any(tok.token_bytes(i) == b"na\xc3" for _, ids in _streams(tok) for i in ids)


def one_string(tok, ids):
    return tok.decode(ids)


def test_stream_grader_wants_one_string_per_id():
    with pytest.raises(AssertionError, match="return a list of str"):
        check_stream_decode(one_string)
    with pytest.raises(AssertionError, match="one str per token id"):
        check_stream_decode(lambda tok, ids: incremental(tok, ids) + [""])


# --- exercise 2: merges by hand


def merges(word_counts, num_merges):
    vocab = sorted({c for word in word_counts for c in word})
    ids = {t: i for i, t in enumerate(vocab)}
    words = [([ids[c] for c in word], n) for word, n in word_counts.items()]
    out = []
    for _ in range(num_merges):
        counts = collections.Counter()
        for seq, n in words:
            for pair in pairwise(seq):
                counts[pair] += n
        if not counts:
            break
        a, b = max(counts, key=lambda p: (counts[p], -p[0], -p[1]))
        token = vocab[a] + vocab[b]
        if token not in ids:
            ids[token] = len(vocab)
            vocab.append(token)
        out.append((vocab[a], vocab[b]))
        words = [(merge_pair(seq, (a, b), ids[token]), n) for seq, n in words]
    return out


def merges_as_lists(word_counts, num_merges):          # [left, right] lists are pairs too
    return [list(m) for m in merges(word_counts, num_merges)]


def with_library(word_counts, num_merges):             # the chapter's trainer on the words as byte pieces
    from transformer_lib.assistant import BYTE_CHARS, train_byte_bpe
    text = "\n".join(w for w, n in word_counts.items() for _ in range(n))     # newline: a piece of its own
    tok = train_byte_bpe([text], 256 + num_merges, min_frequency=1, special_tokens=())
    decode = {c: chr(b) for b, c in enumerate(BYTE_CHARS)}
    return [("".join(decode[c] for c in tok.vocab[a]), "".join(decode[c] for c in tok.vocab[b]))
            for a, b in tok.merges if "Ċ" not in tok.vocab[a] + tok.vocab[b]][:num_merges]


def unweighted(word_counts, num_merges):
    return merges({w: 1 for w in word_counts}, num_merges)


def _with_key(word_counts, num_merges, key, count_pairs=None):
    vocab = sorted({c for word in word_counts for c in word})
    ids = {t: i for i, t in enumerate(vocab)}
    words = [([ids[c] for c in word], n) for word, n in word_counts.items()]
    out = []
    for _ in range(num_merges):
        counts = collections.Counter()
        for seq, n in words:
            if count_pairs:
                count_pairs(counts, seq, n)
            else:
                for pair in pairwise(seq):
                    counts[pair] += n
        if not counts:
            break
        a, b = max(counts, key=lambda p: key(counts, vocab, p))
        token = vocab[a] + vocab[b]
        if token not in ids:
            ids[token] = len(vocab)
            vocab.append(token)
        out.append((vocab[a], vocab[b]))
        words = [(merge_pair(seq, (a, b), ids[token]), n) for seq, n in words]
    return out


def ties_to_largest_ids(word_counts, num_merges):
    return _with_key(word_counts, num_merges, lambda counts, vocab, p: (counts[p], p[0], p[1]))


def ties_alphabetical(word_counts, num_merges):
    return _with_key(word_counts, num_merges,
                     lambda counts, vocab, p: (counts[p], [-ord(c) for c in vocab[p[0]] + "\0" + vocab[p[1]]]))


def overlap_counted_once(word_counts, num_merges):
    def count(counts, seq, n):
        i = 0
        while i < len(seq) - 1:
            counts[seq[i], seq[i + 1]] += n
            i += 2 if i + 2 < len(seq) and seq[i] == seq[i + 1] == seq[i + 2] else 1   # skip into aaa's run
    return _with_key(word_counts, num_merges, lambda counts, vocab, p: (counts[p], -p[0], -p[1]), count)


def ties_first_seen(word_counts, num_merges):         # max over a Counter keeps the first pair it meets
    return _with_key(word_counts, num_merges, lambda counts, vocab, p: (counts[p],))


def as_ids(word_counts, num_merges):
    return [(0, 1)] * num_merges


def test_merges_grader_wants_pairs_of_strings():
    with pytest.raises(AssertionError, match="pairs of str"):
        check_bpe_merges(as_ids)
    with pytest.raises(AssertionError, match="stop when no pair is left"):
        check_bpe_merges(lambda word_counts, k: merges(word_counts, k) + [("x", "x")] * (k - len(merges(word_counts, k))))


# --- exercise 3: a loss on the last answer only


def last_turn(template, conversation):
    ids, _ = template.render(conversation)
    start = len(template.render(conversation[:-1])[0]) if len(conversation) > 1 else 0   # the last <|assistant|>
    return ids[:-1], [ids[t + 1] if t + 1 > start else IGNORE_INDEX for t in range(len(ids) - 1)]


def last_turn_as_tensors(template, conversation):     # 1-D tensors are accepted too
    import torch
    inputs, labels = last_turn(template, conversation)
    return torch.tensor(inputs), torch.tensor(labels)


def last_turn_by_roles(template, conversation):        # the bookkeeping from the role tokens: after the last
    ids, _ = template.render(conversation)            # <|assistant|>, everything is the last answer
    start = max(i for i, x in enumerate(ids) if x == template.assistant_id)
    return ids[:-1], [x if t + 1 > start else IGNORE_INDEX for t, x in enumerate(ids[1:])]


def last_turn_unshifted(template, conversation):
    ids, _ = template.render(conversation)
    start = len(template.render(conversation[:-1])[0]) if len(conversation) > 1 else 0
    return ids[:-1], [ids[t] if t > start else IGNORE_INDEX for t in range(len(ids) - 1)]


def last_turn_without_end(template, conversation):
    inputs, labels = last_turn(template, conversation)
    return inputs, labels[:-1] + [IGNORE_INDEX]


def last_turn_with_role(template, conversation):
    ids, _ = template.render(conversation)
    start = len(template.render(conversation[:-1])[0]) if len(conversation) > 1 else 0
    return ids[:-1], [ids[t + 1] if t + 1 >= start else IGNORE_INDEX for t in range(len(ids) - 1)]


def every_assistant_turn(template, conversation):      # what render's trained flags give
    ids, trained = template.render(conversation)
    return ids[:-1], [i if k else IGNORE_INDEX for i, k in zip(ids[1:], trained[1:], strict=True)]


def every_token(template, conversation):
    ids, _ = template.render(conversation)
    return ids[:-1], ids[1:]


def whole_ids(template, conversation):                 # inputs and labels of len(ids): one too many
    ids, _ = template.render(conversation)
    return ids, ids


def labels_only(template, conversation):
    return last_turn(template, conversation)[1]


def test_last_turn_grader_wants_a_pair_of_the_right_length():
    with pytest.raises(AssertionError, match="return a pair"):
        check_last_turn_labels(labels_only)
    with pytest.raises(AssertionError, match="len\\(ids\\) - 1"):
        check_last_turn_labels(whole_ids)


# --- exercise 4: the DPO loss from log-probabilities


def dpo(policy, reference, mask, beta):
    log_ratio = ((policy - reference) * mask).sum(-1)                  # per answer: log pi - log pi_ref, summed
    B = len(log_ratio) // 2
    return -torch.nn.functional.logsigmoid(beta * (log_ratio[:B] - log_ratio[B:])).mean()


def dpo_by_rows(policy, reference, mask, beta):                        # one pair at a time, with where() and log1p
    B, total = len(policy) // 2, 0.0
    for b in range(B):
        s = [torch.where(mask[r], x[r], 0).sum() for r in (b, b + B) for x in (policy, reference)]
        total = total + torch.log1p(torch.exp(-beta * ((s[0] - s[1]) - (s[2] - s[3]))))
    return total / B


def dpo_variant(change):
    def loss(policy, reference, mask, beta):
        m = torch.ones_like(mask) if change == "all" else mask
        count = m.sum(-1) if change == "mean" else 1
        pol, ref = (policy * m).sum(-1) / count, (reference * m).sum(-1) / count
        B = len(pol) // 2
        w, lo = (pol[:B], pol[B:]) if change == "drop_ref" else (pol[:B] - ref[:B], pol[B:] - ref[B:])
        if change == "ref_plus":
            w, lo = pol[:B] + ref[:B], pol[B:] + ref[B:]
        if change == "swap":
            w, lo = lo, w
        inner = (w - lo) / beta if change == "divide" else (w - lo) if change in ("nobeta", "outside") else beta * (w - lo)
        out = -torch.nn.functional.logsigmoid(inner)
        out = out.sum() if change == "batch_sum" else out.mean()
        return beta * out if change == "outside" else -out if change == "plus" else out
    return loss


def test_dpo_grader_wants_a_scalar_tensor():
    with pytest.raises(AssertionError, match="scalar float tensor"):
        check_dpo_loss(lambda p, r, m, beta: float(dpo(p, r, m, beta)))
    with pytest.raises(AssertionError, match="scalar float tensor"):
        check_dpo_loss(lambda p, r, m, beta: -torch.nn.functional.logsigmoid(beta * (p - r).sum(-1)))


def test_graders_are_fast():
    start = time.perf_counter()
    check_stream_decode(incremental)
    check_bpe_merges(merges)
    check_last_turn_labels(last_turn)
    check_dpo_loss(dpo)
    check_last_hidden(last_by_positions)
    assert time.perf_counter() - start < 2


# --- exercise 5: the last real token's hidden state


def last_by_positions(hidden, keep):
    positions = torch.arange(keep.shape[1])
    return hidden[torch.arange(hidden.shape[0]), (keep * positions).argmax(-1)]


def last_by_flip(hidden, keep):                        # the first True of the reversed mask, counted from the end
    T = keep.shape[1]
    return hidden[torch.arange(hidden.shape[0]), T - 1 - keep.flip(-1).int().argmax(-1)]


def last_in_float32(hidden, keep):
    return last_by_positions(hidden.float(), keep)


def last_by_loop(hidden, keep):
    return torch.stack([hidden[b, int(keep[b].nonzero().max())] for b in range(len(keep))])


def position_minus_one(hidden, keep):
    return hidden[:, -1]


def count_minus_one(hidden, keep):
    return hidden[torch.arange(hidden.shape[0]), keep.sum(-1) - 1]


def one_past(hidden, keep):
    return hidden[torch.arange(hidden.shape[0]), ((keep * torch.arange(keep.shape[1])).argmax(-1) + 1).clamp(max=keep.shape[1] - 1)]


def one_before(hidden, keep):
    return hidden[torch.arange(hidden.shape[0]), ((keep * torch.arange(keep.shape[1])).argmax(-1) - 1).clamp(min=0)]


def mean_of_real(hidden, keep):
    return (hidden * keep[..., None]).sum(1) / keep.sum(-1, keepdim=True)


def count_unclamped(hidden, keep):                     # the reader's off-by-one crashes on a full row
    return hidden[torch.arange(hidden.shape[0]), keep.sum(-1)]


def test_last_hidden_grader_names_a_crash_past_the_end():
    with pytest.raises(AssertionError, match="one past T - 1"):
        check_last_hidden(count_unclamped)


def test_last_hidden_grader_wants_one_state_per_row():
    with pytest.raises(AssertionError, match=r"expected \(B, d\) = "):
        check_last_hidden(lambda hidden, keep: hidden)


GRADERS = [
    grader_row(check_stream_decode, correct=[incremental, by_lead_bytes], mistakes=[
        (each_token_alone, "decoding each token alone cuts it"),
        (whole_text_so_far, "whole text so far"),
        (all_at_the_end, "as soon as its last byte has arrived"),
        (bytes_dropped, "characters are missing"),
        (differences_of_prefixes, "shows '\ufffd'"),
        (held_until_all_decodes, "text held back longer than needed"),
        (no_flush_at_the_end, "flush the bytes still held back"),
    ], prints="a stream cut inside a character"),
    grader_row(check_bpe_merges, correct=[merges, merges_as_lists, with_library], mistakes=[
        (unweighted, "counts not weighted"),
        (ties_to_largest_ids, "tie broken the other way"),
        (ties_first_seen, "order in which pairs were first seen"),
        (ties_alphabetical, "alphabetical order"),
        (overlap_counted_once, "overlapping pair counted once"),
    ], prints="6 small vocabularies"),
    grader_row(check_last_turn_labels, correct=[last_turn, last_turn_as_tensors, last_turn_by_roles], mistakes=[
        (last_turn_unshifted, "labels are not shifted"),
        (last_turn_without_end, "carries no loss: the model would never learn to stop"),
        (last_turn_with_role, "the <\\|assistant\\|> token is labelled"),
        (every_assistant_turn, "the earlier assistant turns are labelled"),
        (every_token, "every token is labelled, the user's turns too"),
    ], prints="4 conversations"),
    grader_row(check_dpo_loss, correct=[dpo, dpo_by_rows], mistakes=[
        (dpo_variant("nobeta"), "beta is missing"),
        (dpo_variant("outside"), "beta multiplies the loss"),
        (dpo_variant("divide"), "divided by beta"),
        (dpo_variant("drop_ref"), "reference model's log-probabilities are missing"),
        (dpo_variant("ref_plus"), "are added"),
        (dpo_variant("swap"), "the margin has the wrong sign"),
        (dpo_variant("mean"), "a mean over its tokens"),
        (dpo_variant("all"), "the prompt's and the padding's tokens are counted"),
        (dpo_variant("batch_sum"), "summed: the loss is their mean"),
        (dpo_variant("plus"), "the sign of the loss is flipped"),
    ], prints="4 batches"),
    grader_row(check_last_hidden, correct=[last_by_positions, last_by_flip, last_in_float32, last_by_loop], mistakes=[
        (position_minus_one, "position -1"),
        (count_minus_one, "padding on the left"),
        (one_past, "the position after the last real token"),
        (one_before, "the position before the last real token"),
        (mean_of_real, "averaged the real tokens"),
    ], prints="on the left"),
]


def test_no_merge_case_spells_a_token_twice():
    """Exercise 2's text says the grader's vocabularies never meet a repeat (a merge spelling a token already there)."""
    from transformer_lib.exercises.assistant import _MERGE_CASES
    for word_counts, k in _MERGE_CASES:
        strings = [a + b for a, b in merges(word_counts, k)]
        assert len(set(strings)) == len(strings) and not set(strings) & {c for w in word_counts for c in w}
