"""The graders of Chapter 16's exercises (the tokenizer, instruction tuning), imported by the chapter's exercise cells.

Hand-written, not exported from the chapter: a grader's reference and named slips are the answers, and Colab shows
every cell of a chapter, so their code stays out of the chapters."""

__all__ = ['check_stream_decode', 'check_bpe_merges', 'check_last_turn_labels', 'check_dpo_loss', 'check_last_hidden']

import codecs
import collections
import functools
from itertools import pairwise

import torch

from ..assistant import BYTE_CHARS, ChatTemplate, merge_pair, train_byte_bpe
from ..bert import IGNORE_INDEX
from ..validation import describe
from .grading import call_reader, grade

# --- exercise 1: decoding a stream of tokens


@functools.cache
def _stream_tokenizer():
    """A small byte-level BPE trained on a little text in several scripts. Some of its merged tokens end inside a
    character (b'na\\xc3': two complete characters, then the first byte of ï) and some join the end of one
    character to the start of the next (b'\\xb1\\xe4', inside 東京); _streams uses both."""
    texts = ["naïve café, déjà vu " * 3, "東京 大阪 東京都 " * 3, "ok 🙂 fine 🙂🙂 " * 3, "def f(x):\n    return x\n" * 2]
    return train_byte_bpe(texts, 256 + 1 + 48)


def _streams(tok):
    """(what, ids) pairs: texts encoded by tok; streams of tokens that end inside a character after complete
    ones (b'na\\xc3') or join two characters (b'\\xb1\\xe4'); one stream cut inside a character."""
    texts = ["naïve café", "東京 and 大阪", "ok 🙂🙂 done", "plain ASCII", "½ x² — 5 €", "é", "京都🙂"]
    streams = [(repr(t), tok.encode(t)) for t in texts]
    token = lambda raw: tok.ids["".join(BYTE_CHARS[b] for b in raw)]               # noqa: E731  (bytes -> its id)
    split = [("'naïve' as b'na\\xc3' + b'\\xafve'", [token(b"na\xc3"), token(b"\xafve")]),
             ("'東京' as b'\\xe6\\x9d' + b'\\xb1\\xe4' + b'\\xba\\xac'",
              [token(b"\xe6\x9d"), token(b"\xb1\xe4"), token(b"\xba\xac")])]
    cut = tok.encode("ok ") + [tok.ids[BYTE_CHARS[b]] for b in "東".encode()[:2]]
    return streams + split + [("'ok 東' cut after the first two bytes of 東", cut)]


def _shown(tok, ids) -> list:
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    shown = [utf8.decode(tok.token_bytes(i)) for i in ids]
    if shown:
        shown[-1] += utf8.decode(b"", final=True)
    return shown


def _held_whole(tok, ids) -> list:
    """The slip 'held back longer than needed': a token's text waits until all the bytes so far decode."""
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


