"""Tests for transformer_lib/data.py (Chapter 8): tokenizer, number pairs, split, batches and masks."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_lib.data import (
    BOS,
    EOS,
    PAD,
    UNK,
    CharTokenizer,
    LengthGroupedSampler,
    TranslationDataset,
    collate,
    number_pairs,
    split_numbers,
    training_numbers,
)

CHARS = "abcdefghijklmnopqrstuvwxyz ,-äöüß"


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer(CHARS)


def test_special_ids(tok):
    assert tok.itos[:4] == [PAD, BOS, EOS, UNK]
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert len(tok) == 4 + len(set(CHARS))
    assert tok.chars == sorted(set(CHARS))


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=CHARS, max_size=60))
def test_round_trip(text):
    tok = CharTokenizer(CHARS)
    ids = tok.encode(text, bos=True, eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id and len(ids) == len(text) + 2
    assert all(i >= 4 for i in ids[1:-1])
    assert tok.decode(ids) == text
    assert tok.decode(torch.tensor(ids)) == text


def test_decode_stops_at_eos_and_skips_pad(tok):
    ids = [tok.bos_id, *tok.encode("elf"), tok.pad_id, tok.eos_id, *tok.encode("zwei")]
    assert tok.decode(ids) == "elf"


def test_unknown_character_raises(tok):
    with pytest.raises(ValueError, match=r"character '!' at position 5 is not in the vocabulary"):
        tok.encode("zwölf!")
    with pytest.raises(ValueError, match="ids must lie in"):
        tok.decode([len(tok)])
    with pytest.raises(ValueError, match="ids must lie in"):
        tok.decode([-1])
    with pytest.raises(ValueError, match="single characters"):
        CharTokenizer(["ab", "c"])


@pytest.mark.parametrize("ids", [
    torch.tensor([[5, 6], [7, 8]]),              # a batch: decode one row at a time
    torch.tensor([5.0, 6.0]),                    # float ids
    torch.tensor([True, False]),
    torch.tensor(5),                             # 0-D
    [5.0, 6.0],
    [[5, 6]],
    [True, 5],
    "abc",
    5,
])
def test_decode_rejects_anything_but_1d_integer_ids(tok, ids):
    with pytest.raises(ValueError, match=r"^ids must be a list of int ids or a 1-D integer tensor"):
        tok.decode(ids)


def test_decode_accepts_1d_integer_ids(tok):
    ids = tok.encode("elf")
    for form in (ids, tuple(ids), torch.tensor(ids), torch.tensor(ids, dtype=torch.int32), iter(ids)):
        assert tok.decode(form) == "elf"
    assert tok.decode([]) == "" and tok.decode(torch.tensor([], dtype=torch.long)) == ""


def test_tokenizer_argument_errors(tok):
    with pytest.raises(ValueError, match="^text must be a str"):
        tok.encode(["e", "l", "f"])
    with pytest.raises(ValueError, match="^bos must be True or False"):
        tok.encode("elf", bos=1)
    with pytest.raises(ValueError, match="^eos must be True or False"):
        tok.encode("elf", eos="False")
    with pytest.raises(ValueError, match="^use_unk must be True or False"):
        CharTokenizer("abc", use_unk="yes")
    with pytest.raises(ValueError, match="^texts must be a list of strings; for one text pass"):
        CharTokenizer.from_texts("abc")


def test_unknown_character_with_unk():
    tok = CharTokenizer(CHARS, use_unk=True)
    assert tok.encode("a!b") == [tok.stoi["a"], tok.unk_id, tok.stoi["b"]]
    assert tok.decode(tok.encode("a!b")) == "a<unk>b"


def test_from_texts():
    tok = CharTokenizer.from_texts(["zwei", "two"])
    assert tok.chars == sorted(set("zweitwo"))


def test_number_pairs():
    assert number_pairs([342, 21, 0]) == [("three hundred and forty-two", "dreihundertzweiundvierzig"),
                                          ("twenty-one", "einundzwanzig"), ("zero", "null")]
    assert number_pairs([7], tgt_lang="fr") == [("seven", "sept")]
    assert number_pairs([]) == []
    assert number_pairs([5], src_lang="en_GB") == [("five", "fünf")]     # a regional code falls back to "en"
    for bad in ([-1], [1.5], [True], ["7"]):
        with pytest.raises(ValueError, match="^numbers must hold non-negative ints"):
            number_pairs(bad)
    with pytest.raises(ValueError, match=r"^numbers must be a list .*for one number pass \[n\]"):
        number_pairs(7)


@pytest.mark.parametrize("kwargs, name", [({"src_lang": "xx"}, "src_lang"), ({"tgt_lang": "klingon"}, "tgt_lang"),
                                          ({"tgt_lang": None}, "tgt_lang")])
def test_number_pairs_unknown_language(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name} must be a language code num2words supports, e.g. .*'de'") as err:
        number_pairs([3], **kwargs)
    assert "'en'" in str(err.value) and "got" in str(err.value)


def test_training_numbers_takes_half_of_the_short_numbers_and_draws_the_rest():
    pool, _, _ = split_numbers(20_000, 100, 200, seed=0)
    short = [n for n in pool if n < 1000]
    drawn = training_numbers(pool, 3000, seed=1)
    assert len(drawn) == len(set(drawn)) == 3000 and set(drawn) <= set(pool)
    assert sum(n < 1000 for n in drawn) == len(short) // 2            # exactly half of the short ones ...
    assert 0 < sum(n < 1000 for n in drawn[:1000]) < len(short) // 2   # ... spread through the order, not first
    assert training_numbers(pool, 3000, seed=1) == drawn                # deterministic
    assert training_numbers(pool, 3000, seed=2) != drawn                # seeded
    long_part = [n for n in drawn if n >= 1000]                         # uniform over 1,000..19,999: about 53 %
    assert 0.45 < sum(n >= 10_000 for n in long_part) / len(long_part) < 0.6   # have five digits
    tiny = [5, 7, 2000, 3000]                                           # short: 5 and 7 (below 10); one is drawn
    assert sorted(training_numbers(tiny, 3, short_below=10)) in ([5, 2000, 3000], [7, 2000, 3000])
    with pytest.raises(ValueError, match=r"^n must lie in \[1, 3\]"):
        training_numbers(tiny, 4, short_below=10)                       # the unseen half is never drawn
    for bad, name in (((5, 3), "pool"), (("abc", 3), "pool"), (([1, 2.5], 1), "pool"), (([1, True], 1), "pool"),
                      (([1, 2], 0), "n"), (([1, 2], 1, -1), "seed"), (([1, 2], 1, 1, 0), "short_below")):
        with pytest.raises(ValueError, match=f"^{name} must"):
            training_numbers(*bad)


def test_split_numbers():
    train, valid, test = split_numbers(1000, 100, 200, seed=3)
    assert (len(train), len(valid), len(test)) == (700, 100, 200)
    assert sorted(train + valid + test) == list(range(1000))
    assert not set(train) & set(test) and not set(train) & set(valid) and not set(valid) & set(test)
    assert train == sorted(train)
    assert split_numbers(1000, 100, 200, seed=3) == (train, valid, test)       # deterministic
    assert split_numbers(1000, 100, 200, seed=4)[2] != test                    # seed matters
    assert split_numbers(3, 0, 0) == ([0, 1, 2], [], [])
    for bad in ((10, 5, 5), (10, -1, 2), (10, 2, 20), (10, True, 2), (10, 2.0, 2)):
        with pytest.raises(ValueError, match="n_valid"):
            split_numbers(*bad)
    for bad, name in (((0, 0, 0), "n_max"), ((True, 0, 0), "n_max"), ((10, 1, -1), "n_test"),
                      ((10, 1, False), "n_test")):
        with pytest.raises(ValueError, match=f"^{name} must be an int"):
            split_numbers(*bad)
    with pytest.raises(ValueError, match="^seed must be an int"):
        split_numbers(10, 1, 1, seed=True)


def test_dataset_framing(tok):
    ds = TranslationDataset([("one", "eins")], tok)
    src, tgt = ds[0]
    assert src.tolist() == tok.encode("one") + [tok.eos_id]
    assert tgt.tolist() == [tok.bos_id] + tok.encode("eins") + [tok.eos_id]
    assert len(ds) == 1
    with pytest.raises(ValueError, match="^pairs must hold"):
        TranslationDataset(["one"], tok)


def test_collate_shapes_shift_and_masks(tok):
    ds = TranslationDataset([("one", "eins"), ("forty-two", "zweiundvierzig"), ("ten", "zehn")], tok)
    b = collate([ds[i] for i in range(3)], pad_id=tok.pad_id)
    B, S, T = 3, len("forty-two") + 1, len("zweiundvierzig") + 1
    assert b.src.shape == (B, S) and b.tgt_in.shape == (B, T) and b.tgt_out.shape == (B, T)
    assert b.src_mask.shape == (B, 1, 1, S) and b.tgt_mask.shape == (B, 1, 1, T)
    assert b.src_mask.dtype == torch.bool and b.tgt_mask.dtype == torch.bool
    # teacher forcing: the decoder input is the target shifted right by one, starting with BOS
    assert torch.equal(b.tgt_in[:, 1:], b.tgt_out[:, :-1])
    assert (b.tgt_in[:, 0] == tok.bos_id).all()
    assert b.tgt_out[0].tolist() == tok.encode("eins") + [tok.eos_id] + [tok.pad_id] * (T - 5)
    # source mask: True exactly on real tokens
    assert torch.equal(b.src_mask[:, 0, 0], b.src != tok.pad_id)
    assert b.src_mask[0, 0, 0].tolist() == [True] * 4 + [False] * (S - 4)
    # target mask: padding only, (B, 1, 1, T); the decoder adds the causal mask itself
    assert b.tgt_mask.shape == (B, 1, 1, T)
    assert torch.equal(b.tgt_mask[:, 0, 0], b.tgt_in != tok.pad_id)
    assert b.tgt_mask[0, 0, 0].tolist() == [True] * 6 + [False] * (T - 6)        # BOS eins EOS, then padding
    moved = b.to("cpu")
    assert torch.equal(moved.src, b.src) and torch.equal(moved.tgt_mask, b.tgt_mask)


def test_collate_with_another_pad_id(tok):
    ds = TranslationDataset([("one", "eins"), ("forty-two", "zweiundvierzig")], tok)
    b = collate([ds[0], ds[1]], pad_id=3)
    assert b.src[0, 4:].eq(3).all() and torch.equal(b.src_mask[:, 0, 0], b.src != 3)


@pytest.mark.parametrize("examples", [
    [],
    [(torch.tensor([5, 2]),)],                                                # not a pair
    [(torch.tensor([5, 2]), torch.tensor([1.0, 2.0]))],                       # float ids
    [(torch.tensor([[5, 2]]), torch.tensor([1, 5, 2]))],                      # 2-D source
    [(torch.tensor([5, 2]), torch.tensor([1]))],                              # target without BOS ... EOS
    [([5, 2], [1, 5, 2])],                                                    # lists, not tensors
])
def test_collate_rejects_bad_examples(examples):
    with pytest.raises(ValueError, match="^examples must hold"):
        collate(examples)


@pytest.mark.parametrize("pad_id", [True, -1, 0.0, None])
def test_collate_rejects_bad_pad_id(tok, pad_id):
    ds = TranslationDataset([("one", "eins")], tok)
    with pytest.raises(ValueError, match="^pad_id must be an int"):
        collate([ds[0]], pad_id=pad_id)


def test_length_grouped_sampler():
    lengths = [(i * 37) % 50 + 1 for i in range(1000)]
    sampler = LengthGroupedSampler(lengths, 32, seed=0)
    assert len(sampler) == 32
    epoch0, epoch1 = list(sampler), list(sampler)
    for epoch in (epoch0, epoch1):
        assert sorted(i for b in epoch for i in b) == list(range(1000))        # each example once per epoch
        spread = max(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in epoch)
        assert spread <= 2                                                     # similar lengths together
    assert epoch0 != epoch1                                                    # reshuffled every epoch
    assert list(LengthGroupedSampler(lengths, 32, seed=0)) == epoch0           # seeded
    fixed = list(LengthGroupedSampler(lengths, 100, shuffle=False))
    assert [i for b in fixed for i in b] == sorted(range(1000), key=lambda i: (lengths[i], i))   # sorted, stable
    assert [len(b) for b in fixed] == [100] * 10
    assert list(LengthGroupedSampler([], 4)) == [] and len(LengthGroupedSampler([], 4)) == 0
    assert [len(b) for b in LengthGroupedSampler([1] * 5, 2, shuffle=False)] == [2, 2, 1]


@pytest.mark.parametrize("kwargs, name", [({"batch_size": 0}, "batch_size"), ({"batch_size": True}, "batch_size"),
                                          ({"batch_size": 2.0}, "batch_size"), ({"shuffle": "False"}, "shuffle"),
                                          ({"seed": -1}, "seed"), ({"seed": True}, "seed")])
def test_length_grouped_sampler_errors(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        LengthGroupedSampler([1, 2, 3], **{"batch_size": 2, **kwargs})
