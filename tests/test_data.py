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
    with pytest.raises(ValueError, match="single characters"):
        CharTokenizer(["ab", "c"])


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
    with pytest.raises(ValueError, match="non-negative ints"):
        number_pairs([-1])
    with pytest.raises(ValueError, match="non-negative ints"):
        number_pairs([1.5])


def test_split_numbers():
    train, valid, test = split_numbers(1000, 100, 200, seed=3)
    assert (len(train), len(valid), len(test)) == (700, 100, 200)
    assert sorted(train + valid + test) == list(range(1000))
    assert not set(train) & set(test) and not set(train) & set(valid) and not set(valid) & set(test)
    assert train == sorted(train)
    assert split_numbers(1000, 100, 200, seed=3) == (train, valid, test)       # deterministic
    assert split_numbers(1000, 100, 200, seed=4)[2] != test                    # seed matters
    for bad in ((10, 5, 5), (10, -1, 2), (10, 2, 20)):
        with pytest.raises(ValueError, match="n_valid"):
            split_numbers(*bad)


def test_dataset_framing(tok):
    ds = TranslationDataset([("one", "eins")], tok)
    src, tgt = ds[0]
    assert src.tolist() == tok.encode("one") + [tok.eos_id]
    assert tgt.tolist() == [tok.bos_id] + tok.encode("eins") + [tok.eos_id]
    assert len(ds) == 1


def test_collate_shapes_shift_and_masks(tok):
    ds = TranslationDataset([("one", "eins"), ("forty-two", "zweiundvierzig"), ("ten", "zehn")], tok)
    b = collate([ds[i] for i in range(3)], pad_id=tok.pad_id)
    B, S, T = 3, len("forty-two") + 1, len("zweiundvierzig") + 1
    assert b.src.shape == (B, S) and b.tgt_in.shape == (B, T) and b.tgt_out.shape == (B, T)
    assert b.src_mask.shape == (B, 1, 1, S) and b.tgt_mask.shape == (B, 1, T, T)
    assert b.src_mask.dtype == torch.bool and b.tgt_mask.dtype == torch.bool
    # teacher forcing: the decoder input is the target shifted right by one, starting with BOS
    assert torch.equal(b.tgt_in[:, 1:], b.tgt_out[:, :-1])
    assert (b.tgt_in[:, 0] == tok.bos_id).all()
    assert b.tgt_out[0].tolist() == tok.encode("eins") + [tok.eos_id] + [tok.pad_id] * (T - 5)
    # source mask: True exactly on real tokens
    assert torch.equal(b.src_mask[:, 0, 0], b.src != tok.pad_id)
    assert b.src_mask[0, 0, 0].tolist() == [True] * 4 + [False] * (S - 4)
    # target mask: causal and no padded key
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(B):
        real = b.tgt_in[i] != tok.pad_id
        assert torch.equal(b.tgt_mask[i, 0], causal & real[None, :])
    assert not (b.tgt_mask[:, 0] & ~causal).any()              # never a future position
    moved = b.to("cpu")
    assert torch.equal(moved.src, b.src)


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
    fixed = LengthGroupedSampler(lengths, 100, shuffle=False)
    assert list(fixed) == list(fixed)
    with pytest.raises(ValueError, match="batch_size"):
        LengthGroupedSampler(lengths, 0)