def check_stream_decode(fn) -> None:
    """Test fn(tok, ids) -> one str per id, the text that can be shown once that token has arrived (an unfinished
    character held back until its last byte, every complete one shown at once; joined: tok.decode(ids)), on
    streams of a small byte-level BPE. Raises AssertionError naming the mistake; prints a verdict."""
    tok = _stream_tokenizer()
    streams = _streams(tok)
    if not any(want[k] and want[:k + 1] != _held_whole(tok, ids)[:k + 1]           # the grader's own check: some
               for _, ids in streams for want in [_shown(tok, ids)] for k in range(len(ids))):   # token ends in a cut
        raise RuntimeError("no stream has a token that ends inside a character after complete ones")
    for what, ids in streams:
        got = call_reader(fn, f"my_stream_decode(tok, ids of {what})", tok, list(ids))
        if not isinstance(got, (list, tuple)) or not all(isinstance(s, str) for s in got):
            raise AssertionError(f"{what}: return a list of str, one per token id, got {describe(got)}")
        got, want, full = list(got), _shown(tok, ids), tok.decode(ids)
        if len(got) != len(ids):
            raise AssertionError(f"{what}: return one str per token id: {len(ids)} ids, {len(got)} strings")
        if got == want:
            continue
        joined = "".join(got)
        if got == [tok.decode([i]) for i in ids] or ("\ufffd" in joined and joined.count("\ufffd") > full.count("\ufffd")):
            raise AssertionError(f"{what}: your text shows '\ufffd' where the full decode has a character: a token "
                                 "can end inside a character (UTF-8 takes up to 4 bytes for one); decoding each "
                                 "token alone cuts it. Keep the unfinished bytes until the rest arrives")
        if len(got) > 1 and all(got[k] == tok.decode(ids[:k + 1]) for k in range(len(ids))):
            raise AssertionError(f"{what}: you return the whole text so far at every step; return only the text "
                                 "that is new with each token, so that the strings join to tok.decode(ids)")
        if joined == full:
            k = next(k for k in range(len(ids)) if "".join(got[:k + 1]) != "".join(want[:k + 1]))
            held = ("text held back longer than needed: a token can end with complete characters and then the first "
                    "byte of the next; show the complete ones at once and keep only the unfinished bytes"
                    if got == _held_whole(tok, ids) else "show every character as soon as its last byte has arrived")
            raise AssertionError(f"{what}: after token {k}, {''.join(want[:k + 1])!r} can be shown, but you show "
                                 f"{''.join(got[:k + 1])!r}: {held}")
        if ids and want[-1].endswith("\ufffd") and joined + "\ufffd" == full:
            raise AssertionError(f"{what}: the stream ends inside a character and your strings join to {joined!r}, "
                                 f"where tok.decode(ids) is {full!r}: at the end of the stream, flush the bytes still "
                                 "held back (decode them with errors='replace', which gives '\ufffd')")
        if len(joined) < len(full):
            raise AssertionError(f"{what}: characters are missing: tok.decode(ids) is {full!r}, your strings join to "
                                 f"{joined!r}: do not drop bytes that do not decode alone (errors='ignore'); keep "
                                 "them for the next token")
        raise AssertionError(f"{what}: your strings join to {joined!r}, tok.decode(ids) is {full!r}")
    print(f"check_stream_decode: correct on {len(streams)} token streams (é, 東, 🙂 split between tokens; a stream "
          "cut inside a character)")


# --- exercise 2: merges by hand


def _choose(counts, vocab, ties):
    """The pair to merge: the highest count, ties to the smallest ids ("ids"), or a slip: to the largest ids, to the
    first seen (counts in the order the words and their positions were read), or to the alphabetically first
    strings."""
    if ties == "ids":
        return max(counts, key=lambda p: (counts[p], -p[0], -p[1]))
    if ties == "largest":
        return max(counts, key=lambda p: (counts[p], p[0], p[1]))
    if ties == "first":
        return max(counts, key=counts.get)
    return min(counts, key=lambda p: (-counts[p], vocab[p[0]], vocab[p[1]]))


def _bpe_merges(word_counts, num_merges, weighted=True, ties="ids", overlapping=True) -> list:
    """The reference, and its slips: counts not weighted by the words' counts, ties to the largest ids or to the
    alphabetical order of the strings, a pair overlapping itself (aaa) counted once."""
    vocab = sorted({c for word in word_counts for c in word})
    ids = {token: i for i, token in enumerate(vocab)}
    words = [([ids[c] for c in word], n if weighted else 1) for word, n in word_counts.items()]
    merges = []
    for _ in range(num_merges):
        counts = collections.Counter()
        for seq, n in words:
            if overlapping:
                for pair in pairwise(seq):
                    counts[pair] += n
            else:                                  # the slip: occurrences as merge_pair would replace them
                for pair in set(pairwise(seq)):
                    counts[pair] += n * (len(seq) - len(merge_pair(seq, pair, -1)))
        if not counts:
            break
        a, b = _choose(counts, vocab, ties)
        token = vocab[a] + vocab[b]
        if token not in ids:
            ids[token] = len(vocab)
            vocab.append(token)
        merges.append((vocab[a], vocab[b]))
        words = [(merge_pair(seq, (a, b), ids[token]), n) for seq, n in words]
    return merges


_MERGE_CASES = [({"cd": 2, "ab": 2, "ef": 2}, 1),                # a three-way tie: first seen, smallest, largest ids
                ({"tenet": 3, "net": 4, "ten": 2, "nets": 1}, 4),
                ({"abx": 3, "cy": 3, "ab": 2}, 2),
                ({"aaa": 3, "ab": 5, "ba": 1}, 3),
                ({"low": 5, "slow": 2, "owl": 1, "glow": 3, "lows": 1}, 5),
                ({"x": 7}, 2)]
_MERGE_MISTAKES = {
    "counts not weighted: a word seen n times holds each of its pairs n times": {"weighted": False},
    "a tie broken by the strings' alphabetical order: ties go to the smallest ids, and a merged token's id comes "
    "after every character's": {"ties": "strings"},
    "a tie broken by the order in which pairs were first seen (max over the counts keeps the first it meets): among "
    "pairs of equal count take the smallest left id, then the smallest right id": {"ties": "first"},
    "a tie broken the other way: among pairs of equal count take the smallest left id, then the smallest right id":
        {"ties": "largest"},
    "an overlapping pair counted once: every position counts, so 'aaa' holds (a, a) twice": {"overlapping": False},
}


def check_bpe_merges(fn) -> None:
    """Test fn(word_counts {word: count}, num_merges) -> the first num_merges merges as (left, right) str pairs,
    with section 16.1's rules (every position counts, pairs weighted by the word's count, ties to the smallest
    ids: the characters in code-point order first, then each merge's token), on small vocabularies. Raises
    AssertionError naming the mistake; prints a verdict."""
    for word_counts, k in _MERGE_CASES:
        where = f"{word_counts}, {k} merges"
        got = call_reader(fn, f"my_bpe_merges({where})", dict(word_counts), k)
        if (not isinstance(got, (list, tuple)) or not all(isinstance(m, (list, tuple)) and len(m) == 2
                                                           and all(isinstance(s, str) for s in m) for m in got)):
            raise AssertionError(f"{where}: return a list of (left, right) pairs of str, got {describe(got)}")
        got, want = [tuple(m) for m in got], _bpe_merges(word_counts, k)
        if got == want:
            continue
        if len(got) != len(want):
            raise AssertionError(f"{where}: {len(got)} merges returned, expected {len(want)}" + (
                ": stop when no pair is left" if len(want) < k else ""))
        for message, slip in _MERGE_MISTAKES.items():
            if got == _bpe_merges(word_counts, k, **slip):
                raise AssertionError(f"{where}: {message}")
        i = next(i for i in range(len(want)) if got[i] != want[i])
        raise AssertionError(f"{where}: merge {i} is {got[i]}, expected {want[i]}")
    print(f"check_bpe_merges: correct on {len(_MERGE_CASES)} small vocabularies (weights, ties, overlapping pairs)")

# --- exercise 3: a loss on the last answer only


def _last_turn_labels(template, conversation, slip=None) -> tuple:
    """The reference (slip None) and its slips: "unshifted" (labels[t] = ids[t]), "no end" (the closing <|end|>
    unlabelled), "role" (the <|assistant|> token labelled), "every turn" (every assistant turn labelled, as
    render marks them), "everything" (every token labelled)."""
    ids, trained = template.render(conversation)
    start = len(template.render(conversation[:-1])[0]) if len(conversation) > 1 else 0   # the last <|assistant|>
    keep = [i > start for i in range(len(ids))]
    if slip == "no end":
        keep[-1] = False
    elif slip == "role":
        keep[start] = True
    elif slip == "every turn":
        keep = list(trained)
    elif slip == "everything":
        keep = [True] * len(ids)
    targets = ids[:-1] if slip == "unshifted" else ids[1:]
    flags = keep[:-1] if slip == "unshifted" else keep[1:]
    return ids[:-1], [i if k else IGNORE_INDEX for i, k in zip(targets, flags, strict=True)]


_CONVERSATIONS = [
    [("user", "sort: b a c"), ("assistant", "a b c")],
    [("user", "hi"), ("assistant", "hello, café"), ("user", "and now?"), ("assistant", "ok 🙂 done")],
    [("user", "1"), ("assistant", "one"), ("user", "2"), ("assistant", "two"), ("user", "3"), ("assistant", "three")],
    [("user", "say nothing"), ("assistant", "")],
]
_LAST_TURN_MISTAKES = {
    "unshifted": "labels are not shifted: labels[t] is the token the model should write after reading inputs[t], "
                 "that is ids[t + 1], not ids[t]",
    "no end": "the <|end|> that closes the last answer carries no loss: the model would never learn to stop",
    "role": "the <|assistant|> token is labelled: the template writes it, the model does not have to",
    "every turn": "the earlier assistant turns are labelled: they are context here; only the last answer "
                  "(and its <|end|>) carries a loss",
    "everything": "every token is labelled, the user's turns too: only the last answer (and its <|end|>) carries "
                  "a loss",
}


def check_last_turn_labels(fn) -> None:
    """Test fn(template, conversation) -> (inputs, labels), each len(ids) - 1 token ids (lists or 1-D tensors),
    ids = template.render(conversation)[0]: inputs = ids[:-1]; labels[t] = ids[t + 1] where that token is in the
    text of the last assistant turn or is the <|end|> that closes it, else IGNORE_INDEX (-100). Conversations of
    one to three exchanges, one with an empty last answer. Raises AssertionError naming the mistake; prints a
    verdict."""
    template = ChatTemplate(_stream_tokenizer())
    for conversation in _CONVERSATIONS:
        where = f"conversation {conversation}"
        got = call_reader(fn, f"my_last_turn_labels(template, {where})", template, [tuple(t) for t in conversation])
        if not (isinstance(got, (list, tuple)) and len(got) == 2):
            raise AssertionError(f"{where}: return a pair (inputs, labels), got {describe(got)}")
        got = [g.tolist() if hasattr(g, "tolist") else g for g in got]
        want = _last_turn_labels(template, conversation)
        n = len(want[0])
        if not all(isinstance(g, (list, tuple)) and len(g) == n and all(isinstance(x, int) for x in g) for g in got):
            raise AssertionError(f"{where}: return inputs and labels as {n} token ids each (len(ids) - 1: the last "
                                 f"token is no input, the first no label), got {describe(got[0])} and "
                                 f"{describe(got[1])}")
        inputs, labels = list(got[0]), list(got[1])
        if inputs != want[0]:
            raise AssertionError(f"{where}: inputs must be the rendered ids without the last one, ids[:-1]")
        if labels == want[1]:
            continue
        for slip, message in _LAST_TURN_MISTAKES.items():
            if labels == _last_turn_labels(template, conversation, slip)[1]:
                raise AssertionError(f"{where}: {message}")
        t = next(t for t in range(n) if labels[t] != want[1][t])
        raise AssertionError(f"{where}: labels[{t}] is {labels[t]}, expected {want[1][t]}")
    print(f"check_last_turn_labels: correct on {len(_CONVERSATIONS)} conversations (one to three exchanges, an "
          "empty last answer)")


# --- exercise 4: the DPO loss from log-probabilities


def _dpo_loss(policy, reference, mask, beta, slip=None):
    """The reference DPO loss (slip None) and its slips, all in float64: policy and reference (2B, T) per-token
    log-probabilities, the first B rows chosen, the last B rejected; mask (2B, T) True at answer tokens."""
    import torch
    import torch.nn.functional as F

    policy, reference = policy.double(), reference.double()
    keep = torch.ones_like(mask) if slip == "all tokens" else mask
    if slip == "token mean":
        total = lambda x: (x * keep).sum(-1) / keep.sum(-1)                    # noqa: E731
    else:
        total = lambda x: (x * keep).sum(-1)                                    # noqa: E731
    pol, ref = total(policy), total(reference)
    B = len(pol) // 2
    chosen, rejected = pol[:B] - ref[:B], pol[B:] - ref[B:]
    if slip == "no reference":
        chosen, rejected = pol[:B], pol[B:]
    elif slip == "reference added":
        chosen, rejected = pol[:B] + ref[:B], pol[B:] + ref[B:]
    diff = chosen - rejected
    if slip == "swapped":
        diff = -diff
    if slip == "no beta":
        return -F.logsigmoid(diff).mean()
    if slip == "beta outside":
        return -beta * F.logsigmoid(diff).mean()
    if slip == "beta divides":
        return -F.logsigmoid(diff / beta).mean()
    losses = -F.logsigmoid(beta * diff)
    if slip == "batch sum":
        return losses.sum()
    if slip == "plus sign":
        return -losses.mean()
    return losses.mean()


def _dpo_cases():
    """(B, T, beta, dtype, seed) of the grader's batches: answers of different lengths after prompts of different
    lengths, margins of both signs, float64 and float32."""
    import torch

    cases = []
    for B, T, beta, dtype, seed in ((1, 6, 0.1, torch.float64, 0), (3, 9, 0.1, torch.float32, 1),
                                    (4, 12, 0.5, torch.float64, 2), (2, 7, 0.25, torch.float32, 3)):
        g = torch.Generator().manual_seed(seed)
        policy = -3 * torch.rand(2 * B, T, generator=g, dtype=torch.float64)
        reference = policy + 0.8 * torch.randn(2 * B, T, generator=g, dtype=torch.float64)
        reference = reference.clamp(max=-1e-3)
        mask = torch.zeros(2 * B, T, dtype=torch.bool)
        for row in range(2 * B):
            start = int(torch.randint(1, T // 2, (1,), generator=g))              # the prompt's tokens
            stop = int(torch.randint(start + 1, T + 1, (1,), generator=g))        # then the answer, then padding
            mask[row, start:stop] = True
        cases.append((policy.to(dtype), reference.to(dtype), mask, beta))
    return cases


_DPO_MISTAKES = {
    "no beta": "beta is missing: the margin is beta times the difference of the two log-ratios, inside the sigmoid",
    "beta outside": "beta multiplies the loss, outside -log sigmoid(...): it belongs inside, on the margin",
    "beta divides": "the difference of the log-ratios is divided by beta: it is multiplied by beta",
    "no reference": "the reference model's log-probabilities are missing: each answer's term is the log-ratio "
                    "log pi(y|x) - log pi_ref(y|x)",
    "reference added": "the reference's log-probabilities are added: each log-ratio subtracts log pi_ref(y|x)",
    "swapped": "the margin has the wrong sign: the chosen answer's log-ratio minus the rejected one's (chosen and "
               "rejected swapped, or a log-ratio written as log pi_ref - log pi)",
    "token mean": "each answer's log-probability is a mean over its tokens: log pi(y|x) is their sum, the "
                  "probability of the whole answer",
    "all tokens": "the prompt's and the padding's tokens are counted: sum only where answer_mask is True",
    "batch sum": "the losses of the pairs are summed: the loss is their mean over the batch",
    "plus sign": "the sign of the loss is flipped: it is -log sigmoid(margin), which falls as the margin grows",
}


def check_dpo_loss(fn) -> None:
    """Test fn(policy_logps, reference_logps, answer_mask, beta) -> the DPO loss, a scalar tensor: policy_logps and
    reference_logps (2B, T) the log-probability of each token under the policy and under the reference, the first B
    rows the chosen answers and the last B the rejected ones (of the same prompts); answer_mask (2B, T) bool, True
    at the answer's tokens. Four batches, float64 and float32. Raises AssertionError naming the mistake; prints a
    verdict."""
    import torch

    cases = _dpo_cases()
    for n, (policy, reference, mask, beta) in enumerate(cases):
        where = f"batch {n + 1} (B={len(policy) // 2} pairs, T={policy.shape[1]}, beta={beta}, {policy.dtype})"
        got = call_reader(fn, f"my_dpo_loss(...) on {where}", policy.clone(), reference.clone(), mask.clone(), beta)
        if not (isinstance(got, torch.Tensor) and got.numel() == 1 and got.is_floating_point()):
            raise AssertionError(f"{where}: return the loss as a scalar float tensor, got {describe(got)}")
        value = got.detach().double().item()
        tol = 1e-4 if policy.dtype == torch.float32 else 1e-9

        def close(want, value=value, tol=tol):
            return abs(value - want) <= tol * max(1.0, abs(want))

        if close(_dpo_loss(policy, reference, mask, beta).item()):
            continue
        for slip, message in _DPO_MISTAKES.items():
            if close(_dpo_loss(policy, reference, mask, beta, slip).item()):
                raise AssertionError(f"{where}: {message}")
        raise AssertionError(f"{where}: the loss is {value:.6g}, not the DPO loss of these log-probabilities")
    print(f"check_dpo_loss: correct on {len(cases)} batches (answers of different lengths, float64 and float32)")
# --- exercise 5: the last real token's hidden state, padding on either side


def _last_position(keep):
    """(B,) the position of each row's last True in keep (B, T)."""
    positions = torch.arange(keep.shape[1])
    return torch.where(keep, positions, -1).max(-1).values


def _gather(hidden, where):
    return hidden[torch.arange(hidden.shape[0]), where.clamp(0, hidden.shape[1] - 1)]


def _last_hidden(hidden, keep):
    return _gather(hidden, _last_position(keep))


def _keep(lengths, T, side):
    """(B, T) bool: lengths[b] real tokens at the right end (side "left": padding on the left) or at the start."""
    positions = torch.arange(T)
    lengths = torch.tensor(lengths)[:, None]
    return positions >= T - lengths if side == "left" else positions < lengths


_LAST_HIDDEN_MISTAKES = {
    "you took position -1 (T - 1) in every row: with padding on the right, that is a pad token in every row shorter "
    "than the longest. Find where each row's real tokens end": lambda h, k: h[:, -1],
    "you took position 0 in every row: a decoder's first token has read only itself": lambda h, k: h[:, 0],
    "you took each row's FIRST real token: under the causal mask it has read nothing of the row after it; the last "
    "real token has read the whole row": lambda h, k: _gather(h, k.int().argmax(-1)),
    "you counted each row's real tokens n and took position n - 1: right only when the padding is on the right. With "
    "padding on the left the real tokens come after it, and the last one sits at T - 1":
        lambda h, k: _gather(h, k.sum(-1) - 1),
    "off by one: you took the position after the last real token (a row of n real tokens starting at 0 ends at "
    "n - 1)": [lambda h, k: _gather(h, k.sum(-1)), lambda h, k: _gather(h, _last_position(k) + 1)],
    "off by one: you took the position before the last real token": [lambda h, k: _gather(h, k.sum(-1) - 2),
                                                                     lambda h, k: _gather(h, _last_position(k) - 1)],
    "you averaged the real tokens' states (a possible classifier input, but not the last token's state)":
        lambda h, k: (h * k[..., None]).sum(1) / k.sum(-1, keepdim=True),
}


def check_last_hidden(fn) -> None:
    """Test fn(hidden (B, T, d), keep (B, T) bool, True at real tokens) -> (B, d): each row's hidden state at its
    last real token, for batches padded on the right, on the left, and not at all (float64 and float32 accepted).
    Raises AssertionError naming the mistake; prints a verdict."""
    generator = torch.Generator().manual_seed(5)
    cases = {}
    for side, lengths in (("padded on the right", [7, 3, 5, 1]), ("padded on the left", [2, 7, 4, 6]),
                          ("not padded", [7, 7])):
        hidden = torch.randn(len(lengths), 7, 3, generator=generator, dtype=torch.float64)
        cases[f"a batch {side}, lengths {lengths}, T = 7"] = (hidden, _keep(lengths, 7, side.split()[-1]))
    grade(fn, _last_hidden, cases, _LAST_HIDDEN_MISTAKES, name="my_last_hidden", shape="(B, d) = ",
          crash=" (is a position you index one past T - 1?)")
    print(f"check_last_hidden: correct on {len(cases)} batches (padded on the right, on the left, not padded)")
